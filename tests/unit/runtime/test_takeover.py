"""Taking a session over (``runtime/takeover.py``): two controllers on one store and one fake engine."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import FakeBackend, fake_settings

from orchestrator import Orchestrator, SessionAttachedElsewhere, SessionHeld
from orchestrator.agent import request_table
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
    new = second.attach(old.id, force=True)
    assert new.container_id == container and backend.removed == []  # the same container, moved over
    agent = backend.container_of(new.sandbox_id).agent
    assert agent.count(request_table.RESTORE_BEGIN) == 0  # it held the session's generation: nothing to restore
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
    new = second.attach(old.id, force=True)
    assert new.container_id is None  # attaching is not using: its first call resumes it
    assert new.execute("x").generation == 1 and new.container_id is not None


def test_attach_refuses_a_session_a_live_controller_holds_and_names_it(
    controllers: tuple[Orchestrator, Orchestrator], backend: FakeBackend
) -> None:
    first, second = controllers
    old = first.create_session()
    old.execute("x = 'one'")
    with pytest.raises(SessionHeld, match=rf"pid {os.getpid()} on host .*since .*force") as refused:
        second.attach(old.id)
    assert (refused.value.pid, refused.value.host) == (os.getpid(), socket.gethostname())
    assert old.execute("y = 'two'").generation == 2 and old.epoch == 1  # the holder did not notice
    with pytest.raises(SessionHeld):
        second.remove(old.id)
    with pytest.raises(SessionHeld):
        second.resume(old.id)
    assert old.state is SessionState.READY and backend.removed == []


def test_attach_in_the_holding_orchestrator_gives_its_handle(controllers: tuple[Orchestrator, Orchestrator]) -> None:
    first, _ = controllers
    session = first.create_session()
    session.execute("x = 1")
    assert first.attach(session.id) is session and session.epoch == 1
    first.resume(session.id)
    assert session.execute("y = 2").generation == 2 and session.variables == ["x", "y"]
    session.close()  # the README's first example: no stale handle, nothing raised


def test_a_detached_session_is_attached_without_force(controllers: tuple[Orchestrator, Orchestrator]) -> None:
    first, second = controllers
    old = first.create_session()
    old.detach()
    new = second.attach(old.id)
    assert new.epoch == 2
    with pytest.raises(SessionHeld):
        first.attach(old.id)  # the handle it let go of is not first's any more


def test_closing_a_stale_handle_lets_go_and_says_what_it_left(
    controllers: tuple[Orchestrator, Orchestrator], caplog: pytest.LogCaptureFixture
) -> None:
    first, second = controllers
    old = first.create_session()
    new = second.attach(old.id, force=True)
    old.close()  # does not raise
    assert old.state is SessionState.DETACHED
    assert "left to the controller that holds it" in caplog.text
    assert new.execute("x = 1").generation == 1 and new.variables == ["x"]  # the new owner's session is whole
    old.detach()
    assert first.attach(old.id, force=True).epoch == 3  # the stale handle gave way: first takes it back by force


def test_the_holder_renews_its_lease_and_ends_it_when_it_lets_go(
    controllers: tuple[Orchestrator, Orchestrator],
) -> None:
    first, _ = controllers
    session = first.create_session()
    leases = first.store.lease(session.id)
    created = leases.read()
    assert created is not None and created.pid == os.getpid() and created.owner == first.store.load(session.id).owner
    deadline = time.monotonic() + 60
    while (renewed := leases.read()) is not None and renewed.renewed == created.renewed:
        assert time.monotonic() < deadline, "the lease was never renewed"
        time.sleep(0.05)
    assert renewed is not None and renewed.since == created.since
    session.detach()
    assert leases.read() is None
