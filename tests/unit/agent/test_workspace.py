"""The workspace's part of the checkpoint: deltas from inotify events or scans, race-safe reads, restore."""

from __future__ import annotations

import os
import socket
import stat
import threading
import time

import pytest

from orchestrator.agent import blob_format, checkpoint, checkpoint_names, workspace
from orchestrator.agent import workspace_disk as disk
from orchestrator.agent import workspace_inotify as inotify
from orchestrator.agent.protocol import BadRequest

BIG = 1 << 40


@pytest.fixture
def root(tmp_path):
    path = tmp_path / "ws"
    path.mkdir()
    return path


def started(root, max_entries=100_000, max_bytes=BIG, max_file_bytes=BIG):
    ws = workspace.Workspace(str(root), max_entries, max_bytes, max_file_bytes)
    ws.start()
    return ws


@pytest.fixture
def ws(root):
    made = started(root)
    # the first delta says what the workspace holds, unsaved included: the record may name stale entries
    assert made.delta(set()) == ({"changed": [], "deleted": [], "unsaved": {}}, [])
    assert made.delta(set()) == (None, [])
    yield made
    made.close()


def rows(files):
    return {row[0]: row for row in files["changed"]}


def contents(blobs):
    out = {}
    for blob in blobs:
        data = b"".join(blob.parts)
        assert blob_format.blob_digest(data) == blob.digest and len(data) == blob.size
        out[blob.digest] = data
    return out


def write(path, data, mode=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mode is not None:
        path.chmod(mode)


# -- what a delta says


def test_a_new_file_is_sent_once_and_an_unchanged_workspace_says_nothing(ws, root):
    write(root / "a.txt", b"hello")
    files, blobs = ws.delta(set())
    st = os.lstat(root / "a.txt")
    digest = blob_format.blob_digest(b"hello")
    row = ["a.txt", "f", stat.S_IMODE(st.st_mode), st.st_mtime_ns, digest, 5]
    assert files == {"changed": [row], "deleted": [], "unsaved": {}}
    assert contents(blobs) == {digest: b"hello"}
    assert ws.delta(set()) == (None, [])


def test_change_rename_delete(ws, root):
    write(root / "a", b"one")
    ws.delta(set())
    write(root / "a", b"two")
    files, blobs = ws.delta(set())
    assert rows(files)["a"][4] == blob_format.blob_digest(b"two") and contents(blobs)
    os.rename(root / "a", root / "b")
    files, blobs = ws.delta(set())
    assert files["deleted"] == ["a"] and list(rows(files)) == ["b"]
    assert blobs == []  # the store holds these bytes already
    os.unlink(root / "b")
    assert ws.delta(set())[0] == {"changed": [], "deleted": ["b"], "unsaved": {}}


def test_nested_directories_and_a_deleted_tree_listed_once(ws, root):
    write(root / "x/y/z/deep.bin", b"\0\1\2")
    files, _ = ws.delta(set())
    assert [row[:2] for row in files["changed"]] == [["x", "d"], ["x/y", "d"], ["x/y/z", "d"], ["x/y/z/deep.bin", "f"]]
    write(root / "x/y/z/later", b"")  # made in a directory watched since the last delta
    assert "x/y/z/later" in rows(ws.delta(set())[0])
    for path in sorted(root.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    assert ws.delta(set())[0]["deleted"] == ["x"]


def test_a_directory_made_and_filled_between_deltas_is_found_whole(ws, root):
    os.makedirs(root / "p/q")
    write(root / "p/q/r", b"r")
    os.rename(root / "p", root / "moved")
    files, _ = ws.delta(set())
    assert set(rows(files)) == {"moved", "moved/q", "moved/q/r"}
    write(root / "moved/q/s", b"s")  # the moved directory's watch follows it
    assert set(rows(ws.delta(set())[0])) == {"moved/q", "moved/q/s"}


def test_a_directory_swapped_for_another_of_the_same_name(ws, root):
    write(root / "a/old", b"old")
    write(root / "b/new", b"new")
    ws.delta(set())
    os.rename(root / "a", root / "gone")
    os.rename(root / "b", root / "a")
    files, _ = ws.delta(set())
    assert set(rows(files)) >= {"a", "a/new", "gone", "gone/old"} and files["deleted"] == ["a/old", "b"]
    write(root / "a/later", b"later")
    assert set(rows(ws.delta(set())[0])) == {"a", "a/later"}


def test_a_directory_that_became_a_file_loses_its_entries(ws, root):
    write(root / "d/x", b"x")
    write(root / "d/sub/y", b"y")
    ws.delta(set())
    for path in (root / "d/sub/y", root / "d/sub", root / "d/x", root / "d"):
        path.rmdir() if path.is_dir() else path.unlink()
    write(root / "d", b"now a file")
    files, _ = ws.delta(set())
    assert [row[:2] for row in files["changed"]] == [["d", "f"]] and files["deleted"] == ["d/sub", "d/x"]


def test_empty_and_binary_files(ws, root):
    binary = bytes(range(256)) * 1000
    write(root / "empty", b"")
    write(root / "binary", binary)
    files, blobs = ws.delta(set())
    assert rows(files)["empty"][4:] == [blob_format.blob_digest(b""), 0]
    assert contents(blobs)[rows(files)["binary"][4]] == binary


def test_identical_files_share_one_blob_and_held_blobs_are_not_sent(ws, root):
    for name in ("one", "two", "three"):
        write(root / name, b"same bytes")
    write(root / "value", b"a value has these")
    files, blobs = ws.delta({blob_format.blob_digest(b"a value has these")})
    assert len({row[4] for row in files["changed"]}) == 2
    assert list(contents(blobs).values()) == [b"same bytes"]


def test_links_are_saved_as_their_target_and_never_followed(ws, root, tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"do not read")
    (tmp_path / "outside").mkdir()
    write(tmp_path / "outside/also", b"do not read either")
    write(root / "inside", b"in")
    os.symlink("inside", root / "to_inside")
    os.symlink(str(secret), root / "to_secret")
    os.symlink(str(tmp_path / "outside"), root / "to_dir")
    files, blobs = ws.delta(set())
    found = rows(files)
    assert found["to_inside"][1:2] + found["to_inside"][4:] == ["l", "inside", 0]
    assert found["to_secret"][4] == str(secret) and found["to_dir"][1] == "l"
    assert set(found) == {"inside", "to_inside", "to_secret", "to_dir"}
    assert list(contents(blobs).values()) == [b"in"]


def test_modes_and_mtimes(ws, root):
    write(root / "script.sh", b"#!/bin/sh\n", mode=0o750)
    os.mkdir(root / "private", 0o700)
    os.utime(root / "script.sh", ns=(1, 1_733_600_000_123_456_789))
    files, _ = ws.delta(set())
    assert rows(files)["script.sh"][2:4] == [0o750, 1_733_600_000_123_456_789]
    assert rows(files)["private"][2] == 0o700
    os.chmod(root / "script.sh", 0o4755)  # setuid is dropped: the mount is nosuid
    assert rows(ws.delta(set())[0])["script.sh"][2] == 0o755
    os.utime(root / "script.sh", ns=(0, -5))  # before 1970: the record holds 0
    assert rows(ws.delta(set())[0])["script.sh"][3] == 0


def test_names_that_are_not_utf8_round_trip(ws, root, tmp_path):
    raw = os.fsencode(str(root)) + b"/caf\xe9\n\x1b[31m"
    with open(raw, "wb") as handle:
        handle.write(b"latin-1")
    files, blobs = ws.delta(set())
    (path,) = rows(files)
    assert path == "caf\udce9\n\x1b[31m" and disk.os_name(path) == b"caf\xe9\n\x1b[31m"
    target = tmp_path / "restored"
    target.mkdir()
    restored = workspace.Workspace(str(target), 100, BIG, BIG)
    restored.restore(files["changed"], lambda ref, size: contents(blobs)[ref])
    assert os.listdir(os.fsencode(str(target))) == [b"caf\xe9\n\x1b[31m"]


def test_a_delta_that_changed_nothing_looks_at_no_file(ws, root, monkeypatch):
    for index in range(10_000):
        (root / f"f{index:05d}").write_bytes(b"")
    ws.delta(set())
    calls = []
    for name in ("stat", "lstat", "scandir", "listdir", "open"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    started_at = time.perf_counter()
    assert ws.delta(set()) == (None, [])
    took = time.perf_counter() - started_at
    assert calls == [] and took < 0.05  # measured: about 10 microseconds
    (root / "f00007").write_bytes(b"x")
    assert list(rows(ws.delta(set())[0])) == ["f00007"]
    assert calls.count("stat") < 10  # one file looked at, not ten thousand


# -- what cannot be saved


def test_a_fifo_and_a_socket_are_named_unsaved_and_never_opened(ws, root):
    os.mkfifo(root / "fifo")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(root / "sock"))
    try:
        files, _ = ws.delta(set())
    finally:
        server.close()
    assert files["unsaved"] == {"fifo": "a FIFO cannot be saved", "sock": "a socket cannot be saved"}
    assert files["changed"] == []
    assert ws.delta(set()) == (None, [])  # the same unsaved again is no news


def test_a_saved_file_that_becomes_unsaveable_keeps_its_last_version(root):
    ws = started(root, max_bytes=10)
    write(root / "a", b"12345")
    assert ws.delta(set())[0]["changed"]
    write(root / "a", b"12345678901")
    files, blobs = ws.delta(set())
    reason = "the workspace saves at most 10 bytes of files; its last saved version is kept"
    assert files == {"changed": [], "deleted": [], "unsaved": {"a": reason}} and blobs == []
    write(root / "a", b"1")
    files, _ = ws.delta(set())
    assert list(rows(files)) == ["a"] and files["unsaved"] == {}


def test_a_file_the_checkpoint_quota_has_no_room_for_is_unsaved(ws, root):
    write(root / "a", b"x" * 10)
    write(root / "b", b"y" * 10)
    write(root / "c", b"x" * 10)  # a's bytes: no room needed
    files, blobs = ws.delta(set(), limit=15)
    assert set(rows(files)) == {"a", "c"} and len(blobs) == 1 and ws.blob_bytes == 10
    assert files["unsaved"] == {"b": "the checkpoint quota has no room for its 10 bytes"}
    write(root / "a", b"z" * 10)  # a new version of a file whose old blob c still holds: no room
    files, _ = ws.delta(set(), limit=15)
    assert list(rows(files)) == [] and "a" in files["unsaved"]
    os.unlink(root / "c")
    files, _ = ws.delta(set(), limit=15)  # c's blob was a's old one: freed by the new version in the same delta
    assert files["deleted"] == ["c"] and list(rows(files)) == ["a"] and ws.blob_bytes == 10
    os.unlink(root / "a")
    write(root / "d", b"d")
    files, _ = ws.delta(set(), limit=15)  # what a delta deletes frees room for what it saves
    assert files["deleted"] == ["a"] and set(rows(files)) == {"b", "d"} and files["unsaved"] == {}
    assert ws.blob_bytes == 11


def test_a_hard_link_set_is_unsaved_until_one_name_remains(ws, root):
    write(root / "a", b"linked")
    os.link(root / "a", root / "b")
    files, _ = ws.delta(set())
    assert files["changed"] == [] and set(files["unsaved"]) == {"a", "b"}
    assert "2 hard links" in files["unsaved"]["a"]
    os.unlink(root / "b")
    files, _ = ws.delta(set())
    assert list(rows(files)) == ["a"] and files["unsaved"] == {}


def test_a_file_swapped_for_a_link_before_it_is_read_is_saved_as_the_link(ws, root, tmp_path, monkeypatch):
    secret = tmp_path / "shadow"
    secret.write_bytes(b"root:secret")
    write(root / "victim", b"harmless")
    real_open = os.open

    def racing_open(path, flags, *args, **kwargs):
        if path == b"victim" and not (root / "victim").is_symlink():
            os.unlink(root / "victim")
            os.symlink(str(secret), root / "victim")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", racing_open)
    files, blobs = ws.delta(set())
    assert rows(files)["victim"][1] == "l" and rows(files)["victim"][4] == str(secret)
    assert blobs == []


def test_a_directory_swapped_for_a_link_out_is_never_entered(ws, root, tmp_path):
    write(root / "d/mine", b"mine")
    ws.delta(set())
    write(tmp_path / "elsewhere/theirs", b"not the workspace's")
    os.rename(root / "d", tmp_path / "moved-away")
    os.symlink(str(tmp_path / "elsewhere"), root / "d")
    write(tmp_path / "moved-away/later", b"written outside after the move")
    files, blobs = ws.delta(set())
    assert files["changed"][0][:2] == ["d", "l"] and len(files["changed"]) == 1
    assert files["deleted"] == ["d/mine"] and blobs == []


def test_a_file_growing_while_it_is_read_is_unsaved(ws, root, monkeypatch):
    path = root / "log"
    write(path, b"x" * (1 << 20))
    turn, done, stop = threading.Semaphore(0), threading.Semaphore(0), threading.Event()
    real_readv = os.readv

    def grow():  # another thread of the cell appends while the worker reads: once per read
        with open(path, "ab", buffering=0) as handle:
            while turn.acquire(timeout=5) and not stop.is_set():
                handle.write(b"y" * 100)
                done.release()

    def racing_readv(fd, buffers):
        turn.release()
        done.acquire(timeout=5)
        return real_readv(fd, buffers)

    writer = threading.Thread(target=grow)
    writer.start()
    monkeypatch.setattr(os, "readv", racing_readv)
    try:
        files, blobs = ws.delta(set())
    finally:
        monkeypatch.setattr(os, "readv", real_readv)
        stop.set()
        turn.release()
        writer.join()
    assert files["unsaved"] == {"log": "it kept changing while it was read"} and blobs == []
    files, blobs = ws.delta(set())  # once it stopped growing, the next delta saves it whole
    assert rows(files)["log"][5] == path.stat().st_size == len(contents(blobs)[rows(files)["log"][4]])


def test_a_sparse_huge_file_is_unsaved_without_reading_it(root):
    ws = started(root, max_file_bytes=1 << 20)
    with open(root / "huge", "wb") as handle:
        handle.truncate(1 << 40)
    started_at = time.perf_counter()
    files, blobs = ws.delta(set())
    assert time.perf_counter() - started_at < 1
    assert files["unsaved"] == {"huge": "the file is larger than 1048576 bytes"} and blobs == []


def test_entries_past_the_bound_are_left_out_in_path_order(root):
    ws = started(root, max_entries=10_000)
    assert ws.delta(set())[0] == {"changed": [], "deleted": [], "unsaved": {}}
    names = [f"e{index:05d}" for index in range(20_000)]
    for name in reversed(names):
        (root / name).write_bytes(b"")
    files, blobs = ws.delta(set())
    with open("/proc/sys/fs/inotify/max_queued_events") as limit:
        queued = int(limit.read())
    if queued < 20_000:  # more events than the queue holds: the events are not trusted, the tree is walked
        assert ws.last_scan == "inotify's queue overflowed"
    assert [row[0] for row in files["changed"]] == names[:10_000]
    assert len(files["unsaved"]) == checkpoint_names.MAX_UNSAVED_NAMES  # the rest counted in "+N more"
    assert files["unsaved"]["e10000"] == "the workspace saves at most 10000 entries"
    assert len(blobs) == 1  # twenty thousand empty files: one blob
    os.unlink(root / "e00000")
    files, _ = ws.delta(set())
    assert files["deleted"] == ["e00000"] and list(rows(files)) == ["e10000"]


def test_a_directory_past_the_bound_is_named_once_and_saved_when_room_comes(root):
    ws = started(root, max_entries=2)
    write(root / "a", b"a")
    write(root / "b", b"b")
    write(root / "c/x", b"x")
    files, _ = ws.delta(set())
    assert list(rows(files)) == ["a", "b"]
    assert files["unsaved"] == {"c": "the workspace saves at most 2 entries (with everything in it)"}
    os.unlink(root / "a")
    files, _ = ws.delta(set())
    assert list(rows(files)) == ["c"] and files["unsaved"] == {"c/x": "the workspace saves at most 2 entries"}
    os.unlink(root / "b")
    files, _ = ws.delta(set())
    assert list(rows(files)) == ["c/x"] and files["unsaved"] == {}


def test_a_path_past_4096_bytes_is_unsaved_with_everything_in_it(ws, root):
    fd = os.open(root, os.O_RDONLY)
    for index in range(21):  # 200-byte names: past PATH_MAX, so made one level at a time
        name = f"{index:02d}" * 100
        os.mkdir(name, dir_fd=fd)
        fd, parent = os.open(name, os.O_RDONLY, dir_fd=fd), fd
        os.close(parent)
    os.close(os.open("file", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    os.close(fd)
    files, _ = ws.delta(set())
    assert len(files["changed"]) == 20
    ((unsaved, reason),) = files["unsaved"].items()
    assert unsaved.count("/") == 20 and reason == "a path is longer than 4096 bytes (with everything in it)"


# -- when events cannot be trusted


def test_a_faked_overflow_makes_a_scan_that_finds_what_events_missed(ws, root, monkeypatch):
    write(root / "kept", b"1")
    ws.delta(set())
    monkeypatch.setattr(inotify.Inotify, "read", lambda self: [(-1, inotify.IN_Q_OVERFLOW, b"")])
    write(root / "kept", b"2")
    write(root / "new", b"3")
    files, _ = ws.delta(set())
    assert ws.last_scan == "inotify's queue overflowed" and set(rows(files)) == {"kept", "new"}


def test_the_inotify_descriptor_closed_and_reused_behind_its_back(ws, root, tmp_path):
    write(root / "a", b"1")
    ws.delta(set())
    lost = ws._events.fd
    os.close(lost)
    other = tmp_path / "cells-file"
    other.write_bytes(b"the cell's own file")
    reused = os.open(other, os.O_RDONLY)
    try:
        assert reused == lost
        write(root / "a", b"2")
        files, _ = ws.delta(set())
        assert ws.last_scan == "the inotify descriptor was closed or replaced" and list(rows(files)) == ["a"]
        assert os.read(reused, 100) == b"the cell's own file"  # its file is untouched: not read, not closed
        write(root / "b", b"3")
        assert list(rows(ws.delta(set())[0])) == ["b"] and ws.last_scan.endswith("replaced")
    finally:
        os.close(reused)


def test_a_descriptor_put_over_the_inotify_one_is_neither_read_nor_closed(ws, root):
    write(root / "a", b"1")
    ws.delta(set())
    read_end, write_end = os.pipe()
    os.write(write_end, b"the cell's pipe")
    replaced = os.dup2(read_end, ws._events.fd)
    write(root / "a", b"2")
    files, _ = ws.delta(set())
    assert ws.last_scan == "the inotify descriptor was closed or replaced" and list(rows(files)) == ["a"]
    assert os.read(replaced, 100) == b"the cell's pipe"
    for fd in (read_end, write_end, replaced):
        os.close(fd)


def test_without_inotify_every_delta_scans(root, monkeypatch):
    monkeypatch.setattr(inotify.Inotify, "open", classmethod(lambda cls: None))
    ws = started(root)
    ws.delta(set())
    write(root / "d/f", b"x")
    assert set(rows(ws.delta(set())[0])) == {"d", "d/f"} and ws.last_scan == "no inotify"
    os.unlink(root / "d/f")
    assert ws.delta(set())[0]["deleted"] == ["d/f"]


def test_a_directory_without_a_watch_makes_every_delta_scan(ws, root, monkeypatch):
    def refuse(self, dir_fd, path):
        raise inotify.WatchFailed("No space left on device")

    monkeypatch.setattr(inotify.Inotify, "add", refuse)
    os.mkdir(root / "d")
    ws.delta(set())
    write(root / "d/f", b"x")
    assert "d/f" in rows(ws.delta(set())[0]) and ws.last_scan == "a directory could not be watched"


def test_a_delta_cut_short_changes_nothing_and_the_next_one_walks_the_tree(ws, root, monkeypatch):
    write(root / "a", b"1")
    write(root / "b", b"1")
    ws.delta(set())
    write(root / "a", b"2")
    os.unlink(root / "b")
    real = disk.read_file

    def out_of_time(*args):
        raise KeyboardInterrupt  # the worker's checkpoint timer (SIGUSR2)

    monkeypatch.setattr(disk, "read_file", out_of_time)
    with pytest.raises(KeyboardInterrupt):
        ws.delta(set())
    monkeypatch.setattr(disk, "read_file", real)
    files, blobs = ws.delta(set())
    assert ws.last_scan == "the last delta did not finish"
    assert list(rows(files)) == ["a"] and files["deleted"] == ["b"] and contents(blobs)


def test_a_missing_workspace_directory_holds_nothing(tmp_path):
    ws = started(tmp_path / "not-mounted")
    assert ws.delta(set())[0] == {"changed": [], "deleted": [], "unsaved": {}}
    assert ws.delta(set()) == (None, [])
    write(tmp_path / "not-mounted/late", b"mounted after the worker started")
    assert list(rows(ws.delta(set())[0])) == ["late"]


# -- restore


def tree(root):
    """Everything under ``root`` as lstat saw it: kind, mode, mtime and content or target."""
    out = {}
    for directory, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(directory, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                body = os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as handle:
                    body = handle.read()
            else:
                body = None
            out[os.path.relpath(path, root)] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_mtime_ns, body)
    return out


def test_restore_writes_the_delta_back_byte_identical(ws, root, tmp_path):
    write(root / "data/a.bin", os.urandom(100_000), mode=0o600)
    write(root / "data/empty", b"")
    write(root / "data/copy", b"same")
    write(root / "other/copy", b"same")
    os.symlink("data/a.bin", root / "latest")
    os.symlink("/etc/passwd", root / "outside")
    os.mkdir(root / "locked")
    write(root / "locked/inner", b"inner")
    os.chmod(root / "locked", 0o500)
    os.utime(root / "data", ns=(5, 1_000_000_000_000_000_007))
    files, blobs = ws.delta(set())
    bodies = contents(blobs)
    target = tmp_path / "restored"
    target.mkdir()
    write(target / "stale/file", b"what a dead sandbox left")
    restored = workspace.Workspace(str(target), 100, BIG, BIG)
    restored.start()
    restored.begin_restore()
    rows_sorted = sorted(files["changed"])
    half = len(rows_sorted) // 2
    restored.put(rows_sorted[:half][::-1], lambda ref, size: bodies[ref])  # a batch is sorted by its reader
    restored.put(rows_sorted[half:], lambda ref, size: bodies[ref])
    restored.finish_restore()
    assert tree(target) == tree(root)
    assert restored.delta(set()) == ({"changed": [], "deleted": [], "unsaved": {}}, [])
    assert restored.last_scan == "the workspace was restored"
    write(target / "data/new", b"after")
    assert set(rows(restored.delta(set())[0])) == {"data", "data/new"}
    restored.close()


def test_restore_refuses_entries_it_cannot_write_exactly(root):
    ws = workspace.Workspace(str(root), 100, BIG, BIG)
    digest = blob_format.blob_digest(b"x")
    for entries in (
        [["a/b", "f", 0o644, 0, digest, 1]],  # no directory for it
        [["../out", "f", 0o644, 0, digest, 1]],
        [["a", "f", 0o644, 0, digest, 1], ["a", "d", 0o755, 0, "", 0]],
        [["a", "f", 0o644, 0, digest, 2]],  # the content is not that size
        [["a", "f", 0o6755, 0, digest, 1]],
        [["a", "l", 0o777, 0, "", 0]],
    ):
        with pytest.raises(BadRequest):
            ws.restore(entries, lambda ref, size: b"x")
    assert os.listdir(root) in ([], ["a"])


def test_checkpoint_adds_the_files_to_the_values_delta(ws, root):
    tracker = checkpoint.Tracker(quota=1000)
    description, parts = tracker.delta({"v": b"shared bytes"})
    value_blob = b"".join(parts)
    description, parts = tracker.delta({"v": b"shared bytes"})
    assert description["vars"] == {} and description["generation"] == 1
    write(root / "same", value_blob)  # the bytes of the value's blob: not sent again
    write(root / "new", b"new file")
    write(root / "too_big", b"z" * 2000)
    ws.checkpoint(description, parts, tracker)
    assert description["generation"] == tracker.generation == 2
    assert set(rows(description["files"])) == {"same", "new"}
    assert description["blobs"] == [{"digest": blob_format.blob_digest(b"new file"), "size": 8}]
    assert b"".join(parts) == b"new file"
    assert description["files"]["unsaved"] == {"too_big": "the checkpoint quota has no room for its 2000 bytes"}
    before = dict(description)
    ws.checkpoint(description, parts, tracker)  # nothing changed since: nothing added
    assert description == before


def test_a_checkpoint_out_of_time_leaves_the_files_to_the_next_one(ws, root, monkeypatch):
    tracker = checkpoint.Tracker()
    write(root / "f", b"f")
    real = disk.read_file

    def out_of_time(*args):
        raise KeyboardInterrupt  # the worker's SIGUSR2 while armed

    monkeypatch.setattr(disk, "read_file", out_of_time)
    description, parts = tracker.delta({})
    ws.checkpoint(description, parts, tracker)
    assert "files" not in description and tracker.generation == 0
    monkeypatch.setattr(disk, "read_file", real)
    description, parts = tracker.delta({})
    ws.checkpoint(description, parts, tracker)
    assert list(rows(description["files"])) == ["f"] and description["generation"] == 1 and parts == [b"f"]
