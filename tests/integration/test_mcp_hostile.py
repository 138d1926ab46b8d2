"""``orchestrator mcp`` attacked as a local user and a token holder would: a file swapped for a symbolic link while
the server reads it, and more MCP sessions and sandbox sessions than the server allows. The server is the real
command, driven by the MCP SDK's own client, on the real engine."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client
from test_mcp import call, server, store  # noqa: F401 (store: the fixture of the server's store)

from orchestrator import Settings

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
