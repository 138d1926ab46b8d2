"""Session lifecycle in one process: hibernate and resume, statuses as ``list_sessions`` shows them, the idle
policy (``Settings.capacity.hibernate_after``), the cap on running sessions (``Settings.capacity.max_running``) and
logs.

(Another process hibernating or resuming a session is in test_controller_processes.py; pruning in test_prune.py.)
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import pytest
from support import kill_and_wait

from orchestrator import Capacity, ConfigError, SessionAttachedElsewhere, SessionBusy, SessionHeld, SessionNotFound
from orchestrator.errors import CapacityExceeded
from orchestrator.ops.survey import SessionStatus

pytestmark = pytest.mark.docker


def _wait_for(predicate, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(interval)


def _status(orch, session_id: str) -> SessionStatus:
    return orch.describe(session_id).status


def _running(orch) -> set[str]:
    return {info.id for info in orch.list_sessions() if info.container_status == "running"}


# ---------------------------------------------------------------- statuses


def test_list_sessions_shows_running_busy_idle_hibernated_and_broken(settings_for, make_orch, new_session) -> None:
    """One session through every status, with its ages, memory and problem as ``list_sessions`` reports them."""
    orch = make_orch(settings_for())
    started = time.time()
    s = new_session(orch)
    assert s.execute("import time\nx = 'kept'").ok

    [info] = orch.list_sessions()
    assert info.id == s.id and info.status is SessionStatus.RUNNING and info.problem is None
    assert info.container_id == s.container_id and info.sandbox_id == s.sandbox_id
    assert info.container_status == "running"
    assert info.memory_bytes is not None and 1 << 20 < info.memory_bytes < 1 << 30, info.memory_bytes
    assert info.generation == s.generation and info.epoch == s.epoch and info.checkpoint_bytes == s.checkpoint_bytes
    assert info.variables == len(s.variables) and not info.checkpoint_damaged
    assert abs(info.created_at - started) < 10 and info.hibernated_at is None
    assert info.to_json()["status"] == "running"

    # busy, during a call (and idle 0 meanwhile)
    done: dict[str, Any] = {}
    caller = threading.Thread(target=lambda: done.update(r=s.execute("time.sleep(1.5)")))
    caller.start()
    try:
        _wait_for(lambda: _status(orch, s.id) is SessionStatus.BUSY, 10, "busy status")
        busy = orch.describe(s.id)
        assert busy.idle_seconds == 0.0 and busy.problem is None
    finally:
        caller.join(30)
    assert done["r"].ok

    # idle time to the second (not the record's 30 s resolution), age from creation
    time.sleep(2)
    idle = orch.describe(s.id)
    assert idle.status is SessionStatus.RUNNING
    assert 1.5 < idle.idle_seconds < 3.5, idle.idle_seconds
    assert idle.age_seconds >= idle.idle_seconds and idle.age_seconds < time.time() - started + 1
    future = orch.describe(s.id, now=time.time() + 3600)
    assert 3600 < future.idle_seconds < 3600 + 10 and future.age_seconds > 3600

    # hibernated
    s.hibernate()
    hibernated = orch.describe(s.id)
    assert hibernated.status is SessionStatus.HIBERNATED and hibernated.problem is None
    assert hibernated.container_id is None and hibernated.container_status is None and hibernated.memory_bytes is None
    assert hibernated.hibernated_at is not None and abs(hibernated.hibernated_at - time.time()) < 10
    assert s.execute("x").return_value == "'kept'"
    assert _status(orch, s.id) is SessionStatus.RUNNING and orch.describe(s.id).hibernated_at is None

    # broken: the container killed between calls, no controller holding the session
    container = s.container_id
    s.detach()
    kill_and_wait(orch, container)
    broken = orch.describe(s.id)
    assert broken.status is SessionStatus.BROKEN
    assert broken.container_status == "exited" and broken.memory_bytes is None
    assert broken.problem is not None and "exited" in broken.problem and "137" in broken.problem, broken.problem
    assert not broken.checkpoint_damaged
    again = orch.attach(s.id)
    assert again.execute("x").return_value == "'kept'"
    assert _status(orch, s.id) is SessionStatus.RUNNING

    # broken: a damaged checkpoint (a blob its manifest names is gone), even with the container running
    blobs = sorted((orch.settings.state_dir / "sessions" / s.id / "blobs").iterdir())
    assert blobs
    blobs[0].unlink()
    damaged = orch.describe(s.id)
    assert damaged.status is SessionStatus.BROKEN and damaged.checkpoint_damaged
    assert damaged.problem is not None and "damaged" in damaged.problem
    again.close()
    assert orch.list_sessions() == []


def test_an_unreadable_record_is_listed_as_broken(settings_for, make_orch) -> None:
    orch = make_orch(settings_for())
    directory = orch.settings.state_dir / "sessions" / "bad-record"
    directory.mkdir()
    (directory / "meta.json").write_text("{not json")
    [info] = orch.list_sessions()
    assert info.id == "bad-record" and info.status is SessionStatus.BROKEN and info.checkpoint_damaged
    assert info.problem is not None and "unreadable" in info.problem
    assert orch.describe("bad-record").status is SessionStatus.BROKEN
    with pytest.raises(SessionNotFound):
        orch.describe("no-such-session")


# ---------------------------------------------------------------- hibernate / resume in one process


def test_hibernate_keeps_the_state_and_the_owner(settings_for, make_orch, new_session) -> None:
    orch = make_orch(settings_for())
    s = new_session(orch)
    assert s.execute("x = [1, 2]\ndef f():\n    return sum(x)").ok
    epoch, generation, container, sandbox = s.epoch, s.generation, s.container_id, s.sandbox_id
    s.hibernate()
    assert s.container_id is None and s.sandbox_id is None
    assert orch.backend.inspect(container) is None
    assert not (orch.settings.runtime_dir / sandbox).exists(), "the sandbox's channel directory was left behind"
    assert orch.containers(s.id) == []
    s.hibernate()  # again: nothing to do, no error
    assert s.execute("f()").return_value == "3"
    assert s.epoch == epoch and s.generation == generation
    assert s.container_id not in (None, container)
    assert orch.hibernate(s.id) is True
    assert s.container_id is None and orch.containers(s.id) == []
    # resume(): starts it now (no call needed); the handle this orchestrator holds stays its handle
    orch.resume(s.id)
    info = orch.describe(s.id)
    assert info.status is SessionStatus.RUNNING and info.container_status == "running"
    again = orch.attach(s.id)
    assert again is s and again.container_id == info.container_id, "resume started a container attach did not get"
    assert again.execute("f()").return_value == "3"
    with pytest.raises(SessionNotFound):
        orch.hibernate("no-such-session")


def test_orchestrator_hibernate_of_a_held_session_says_if_it_was_hibernated_already(
    settings_for, make_orch, new_session
) -> None:
    """``Orchestrator.hibernate`` returns False for a session hibernated already (its docstring), whether this
    orchestrator holds it or not (from another process it does: test_controller_processes)."""
    orch = make_orch(settings_for())
    s = new_session(orch)
    assert orch.hibernate(s.id) is True
    assert orch.describe(s.id).status is SessionStatus.HIBERNATED
    assert orch.hibernate(s.id) is False


def test_hibernate_does_not_count_as_use(settings_for, make_orch, new_session) -> None:
    """Idle time runs from the last *call*: giving up the container is not a use of the session.

    Otherwise a session the idle policy hibernated after 10 min shows "idle 0s" in ``orchestrator ls`` and
    ``prune --idle 30m`` counts its 30 min from the hibernation, not from its last call.
    """
    orch = make_orch(settings_for())
    s = new_session(orch)
    assert s.execute("x = 1").ok
    time.sleep(1.5)
    s.hibernate()
    assert orch.describe(s.id).idle_seconds > 1.2, "hibernating reset the session's idle time"


def test_orchestrator_hibernate_works_beside_a_stale_local_handle(settings_for, make_orch, new_session) -> None:
    """``Orchestrator.hibernate(id)`` hibernates the session whoever owns it (its docstring): a handle this
    orchestrator still holds but another controller took over must not make it fail."""
    settings = settings_for()
    orch_a, orch_b = make_orch(settings), make_orch(settings)
    s = new_session(orch_a)
    assert s.execute("x = 1").ok
    taken = orch_b.attach(s.id, force=True)
    assert orch_a.hibernate(s.id) is True
    assert orch_a.describe(s.id).status is SessionStatus.HIBERNATED
    assert taken.execute("x").return_value == "1"
    taken.close()


def test_orchestrator_hibernate_of_a_held_session_in_a_call_is_refused(settings_for, make_orch, new_session) -> None:
    """``Orchestrator.hibernate`` documents SessionBusy while a call runs (as from another process it is), not a
    wait for the call to end (up to ``exec_timeout``)."""
    orch = make_orch(settings_for())
    s = new_session(orch)
    assert s.execute("import time").ok
    caller = threading.Thread(target=s.execute, args=("time.sleep(2)",))
    caller.start()
    try:
        _wait_for(lambda: _status(orch, s.id) is SessionStatus.BUSY, 10, "busy status")
        started = time.monotonic()
        with pytest.raises(SessionBusy):
            orch.hibernate(s.id)
        assert time.monotonic() - started < 1.0
    finally:
        caller.join(30)


def test_resume_by_another_controller_is_refused_then_takes_over_with_force(
    settings_for, make_orch, new_session
) -> None:
    """Hibernating is not a change of owner, but ``resume`` is an attach (documented): refused while the owner
    lives (``SessionHeld``, nothing changed); with ``force`` the owner's handle learns it is stale with a typed
    error, and nothing it stored is lost."""
    settings = settings_for()
    owner_orch, ops = make_orch(settings), make_orch(settings)
    s = new_session(owner_orch)
    assert s.execute("x = 'mine'").ok
    epoch = s.epoch
    assert ops.hibernate(s.id) is True
    assert s.execute("x").return_value == "'mine'" and s.epoch == epoch  # hibernation: the owner goes on
    assert ops.hibernate(s.id) is True
    with pytest.raises(SessionHeld):
        ops.resume(s.id)
    assert ops.describe(s.id).status is SessionStatus.HIBERNATED and s.epoch == epoch
    assert ops.resume(s.id, force=True) is True
    assert ops.describe(s.id).status is SessionStatus.RUNNING
    with pytest.raises(SessionAttachedElsewhere):
        s.execute("x")
    again = ops.attach(s.id)
    assert again.execute("x").return_value == "'mine'"


# ---------------------------------------------------------------- logs


def test_logs_return_the_agents_log_and_refuse_a_hibernated_session(settings_for, make_orch, new_session) -> None:
    orch = make_orch(settings_for())
    s = new_session(orch)
    assert s.execute("import os\nos.write(2, b'marker-one\\n')\nos.write(1, b'marker-two\\n')").ok
    _wait_for(lambda: "marker-two" in orch.logs(s.id), 10, "the marker in the log")
    log = orch.logs(s.id)
    assert isinstance(log, str) and "marker-one" in log
    assert "marker-one" in orch.logs(s.id, tail=None)
    assert orch.logs(s.id, tail=1).strip().splitlines()[-1:] == log.strip().splitlines()[-1:]
    assert len(orch.logs(s.id, tail=1).strip().splitlines()) <= 1
    s.hibernate()
    with pytest.raises(ConfigError, match="hibernated"):
        orch.logs(s.id)
    with pytest.raises(SessionNotFound):
        orch.logs("no-such-session")


# ---------------------------------------------------------------- idle policy


def test_the_idle_policy_hibernates_a_held_session_and_the_next_call_resumes(
    settings_for, make_orch, new_session
) -> None:
    orch = make_orch(settings_for(capacity=Capacity(hibernate_after=2.0)))
    s = new_session(orch)
    assert s.execute("import time\nx = 5").ok
    container = s.container_id
    # A call longer than hibernate_after is a use, not idleness: it is not hibernated under the call.
    r = s.execute("time.sleep(2.6)\ny = 6")
    assert r.ok and s.container_id == container
    ended = time.time()
    _wait_for(lambda: _status(orch, s.id) is SessionStatus.HIBERNATED, 12, "hibernation by the idle policy", 0.1)
    info = orch.describe(s.id)
    assert info.hibernated_at is not None and info.hibernated_at - ended >= 1.9, "hibernated before 2 s idle"
    assert orch.backend.inspect(container) is None
    assert s.container_id is None
    assert s.execute("x + y").return_value == "11"
    assert s.container_id not in (None, container)


# ---------------------------------------------------------------- the cap on running sessions


def test_max_running_hibernates_the_least_recently_used_or_refuses(
    settings_for, make_orch, new_session, run_id
) -> None:
    settings = settings_for(capacity=Capacity(max_running=2))
    orch = make_orch(settings)
    a = new_session(orch)
    assert a.execute("v = 'a'\nimport time").ok
    b = new_session(orch)
    assert b.execute("v = 'b'\nimport time").ok
    c = new_session(orch)  # a is the least recently used: it makes room
    assert _running(orch) == {b.id, c.id}
    assert _status(orch, a.id) is SessionStatus.HIBERNATED
    assert a.execute("v").return_value == "'a'"  # resumes; now b is the least recently used
    assert _running(orch) == {a.id, c.id}
    assert _status(orch, b.id) is SessionStatus.HIBERNATED

    # Every running session in a call: nothing can make room, even under the "hibernate" policy.
    callers = [threading.Thread(target=x.execute, args=("__import__('time').sleep(2)",)) for x in (a, c)]
    for t in callers:
        t.start()
    try:
        _wait_for(lambda: {_status(orch, a.id), _status(orch, c.id)} == {SessionStatus.BUSY}, 10, "both busy")
        with pytest.raises(CapacityExceeded, match="in a call"):
            b.execute("v")
    finally:
        for t in callers:
            t.join(30)
    assert _running(orch) == {a.id, c.id}

    # Another controller on the same store with the "refuse" policy: a third session is refused, nothing left.
    refusing = make_orch(settings.replace(capacity=settings.capacity.replace(policy="refuse")))
    sid = f"refused-{run_id}"
    sandboxes = sorted(p.name for p in settings.runtime_dir.iterdir())
    with pytest.raises(CapacityExceeded) as refused:
        refusing.create_session(session_id=sid)
    message = str(refused.value)
    assert "max_running=2" in message and "refuse" in message and sid in message, message
    assert not refusing.store.exists(sid) and not (settings.state_dir / "sessions" / sid).exists()
    assert refusing.containers(sid) == []
    assert sorted(p.name for p in settings.runtime_dir.iterdir()) == sandboxes
    assert _running(orch) == {a.id, c.id}
    with contextlib.suppress(CapacityExceeded):
        b.close()
