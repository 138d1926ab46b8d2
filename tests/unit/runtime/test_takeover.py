"""Taking a session over (``runtime/takeover.py``): two controllers on one store and one fake engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import FakeBackend, fake_settings

from orchestrator import Orchestrator, SessionAttachedElsewhere
from orchestrator.agent import protocol
from orchestrator.api.session import SessionState


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def controllers(tmp_path: Path, backend: FakeBackend) -> Iterator[tuple[Orchestrator, Orchestrator]]:
    settings = fake_settings(tmp_path)
    with Orchestrator(settings, backend=backend) as first, Orchestrator(settings, backend=backend) as second:
        yield first, second


def test_attach_takes_the_live_sandbox_over_and_the_old_handle_goes_stale(
    controllers: tuple[Orchestrator, Orchestrator], backend: FakeBackend
) -> None:
    first, second = controllers
    old = first.create_session()
    old.execute("x = 'one'")
    container = old.container_id
    new = second.attach(old.id)
    assert new.container_id == container and backend.removed == []  # the same container, moved over
    agent = backend.container_of(new.sandbox_id).agent
    assert agent.count(protocol.RESTORE_BEGIN) == 0  # it held the session's generation: nothing to restore
    assert new.epoch == old.epoch + 1
    with pytest.raises(SessionAttachedElsewhere, match="was attached by another controller"):
        old.execute("x = 'lost'")
    assert old.state is SessionState.DETACHED
    assert new.execute("y = 'two'").generation == 2 and new.variables == ["x", "y"]


def test_attach_of_a_session_whose_container_is_gone_starts_and_restores(
    controllers: tuple[Orchestrator, Orchestrator], backend: FakeBackend
) -> None:
    first, second = controllers
    old = first.create_session()
    old.execute("x = 'one'")
    container = old.container_id
    old.detach()
    backend.kill(container)
    new = second.attach(old.id)
    assert new.container_id not in (None, container) and backend.removed == [container]
    assert backend.container_of(new.sandbox_id).agent.values == {"x": b"'one'"}


def test_attach_leaves_a_hibernated_session_hibernated(controllers: tuple[Orchestrator, Orchestrator]) -> None:
    first, second = controllers
    old = first.create_session()
    old.execute("x = 'one'")
    old.hibernate()
    new = second.attach(old.id)
    assert new.container_id is None  # attaching is not using: its first call resumes it
    assert new.execute("x").generation == 1 and new.container_id is not None
