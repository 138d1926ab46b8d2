"""``orchestrator mcp`` attacked as a local user and a token holder would: a file swapped for a symbolic link while
the server reads it, and more MCP sessions and sandbox sessions than the server allows. The server is the real
command, driven by the MCP SDK's own client, on the real engine."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.to_thread
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from test_mcp import call, orch, server, serving_http, store  # noqa: F401 (orch, store: fixtures)

from orchestrator import Orchestrator, Settings

pytestmark = pytest.mark.docker

SECRET = "TOP-SECRET-OUTSIDE-THE-ROOT-0123456789"
INSIDE = "inside"
TRIES = 400

_RACER = textwrap.dedent(
    """
    import os, sys
    target, outside = sys.argv[1], sys.argv[2]
    link, plain = target + ".link", target + ".plain"
    while True:
        for path in (link, plain):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        os.symlink(outside, link)
        os.rename(link, target)          # the file is now a link out of the root...
        with open(plain, "w") as file:
            file.write("inside")
        os.rename(plain, target)         # ...and a plain file again
    """
)


@pytest.fixture
def racer(tmp_path: Path) -> Iterator[Path]:
    """A local user (uid 65534) who may write under the allowed root, swapping its file for a link to a root-only
    file outside it, as fast as it can, in a process of its own."""
    root = tmp_path / "allowed"
    root.mkdir()
    os.chown(root, 65534, 65534)
    outside = tmp_path / "secret"
    outside.write_text(SECRET)
    outside.chmod(0o600)  # the racer cannot read it itself: only the server (root) can
    target = root / "notes.txt"
    target.write_text(INSIDE)
    os.chown(target, 65534, 65534)
    # Another user where there is one to be (a system Python it may run); in the root: the test's own
    # directories above it are closed to that user.
    other = os.getuid() == 0 and os.access("/usr/bin/python3", os.X_OK)
    process = subprocess.Popen(
        ["/usr/bin/python3" if other else sys.executable, "-c", _RACER, target.name, str(outside)],
        cwd=root,
        user=65534 if other else None,
        stderr=subprocess.PIPE,
    )
    try:
        yield target
    finally:
        process.kill()
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == -9, stderr  # it raced all along (no permission error ended it)


def test_a_file_swapped_for_a_link_while_the_server_reads_it_never_leaks_the_outside(
    store: Settings,  # noqa: F811
    racer: Path,
) -> None:
    async def scenario() -> tuple[list[str], str]:
        async with Client(server(store, "--allow-files", str(racer.parent))) as client:
            answers = [await call(client, "add_context", path=str(racer)) for _ in range(TRIES)]
            seen = await call(
                client,
                "execute_code",
                code=f"any({SECRET!r} in str(v) for k, v in list(globals().items()) if k.startswith('context'))",
            )
            return answers, seen

    answers, seen = anyio.run(scenario)
    leaked = [answer for answer in answers if f"{len(SECRET)} characters" in answer]
    assert leaked == [] and "return value: False" in seen, (len(leaked), leaked[:1], seen)
    read = [answer for answer in answers if f"str, {len(INSIDE)} characters" in answer]
    refused = [answer for answer in answers if "symbolic link" in answer]
    assert read and refused, answers[:3]  # the race was run: the server saw both
    assert len(read) + len(refused) == TRIES, [a for a in answers if a not in read and a not in refused][:3]


def test_one_token_holder_gets_no_more_sandboxes_or_mcp_sessions_than_the_server_allows(
    store: Settings,  # noqa: F811
    orch: Orchestrator,  # noqa: F811
) -> None:
    """Five MCP sessions of one client against ``--max-sessions 1``: one sandbox in all, the others refused; a
    sixth MCP session past ``--max-clients 5`` is refused by the transport."""

    async def scenario(url: str, token: str) -> tuple[list[str], list[str], str, list[str]]:
        async with contextlib.AsyncExitStack() as stack:
            http = await stack.enter_async_context(httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}))
            clients = [
                await stack.enter_async_context(Client(streamable_http_client(url, http_client=http), mode="legacy"))
                for _ in range(5)
            ]
            ran = [await call(client, "execute_code", code="x = 1") for client in clients]
            forked = [await call(client, "fork_session") for client in clients]
            with pytest.raises(Exception) as sixth:  # the SDK's client raises what the transport saw
                async with Client(streamable_http_client(url, http_client=http), mode="legacy") as extra:
                    await extra.list_tools()
            held = await anyio.to_thread.run_sync(orch.sessions)  # while the five are still connected
            return ran, forked, repr(sixth.value), held

    with serving_http(store, "--max-sessions", "1", "--max-clients", "5") as (url, token, _):
        ran, forked, sixth, held = anyio.run(scenario, url, token)
    assert len(held) == 1, held
    assert sum(answer.startswith("status: success") for answer in ran) == 1, ran
    refusals = [answer for answer in ran + forked if answer.startswith("status: refused")]
    assert len(refusals) == 9 and all("--max-sessions 1" in answer for answer in refusals), ran + forked
    assert "Too many open sessions" in sixth, sixth
