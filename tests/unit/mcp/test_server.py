"""The MCP server in process, with the SDK's client: the tools and their arguments, and the bearer token of HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from fakes import FakeBackend, fake_settings
from mcp import Client
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from orchestrator import Orchestrator
from orchestrator.mcp.clients import Clients
from orchestrator.mcp.server import BearerToken, build_server
from orchestrator.mcp.workspace import Limits, Workspace


@pytest.fixture
def clients(tmp_path: Path) -> Iterator[Clients]:
    with Orchestrator(fake_settings(tmp_path), backend=FakeBackend()) as orch:
        clients = Clients(lambda: Workspace(orch, Limits(max_timeout=30)), per_session=False, idle_after=None)
        yield clients
        clients.close()


def test_the_tools_their_arguments_and_a_call(clients: Clients) -> None:
    async def scenario() -> tuple[dict[str, dict], str, str, bool]:
        async with Client(build_server(clients)) as client:
            tools = {tool.name: tool.input_schema for tool in (await client.list_tools()).tools}
            ran = await client.call_tool("execute_code", {"code": "x = 'one'"})
            bad = await client.call_tool("execute_code", {"code": "1", "timeout_seconds": 31})
            wrong = await client.call_tool("execute_code", {"code": 1})
            return tools, ran.content[0].text, bad.content[0].text, wrong.is_error

    tools, ran, too_long, wrong_type = anyio.run(scenario)
    assert set(tools) == {
        "execute_code",
        "reset_repl",
        "undo_last_cell",
        "list_variables",
        "add_context",
        "fork_session",
        "history",
        "rewind",
        "list_sessions",
        "close_session",
    }
    assert tools["execute_code"]["required"] == ["code"]
    assert "at most 30" in str(tools["execute_code"]["properties"]["timeout_seconds"])
    assert tools["rewind"]["required"] == ["generation"]
    assert set(tools["add_context"]["properties"]) == {"text", "path", "session"}
    assert ran.startswith("status: success")
    assert too_long.startswith("status: invalid call") and "at most 30" in too_long  # PythonTool's own answer
    assert wrong_type  # the SDK checks the arguments against the schema


def _app() -> BearerToken:
    async def hello(request: object) -> PlainTextResponse:
        return PlainTextResponse("in")

    return BearerToken(Starlette(routes=[Route("/mcp", hello, methods=["POST"])]), "s3cret-token-of-16")


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer s3cret-token-of-1", "Bearer s3cret-token-of-16 ", "bearer s3cret-token-of-16"],
)
def test_a_request_without_the_exact_token_is_refused(authorization: str | None) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    with TestClient(_app()) as client:
        reply = client.post("/mcp", headers=headers)
    assert reply.status_code == 401 and reply.headers["www-authenticate"] == "Bearer"
    assert reply.text.startswith("401 Unauthorized")


def test_the_token_lets_a_request_through() -> None:
    with TestClient(_app()) as client:
        reply = client.post("/mcp", headers={"Authorization": "Bearer s3cret-token-of-16"})
    assert (reply.status_code, reply.text) == (200, "in")


def test_an_empty_token_is_a_mistake() -> None:
    with pytest.raises(ValueError, match="empty"):
        BearerToken(Starlette(), "")
