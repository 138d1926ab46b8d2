"""Hibernation (``ops/hibernation.py``) of sessions on the fake engine: by their owner, by the idle policy, by ops."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import FakeBackend, fake_settings

from orchestrator import Orchestrator, Session
from orchestrator.ops import hibernation


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def orch(tmp_path: Path, backend: FakeBackend) -> Iterator[Orchestrator]:
    with Orchestrator(fake_settings(tmp_path), backend=backend) as orch:
        yield orch


def _resumes(session: Session, backend: FakeBackend) -> None:
    assert session.execute("y = 'two'").generation == 2
    assert backend.container_of(session.sandbox_id).agent.values == {"x": b"'one'", "y": b"'two'"}


def test_hibernating_a_held_session_from_ops_lets_its_handle_resume(orch: Orchestrator, backend: FakeBackend) -> None:
    session = orch.create_session()
    session.execute("x = 'one'")
    container = session.container_id
    assert orch.hibernate(session.id) is True
    assert session.container_id is None and backend.removed == [container]  # the handle let go of it
    assert orch.store.load(session.id).hibernated_at is not None
    assert orch.hibernate(session.id) is False  # already
    _resumes(session, backend)


def test_the_idle_policy_hibernates_only_an_idle_session(orch: Orchestrator, backend: FakeBackend) -> None:
    session = orch.create_session()
    session.execute("x = 'one'")
    held = orch._sessions.sandbox_of(session.id)  # the runtime the orchestrator's idle watch hibernates
    assert not hibernation.hibernate_if_idle(held, idle_for=3600)
    assert session.container_id is not None
    assert hibernation.hibernate_if_idle(held, idle_for=0)
    assert session.container_id is None
    _resumes(session, backend)


def test_hibernate_idle_of_a_session_nobody_holds(orch: Orchestrator, backend: FakeBackend) -> None:
    session = orch.create_session()
    session.execute("x = 'one'")
    session.detach()
    assert hibernation.hibernate_idle(orch.store, backend, orch.settings.runtime_dir, session.id) is True
    assert backend.running() == []
    _resumes(orch.attach(session.id), backend)
