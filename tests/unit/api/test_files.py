"""session.files, its read side (orchestrator.api.files): the store's workspace read, listed and downloaded.

The records are ``SessionRecord`` with ``files`` set directly, as docs/design/workspace.md ("The record") gives it:
``{path: (kind, mode, mtime_ns, ref)}``.
"""

from __future__ import annotations

import os
import tracemalloc

import pytest

from orchestrator.agent.blob_format import blob_digest
from orchestrator.api.files import FileInfo, Files
from orchestrator.errors import (
    CheckpointError,
    ConfigError,
    FileNotFoundInWorkspace,
    NotAFileInWorkspace,
    PathOutsideWorkspace,
    WorkspaceError,
    WorkspaceFileTooBig,
)
from orchestrator.state.store import SessionRecord, SessionStore

MTIME = 1_733_600_000_500_000_000
TB = 1 << 40


class Workspace:
    """A session's stored workspace: a record in a real store, its files' blobs beside its values'."""

    def __init__(self, tmp_path):
        self.store = SessionStore(tmp_path / "state")
        self.record = SessionRecord(session_id="s-files", image="i", created_at=0.0, last_used_at=0.0)
        self.store.create(self.record)
        self.record.files = {}  # the field state/files.py (workspace-record) adds
        self.files = Files(lambda: self.record, self.store)

    def file(self, path, data, *, mode=0o644, size=None, blob=None):
        digest = blob_digest(data)
        self.store.write_blobs(self.record.session_id, {digest: data if blob is None else blob})
        self.record.files[path] = ("f", mode, MTIME, digest)
        self.record.blob_sizes[digest] = len(data) if size is None else size

    def dir(self, path, *, mode=0o755):
        self.record.files[path] = ("d", mode, MTIME, "")

    def link(self, path, target):
        self.record.files[path] = ("l", 0o777, MTIME, target)


@pytest.fixture
def ws(tmp_path):
    ws = Workspace(tmp_path)
    ws.dir("data")
    ws.file("data/a.bin", bytes(range(256)) * 10)
    ws.file("data/empty", b"", mode=0o600)
    ws.dir("data/deep")
    ws.file("data/deep/c.txt", b"c")
    ws.file("top.txt", b"top")
    ws.link("latest", "data/a.bin")
    ws.link("here", "data")
    ws.link("shadow", "/etc/shadow")
    ws.link("up", "../..")
    return ws


def test_read_gives_a_files_bytes_by_relative_absolute_and_linked_paths(ws):
    assert ws.files.read("data/a.bin") == bytes(range(256)) * 10
    assert ws.files.read("/workspace/data/a.bin") == bytes(range(256)) * 10
    assert ws.files.read("./data/deep/../a.bin") == bytes(range(256)) * 10
    assert ws.files.read("latest") == bytes(range(256)) * 10
    assert ws.files.read("here/deep/c.txt") == b"c"
    assert ws.files.read("data/empty") == b""


def test_read_is_bounded_and_says_how_to_stream(ws):
    with pytest.raises(WorkspaceFileTooBig, match=r"read\(path, to=local_path\)") as caught:
        ws.files.read("data/a.bin", max_bytes=100)
    assert (caught.value.size, caught.value.limit, caught.value.path) == (2560, 100, "data/a.bin")
    with pytest.raises(ConfigError):
        ws.files.read("data/a.bin", max_bytes=-1)


def test_read_to_streams_any_size_in_bounded_memory_and_replaces_a_planted_link(ws, tmp_path):
    big = os.urandom(1 << 16) * 96  # 6 MiB
    ws.file("big", big)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    target = tmp_path / "big.out"
    target.symlink_to(victim)

    tracemalloc.start()
    try:
        written = ws.files.read("big", to=target)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert written == len(big)
    assert peak < 2 << 20
    assert target.read_bytes() == big and not target.is_symlink()
    assert victim.read_bytes() == b"precious"


def test_a_directory_is_not_a_file_and_a_missing_path_is_not_found(ws, tmp_path):
    for path in ("data", ".", "/workspace", "here"):
        with pytest.raises(NotAFileInWorkspace, match=r"files\.download\(\)"):
            ws.files.read(path)
    with pytest.raises(FileNotFoundInWorkspace, match=r"files\.list\(\)") as caught:
        ws.files.read("data/nope")
    assert isinstance(caught.value, LookupError)
    with pytest.raises(FileNotFoundInWorkspace):
        ws.files.read("top.txt/x")
    with pytest.raises(FileNotFoundInWorkspace):
        ws.files.list("nope")
    with pytest.raises(FileNotFoundInWorkspace):
        ws.files.download("nope", tmp_path / "out")


@pytest.mark.parametrize(
    "path", ["..", "../x", "data/../../x", "/etc/passwd", "/workspace/../etc/passwd", "/workspacex/a", "/", "a\x00b"]
)
def test_paths_outside_the_workspace_are_refused_by_every_call(ws, tmp_path, path):
    for call in (ws.files.read, ws.files.list, ws.files.exists, lambda p: ws.files.download(p, tmp_path / "out")):
        with pytest.raises(PathOutsideWorkspace, match="relative to /workspace") as caught:
            call(path)
        assert isinstance(caught.value, ValueError) and isinstance(caught.value, WorkspaceError)
    assert not (tmp_path / "out").exists()


def test_links_are_never_followed_out_of_the_workspace(ws, tmp_path):
    for path in ("shadow", "up/etc/passwd", "up"):
        with pytest.raises(PathOutsideWorkspace, match="links are never followed out of it"):
            ws.files.read(path)
    with pytest.raises(PathOutsideWorkspace):
        ws.files.download("shadow", tmp_path / "out")
    assert ws.files.exists("shadow") and ws.files.exists("up")  # the links themselves are there
    with pytest.raises(PathOutsideWorkspace):
        ws.files.exists("up/etc/passwd")


def test_list_gives_entries_in_tree_order_with_their_fields(ws):
    listed = ws.files.list()
    assert [info.path for info in listed] == ["data", "here", "latest", "shadow", "top.txt", "up"]
    assert listed[0] == FileInfo("data", "dir", 0, 0o755, MTIME / 1e9, None)
    assert listed[3] == FileInfo("shadow", "symlink", len("/etc/shadow"), 0o777, MTIME / 1e9, "/etc/shadow")
    assert listed[4] == FileInfo("top.txt", "file", 3, 0o644, MTIME / 1e9, None)
    assert [info.path for info in ws.files.list("data", recursive=True)] == [
        "data/a.bin",
        "data/deep",
        "data/deep/c.txt",
        "data/empty",
    ]
    assert [info.path for info in ws.files.list("here")] == ["data/a.bin", "data/deep", "data/empty"]
    assert ws.files.list("latest") == [ws.files.list("data")[0]]  # a file (through its link): its own entry
    assert len(ws.files.list(recursive=True)) == 10


def test_exists_tells_entries_from_missing_ones(ws):
    assert ws.files.exists(".") and ws.files.exists("data/deep/c.txt") and ws.files.exists("here/deep")
    assert not ws.files.exists("data/nope") and not ws.files.exists("top.txt/x")


def test_names_with_newlines_escapes_and_bytes_that_are_not_utf8_are_shown_escaped(ws):
    hostile = os.fsdecode(b"caf\xe9\n\x1b]52;c;AAAA\x07") + "\u202e"
    ws.file(hostile, b"x")
    raised = []
    for call in (lambda: ws.files.read(hostile + "/x"), lambda: ws.files.read(hostile, max_bytes=0)):
        with pytest.raises(WorkspaceError) as caught:
            call()
        raised.append(str(caught.value))
    for message in raised:
        assert "caf\\xe9\\n\\x1b]52;c;AAAA\\x07\\u202e" in message
        assert message.isprintable()
    assert ws.files.read(hostile) == b"x"
    assert [info.path for info in ws.files.list() if info.kind == "file"] == [hostile, "top.txt"]


def test_a_blob_of_another_length_than_recorded_is_an_error(ws, tmp_path):
    ws.file("short", b"0123456789", blob=b"01234")
    ws.file("long", b"0123", blob=b"0123456789")
    ws.file("huge", b"9876543210", size=TB)
    with pytest.raises(CheckpointError, match="holds 5 bytes, not the 10"):
        ws.files.read("short")
    with pytest.raises(CheckpointError, match="holds more than the 4"):
        ws.files.read("long")
    with pytest.raises(WorkspaceFileTooBig):  # a 1 TB claim: nothing is read, nothing reserved
        ws.files.read("huge")
    with pytest.raises(CheckpointError, match=f"holds 10 bytes, not the {TB}"):
        ws.files.read("huge", to=tmp_path / "huge.out")
    assert os.listdir(tmp_path) == ["state"]


def test_a_missing_blob_is_an_error_that_says_what_to_do(ws):
    ws.record.files["gone"] = ("f", 0o644, MTIME, "f" * 32)
    ws.record.blob_sizes["f" * 32] = 3
    with pytest.raises(CheckpointError, match="try again"):
        ws.files.read("gone")


def test_download_writes_a_file_into_a_directory_or_at_a_path_and_a_tree_into_a_directory(ws, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    assert ws.files.download("latest", out).bytes == 2560
    assert (out / "latest").read_bytes() == bytes(range(256)) * 10
    ws.files.download("/workspace/top.txt", tmp_path / "top.copy")
    assert (tmp_path / "top.copy").read_bytes() == b"top"

    report = ws.files.download(".", tmp_path / "all")

    assert set(report.skipped) == {"shadow", "up"}
    assert (tmp_path / "all/data/deep/c.txt").read_bytes() == b"c"
    assert os.readlink(tmp_path / "all/here") == "data"
    report = ws.files.download("here", tmp_path / "data-only")
    assert sorted(os.listdir(tmp_path / "data-only")) == ["a.bin", "deep", "empty"]


def test_ten_thousand_entries_are_listed_in_bounded_memory_without_reading_a_blob(tmp_path):
    ws = Workspace(tmp_path)
    for d in range(100):
        ws.dir(f"d{d:03}")
        for f in range(99):
            ws.record.files[f"d{d:03}/f{f:03}"] = ("f", 0o644, MTIME, "0" * 32)  # no such blob: never opened
    ws.record.blob_sizes["0" * 32] = TB

    tracemalloc.start()
    try:
        listed = ws.files.list(recursive=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert len(listed) == 10_000 and listed[1] == FileInfo("d000/f000", "file", TB, 0o644, MTIME / 1e9, None)
    assert peak < 16 << 20
    assert len(ws.files.list("d050")) == 99
