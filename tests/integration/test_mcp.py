"""``orchestrator mcp`` end to end, driven by the official MCP SDK's own client: over stdio (the server is a subprocess
the client starts, as a desktop client does) and over streamable HTTP on loopback with its bearer token."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import httpx2
import pytest
from conftest import RUN_ID, TEST_LABEL
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from support import cli_env, kill_and_wait

from orchestrator import Orchestrator, Settings

pytestmark = pytest.mark.docker

TOOLS = {
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


@pytest.fixture
def store(settings_for: Callable[..., Settings], image: str) -> Settings:
    """A store of its own (swept at the end), so what the server leaves behind is all that is in it."""
    return settings_for()


@pytest.fixture
def orch(store: Settings, make_orch: Callable[[Settings], Orchestrator]) -> Orchestrator:
    """Another controller on the server's store: it finds the server's containers and kills them."""
    return make_orch(store)


def server(store: Settings, *args: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "orchestrator", "mcp", "--label", f"{TEST_LABEL}={RUN_ID}", *args],
        env=cli_env(store),
    )


async def call(client: Client, tool: str, **arguments: Any) -> str:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result
    (content,) = result.content
    assert content.type == "text"
    return content.text


def default_session(listing: str) -> str:
    found = re.search(r"^(\S+) \(default\)", listing, re.MULTILINE)
    assert found, listing
    return found.group(1)


def test_the_state_is_back_after_the_sandbox_is_killed_between_two_calls(store: Settings, orch: Orchestrator) -> None:
    async def scenario() -> str:
        async with Client(server(store)) as client:
            assert {tool.name for tool in (await client.list_tools()).tools} == TOOLS
            first = await call(client, "execute_code", code="data = [1, 2, 3]\ndef total():\n    return sum(data)")
            assert first.startswith("status: success"), first
            session_id = default_session(await call(client, "list_sessions"))
            (container,) = orch.containers(session_id)
            await anyio.to_thread.run_sync(kill_and_wait, orch, container.id)

            again = await call(client, "execute_code", code="data.append(4)\ntotal()")
            assert again.startswith("status: success") and "return value: 10" in again, again
            (restarted,) = [c for c in orch.containers(session_id) if c.running]
            assert restarted.id != container.id
            return session_id

    session_id = anyio.run(scenario)
    # The client went: the session it was given is removed, container and stored state (no leak).
    assert orch.containers(session_id) == [] and session_id not in orch.sessions()


def test_a_call_the_client_cancels_is_stopped_in_the_sandbox(store: Settings) -> None:
    async def scenario() -> str:
        async with Client(server(store)) as client:
            await call(client, "execute_code", code="kept = 'still here'")
            with pytest.raises(TimeoutError), anyio.fail_after(3):  # the SDK cancels the request
                await client.call_tool("execute_code", {"code": "import time\ntime.sleep(3600)"})
            # Had the cell gone on sleeping, this call would wait for it (and the test time out).
            return await call(client, "execute_code", code="kept")

    assert "return value: 'still here'" in anyio.run(scenario)


def test_hostile_and_huge_output_reaches_the_client_made_safe_and_cut(store: Settings) -> None:
    async def scenario() -> tuple[str, str]:
        async with Client(server(store, "--max-answer-chars", "2000")) as client:
            huge = await call(client, "execute_code", code="print('x' * 1_000_000)")
            hostile = await call(client, "execute_code", code="print('\\x1b]0;owned\\x07\\x1b[2J\\u202e')")
            return huge, hostile

    huge, hostile = anyio.run(scenario)
    assert len(huge) <= 2000 and "left out" in huge and "all of it is in the file" in huge, huge
    assert not any(char in hostile for char in "\x1b\x07\u202e") and "\\x1b" in hostile, hostile


def test_sigterm_with_the_client_still_connected_removes_its_session(store: Settings, orch: Orchestrator) -> None:
    """A client (or a service manager) stopping the server with SIGTERM, its stdin still open: the session goes too."""
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "mcp", "--label", f"{TEST_LABEL}={RUN_ID}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(store),
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        for message in (
            {
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "test", "version": "1"},
                },
            },
            {"method": "notifications/initialized"},
            {"id": 2, "method": "tools/call", "params": {"name": "execute_code", "arguments": {"code": "x = 1"}}},
        ):
            process.stdin.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
            process.stdin.flush()
        replies = [json.loads(process.stdout.readline()) for _ in range(2)]
        assert "status: success" in replies[1]["result"]["content"][0]["text"], replies
        (session_id,) = orch.sessions()
        process.terminate()
        assert process.wait(timeout=120) == 0
        assert orch.sessions() == [] and orch.containers(session_id) == []
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=60)


def test_forks_rewind_and_context_through_the_tools_and_nothing_left_behind(
    store: Settings, orch: Orchestrator, tmp_path
) -> None:
    (tmp_path / "notes.txt").write_text("the context, from a file")
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "pipe")  # opening it to read would wait for a writer: the server must not

    async def scenario() -> list[str]:
        async with Client(server(store, "--allow-files", str(tmp_path))) as client:
            await call(client, "execute_code", code="x = 1")
            await call(client, "execute_code", code="x = 2")
            forked = await call(client, "fork_session")
            fork = re.search(r"new session: (\S+)", forked)
            assert fork, forked
            assert "return value: 3" in await call(client, "execute_code", code="x += 1\nx", session=fork.group(1))
            assert "return value: 2" in await call(client, "execute_code", code="x")  # the default one is untouched

            history = await call(client, "history")
            assert "generation 1: " in history and "generation 2 (current)" in history, history
            assert "as the new generation 3" in await call(client, "rewind", generation=1)
            assert "return value: 1" in await call(client, "execute_code", code="x")
            assert "were before it" in await call(client, "undo_last_cell")  # the rewind is the client's: undone
            assert "return value: 2" in await call(client, "execute_code", code="x")

            added = await call(client, "add_context", path=str(tmp_path / "notes.txt"))
            assert "context_0" in added, added
            assert "from a file" in await call(client, "execute_code", code="context")
            assert "not a regular file" in await call(client, "add_context", path=str(tmp_path / "pipe"))
            assert "not a regular file" in await call(client, "add_context", path=str(tmp_path / "folder"))
            assert "not under a directory" in await call(client, "add_context", path="/etc/passwd")
            assert "no session 'elsewhere'" in await call(client, "list_variables", session="elsewhere")
            listing = await call(client, "list_sessions")
            return [default_session(listing), fork.group(1)]

    made = anyio.run(scenario)
    assert all(orch.containers(sid) == [] for sid in made) and set(made).isdisjoint(orch.sessions())


def test_a_named_session_survives_the_client_and_a_live_holder_is_refused(
    store: Settings, orch: Orchestrator, run_id: str
) -> None:
    name = f"mcp-{run_id}"

    async def first() -> None:
        async with Client(server(store, "--session", name)) as client:
            await call(client, "execute_code", code="kept = 'across clients'")
            # A second server cannot take the session this one holds; it says so and exits.
            refused = subprocess.run(
                [sys.executable, "-m", "orchestrator", "mcp", "--session", name],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                env=cli_env(store),
                timeout=60,
            )
            assert refused.returncode != 0 and "SessionHeld" in refused.stderr, refused

    async def second() -> str:
        async with Client(server(store, "--session", name)) as client:
            return await call(client, "execute_code", code="kept")

    anyio.run(first)
    assert name in orch.sessions()
    assert "across clients" in anyio.run(second)
    orch.remove(name)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def http_server(store: Settings) -> Iterator[tuple[str, str, subprocess.Popen[str]]]:
    """``orchestrator mcp --http`` on a free loopback port with a known token: (url, token, process)."""
    with serving_http(store) as served:
        yield served


@contextlib.contextmanager
def serving_http(store: Settings, *args: str) -> Iterator[tuple[str, str, subprocess.Popen[str]]]:
    """``orchestrator mcp --http [args]`` on a free loopback port with a known token: (url, token, process)."""
    token = "t-" + "0123456789abcdef" * 2
    port = _free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "mcp",
            "--http",
            "--port",
            str(port),
            "--label",
            f"{TEST_LABEL}={RUN_ID}",
            *args,
        ],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(store, ORCH_MCP_TOKEN=token),
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()  # "serving http://127.0.0.1:<port>/mcp" once it is about to listen
        assert f"http://127.0.0.1:{port}/mcp" in line, line
        ends = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < ends, "the server did not listen"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp", token, process
    finally:
        if process.poll() is None:
            process.terminate()
        process.communicate(timeout=60)  # reads the rest of stderr and closes the pipe


def _post(url: str, authorization: str | None) -> int:
    body = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}'
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if authorization is not None:
        headers["Authorization"] = authorization
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=30) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_http_refuses_a_request_without_the_token_and_serves_one_with_it(
    http_server: tuple[str, str, subprocess.Popen[str]], orch: Orchestrator
) -> None:
    url, token, process = http_server
    assert _post(url, None) == 401
    assert _post(url, "Bearer wrong-token-of-the-same-size-x") == 401
    assert _post(url, token) == 401  # the token without its scheme
    assert _post(url, f"Basic {token}") == 401

    async def scenario() -> tuple[set[str], str]:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            names = {tool.name for tool in (await client.list_tools()).tools}
            return names, await call(client, "execute_code", code="6 * 7")

    names, answer = anyio.run(scenario)
    assert names == TOOLS and "return value: 42" in answer
    assert len(orch.sessions()) == 1  # the 2026-07-28 protocol has no client sessions: its clients share one
    process.terminate()  # as a service manager stops it: the sessions it made go with it
    assert process.wait(timeout=60) == 0
    assert orch.sessions() == [] and orch.containers() == []


def test_http_clients_that_keep_an_mcp_session_each_get_their_own(
    http_server: tuple[str, str, subprocess.Popen[str]], orch: Orchestrator
) -> None:
    url, token, _ = http_server

    async def scenario() -> tuple[str, str]:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http,
            Client(streamable_http_client(url, http_client=http), mode="legacy") as first,
            Client(streamable_http_client(url, http_client=http), mode="legacy") as second,
        ):
            await call(first, "execute_code", code="who = 'first'")
            await call(second, "execute_code", code="who = 'second'")
            mine = default_session(await call(first, "list_sessions"))
            assert mine != default_session(await call(second, "list_sessions"))
            assert "no session" in await call(second, "list_variables", session=mine)  # out of its reach
            return await call(first, "execute_code", code="who"), await call(second, "execute_code", code="who")

    first, second = anyio.run(scenario)
    assert "'first'" in first and "'second'" in second
    # Each client ended its MCP session (DELETE) on the way out: its sandbox session went with it.
    assert orch.sessions() == []
