"""session.files' write side (api/file_writes.py) on the fake engine: each write or removal is a call whose delta is
committed before it returns, read back from the store; a restore writes the stored workspace back, parents first."""

from __future__ import annotations

import asyncio
import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import Answer, FakeAgent, FakeBackend, Header, fake_settings

from orchestrator import (
    AsyncOrchestrator,
    ConfigError,
    FileNotFoundInWorkspace,
    Orchestrator,
    PathOutsideWorkspace,
    WorkspaceError,
)
from orchestrator.agent import request_table
from orchestrator.errors import WorkspaceFileTooBig


@pytest.fixture
def orch(tmp_path: Path) -> Iterator[Orchestrator]:
    with Orchestrator(
        fake_settings(tmp_path, ORCH_WORKSPACE_BYTES="1m", ORCH_WORKSPACE_FILES="8"), backend=FakeBackend()
    ) as made:
        yield made


def test_writes_are_committed_and_read_back_from_the_store(orch: Orchestrator) -> None:
    session = orch.create_session()
    files = session.files
    files.write("data/a.bin", b"\x00\xff")
    files.write("/workspace/notes.txt", "h\u00e9", mode=0o600)
    files.write("data/b.bin", io.BytesIO(b"from a file"))
    assert session.generation == 3 and files.read("data/a.bin") == b"\x00\xff"
    assert files.read("notes.txt") == "h\u00e9".encode() and files.list("notes.txt")[0].mode == 0o600
    assert [info.path for info in files.list(recursive=True)] == ["data", "data/a.bin", "data/b.bin", "notes.txt"]
    files.remove("data", recursive=True)
    assert not files.exists("data/a.bin") and session.generation == 4
    with pytest.raises(FileNotFoundInWorkspace):
        files.remove("nothing")  # the stored record says so: nothing is sent


def test_what_the_sandbox_refuses_or_cannot_keep_is_an_error(orch: Orchestrator) -> None:
    def refusing(agent: FakeAgent, request: Header, body: bytes) -> Answer:
        if request["type"] == request_table.FILE_WRITE and request["path"] == "dir":
            return {"type": request_table.STATE_REPLY, "status": "error", "reason": "a directory is there"}
        answer = agent.answer(request, body)
        if request["type"] == request_table.FILE_WRITE:
            reply, _ = answer
            agent.generation -= 1  # written, not kept: the generation stays
            reply["checkpoint"].update(generation=agent.generation, blobs=[])
            reply["checkpoint"]["files"] = {"changed": [], "deleted": [], "unsaved": {"big": "past a bound"}}
            return reply, b""
        return answer

    session = orch.create_session()
    orch.backend.handler = refusing
    with pytest.raises(WorkspaceError, match="could not change 'dir' of its workspace: a directory is there"):
        session.files.write("dir", b"")
    with pytest.raises(WorkspaceError, match="cannot keep it \\(past a bound\\)"):
        session.files.write("big", b"x")
    assert session.unsaved == {"/workspace/big": "past a bound"} and not session.files.exists("big")


def test_bad_paths_modes_and_sizes_send_nothing(orch: Orchestrator) -> None:
    session = orch.create_session()
    with pytest.raises(PathOutsideWorkspace):
        session.files.write("../etc/passwd", b"")
    with pytest.raises(ConfigError, match="workspace itself"):
        session.files.remove("/workspace")
    with pytest.raises(ConfigError, match="mode"):
        session.files.write("a", b"", mode=0o4755)
    with pytest.raises(WorkspaceFileTooBig):
        session.files.write("big", io.BytesIO(b"x" * ((1 << 20) + 1)))
    assert session.generation == 0


def test_a_restore_puts_the_stored_files_back_parents_first(orch: Orchestrator) -> None:
    session = orch.create_session()
    session.files.write("d/e/f.txt", b"kept")
    session.hibernate()
    assert session.files.read("d/e/f.txt") == b"kept"  # read from the store, the session not started
    session.execute("x = 1")
    agent = orch.backend.running()[0].agent
    put = [r for r in agent.requests if r["type"] == request_table.FILES_PUT]
    assert [e[0] for e in put[0]["entries"]] == ["d", "d/e", "d/e/f.txt"]
    assert agent.workspace["d/e/f.txt"][3] == b"kept"


def test_upload_of_a_tree_names_what_it_skips_and_keeps_the_bounds(orch: Orchestrator, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "empty").mkdir()
    (tree / "sub" / "x.py").write_bytes(b"print(1)")
    (tree / "top.txt").write_bytes(b"top")
    os.chmod(tree / "top.txt", 0o640)
    (tree / "link").symlink_to("top.txt")
    session = orch.create_session()
    uploaded = session.files.upload(tree, "in")
    assert (uploaded.files, uploaded.bytes) == (2, 11) and sorted(Path(p).name for p in uploaded.skipped) == [
        "empty",
        "link",
    ]
    assert session.files.read("in/sub/x.py") == b"print(1)" and session.files.list("in/top.txt")[0].mode == 0o640
    for index in range(8):
        (tree / f"more{index}").write_bytes(b"")
    with pytest.raises(ConfigError, match="nothing was uploaded"):
        session.files.upload(tree, ".")
    single = session.files.upload(tree / "top.txt", "one.txt")
    assert single.files == 1 and session.files.read("one.txt") == b"top"


def test_a_context_and_the_async_twin_write_the_same_workspace(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AsyncOrchestrator(fake_settings(tmp_path), backend=FakeBackend()) as orch:
            session = await orch.create_session()
            await session.files.write("a", b"1")
            context = await session.create_context(context_id="other")
            await context.files.write("b", b"2")
            assert await session.files.read("b") == b"2" and await context.files.exists("a")

    asyncio.run(scenario())
