"""Every row of the recovery table (``runtime/recovery.py``), run by a real session against the fake engine and agent.

Each test makes the agent fail one way during a call and checks what happened to the sandbox (restored
into the agent's fresh worker, or replaced), the error the caller got, what its message says, and that
the session serves the next call with its checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import Answer, FakeAgent, FakeBackend, Header, exec_reply, fake_settings, healthy, worker_lost

from orchestrator import (
    CheckpointLimitExceeded,
    ExecutionTimeout,
    Orchestrator,
    ProtocolError,
    SandboxCrashed,
    SandboxOutOfMemory,
    Session,
    SessionAttachedElsewhere,
)
from orchestrator.agent import protocol, request_table
from orchestrator.api.session import SessionState
from orchestrator.runtime.recovery import RECOVERY
from orchestrator.wire import connection

QUOTA = 4096


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def session(tmp_path: Path, backend: FakeBackend) -> Iterator[Session]:
    settings = fake_settings(
        tmp_path, ORCH_INTERRUPT_GRACE="0.05", ORCH_REPLY_MARGIN="0.1", ORCH_CHECKPOINT_QUOTA=str(QUOTA)
    )
    with Orchestrator(settings, backend=backend) as orch:
        session = orch.create_session()
        session.execute("x = 'one'")
        session.execute("y = 'two'")
        assert session.generation == 2
        yield session


def fail_once(backend: FakeBackend, kind: str, failure: Any) -> None:
    """The first ``kind`` request from now on fails with ``failure(agent)``; every other request is answered."""
    failed: list[bool] = []

    def handler(agent: FakeAgent, request: Header, body: bytes) -> Answer:
        if request["type"] == kind and not failed:
            failed.append(True)
            return failure(agent)
        return agent.answer(request, body)

    backend.handler = handler


def assert_serves_its_checkpoint(session: Session, backend: FakeBackend) -> None:
    """The session works again, from the values of its last checkpoint."""
    assert session.state is SessionState.READY
    assert session.execute("z = 'three'").generation == 3
    assert session.variables == ["x", "y", "z"]
    agent = backend.container_of(session.sandbox_id).agent
    assert agent is not None and agent.values == {"x": b"'one'", "y": b"'two'", "z": b"'three'"}


def test_every_row_has_its_test_here() -> None:
    assert set(RECOVERY) == {  # a new row needs its test below
        "worker died (crash, kill -9, OOM)",
        "worker ignored the interrupt and was killed",
        "worker sent a forged or invalid frame",
        "container died or was removed during the call",
        "agent did not answer by the deadline",
        "agent sent an invalid reply",
        "agent sent a checkpoint past the session's limits",
    }


@pytest.mark.parametrize(
    ("oom", "error"), [(False, SandboxCrashed), (True, SandboxOutOfMemory)], ids=["crash", "out-of-memory"]
)
def test_worker_died_restores_into_the_fresh_worker(
    session: Session, backend: FakeBackend, oom: bool, error: type[Exception]
) -> None:
    container = session.container_id
    fail_once(backend, request_table.EXEC, lambda agent: worker_lost(reason="the worker was killed", oom=oom))
    with pytest.raises(error) as caught:
        session.execute("x = 'lost'")
    assert type(caught.value) is error
    assert caught.value.restored and caught.value.generation == 2
    message = str(caught.value)
    assert message.startswith("worker died (crash, kill -9, OOM): the worker was killed")
    assert f"session {session.id} was restored to checkpoint generation 2" in message
    assert session.container_id == container and backend.removed == []  # the agent lives: same container
    assert backend.container_of(session.sandbox_id).agent.count(request_table.RESTORE_BEGIN) == 2  # start, recovery
    assert_serves_its_checkpoint(session, backend)


def test_worker_that_ignored_the_interrupt_is_a_timeout_with_restore(session: Session, backend: FakeBackend) -> None:
    container = session.container_id
    fail_once(
        backend, request_table.EXEC, lambda agent: worker_lost(status=protocol.STATUS_TIMEOUT, reason="no SIGINT")
    )
    with pytest.raises(ExecutionTimeout) as caught:
        session.execute("x = 'lost'")
    assert caught.value.restored and caught.value.generation == 2
    assert str(caught.value).startswith("worker ignored the interrupt and was killed: no SIGINT")
    assert session.container_id == container
    assert_serves_its_checkpoint(session, backend)


def test_a_checkpoint_that_ignored_the_interrupt_says_so(session: Session, backend: FakeBackend) -> None:
    fail_once(
        backend,
        request_table.EXEC,
        lambda agent: worker_lost(status=protocol.STATUS_TIMEOUT, reason="stuck", phase="checkpoint"),
    )
    with pytest.raises(ExecutionTimeout, match=r"^checkpointing took longer than checkpoint_timeout"):
        session.execute("x = 'lost'")
    assert_serves_its_checkpoint(session, backend)


def test_worker_that_forged_a_frame_is_a_protocol_error_with_restore(session: Session, backend: FakeBackend) -> None:
    container = session.container_id
    fail_once(
        backend, request_table.EXEC, lambda agent: worker_lost(status=protocol.STATUS_PROTOCOL_ERROR, reason="forged")
    )
    with pytest.raises(ProtocolError) as caught:
        session.execute("x = 'lost'")
    assert type(caught.value) is ProtocolError and caught.value.restored
    assert str(caught.value).startswith("worker sent a forged or invalid frame: forged")
    assert session.container_id == container
    assert_serves_its_checkpoint(session, backend)


def _dies(oom: bool) -> Any:
    def failure(agent: FakeAgent) -> Answer:
        agent.die(oom=oom)
        return None

    return failure


@pytest.mark.parametrize(
    ("oom", "error", "how"),
    [
        (False, SandboxCrashed, "is exited (exit code 137)"),
        (True, SandboxOutOfMemory, "was killed for exceeding its memory limit"),
    ],
    ids=["crash", "out-of-memory"],
)
def test_container_died_during_the_call_is_replaced(
    session: Session, backend: FakeBackend, oom: bool, error: type[Exception], how: str
) -> None:
    container = session.container_id
    fail_once(backend, request_table.EXEC, _dies(oom))
    with pytest.raises(error) as caught:
        session.execute("x = 'lost'")
    assert type(caught.value) is error and caught.value.restored and caught.value.generation == 2
    message = str(caught.value)
    assert message.startswith("container died or was removed during the call: container ")
    assert how in message and "was restored to checkpoint generation 2" in message
    assert session.container_id != container and backend.removed == [container]
    assert_serves_its_checkpoint(session, backend)


def test_agent_past_its_deadline_is_a_timeout_and_replaced(
    session: Session, backend: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    container = session.container_id
    monkeypatch.setattr(connection, "_REPLACE_SECONDS", 0.1)  # the ladder's kill waits this long for the supervisor
    fail_once(backend, request_table.EXEC, lambda agent: None)  # the whole agent hangs
    with pytest.raises(ExecutionTimeout) as caught:
        session.execute("x = 'lost'", timeout=0.05)
    assert caught.value.restored and caught.value.generation == 2
    assert str(caught.value).startswith("agent did not answer by the deadline: ")
    assert session.container_id != container and backend.removed == [container]
    assert_serves_its_checkpoint(session, backend)


def test_invalid_reply_is_a_protocol_error_and_replaced(session: Session, backend: FakeBackend) -> None:
    container = session.container_id
    fail_once(backend, request_table.EXEC, lambda agent: exec_reply(status="fine, thanks"))
    with pytest.raises(ProtocolError) as caught:
        session.execute("x = 'lost'")
    assert type(caught.value) is ProtocolError and caught.value.restored
    assert str(caught.value).startswith("agent sent an invalid reply: unknown reply status 'fine, thanks'")
    assert session.container_id != container
    assert_serves_its_checkpoint(session, backend)


def test_checkpoint_past_the_quota_is_refused_and_replaced(session: Session, backend: FakeBackend) -> None:
    container = session.container_id
    backend.handler = _with_big_value(healthy)
    with pytest.raises(CheckpointLimitExceeded) as caught:
        session.execute("big = 'anything'")
    error = caught.value
    assert error.restored and error.generation == 2
    assert error.unit == "bytes" and error.quota == QUOTA and error.size > QUOTA
    assert str(error).startswith("agent sent a checkpoint past the session's limits: ")
    assert session.container_id != container
    assert_serves_its_checkpoint(session, backend)


def _with_big_value(inner: Any) -> Any:
    def handler(agent: FakeAgent, request: Header, body: bytes) -> Answer:
        if request["type"] == request_table.EXEC and request["code"].startswith("big = "):
            delta, blobs = agent.delta({"big": b"b" * (QUOTA + 1)})
            return exec_reply(checkpoint=delta), blobs
        return inner(agent, request, body)

    return handler


def test_worker_dead_between_calls_is_restored_and_the_request_sent_again(
    session: Session, backend: FakeBackend
) -> None:
    container = session.container_id
    fail_once(backend, request_table.EXEC, lambda agent: worker_lost(ran=False))
    result = session.execute("z = 'three'")  # no error: the request never ran, so it runs now
    assert result.generation == 3 and session.variables == ["x", "y", "z"]
    agent = backend.container_of(session.sandbox_id).agent
    assert session.container_id == container and agent.count(request_table.EXEC) == 4  # two earlier, this one twice
    assert agent.count(request_table.RESTORE_BEGIN) == 2


def test_losing_the_worker_again_before_running_is_a_worker_death(session: Session, backend: FakeBackend) -> None:
    container = session.container_id
    lost: list[bool] = []

    def handler(agent: FakeAgent, request: Header, body: bytes) -> Answer:
        if request["type"] == request_table.EXEC and len(lost) < 2:
            lost.append(True)
            return worker_lost(ran=False)
        return agent.answer(request, body)

    backend.handler = handler
    with pytest.raises(SandboxCrashed) as caught:  # sent once more only: the second loss goes by the table
        session.execute("z = 'lost'")
    assert caught.value.restored and str(caught.value).startswith("worker died (crash, kill -9, OOM): ")
    agent = backend.container_of(session.sandbox_id).agent
    assert session.container_id == container and agent.count(request_table.EXEC) == 4
    assert agent.count(request_table.RESTORE_BEGIN) == 3  # start, before sending again, recovery
    assert_serves_its_checkpoint(session, backend)


def test_restore_failures_are_named_in_the_error(session: Session, backend: FakeBackend) -> None:
    def handler(agent: FakeAgent, request: Header, body: bytes) -> Answer:
        if request["type"] == request_table.EXEC and request["code"] == "crash":
            return worker_lost()
        if request["type"] == request_table.LOAD and request["name"] == "y":
            return {"type": request_table.LOAD_REPLY, "status": protocol.STATUS_ERROR, "reason": "no module named y"}
        return agent.answer(request, body)

    backend.handler = handler
    with pytest.raises(SandboxCrashed) as caught:
        session.execute("crash")
    assert caught.value.restore_failures == {"y": "no module named y"}
    assert str(caught.value).endswith("restored to checkpoint generation 2 without y")
    assert session.restore_failures == {"y": "no module named y"} and session.variables == ["x"]
    assert session.execute("pass").restore_failures == {}  # reported once


def test_a_failed_restore_drops_the_sandbox_for_the_next_call(session: Session, backend: FakeBackend) -> None:
    container = session.container_id

    def handler(agent: FakeAgent, request: Header, body: bytes) -> Answer:
        if agent.container.id == container and request["type"] == request_table.EXEC:
            return worker_lost()
        if agent.container.id == container and request["type"] == request_table.RESTORE_BEGIN:
            return {"type": request_table.RESTORE_REPLY, "status": protocol.STATUS_ERROR, "reason": "cannot"}
        return agent.answer(request, body)

    backend.handler = handler
    with pytest.raises(ProtocolError, match="restore failed in the agent: cannot"):
        session.execute("x = 'lost'")
    assert session.container_id is None and backend.removed == [container]
    assert_serves_its_checkpoint(session, backend)  # the next call starts a new sandbox and restores


def test_taken_over_during_recovery_makes_the_handle_stale(session: Session, backend: FakeBackend) -> None:
    def handler(agent: FakeAgent, request: Header, body: bytes) -> Answer:
        if request["type"] == request_table.EXEC:
            return worker_lost()
        if request["type"] == request_table.RESTORE_BEGIN:
            agent.say_goodbye()
            return None
        return agent.answer(request, body)

    backend.handler = handler
    container = session.container_id
    with pytest.raises(SessionAttachedElsewhere, match="was attached by another controller; this call was not kept"):
        session.execute("x = 'lost'")
    assert session.state is SessionState.DETACHED and session.container_id is None
    assert backend.removed == [] and backend.containers[container].running  # the new owner's now
    with pytest.raises(SessionAttachedElsewhere, match="is detached"):
        session.execute("pass")


def test_taken_over_during_the_call_makes_the_handle_stale(session: Session, backend: FakeBackend) -> None:
    def goodbye(agent: FakeAgent) -> Answer:
        agent.say_goodbye()
        return None

    fail_once(backend, request_table.EXEC, goodbye)
    with pytest.raises(SessionAttachedElsewhere, match="this call was not kept"):
        session.execute("x = 'lost'")
    assert session.state is SessionState.DETACHED and backend.removed == []


def test_container_died_between_calls_is_replaced_before_the_next_call(session: Session, backend: FakeBackend) -> None:
    container = session.container_id
    backend.container_of(session.sandbox_id).agent.die()
    assert session.execute("z = 'three'").generation == 3  # no error: the request had not been sent
    assert session.container_id != container and session.variables == ["x", "y", "z"]


def test_hibernated_session_resumes_on_its_next_call(session: Session, backend: FakeBackend) -> None:
    container = session.container_id
    session.hibernate()
    assert session.container_id is None and backend.removed == [container]
    assert_serves_its_checkpoint(session, backend)
