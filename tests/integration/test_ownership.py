"""One owner per session, with two controllers in two real processes on one state directory.

The test process is one controller; ``controller_process.py`` run with ``subprocess`` is the other
(driven over stdin/stdout with JSON lines). What these tests pin down:

- what an old owner's caller is told about a call that a takeover interrupted matches what the new
  owner sees (kept and visible, or a ``SessionAttachedElsewhere`` and not kept);
- a stale handle (``execute``, ``add_context``, ``reset``, ``detach``, ``close``, ``Orchestrator.close``)
  never touches the new owner's container, record or blobs (the forced takeovers here are what they test);
- under a race of attaches and calls from both processes, every call a process was told succeeded
  is in the final state exactly once, also after a kill and restore;
- two stores (state dirs) that use the same session id never touch each other's containers.
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from lifecycle_support import settings_env
from support import kill_and_wait, tree_snapshot

from orchestrator import SessionAttachedElsewhere, SessionNotFound, Settings
from orchestrator.api.session import SessionState
from orchestrator.state.lease import LeaseFile

pytestmark = pytest.mark.docker

HELPER = Path(__file__).with_name("controller_process.py")
STORE_LABEL = "orchestrator.store"


class ControllerProcess:
    """A controller in another process; ``call`` sends one command and waits for its answer."""

    def __init__(self, settings: Settings) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HELPER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=settings_env(settings),
            cwd=str(HELPER.parent),
        )
        self._answers: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        assert self.call("ping", timeout=60) == {"ok": True}

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._answers.put(line)
        self._answers.put(None)

    def send(self, op: str, **args: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()

    def recv(self, timeout: float = 60.0) -> dict[str, Any]:
        try:
            line = self._answers.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the controller process did not answer within {timeout} s") from None
        if line is None:
            raise AssertionError(f"the controller process exited (status {self.proc.wait(5)})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def call(self, op: str, timeout: float = 60.0, **args: Any) -> dict[str, Any]:
        self.send(op, **args)
        return self.recv(timeout)

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.send("quit")
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=5)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


@pytest.fixture
def controller() -> Iterator[Callable[[Settings], ControllerProcess]]:
    """Factory of controller processes on the given settings, stopped after the test."""
    started: list[ControllerProcess] = []

    def start(settings: Settings) -> ControllerProcess:
        started.append(ControllerProcess(settings))
        return started[-1]

    try:
        yield start
    finally:
        for proc in started:
            proc.close()


def ok(answer: dict[str, Any]) -> dict[str, Any]:
    assert answer["ok"], answer
    return answer


@pytest.mark.parametrize("delay", [1.0, 2.95], ids=["early", "near-the-end"])
def test_attach_during_a_call_agrees_with_what_the_old_caller_was_told(
    make_orch, settings_for, new_session, controller, delay: float
) -> None:
    """Process B attaches while process A is inside ``time.sleep(3); x = 'two'``.

    A's call either raises SessionAttachedElsewhere (and B sees ``x == 'one'``) or returns (and B sees
    ``x == 'two'``): never told success with the change lost, nor told failure with the change kept.
    Either way the call ends promptly and A's handle is stale afterwards.
    """
    settings = settings_for()
    orch_a = make_orch(settings)
    a = new_session(orch_a)
    assert a.execute("import time\nx = 'one'").ok
    container = a.container_id
    b = controller(settings)

    b.send("attach", sid=a.id, delay=delay, force=True)
    started = time.monotonic()
    try:
        result = a.execute("time.sleep(3)\nx = 'two'\n'done'", timeout=30)
    except SessionAttachedElsewhere:
        kept = False
    else:
        assert result.error is None and result.return_value == "'done'", result
        kept = True
    took = time.monotonic() - started
    attached = ok(b.recv())
    assert attached["container_id"] == container, "the live container is taken over, not replaced"
    assert took < 3 + 10, f"A's call took {took:.1f} s"

    seen = ok(b.call("execute", code="x"))
    assert seen["return_value"] == ("'two'" if kept else "'one'"), f"A was told kept={kept}, B sees {seen}"
    with pytest.raises(SessionAttachedElsewhere):
        a.execute("x")
    assert a.state is SessionState.DETACHED
    # What B saw is what is stored: it survives a restore from the checkpoint.
    assert ok(b.call("execute", code="x = x + '!'"))["ok"]
    kill_and_wait(orch_a, attached["container_id"])
    again = ok(b.call("execute", code="x"))
    assert again["return_value"] == ("'two!'" if kept else "'one!'")
    assert again["restore_failures"] == {}
    ok(b.call("call", method="close"))


def test_a_stale_handle_cannot_touch_the_new_owner(make_orch, settings_for, new_session, controller, orch) -> None:
    """After B took the session over (by force), no call on an old handle changes anything.

    Several old handles (the creator's and five forced attaches from other orchestrators in this process,
    each superseded by the next) each get a *different* first call after process B attached, so every kind
    of call is tried on a handle that has not learnt yet that it is stale: ``execute``, ``add_context`` and
    ``reset`` raise SessionAttachedElsewhere, ``detach`` and ``close`` let go of the handle without
    raising, and ``Orchestrator.close`` forgets its handle quietly. After each, B's container is still
    running and no file under the session's store directory changed (record, blobs); B's next call works
    in the same container, and after a kill B's session restores completely (no blob of B's checkpoint
    was deleted by a stale owner).
    """
    settings = settings_for()
    orch_a = make_orch(settings)
    a = new_session(orch_a)
    assert a.execute("data = list(range(1000))\nbig = 'a' * 2_000_000\nx = 1").ok
    container = a.container_id
    handles = {"execute": a}
    orchestrators = {}
    for name in ("add_context", "reset", "detach", "close", "Orchestrator.close"):
        orchestrators[name] = make_orch(settings)
        handles[name] = orchestrators[name].attach(a.id, force=True)
        assert handles[name].container_id == container
    b = controller(settings)
    attached = ok(b.call("attach", sid=a.id, force=True))
    assert attached["container_id"] == container, "the live container is taken over"
    # B replaces values so that blobs the old owners knew are garbage now and B's blobs are new to them.
    ok(b.call("execute", code="x = 2\ndata.append(1000)\nz = 'from-b'\nbig = 'B' * 2_000_000"))
    session_dir = settings.state_dir / "sessions" / a.id
    before = tree_snapshot(session_dir)
    assert any(name.startswith("blobs/") for name in before)

    def unchanged(after: str) -> None:
        assert tree_snapshot(session_dir) == before, f"the stale {after} changed the store"
        lease = LeaseFile(session_dir).read()
        assert lease is not None and lease.pid == b.proc.pid, f"the stale {after} ended or took B's lease"
        state = orch.backend.inspect(container)
        assert state is not None and state.running, f"the stale {after} stopped the new owner's container"

    first_calls: dict[str, Callable[[], object]] = {
        "execute": lambda: handles["execute"].execute("x = 3\nbig = None"),
        "add_context": lambda: handles["add_context"].add_context("from a stale handle"),
        "reset": handles["reset"].reset,
    }
    for name, call in first_calls.items():
        with pytest.raises(SessionAttachedElsewhere):
            call()
        unchanged(name)
        assert handles[name].state is SessionState.DETACHED
    for name in ("detach", "close"):  # letting go of a stale handle is not an error: it says what it left alone
        getattr(handles[name], name)()
        unchanged(name)
        assert handles[name].state is SessionState.DETACHED
    orchestrators["Orchestrator.close"].close()  # forgets its taken-over handle without closing anything
    unchanged("Orchestrator.close")
    # Handles that know they are stale stay harmless.
    with pytest.raises(SessionAttachedElsewhere):
        a.execute("x")
    handles["reset"].close()
    handles["close"].detach()
    orch_a.close()
    unchanged("second round")

    check = "x, z, len(data), data[-1], big[0], len(big), 'context' in globals()"
    expected = "(2, 'from-b', 1001, 1000, 'B', 2000000, False)"
    live = ok(b.call("execute", code=check))
    assert live["return_value"] == expected
    assert live["container_id"] == container
    kill_and_wait(orch, container)
    restored = ok(b.call("execute", code=check))
    assert restored["return_value"] == expected
    assert restored["restore_failures"] == {}
    assert restored["container_id"] != container
    ok(b.call("call", method="close"))
    assert not session_dir.exists()


RACE_SECONDS = 8.0


def test_racing_controllers_lose_no_acknowledged_call(make_orch, settings_for, new_session, controller, orch) -> None:
    """Two processes attach and run ``n += 1`` against each other for a while.

    Every call a process was told succeeded is in ``n`` exactly once; every call that raised
    SessionAttachedElsewhere is not. The same holds after the final container is killed and the
    session restored from its checkpoint. Then, stricter: takeover is the only failure a racing
    call or attach may see (``SessionAttachedElsewhere``, not a transport error), no attach waits
    long, both racers make progress, and the live container is only ever taken over, never
    replaced by a new one (it never died). (In-memory-only values may still be lost: a takeover that
    discards an in-flight call rolls the live worker back by a restore.)
    """
    settings = settings_for()
    creator = make_orch(settings)
    first = new_session(creator)
    assert first.execute("n = 0").ok
    container = first.container_id
    first.detach()
    racers = [controller(settings), controller(settings)]
    for seed, racer in enumerate(racers):
        racer.send("race", sid=first.id, seconds=RACE_SECONDS, code="n += 1", timeout=30, seed=seed, force=True)
    results = [ok(racer.recv(timeout=RACE_SECONDS + 120)) for racer in racers]
    told = sum(r["successes"] for r in results)
    summary = json.dumps(results, indent=1)

    final = make_orch(settings).attach(first.id, force=True)
    try:
        n = final.execute("n").return_value
        assert n == str(told), f"n = {n} but the racers were told of {told} successful calls: {summary}"
        final_container = final.container_id
        kill_and_wait(orch, final.container_id)
        result = final.execute("n")
        assert result.return_value == str(told), summary
        assert final.restore_failures == {}
        unexpected = {k: v for r in results for k, v in r["failures"].items() if "SessionAttachedElsewhere" not in k}
        assert not unexpected, f"racing calls failed in ways other than a takeover: {summary}"
        # Liveness: losing an attach race is a prompt SessionAttachedElsewhere, not a wait for start_timeout.
        slowest = max(r["slowest_attach"] for r in results)
        assert slowest < 10, f"an attach took {slowest} s under the race: {summary}"
        assert all(r["successes"] > 0 and r["attaches"] > 1 for r in results), f"a racer starved: {summary}"
        seen = {c for r in results for c in r["containers"]} | {final_container}
        assert seen == {container}, (
            f"the running container {container[:12]} was replaced during the race (an attach started a new "
            f"one although the old one never died): {summary}"
        )
    finally:
        final.close()


def test_two_stores_with_one_session_id_leave_each_other_alone(make_orch, settings_for, new_session, run_id) -> None:
    """The same session id in two state dirs: two containers, labelled with different stores, independent lives."""
    s1, s2 = settings_for(), settings_for()
    o1, o2 = make_orch(s1), make_orch(s2)
    sid = f"dup-{run_id}"
    a = new_session(o1, session_id=sid)
    assert a.execute("v = 'one'").ok
    b = new_session(o2, session_id=sid)
    assert b.execute("v = 'two'").ok
    assert a.container_id != b.container_id
    state_a, state_b = o1.backend.inspect(a.container_id), o1.backend.inspect(b.container_id)
    assert state_a is not None and state_a.running, "creating the second session stopped the first one's container"
    assert state_b is not None and state_b.running
    assert state_a.labels.get(STORE_LABEL) and state_b.labels.get(STORE_LABEL)
    assert state_a.labels[STORE_LABEL] != state_b.labels[STORE_LABEL]
    assert state_a.name != state_b.name

    container_a = a.container_id
    assert a.execute("v").return_value == "'one'"
    assert a.container_id == container_a
    b.close()
    state_a = o1.backend.inspect(container_a)
    assert state_a is not None and state_a.running, "closing the session of the other store removed our container"
    assert a.execute("v").return_value == "'one'"
    assert a.container_id == container_a
    with pytest.raises(SessionNotFound):
        o2.attach(sid)

    # A fresh session with that id in store 2, and an attach in store 1, still do not cross over.
    c = new_session(o2, session_id=sid)
    assert c.execute("'v' in globals()").return_value == "False"
    a2 = o1.attach(sid)
    assert a2.container_id == container_a
    assert a2.execute("v").return_value == "'one'"
    state_c = o2.backend.inspect(c.container_id)
    assert state_c is not None and state_c.running
    a2.close()
    assert c.execute("1 + 1").return_value == "2"
