"""The workspace wired into the worker (host agent, tests/agent_process.py): the deltas' ``files``, the restore
(``restore_begin``, ``files_put``, ``restore_end``), ``file_write`` and ``file_remove``, one quota; hostile requests."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from agent_process import Agent

from orchestrator.agent import blob_format, framing, request_table


@pytest.fixture
def root(tmp_path: Path) -> Path:
    made = tmp_path / "ws"
    made.mkdir()
    return made


@pytest.fixture
def ws_agent(make_agent, root: Path) -> Agent:
    agent = make_agent(ORCH_WORKSPACE_DIR=str(root))
    first = run(agent, "pass")  # the first delta after the start says what the workspace holds: nothing
    assert first["checkpoint"]["files"] == {"changed": [], "deleted": [], "unsaved": {}}
    return agent


def run(agent: Agent, code: str) -> dict:
    reply, body = agent.run(code)
    assert reply["status"] == "ok", reply
    reply["blobs"] = blobs(reply, body)
    return reply


def blobs(reply: dict, body: bytes) -> dict[str, bytes]:
    """digest -> bytes of the reply's new blobs, each checked against its digest."""
    index = reply.get("checkpoint", {}).get("blobs", [])
    parts = framing.split_body(body, [entry["size"] for entry in index])
    found = {entry["digest"]: bytes(part) for entry, part in zip(index, parts, strict=True)}
    assert all(blob_format.blob_digest(data) == digest for digest, data in found.items())
    return found


def rows(reply: dict) -> dict[str, list]:
    return {row[0]: row for row in reply["checkpoint"]["files"]["changed"]}


def request(agent: Agent, kind: str, body: bytes = b"", **fields) -> dict:
    reply, reply_body = agent.request(kind, body, **fields)
    reply["blobs"] = blobs(reply, reply_body)
    return reply


def write(agent: Agent, path: str, data: bytes, mode: int = 0o644) -> dict:
    return request(agent, request_table.FILE_WRITE, data, path=path, mode=mode, checkpoint_timeout=10)


def remove(agent: Agent, path: str, recursive: bool = False) -> dict:
    return request(agent, request_table.FILE_REMOVE, path=path, recursive=recursive, checkpoint_timeout=10)


def files_put(agent: Agent, entries: list, body: bytes) -> dict:
    return request(agent, request_table.FILES_PUT, body, entries=entries, timeout=10)


# -- the deltas


def test_a_cells_file_is_in_its_checkpoint_and_an_unchanged_call_carries_no_files(ws_agent, root):
    reply = run(ws_agent, f"open({str(root / 'a.bin')!r}, 'wb').write(bytes(range(256)))")
    digest = blob_format.blob_digest(bytes(range(256)))
    st = os.lstat(root / "a.bin")
    assert rows(reply) == {"a.bin": ["a.bin", "f", stat.S_IMODE(st.st_mode), st.st_mtime_ns, digest, 256]}
    assert reply["blobs"] == {digest: bytes(range(256))} and reply["checkpoint"]["generation"] == 1
    unchanged = run(ws_agent, "x = 1")
    assert "files" not in unchanged["checkpoint"] and unchanged["checkpoint"]["generation"] == 2
    gone = run(ws_agent, f"import os; os.remove({str(root / 'a.bin')!r})")
    assert gone["checkpoint"]["files"] == {"changed": [], "deleted": ["a.bin"], "unsaved": {}}
    assert gone["checkpoint"]["generation"] == 3  # a file's change alone moves the generation


SLOW_READS = """
def _slow(root):
    import sys, time
    disk = sys.modules["orchestrator_agent.workspace_disk"]
    def read_file(*args):
        time.sleep(30)
    read_file.real = disk.read_file
    disk.read_file = read_file
    open(root + "/f", "wb").write(b"data")
_slow(%r)
del _slow
"""
FAST_READS = """
def _fast():
    import sys
    disk = sys.modules["orchestrator_agent.workspace_disk"]
    disk.read_file = disk.read_file.real
_fast()
del _fast
"""


def test_a_checkpoint_out_of_time_while_reading_files_leaves_them_to_the_next(ws_agent, root):
    reply, _ = ws_agent.run(SLOW_READS % str(root), checkpoint_timeout=0.5)
    assert reply["status"] == "ok" and reply["id"] in ws_agent.cell_done  # the checkpoint's clock ran
    assert "files" not in reply["checkpoint"] and reply["checkpoint"]["generation"] == 0
    reply = run(ws_agent, FAST_READS)
    assert list(rows(reply)) == ["f"] and reply["checkpoint"]["generation"] == 1
    assert reply["blobs"] == {blob_format.blob_digest(b"data"): b"data"}


def test_without_the_directory_the_workspace_is_off(make_agent, tmp_path):
    agent = make_agent(ORCH_WORKSPACE_DIR=str(tmp_path / "none"))
    assert "files" not in run(agent, "pass")["checkpoint"]
    reply = write(agent, "a", b"x")
    assert reply["status"] == "error" and "no workspace" in reply["reason"]
    assert "no workspace" in remove(agent, "a")["reason"]
    assert files_put(agent, [], b"")["status"] == "ok"
    assert "no workspace" in files_put(agent, [["a", "f", 0o644, 0, blob_format.blob_digest(b"x"), 1]], b"x")["reason"]


# -- restore


def test_a_restore_writes_the_stored_workspace_and_a_cell_reads_it(ws_agent, root):
    run(ws_agent, f"open({str(root / 'stale')!r}, 'w').write('from before')")
    data, digest = bytes(range(256)) * 4, blob_format.blob_digest(bytes(range(256)) * 4)
    empty = blob_format.blob_digest(b"")
    assert request(ws_agent, request_table.RESTORE_BEGIN, generation=7)["status"] == "ok"
    assert os.listdir(root) == []
    made = request(ws_agent, request_table.CONTEXT_CREATE, context="c", cwd=str(root / "contexts" / "c"), env={})
    assert made["status"] == "ok"  # its directory is there before the batch that holds it
    first = [
        ["contexts", "d", 0o755, 10**18, "", 0],
        ["contexts/c", "d", 0o700, 10**18, "", 0],
        ["d", "d", 0o750, 10**18, "", 0],
        ["d/a.bin", "f", 0o600, 10**18 + 5, digest, len(data)],
    ]
    assert files_put(ws_agent, first, data)["status"] == "ok"
    second = [["d/empty", "f", 0o644, 0, empty, 0], ["link", "l", 0o777, 10**18, "d/a.bin", 0]]
    assert files_put(ws_agent, second, b"")["status"] == "ok"
    assert request(ws_agent, request_table.RESTORE_END, generation=7)["status"] == "ok"
    assert stat.S_IMODE(os.stat(root / "d").st_mode) == 0o750 and os.stat(root / "d").st_mtime_ns == 10**18
    assert os.stat(root / "d" / "a.bin").st_mtime_ns == 10**18 + 5 and os.readlink(root / "link") == "d/a.bin"
    reply = run(ws_agent, f"open({str(root / 'link')!r}, 'rb').read() == {data!r}")
    assert reply["return_value"] == "True" and reply["checkpoint"]["generation"] == 7
    assert reply["checkpoint"]["files"] == {"changed": [], "deleted": [], "unsaved": {}}  # the store's, as it was
    assert "files" not in run(ws_agent, "pass")["checkpoint"]


def test_a_restore_without_files_put_leaves_an_empty_workspace(ws_agent, root):
    run(ws_agent, f"open({str(root / 'a')!r}, 'w').write('a')")
    request(ws_agent, request_table.RESTORE_BEGIN, generation=0)
    assert request(ws_agent, request_table.RESTORE_END, generation=0)["status"] == "ok"
    assert os.listdir(root) == [] and run(ws_agent, "pass")["checkpoint"]["files"]["changed"] == []


def test_a_fresh_worker_the_restores_begin_missed_empties_the_workspace_first(make_agent, root):
    (root / "left_by_a_killed_worker").write_text("x")  # restore_begin killed its worker: this one never got it
    agent = make_agent(ORCH_WORKSPACE_DIR=str(root))
    assert files_put(agent, [["a", "f", 0o644, 0, blob_format.blob_digest(b"a"), 1]], b"a")["status"] == "ok"
    assert request(agent, request_table.RESTORE_END, generation=3)["status"] == "ok"
    assert os.listdir(root) == ["a"] and run(agent, "pass")["checkpoint"]["files"]["changed"] == []


@pytest.mark.parametrize(
    ("entries", "body", "reason"),
    [
        ([["../x", "f", 0o644, 0, "r", 1]], b"x", "'../x'"),
        ([["/x", "f", 0o644, 0, "r", 1]], b"x", "'/x'"),
        ([["x", "f", 0o644, 0, "r", 2]], b"x", "must hold its files' bytes"),  # a size that lies about the body
        ([["x", "f", 0o644, 0, 5, 1]], b"x", "a workspace entry is [path"),
        ([["a/x", "f", 0o644, 0, "r", 1]], b"x", "'a/x' has no directory"),
        ([["x", "l", 0o777, 0, "", 0]], b"", "bad link target"),
        ([["x", "d", 0o755, 0, "", 0], ["x", "d", 0o755, 0, "", 0]], b"", "'x' comes twice"),
    ],
)
def test_a_bad_files_put_is_an_error_naming_the_entry_and_writes_nothing_outside(ws_agent, root, entries, body, reason):
    request(ws_agent, request_table.RESTORE_BEGIN, generation=0)
    reply = files_put(ws_agent, entries, body)
    assert reply["status"] == "error" and reason in reply["reason"], reply
    assert sorted(os.listdir(root.parent)) == ["ws"] and not Path("/x").exists()


# -- file_write and file_remove


def test_file_write_makes_its_directories_and_checkpoints_the_file(ws_agent, root):
    reply = write(ws_agent, "deep/er/f.txt", b"hello", 0o640)
    assert reply["type"] == request_table.STATE_REPLY and reply["status"] == "ok"
    assert (root / "deep" / "er" / "f.txt").read_bytes() == b"hello"
    assert stat.S_IMODE(os.stat(root / "deep" / "er" / "f.txt").st_mode) == 0o640
    assert set(rows(reply)) == {"deep", "deep/er", "deep/er/f.txt"}
    digest = blob_format.blob_digest(b"hello")
    assert rows(reply)["deep/er/f.txt"][2:] == [0o640, os.stat(root / "deep/er/f.txt").st_mtime_ns, digest, 5]
    assert reply["blobs"] == {digest: b"hello"}
    again = write(ws_agent, str(root / "deep" / "er" / ".." / "g"), b"")  # absolute under the workspace
    assert again["status"] == "ok" and set(rows(again)) == {"deep", "deep/g"} and (root / "deep" / "g").exists()
    assert not list(root.glob("**/.orch-*"))  # the temporary name is gone


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("../x", "leads out of the workspace"),
        ("a/../../x", "leads out of the workspace"),
        ("/etc/x", "is outside the workspace"),
        (".", "the workspace itself"),
        ("a\0b", "NUL"),
        ("n" * 256, "longer than 255 bytes"),
        ("file/x", "file is not a directory"),
        ("dir", "dir is a directory"),
    ],
)
def test_file_write_refuses_a_bad_path_and_writes_nothing(ws_agent, root, path, reason):
    write(ws_agent, "file", b"f")
    (root / "dir").mkdir()
    reply = write(ws_agent, path, b"x")
    assert reply["status"] == "error" and reason in reply["reason"], reply
    assert "checkpoint" not in reply and sorted(os.listdir(root)) == ["dir", "file"] and os.listdir(root / "dir") == []
    assert sorted(os.listdir(root.parent)) == ["ws"]


def test_file_write_never_goes_through_a_link_a_cell_planted(ws_agent, root, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "target").write_bytes(b"keep")
    run(ws_agent, f"import os; os.symlink({str(outside)!r}, {str(root / 'out')!r})")
    run(ws_agent, f"import os; os.symlink({str(outside / 'target')!r}, {str(root / 'last')!r})")
    reply = write(ws_agent, "out/target", b"overwritten")
    assert reply["status"] == "error" and "out is a symbolic link" in reply["reason"]
    assert write(ws_agent, "out/new/x", b"x")["status"] == "error"
    reply = write(ws_agent, "last", b"mine")  # the link at the name is replaced, not written through
    assert reply["status"] == "ok" and rows(reply)["last"][1] == "f" and (root / "last").read_bytes() == b"mine"
    assert sorted(os.listdir(outside)) == ["target"] and (outside / "target").read_bytes() == b"keep"


def test_file_write_past_the_bound_of_one_file_writes_nothing(make_agent, root):
    agent = make_agent(ORCH_WORKSPACE_DIR=str(root), ORCH_WORKSPACE_BYTES="10")
    reply = write(agent, "big", b"x" * 11)
    assert reply["status"] == "error" and "at most 10 bytes" in reply["reason"] and os.listdir(root) == []


def test_file_remove_a_file_a_link_and_a_directory(ws_agent, root, tmp_path):
    write(ws_agent, "d/e/f", b"f")
    run(ws_agent, f"import os; os.symlink({str(tmp_path)!r}, {str(root / 'link')!r})")
    reply = remove(ws_agent, "link")
    assert reply["status"] == "ok" and reply["checkpoint"]["files"]["deleted"] == ["link"] and tmp_path.exists()
    reply = remove(ws_agent, "d")
    assert reply["status"] == "error" and "not empty (remove it recursively)" in reply["reason"]
    assert remove(ws_agent, "d/e/f")["checkpoint"]["files"]["deleted"] == ["d/e/f"]
    write(ws_agent, "d/e/g", b"g")
    os.chmod(root / "d" / "e", 0)  # a directory the cell made unreadable goes too
    reply = remove(ws_agent, "d", recursive=True)
    assert reply["status"] == "ok" and reply["checkpoint"]["files"]["deleted"] == ["d"] and os.listdir(root) == []
    reply = remove(ws_agent, "d")
    assert reply["status"] == "error" and reply["reason"] == "no such file or directory in the workspace: d"
    assert remove(ws_agent, "../ws")["reason"] == "'../ws' leads out of the workspace"


def test_file_remove_never_goes_through_a_link(ws_agent, root, tmp_path):
    (tmp_path / "precious").write_text("keep")
    run(ws_agent, f"import os; os.symlink({str(tmp_path)!r}, {str(root / 'out')!r})")
    reply = remove(ws_agent, "out/precious")
    assert reply["status"] == "error" and "out is a symbolic link" in reply["reason"]
    assert (tmp_path / "precious").read_text() == "keep"


def test_a_file_request_in_a_context_checkpoints_there(ws_agent, root):
    request(ws_agent, request_table.CONTEXT_CREATE, context="c", cwd=str(root / "contexts" / "c"), env={})
    reply = request(ws_agent, request_table.FILE_WRITE, b"x", path="f", mode=0o644, context="c", checkpoint_timeout=9)
    assert reply["status"] == "ok" and "f" in rows(reply) and (root / "f").exists()  # not under the context's cwd


# -- one quota


def test_values_and_files_share_the_checkpoint_quota(make_agent, root):
    agent = make_agent(ORCH_WORKSPACE_DIR=str(root), ORCH_CHECKPOINT_QUOTA="100000")
    run(agent, "pass")
    reply = write(agent, "a", b"a" * 60_000)
    assert "a" in rows(reply)
    reply = run(agent, "v = b'v' * 60_000")  # the file's 60,000 bytes leave no room for the value
    assert reply["checkpoint"]["vars"] == {} and "quota" in reply["checkpoint"]["unsaved"]["v"]
    remove(agent, "a")
    reply = run(agent, "pass")
    assert list(reply["checkpoint"]["vars"]) == ["v"]  # freed: the value is saved now
    reply = write(agent, "b", b"b" * 60_000)  # and the value's bytes leave no room for the file
    assert reply["checkpoint"]["files"]["unsaved"] == {"b": "the checkpoint quota has no room for its 60000 bytes"}
    assert reply["blobs"] == {}
