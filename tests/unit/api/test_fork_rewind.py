"""Fork and rewind through a real ``Orchestrator`` and ``Session`` on the fake engine: what each sends the sandbox,
what it stores, and how it refuses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import Answer, FakeAgent, FakeBackend, Header, fake_settings

from orchestrator import ConfigError, Generation, GenerationNotFound, Orchestrator, Placement, Session
from orchestrator.agent import request_table
from orchestrator.errors import EngineError, SessionAttachedElsewhere


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def orch(tmp_path: Path, backend: FakeBackend) -> Iterator[Orchestrator]:
    with Orchestrator(fake_settings(tmp_path, ORCH_HISTORY_GENERATIONS="3"), backend=backend) as orchestrator:
        yield orchestrator


@pytest.fixture
def session(orch: Orchestrator) -> Session:
    session = orch.create_session()
    for text in ("'one'", "'two'", "'three'"):
        session.execute(f"x = {text}")
    assert session.generation == 3
    return session


def agent_of(backend: FakeBackend, session: Session) -> FakeAgent:
    (container,) = [c for c in backend.running() if c.id == session.container_id]
    assert container.agent is not None
    return container.agent


def test_history_lists_the_kept_generations_oldest_first(session: Session) -> None:
    history = session.history()
    assert [g.generation for g in history] == [0, 1, 2, 3]
    assert [g.current for g in history] == [False, False, False, True]
    assert history[1].changed == ("x",) and history[0].changed == ()
    assert all(isinstance(g, Generation) and g.names == (0 if g.generation == 0 else 1) for g in history)
    session.execute("x = 'four'")
    assert [g.generation for g in session.history()] == [1, 2, 3, 4]  # three kept besides the current one


def test_rewind_restores_the_old_state_into_the_live_sandbox_as_a_new_generation(
    session: Session, backend: FakeBackend
) -> None:
    agent = agent_of(backend, session)
    loads = agent.count(request_table.LOAD)
    rewound = session.rewind(1)
    assert (rewound.generation, rewound.rewound_from, rewound.current) == (4, 1, True)
    assert rewound.changed == ("x",)
    assert agent.values == {"x": b"'one'"} and agent.generation == 4
    assert agent.count(request_table.LOAD) == loads + 1 and agent_of(backend, session) is agent  # in place
    session.execute("y = 'after'")
    assert session.generation == 5
    assert [g.generation for g in session.history()] == [2, 3, 4, 5]


def test_rewind_of_a_hibernated_session_restores_at_its_next_call(session: Session, backend: FakeBackend) -> None:
    session.hibernate()
    assert not backend.running()
    session.rewind(2)
    assert not backend.running()  # nothing started for the rewind itself
    session.execute("y = 'later'")
    assert agent_of(backend, session).values == {"x": b"'two'", "y": b"'later'"}


def test_rewind_refuses_a_generation_that_is_not_kept(session: Session) -> None:
    session.execute("x = 'four'")
    with pytest.raises(GenerationNotFound, match=r"keeps no generation 0; it keeps generation 1, 2, 3, 4"):
        session.rewind(0)
    with pytest.raises(ConfigError, match="generation must be an integer"):
        session.rewind(True)  # type: ignore[arg-type]
    assert session.generation == 4


def test_a_fork_gets_the_state_its_own_sandbox_and_no_history(
    orch: Orchestrator, session: Session, backend: FakeBackend
) -> None:
    fork = session.fork()
    assert fork.id != session.id and fork.forked_from == (session.id, 3)
    assert agent_of(backend, fork).values == {"x": b"'three'"}
    assert [g.generation for g in fork.history()] == [3]
    fork.execute("x = 'forked'")
    assert agent_of(backend, session).values == {"x": b"'three'"}
    assert orch.history(session.id)[-1].generation == 3


def test_fork_at_an_older_generation_and_many_at_once(
    orch: Orchestrator, session: Session, backend: FakeBackend
) -> None:
    forks = orch.fork(session.id, 3, at=2, session_ids=["fork-a", "fork-b", "fork-c"])
    assert [f.id for f in forks] == ["fork-a", "fork-b", "fork-c"]
    assert all(agent_of(backend, f).values == {"x": b"'two'"} and f.generation == 2 for f in forks)
    with pytest.raises(GenerationNotFound, match="keeps no generation 9"):
        orch.fork(session.id, at=9)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"count": 0}, "count must be a positive integer"),
        ({"count": 2, "session_ids": ["only-one"]}, "session_ids must name 2 different ids"),
        ({"count": 2, "session_ids": ["same-id", "same-id"]}, "session_ids must name 2 different ids"),
        ({"session_ids": ["Not Valid"]}, "invalid session id"),
        ({"labels": {"team": "x"}}, "must be namespaced"),
        ({"placement": Placement(("node.role==worker",))}, "needs Settings.backend='swarm'"),
    ],
)
def test_fork_refuses_bad_arguments_before_storing_anything(
    orch: Orchestrator, session: Session, arguments: dict[str, object], message: str
) -> None:
    before = set(orch.sessions())
    with pytest.raises(ConfigError, match=message):
        orch.fork(session.id, **arguments)  # type: ignore[arg-type]
    assert set(orch.sessions()) == before


def test_a_fork_into_a_taken_id_is_refused(orch: Orchestrator, session: Session) -> None:
    other = orch.create_session(session_id="taken-id")
    with pytest.raises(ConfigError, match="'taken-id' already exists"):
        session.fork(session_id="taken-id")
    assert other.generation == 0


def test_forks_whose_sandboxes_cannot_start_are_removed_with_the_others(
    tmp_path: Path, orch: Orchestrator, session: Session, backend: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = backend.run_sandbox
    calls: list[str] = []

    def refuse_the_second(spec, settings):  # type: ignore[no-untyped-def]
        calls.append(spec.name)
        if len(calls) == 2:
            raise EngineError("the engine refused")
        return started(spec, settings)

    monkeypatch.setattr(backend, "run_sandbox", refuse_the_second)
    before = set(orch.sessions())
    with pytest.raises(EngineError, match="refused"):
        orch.fork(session.id, 3)
    assert set(orch.sessions()) == before
    assert not [p for p in (tmp_path / "state" / "sessions").iterdir() if p.name not in before and p.is_dir()]


def test_the_scaffold_and_unsaved_report_come_with_a_fork(orch: Orchestrator, backend: FakeBackend) -> None:
    def unsaved_socket(agent: FakeAgent, request: Header, body: bytes) -> Answer:
        answer = agent.answer(request, body)
        if request["type"] == request_table.EXEC and request["code"] == "s = socket()":
            header, blobs = answer  # type: ignore[misc]
            header["checkpoint"]["unsaved"] = {"s": "cannot pickle 'socket' object"}
            return header, blobs
        return answer

    backend.handler = unsaved_socket
    session = orch.create_session()
    session.set_scaffold("def helper():\n    return 1\n", names=["helper"])
    session.execute("s = socket()")
    assert session.unsaved == {"s": "cannot pickle 'socket' object"}
    fork = session.fork()
    assert fork.unsaved == {"s": "cannot pickle 'socket' object"}
    installs = [r for r in agent_of(backend, fork).requests if r["type"] == request_table.INSTALL]
    assert [r["names"] for r in installs] == [["helper"]]


def test_a_stale_handle_cannot_rewind(tmp_path: Path, orch: Orchestrator, session: Session) -> None:
    with Orchestrator(orch.settings, backend=FakeBackend()) as other:
        other.attach(session.id, force=True)
        with pytest.raises(SessionAttachedElsewhere):
            session.rewind(1)
        assert other.history(session.id)[-1].generation == 3
