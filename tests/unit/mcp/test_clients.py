"""Which workspace serves a request: one per MCP session id over HTTP, a shared one without, and when each goes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import FakeBackend, fake_settings

from orchestrator import Orchestrator
from orchestrator.mcp.clients import Clients
from orchestrator.mcp.seats import Seats
from orchestrator.mcp.workspace import Limits, Workspace


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def orch(tmp_path: Path) -> Iterator[Orchestrator]:
    with Orchestrator(fake_settings(tmp_path), backend=FakeBackend()) as orchestrator:
        yield orchestrator


def clients_on(orch: Orchestrator, *, per_session: bool = True, clock: Clock | None = None) -> Clients:
    return Clients(lambda: Workspace(orch, Limits()), per_session=per_session, idle_after=60.0, clock=clock or Clock())


def test_each_mcp_session_has_its_own_sessions_and_requests_without_one_share(orch: Orchestrator) -> None:
    clients = clients_on(orch)
    one, two = clients.of({"mcp-session-id": "a"}), clients.of({"mcp-session-id": "b"})
    assert one is not two and clients.of({"mcp-session-id": "a"}) is one
    assert clients.of({}) is clients.shared and clients.of(None) is clients.shared
    one.execute("x = 'one'", None, None)
    two.execute("x = 'two'", None, None)
    assert len(orch.sessions()) == 2
    clients.end("a")
    assert len(orch.sessions()) == 1
    clients.end("never-seen")  # nothing to do
    clients.close()
    assert orch.sessions() == []


def test_without_per_session_every_request_shares_one_workspace(orch: Orchestrator) -> None:
    clients = clients_on(orch, per_session=False)
    assert clients.of({"mcp-session-id": "a"}) is clients.shared


def test_a_client_idle_past_the_limit_loses_its_sessions_at_the_next_request(orch: Orchestrator) -> None:
    clock = Clock()
    clients = clients_on(orch, clock=clock)
    clients.of({"mcp-session-id": "idle"}).execute("x = 'one'", None, None)
    clock.now = 30.0
    busy = clients.of({"mcp-session-id": "busy"})
    busy.execute("x = 'two'", None, None)
    clock.now = 61.0  # "idle" last used at 0, "busy" at 30
    clients.of({"mcp-session-id": "busy"})
    assert len(orch.sessions()) == 1
    clients.close()


def test_the_cap_on_sandbox_sessions_is_the_servers_not_each_clients(orch: Orchestrator) -> None:
    seats = Seats(2)
    clients = Clients(lambda: Workspace(orch, Limits(), seats=seats), per_session=True, idle_after=None)
    first, second, third = (clients.of({"mcp-session-id": key}) for key in "abc")
    assert first.execute("x = 1", None, None).startswith("status: success")
    assert "new session" in first.fork(None, None)
    for refused in (second.execute("x = 2", None, None), first.fork(None, None)):
        assert refused.startswith("status: refused") and "--max-sessions 2" in refused, refused
    assert len(orch.sessions()) == 2
    clients.end("a")  # the first client goes: its two places are free again
    assert second.execute("x = 2", None, None).startswith("status: success")
    assert third.execute("x = 3", None, None).startswith("status: success")
    assert third.execute("x", None, None).startswith("status: success") and seats.held == 2
    clients.close()
    assert orch.sessions() == [] and seats.held == 0
