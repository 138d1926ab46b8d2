"""Taking a session over from another controller: its live container if any, else its checkpoint."""

from __future__ import annotations

import pytest

from orchestrator import (
    ConfigError,
    Orchestrator,
    Session,
    SessionAttachedElsewhere,
    SessionClosed,
    SessionNotFound,
    Settings,
)
from orchestrator.api.session import SessionState

pytestmark = pytest.mark.docker

SETUP = "import json\nnumbers = [1, 2, 3]\ndef double(v):\n    return 2 * v\ngen = (i for i in range(100))\nnext(gen)"


@pytest.fixture
def orch2(make_orch, settings: Settings) -> Orchestrator:
    """A second controller on the same state directory."""
    return make_orch(settings)


def test_attach_takes_over_the_live_container(session: Session, orch2: Orchestrator, settings: Settings) -> None:
    assert session.execute(SETUP).ok
    assert "gen" in session.execute("numbers.append(4)").unsaved
    container = session.container_id

    s2 = orch2.attach(session.id, force=True)
    try:
        assert s2.id == session.id
        assert s2.container_id == container
        assert s2.generation == session.generation
        # No restore happened: the unsaveable iterator is still there, mid-way.
        result = s2.execute("next(gen), double(sum(numbers)), json.dumps(numbers)")
        assert result.return_value == "(1, 20, '[1, 2, 3, 4]')"
        assert s2.container_id == container

        # The first handle learns it was taken over on its next call, and stays that way.
        with pytest.raises(SessionAttachedElsewhere):
            session.execute("numbers")
        assert session.state is SessionState.DETACHED
        with pytest.raises(SessionAttachedElsewhere):
            session.execute("numbers")
        with pytest.raises(SessionAttachedElsewhere):
            session.add_context("ctx")

        # ... and did not disturb the new owner.
        assert s2.execute("next(gen)").return_value == "2"
        assert s2.container_id == container
        assert [c.id for c in orch2.containers(session.id)] == [container]
    finally:
        s2.close()
    assert orch2.containers(session.id) == []
    assert session.id not in orch2.sessions()
    assert not (settings.state_dir / "sessions" / session.id).exists()
    with pytest.raises(SessionNotFound):
        orch2.attach(session.id)
    with pytest.raises(SessionClosed):
        s2.execute("1")


def test_attach_after_the_container_was_removed_restores_the_checkpoint(
    orch: Orchestrator, session: Session, orch2: Orchestrator
) -> None:
    assert session.execute(SETUP).ok
    old = session.container_id
    assert old is not None
    orch.backend.remove(old)

    s2 = orch2.attach(session.id, force=True)
    try:
        assert s2.container_id not in (None, old)
        assert s2.restore_failures == {}
        result = s2.execute("double(sum(numbers)), json.dumps(numbers), 'gen' in globals()")
        assert result.return_value == "(12, '[1, 2, 3]', False)"

        # The old handle must not start a container of its own and steal the session back.
        with pytest.raises(SessionAttachedElsewhere):
            session.execute("numbers")
        assert session.state is SessionState.DETACHED
        assert [c.id for c in orch2.containers(session.id)] == [s2.container_id]
        assert s2.execute("sum(numbers)").return_value == "6"
    finally:
        s2.close()
    assert orch.containers(session.id) == []


def test_detach_keeps_container_and_state_for_attach(orch: Orchestrator, session: Session) -> None:
    assert session.execute(SETUP).ok
    container = session.container_id
    session.detach()
    assert session.state is SessionState.DETACHED
    with pytest.raises(SessionAttachedElsewhere, match="detached"):
        session.execute("numbers")
    state = orch.backend.inspect(container or "")
    assert state is not None and state.running
    assert session.id in orch.sessions()

    s2 = orch.attach(session.id)
    try:
        assert s2.container_id == container
        assert s2.execute("next(gen), numbers").return_value == "(1, [1, 2, 3])"
    finally:
        s2.close()


def test_attach_twice_in_a_row(session: Session, orch2: Orchestrator, make_orch, settings: Settings) -> None:
    session.execute("value = 'v'")
    container = session.container_id
    orch3 = make_orch(settings)
    s2 = orch2.attach(session.id, force=True)
    s3 = orch3.attach(session.id, force=True)
    try:
        assert s3.execute("value").return_value == "'v'"
        with pytest.raises(SessionAttachedElsewhere):
            s2.execute("value")
        with pytest.raises(SessionAttachedElsewhere):
            session.execute("value")
        assert s3.execute("value * 2").return_value == "'vv'"
        assert s3.container_id == container
        assert session.container_id is None  # a stale handle lets go of the sandbox it no longer owns
    finally:
        s3.close()


def test_attach_unknown_session(orch: Orchestrator) -> None:
    with pytest.raises(SessionNotFound):
        orch.attach("no-such-session")
    with pytest.raises(ConfigError):
        orch.attach("Not A Valid Id")


def test_sessions_lists_stored_sessions(orch: Orchestrator, session: Session, orch2: Orchestrator) -> None:
    assert session.id in orch.sessions()
    assert session.id in orch2.sessions()
