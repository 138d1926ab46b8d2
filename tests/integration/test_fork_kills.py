"""Fork and rewind with controllers SIGKILLed in the middle, against a real engine and real processes.

Process A holds a session and runs calls on it the whole time, while processes B fork it and are killed at
chosen steps (after the first blob link, inside the second fork, once the forks are stored, once a fork's
container runs but is not recorded, once a fork's sandbox started). After each kill: each fork is listed with
every blob or not at all; afterwards A's session and every fork that survived work (attached by another
controller, their state the source's at the generation they name), prune removes only the leftovers, and the
forks outlive the source's removal. The store-level steps one by one (every link, rename and unlink) are in
tests/unit/state/test_kills.py.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from lifecycle_support import ScriptProcess, script_processes
from support import close_quietly, kill_and_wait

from orchestrator import Orchestrator, Session, Settings
from orchestrator.ops.prune import ORPHAN_GRACE

pytestmark = pytest.mark.docker

SETUP = "data = bytes(range(256)) * 8192\nwords = ['w'] * 1000\nn = 0"
"""Three blobs (a 2 MiB one among them); ``n`` counts the calls since."""
DATA_BYTES = 256 * 8192

HOLDER = """
def main(orch, args):
    session = orch.attach(args["sid"])
    emit({"attached": session.generation})
    calls = 0
    while not os.path.exists(args["stop"]):
        result = session.execute("n += 1")
        assert result.error is None, result.error
        calls += 1
    final = session.execute("n, len(data), len(words)").return_value
    session.detach()
    return {"calls": calls, "final": final}
"""
"""Process A: runs ``n += 1`` in the session until the stop file exists; leaves the session to the test."""

FORKER = """
import signal
from orchestrator.runtime.restore import SessionSandbox
from orchestrator.runtime.sandbox import Sandbox
from orchestrator.state.ledger import CheckpointLedger

def die(*_):
    os.kill(os.getpid(), signal.SIGKILL)

def main(orch, args):
    point = args["point"]
    if point.startswith("link:"):
        real_link, links = os.link, []
        def link(*a, **k):
            real_link(*a, **k)
            links.append(a)
            if len(links) == int(point[5:]):
                die()
        os.link = link
    elif point == "stored":
        real_fork = CheckpointLedger.fork.__func__
        CheckpointLedger.fork = classmethod(lambda cls, *a, **k: die(real_fork(cls, *a, **k)))
    elif point == "container":
        real_sandbox = Sandbox.start.__func__
        Sandbox.start = classmethod(lambda cls, *a, **k: die(real_sandbox(cls, *a, **k)))
    elif point == "started":
        real_start = SessionSandbox.start
        SessionSandbox.start = lambda self: die(real_start(self))
    emit("ready")
    orch.fork(args["sid"], count=2, session_ids=args["ids"])
    return "not killed"
"""
"""Process B: forks the session into two, SIGKILLed at ``point``."""

REWINDER = """
import signal
from orchestrator.agent import request_table
from orchestrator.runtime.restore import SessionSandbox
from orchestrator.runtime.sandbox import Sandbox

def die(*_):
    os.kill(os.getpid(), signal.SIGKILL)

def main(orch, args):
    session = orch.attach(args["sid"])
    if args["point"] == "rewound":
        SessionSandbox.load_current = die
    else:
        real_control = Sandbox._control
        def control(self, header, *a, **k):
            if header["type"] == request_table.RESTORE_END:
                die()
            return real_control(self, header, *a, **k)
        Sandbox._control = control
    emit("ready")
    session.rewind(args["generation"])
    return "not killed"
"""
"""Rewinds the session, SIGKILLed once the rewound record is stored: before its live sandbox is restored
("rewound"), or when every value is loaded into it but the restore is not ended ("restoring")."""


POINTS = [("link:1", 0), ("link:4", 1), ("stored", 2), ("container", 2), ("started", 2)]
"""Where B is killed, and how many of its two forks are then whole: the first link of the first fork; the first
link of the second (the first fork's three are done); both records stored, no sandbox; the first fork's container
running, not yet recorded; the first fork started (the forks start side by side)."""


@pytest.fixture
def script() -> Iterator[Callable[..., ScriptProcess]]:
    with script_processes() as start:
        yield start


def _killed(process: ScriptProcess) -> None:
    assert process.next() == "ready"
    assert process.proc.wait(120) == -signal.SIGKILL, process.stderr


def _whole(orch: Orchestrator, session_id: str) -> None:
    """The session's record loads and every blob any of its manifests names is on disk: judged under the session's
    lock, as any reader of it is (process A commits meanwhile, and a commit deletes the blobs it stops naming)."""
    with orch.store.transaction(session_id) as record:
        missing = [b for b in record.named_blobs() if not orch.store.blob_path(session_id, b).exists()]
    assert missing == [], f"{session_id} lost {missing}"


def _age_orphans(orch: Orchestrator) -> list[Path]:
    """Date session directories without a record back past the orphan grace; returns them."""
    past = time.time() - 2 * ORPHAN_GRACE
    orphans = [d for d in orch.store.session_dirs() if not (d / "meta.json").exists()]
    for directory in orphans:
        os.utime(directory, (past, past))
    return orphans


def test_forks_killed_at_each_step_while_another_process_runs_calls(
    settings_for: Callable[..., Settings],
    make_orch: Callable[[Settings], Orchestrator],
    new_session: Callable[..., Session],
    script: Callable[..., ScriptProcess],
    tmp_path: Path,
) -> None:
    settings = settings_for()
    orch = make_orch(settings)
    source = new_session(orch)
    assert source.execute(SETUP).ok
    base, sid = source.generation, source.id
    source.detach()
    stop = tmp_path / "stop"
    holder = script(settings, HOLDER, {"sid": sid, "stop": str(stop)})
    assert "attached" in holder.next()

    survivors: list[str] = []
    partial: list[str] = []
    forks: list[Session] = []
    try:
        for index, (point, whole) in enumerate(POINTS):
            ids = [f"{sid}-k{index}a", f"{sid}-k{index}b"]
            _killed(script(settings, FORKER, {"sid": sid, "ids": ids, "point": point}))
            listed = [i for i in ids if orch.store.exists(i)]
            assert listed == ids[:whole], point
            for fork_id in listed:
                _whole(orch, fork_id)
                assert orch.store.load(fork_id).forked_from["session_id"] == sid
            survivors += listed
            partial += [str(orch.store.root / i) for i in ids[whole:] if (orch.store.root / i).exists()]
            _whole(orch, sid)
        assert partial, "no kill left a half-made fork"

        # Prune within the grace keeps everything; past it, it removes the half-made forks and nothing else.
        assert not orch.prune().failed
        assert sorted(str(d) for d in _age_orphans(orch)) == sorted(partial)
        report = orch.prune()
        assert not report.failed, report.summary()
        removed = {a.target for a in report.actions if a.action == "remove-orphan-record"}
        assert removed == set(partial)
        for session_id in [sid, *survivors]:
            _whole(orch, session_id)

        stop.touch()
        held = holder.result(timeout=120)
        assert held["calls"] > 0
        assert held["final"] == f"({held['calls']}, {DATA_BYTES}, 1000)"  # A lost no call

        # Every surviving fork works from another controller, with the source's state at its generation.
        generations = [orch.store.load(fork_id).forked_from["generation"] for fork_id in survivors]
        assert len(set(generations)) > 1, f"A made no call while B forked: {generations}"  # forked from a busy source
        for fork_id in survivors:
            fork = orch.attach(fork_id)
            forks.append(fork)
            generation = orch.store.load(fork_id).forked_from["generation"]
            assert fork.generation == generation
            assert fork.execute("n, len(data), len(words)").return_value == f"({generation - base}, {DATA_BYTES}, 1000)"
            # One container each: one a killed controller started and never recorded is removed on attach.
            assert [c.id for c in orch.containers(fork_id)] == [fork.container_id]

        # The source goes; the forks keep every blob, and restore from them into new sandboxes.
        orch.attach(sid).close()
        for fork in forks:
            kill_and_wait(orch, fork.container_id)
            assert fork.execute("n += 1\nlen(data) + len(words)").return_value == str(DATA_BYTES + 1000)
            _whole(orch, fork.id)
    finally:
        stop.touch()
        for fork in forks:
            close_quietly(fork)
        for fork_id in survivors:
            if orch.store.exists(fork_id) and fork_id not in {f.id for f in forks}:
                close_quietly(orch.attach(fork_id, force=True))


@pytest.mark.parametrize("point", ["rewound", "restoring"])
def test_a_rewind_killed_before_its_sandbox_is_restored_is_whole_for_the_next_controller(
    point: str,
    settings_for: Callable[..., Settings],
    make_orch: Callable[[Settings], Orchestrator],
    new_session: Callable[..., Session],
    script: Callable[..., ScriptProcess],
) -> None:
    settings = settings_for()
    orch = make_orch(settings)
    session = new_session(orch)
    assert session.execute("x = 1\ny = [1, 2]").ok
    good = session.generation
    assert session.execute("x = 2\ndel y\nz = 3").ok
    container = session.container_id
    session.detach()

    _killed(script(settings, REWINDER, {"sid": session.id, "generation": good, "point": point}))
    record = orch.store.load(session.id)
    assert record.rewound_from == good and record.generation == good + 2
    _whole(orch, session.id)

    # The next controller takes the live sandbox over (its worker holds the state before the rewind, or a restore
    # that never ended) and brings it to the stored, rewound generation.
    again = orch.attach(session.id)
    try:
        assert again.container_id == container
        assert again.generation == good + 2
        assert again.execute("x, y, 'z' in globals()").return_value == "(1, [1, 2], False)"
        assert again.execute("w = 4").generation == good + 3  # the worker and the record agree on the generation
        assert not orch.prune().failed
        _whole(orch, session.id)
        assert [g.generation for g in again.history()][-4:] == [good, good + 1, good + 2, good + 3]
    finally:
        close_quietly(again)
