"""Calls on a live session: values, output and definitions persist; bad arguments are ConfigErrors."""

from __future__ import annotations

import threading
import time

import pytest

from orchestrator import ConfigError, ExecResult, Orchestrator, Session, SessionClosed, Settings
from orchestrator.agent import protocol

pytestmark = pytest.mark.docker


def ok(result: ExecResult) -> ExecResult:
    assert result.error is None, str(result.error)
    return result


def test_trailing_expression_is_the_return_value(shared_session: Session) -> None:
    assert ok(shared_session.execute("x = 41")).return_value is None
    result = ok(shared_session.execute("x + 1"))
    assert result.return_value == "42"
    assert result.ok
    assert result.duration >= 0


def test_stdout_and_stderr_are_captured(shared_session: Session) -> None:
    result = ok(shared_session.execute("import sys\nprint('out', 1)\nprint('err', 2, file=sys.stderr)\n'done'"))
    assert result.stdout == "out 1\n"
    assert result.stderr == "err 2\n"
    assert result.return_value == "'done'"


def test_trailing_none_gives_none(shared_session: Session) -> None:
    assert ok(shared_session.execute("None")).return_value is None
    assert ok(shared_session.execute("print('side effect')")).return_value is None
    assert ok(shared_session.execute("y = 5")).return_value is None
    assert ok(shared_session.execute("")).return_value is None


def test_imports_functions_classes_and_instances_survive_calls(shared_session: Session) -> None:
    ok(shared_session.execute("import math\nfrom collections import Counter"))
    ok(shared_session.execute("def area(r):\n    return math.pi * r * r"))
    ok(
        shared_session.execute(
            "class Point:\n"
            "    def __init__(self, x, y):\n"
            "        self.x, self.y = x, y\n"
            "    def norm(self):\n"
            "        return math.hypot(self.x, self.y)"
        )
    )
    ok(shared_session.execute("p = Point(3, 4)\nc = Counter('abca')"))
    result = ok(shared_session.execute("area(1) == math.pi, p.norm(), isinstance(p, Point), c['a']"))
    assert result.return_value == "(True, 5.0, True, 2)"
    assert {"math", "Counter", "area", "Point", "p", "c"} <= set(shared_session.variables)


def test_each_changing_call_advances_the_generation(shared_session: Session) -> None:
    before = shared_session.generation
    result = ok(shared_session.execute("counter_value = 1"))
    assert result.generation == shared_session.generation == before + 1
    # A call that changes nothing does not write a checkpoint.
    result = ok(shared_session.execute("counter_value + 1"))
    assert result.generation == shared_session.generation == before + 1


def test_deleted_variables_leave_the_checkpoint(shared_session: Session) -> None:
    ok(shared_session.execute("doomed = [1, 2]"))
    assert "doomed" in shared_session.variables
    ok(shared_session.execute("del doomed"))
    assert "doomed" not in shared_session.variables


def test_container_carries_the_orchestrator_labels(orch: Orchestrator, shared_session: Session) -> None:
    assert shared_session.container_id is not None
    state = orch.backend.inspect(shared_session.container_id)
    assert state is not None and state.running
    labels = state.labels
    assert labels["orchestrator.managed"] == "true"
    assert labels["orchestrator.session-id"] == shared_session.id
    assert labels["orchestrator.protocol"] == str(protocol.PROTOCOL_VERSION)
    assert labels["orchestrator.store"] == orch.store.store_id
    assert labels["orchestrator.sandbox-id"] == shared_session.sandbox_id
    assert time.time() - 600 < int(labels["orchestrator.created-at"]) <= time.time() + 1
    assert state.name == f"orch-{orch.store.store_id}-{shared_session.sandbox_id}"
    found = orch.containers(shared_session.id)
    assert [c.id for c in found] == [shared_session.container_id]


def test_agent_handshake_is_recorded(shared_session: Session) -> None:
    assert shared_session.agent_info["protocol"] == protocol.PROTOCOL_VERSION
    assert shared_session.agent_info["python"]
    assert shared_session.agent_info["dill"]


@pytest.mark.parametrize("code", [123, b"x = 1", None])
def test_code_must_be_a_str(shared_session: Session, code: object) -> None:
    with pytest.raises(ConfigError, match="code must be a str"):
        shared_session.execute(code)  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout", [0, -1, float("nan")])
def test_timeout_must_be_positive(shared_session: Session, timeout: float) -> None:
    with pytest.raises(ConfigError, match="timeout"):
        shared_session.execute("1", timeout=timeout)
    assert shared_session.execute("1 + 1").return_value == "2"


@pytest.mark.parametrize("session_id", ["Bad Id!", "ab", "UPPER", "-leading-dash", "x" * 64, "../escape"])
def test_invalid_session_id(orch: Orchestrator, session_id: str) -> None:
    with pytest.raises(ConfigError, match="invalid session id"):
        orch.create_session(session_id=session_id)


def test_labels_outside_our_namespace_are_refused(orch: Orchestrator) -> None:
    with pytest.raises(ConfigError, match="namespaced"):
        orch.create_session(labels={"com.example.owner": "me"})
    with pytest.raises(ConfigError, match="namespaced"):
        orch.create_session(labels={"orchestrator.owner": "me"})


def test_session_id_of_choice_and_taken_id(orch: Orchestrator, new_session, run_id: str) -> None:
    chosen = f"my-session-{run_id}"
    s = new_session(orch, session_id=chosen)
    assert s.id == chosen
    assert s.container_id is not None
    assert orch.containers(chosen)[0].labels["orchestrator.session-id"] == chosen
    assert s.execute("'hi'").return_value == "'hi'"
    with pytest.raises(ConfigError, match="already exists"):
        orch.create_session(session_id=chosen)
    assert s.execute("'still here'").return_value == "'still here'"


def test_calls_after_close_raise_session_closed(orch: Orchestrator, settings: Settings, new_session) -> None:
    s = new_session(orch)
    s.execute("a = 1")
    container_id = s.container_id
    assert container_id is not None
    s.close()
    s.close()  # closing twice is fine
    with pytest.raises(SessionClosed):
        s.execute("a")
    with pytest.raises(SessionClosed):
        s.add_context("text")
    with pytest.raises(SessionClosed):
        s.reset()
    assert orch.backend.inspect(container_id) is None
    assert s.id not in orch.sessions()
    assert not (settings.state_dir / "sessions" / s.id).exists()


def test_context_manager_closes_the_session(orch: Orchestrator, new_session) -> None:
    with new_session(orch) as s:
        s.execute("a = 1")
        container_id = s.container_id
    assert container_id is not None
    assert orch.backend.inspect(container_id) is None
    assert s.id not in orch.sessions()
    with pytest.raises(SessionClosed):
        s.execute("a")


def test_reset_clears_every_variable(orch: Orchestrator, new_session) -> None:
    s = new_session(orch)
    s.execute("a = 1\nimport json")
    s.add_context("ctx")
    container_id = s.container_id
    s.reset()
    assert s.variables == []
    assert s.get_context_count() == 0
    result = s.execute("'a' in globals(), 'json' in globals(), 'context' in globals()")
    assert result.return_value == "(False, False, False)"
    assert s.container_id == container_id


def test_concurrent_callers_take_turns(orch: Orchestrator, new_session) -> None:
    s = new_session(orch)
    s.execute("import time\nlog = []")
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(5):
                s.execute(f"log.append(({n}, {i}))\ntime.sleep(0.01)")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert s.execute("len(log), sorted(log) == [(n, i) for n in range(4) for i in range(5)]").return_value == (
        "(20, True)"
    )


def test_closing_the_orchestrator_closes_its_sessions(
    orch: Orchestrator, settings: Settings, make_orch, new_session
) -> None:
    other = make_orch(settings)
    s = new_session(other)
    container = s.container_id
    assert container is not None
    other.close()
    with pytest.raises(SessionClosed):
        s.execute("1")
    assert orch.backend.inspect(container) is None
    assert s.id not in orch.sessions()
