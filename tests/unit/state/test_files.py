"""The workspace's ``files`` map without an engine: its rules, a delta applied, the record round trip, commits with
files (blobs, quota, bounds, unsaved), history, rewind, fork, and hostile deltas (each refused, nothing stored)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import ledger_support
import pytest

from orchestrator.errors import CheckpointError, CheckpointLimitExceeded, CheckpointQuotaExceeded, ProtocolError
from orchestrator.state import files
from orchestrator.state.ledger import CheckpointLedger
from orchestrator.state.store import SessionStore
from orchestrator.wire.replies import parse_delta

A, B, C = "a" * 32, "b" * 32, "c" * 32
CONTENT = {A: b"alpha", B: b"bravo!", C: b"c" * 40}
T = 1_733_600_000_000_000_000
DIR = ("d", 0o755, T, "")
ODD = ["\udcc3\udca9", "\ud800", 7]  # "é" as two escaped bytes (a second key for "é"), a lone surrogate, no str


def f(ref: str, mode: int = 0o644) -> files.Entry:
    return ("f", mode, T, ref)


def change(path: str, entry: files.Entry, size: int | None = None) -> list[object]:
    """The wire form of a changed entry (a file's size from ``CONTENT`` unless given)."""
    kind, mode, mtime_ns, ref = entry
    return [path, kind, mode, mtime_ns, ref, (len(CONTENT[ref]) if kind == "f" else 0) if size is None else size]


def header(
    generation: int,
    changed: Sequence[list[object]] = (),
    deleted: Sequence[str] = (),
    sent: Sequence[str] = (),
    unsaved: dict[str, str] | None = None,
) -> tuple[dict, bytearray]:
    """A reply's header carrying a checkpoint with ``files``, and its body (the blobs ``sent``)."""
    checkpoint = {
        "generation": generation,
        "blobs": [{"digest": d, "size": len(CONTENT[d])} for d in sent],
        "vars": {},
        "deleted": [],
        "unsaved": {},
        "files": {"changed": list(changed), "deleted": list(deleted), "unsaved": dict(unsaved or {})},
    }
    return {"checkpoint": checkpoint}, bytearray(b"".join(CONTENT[d] for d in sent))


def commit(ledger: CheckpointLedger, *args, **kwargs) -> dict[str, str]:
    """Parse a reply's checkpoint as the controller does, and commit it."""
    reply, body = header(*args, **kwargs)
    return ledger.commit(parse_delta(reply), body)


@pytest.fixture
def ledger(store):
    ledger = CheckpointLedger.create(store, ledger_support.new_record("s-files"), 10_000, keep=5)
    commit(
        ledger,
        1,
        [change("data", DIR), change("data/a.csv", f(A)), change("latest", ("l", 0o777, T, "data/a.csv"))],
        sent=[A],
    )
    return ledger


def blob_files(store: SessionStore, session_id: str = "s-files") -> set[str]:
    return set(os.listdir(store.root / session_id / "blobs"))


# ---------------------------------------------------------------- the rules


@pytest.mark.parametrize(
    "path",
    ["a", "a/b.txt", "ü/ß", "caf\udce9", "x" * 255, "/".join(["y" * 200] * 20), "a b/-c", ".hidden", "..."],
)
def test_valid_paths(path):
    assert files.path_problem(path) is None


@pytest.mark.parametrize(
    "path",
    ["", "/abs", "a/", "a//b", ".", "a/./b", "..", "a/../b", "a\0b", "x" * 256, "/".join(["y" * 200] * 21), *ODD],
)
def test_invalid_paths(path):
    """Empty, '.' or '..' components, NUL, past NAME_MAX or PATH_MAX, and text that is no name's one form."""
    assert files.path_problem(path) is not None


@pytest.mark.parametrize(
    ("entry", "ok"),
    [
        (f(A), True),
        (DIR, True),
        (("l", 0o777, 0, "/etc/shadow"), True),  # kept as it is, never followed
        (("f", 0o4755, T, A), False),
        (("f", -1, T, A), False),
        (("f", True, T, A), False),
        (("f", 0o644, -1, A), False),
        (("f", 0o644, 1 << 63, A), False),
        (("f", 0o644, T, "h" + A), False),
        (("d", 0o755, T, "x"), False),
        (("l", 0o777, T, ""), False),
        (("l", 0o777, T, "t" * 4097), False),
        (("p", 0o644, T, ""), False),
    ],
)
def test_entries(entry, ok):
    assert (files.entry_problem(*entry) is None) is ok


def test_apply_sets_deletes_and_removes_what_a_deleted_directory_held():
    before = {"d": DIR, "d/e": DIR, "d/e/x": f(A), "dx": f(B), "k": f(C)}
    after = files.apply(before, {"n": f(A), "k": f(B)}, ["d", "gone-already"])
    assert after == {"dx": f(B), "k": f(B), "n": f(A)}
    assert before["d/e/x"] == f(A)  # a new map: the old one is unchanged
    assert files.changed_paths(before, after, ["n", "k", "d", "gone-already"]) == ["d", "k", "n"]
    touched = {**files.apply(before, {}, ["d/e/x"]), "d": ("d", 0o700, T, "")}  # a file gone, its directory's mode
    assert files.changed_paths(before, touched, ["d/e/x", "d"]) == ["d", "d/e/x"]


def test_apply_keeps_a_tree():
    before = {"d": DIR, "d/x": f(A)}
    assert files.apply(before, {"d": f(B)}, ["d"]) == {"d": f(B)}  # replaced, deleted first: fine
    assert files.apply({"d": DIR}, {"d": f(B)}, []) == {"d": f(B)}  # an empty directory replaced: fine
    with pytest.raises(ValueError, match="parent"):
        files.apply(before, {"d": f(B)}, [])  # a directory replaced by a file, what it held left behind
    with pytest.raises(ValueError, match="parent"):
        files.apply({}, {"a/b": f(A)}, [])
    with pytest.raises(ValueError, match="parent"):
        files.apply({"a": f(A)}, {"a/b": f(A)}, [])
    with pytest.raises(ValueError, match="component"):
        files.apply(before, {}, ["../d"])


def test_changed_paths_are_bounded():
    after = {f"p{i:05}": f(A) for i in range(files.MAX_CHANGED_LISTED + 5)}
    listed = files.changed_paths({}, after, after)
    assert len(listed) == files.MAX_CHANGED_LISTED and listed[-1] == "/+6 more"
    assert files.changed_list_ok(listed) and not files.changed_list_ok([*listed, "x"])


# ---------------------------------------------------------------- the record


def test_the_record_round_trips_and_is_checked_on_read(store, ledger):
    record = store.load("s-files")  # parsed and validated, not the writer's copy
    assert (
        record.files
        == ledger.record.files
        == {
            "data": DIR,
            "data/a.csv": f(A),
            "latest": ("l", 0o777, T, "data/a.csv"),
        }
    )
    assert record.files_changed == ["data", "data/a.csv", "latest"] and record.blob_sizes == {A: 5}
    meta = store.root / "s-files" / "meta.json"
    data = json.loads(meta.read_bytes())
    for bad in (
        {"files": {**data["files"], "../x": ["f", 420, T, A]}},
        {"files": {**data["files"], "b.bin": ["f", 420, T, B]}},  # a file blob missing from blob_sizes
        {"files": {**data["files"], "data/a.csv": ["f", 420, T, A, 5]}},
        {"files": {"orphan/x": ["f", 420, T, A]}},
        {"files_changed": ["../x"]},
        {"history": [{**json.loads(store.load("s-files").snapshot().encoded), "generation": 0, "files": {"/": DIR}}]},
    ):
        meta.write_text(json.dumps({**data, **bad}))
        with pytest.raises(CheckpointError, match="invalid"):
            store.load("s-files")


# ---------------------------------------------------------------- commits


def test_a_commit_with_files_moves_the_generation_and_stores_the_blobs(store, ledger):
    assert ledger.record.generation == 1 and blob_files(store) == {A}
    commit(ledger, 2, [change("data/b.bin", f(B)), change("data/a.csv", f(A, 0o600))], sent=[B])
    record = store.load("s-files")
    assert record.files["data/b.bin"] == f(B) and record.files["data/a.csv"] == f(A, 0o600)
    assert record.blob_sizes == {A: 5, B: 6} and blob_files(store) == {A, B}
    assert record.files_changed == ["data/a.csv", "data/b.bin"]
    ledger_support.commit(ledger, 3, {"v": C}, CONTENT)  # a value alone: the files stay, none changed
    record = store.load("s-files")
    assert record.files_changed == [] and set(record.files) == {"data", "data/a.csv", "data/b.bin", "latest"}
    assert record.blob_sizes == {A: 5, B: 6, C: 40}


def test_unsaved_paths_join_the_records_unsaved_and_stay_until_files_reports_again(store, ledger):
    commit(ledger, 1, unsaved={"fifo": "a FIFO cannot be saved"})
    assert store.load("s-files").unsaved == {"/workspace/fifo": "a FIFO cannot be saved"}
    ledger_support.commit(ledger, 2, {"v": C}, CONTENT)  # no files: the workspace's report stays
    assert store.load("s-files").unsaved == {"/workspace/fifo": "a FIFO cannot be saved"}
    commit(ledger, 2)  # files again, no unsaved path: the report is replaced
    assert store.load("s-files").unsaved == {}


def test_file_blobs_count_in_the_quota_and_entries_are_bounded(store, ledger):
    ledger.quota = 10
    with pytest.raises(CheckpointLimitExceeded, match="quota"):
        commit(ledger, 2, [change("b", f(B))], sent=[B])  # 5 + 6 bytes
    ledger.quota, ledger.workspace_files = 10_000, 4
    with pytest.raises(CheckpointLimitExceeded, match="4 workspace entries"):
        commit(ledger, 2, [change("b", f(B)), change("c", f(C))], sent=[B, C])
    ledger.workspace_files = 1
    with pytest.raises(CheckpointLimitExceeded, match="2 workspace entries"):  # counted before any is checked
        commit(ledger, 2, [change("b", f(B)), change("c", f(C))], sent=[B, C])
    ledger.workspace_files = 4
    commit(ledger, 2, [change("b", f(B))], deleted=["latest"], sent=[B])  # 4 entries: within
    assert blob_files(store) == {A, B} and len(store.load("s-files").files) == 3
    ledger.quota = 20
    with pytest.raises(CheckpointQuotaExceeded):
        ledger.check_room(["v"], 10, "a value")  # a host-made value counts the files' 11 bytes too


def test_history_keeps_a_file_blob_a_kept_generation_names_and_rewind_brings_the_map_back(store, ledger):
    commit(ledger, 2, [change("data/a.csv", f(B))], sent=[B])  # A is named by generation 1 only
    commit(ledger, 3, [change("new", f(C))], deleted=["data"], sent=[C])
    assert blob_files(store) == {A, B, C}
    ledger.rewind(1)
    record = store.load("s-files")
    assert (record.generation, record.rewound_from) == (4, 1)
    assert record.files == {"data": DIR, "data/a.csv": f(A), "latest": ("l", 0o777, T, "data/a.csv")}
    assert record.files_changed == ["data", "data/a.csv", "new"] and record.blob_sizes == {A: 5}
    ledger.keep = 0
    commit(ledger, 5, deleted=["data"])
    assert blob_files(store) == set()  # no kept generation names a blob any more


def test_a_commit_may_name_a_file_blob_only_a_kept_generation_holds(store, ledger):
    commit(ledger, 2, [change("data/a.csv", f(B))], sent=[B])
    commit(ledger, 3, [change("data/a.csv", f(A))])  # back to the old content, not sent again
    assert store.load("s-files").blob_sizes == {A: 5}


def test_a_fork_shares_the_workspace(store, ledger):
    commit(ledger, 2, [change("data/b.bin", f(B))], sent=[B])
    (child,) = CheckpointLedger.fork(store, "s-files", [ledger_support.new_record("s-kid")], 10_000, keep=5)
    assert store.load("s-kid").files == ledger.record.files
    assert os.stat(store.blob_path("s-kid", B)).st_ino == os.stat(store.blob_path("s-files", B)).st_ino
    (old,) = CheckpointLedger.fork(store, "s-files", [ledger_support.new_record("s-old")], 10_000, at=1, keep=5)
    assert set(old.record.files) == {"data", "data/a.csv", "latest"} and blob_files(store, "s-old") == {A}
    commit(child, 3, deleted=["data"])
    assert "data/b.bin" in store.load("s-files").files  # the source is untouched


# ---------------------------------------------------------------- hostile deltas


@pytest.mark.parametrize(
    ("changed", "deleted", "sent"),
    [
        ([change("../x", f(B))], [], [B]),
        ([change("a\0b", f(B))], [], [B]),
        ([change("n" * 5000, f(B))], [], [B]),
        ([change("x" * 300, f(B))], [], [B]),
        ([change("x", f(B)), change("x", f(B))], [], [B]),
        ([change("data", f(B))], [], [B]),  # a directory replaced by a file, what it held not deleted
        ([change("x", f(C))], [], []),  # a digest neither sent nor stored
        ([change("x", f(B), size=7)], [], [B]),  # a size lie about a blob sent
        ([change("x", f(A), size=6)], [], []),  # ... and about one stored
        ([change("x", DIR, size=3)], [], []),
        ([change(f"p{i}", f(B)) for i in range(100_001)], [], [B]),
        ([change("x", f(B, 0o4755))], [], [B]),
        ([change("x", ("f", 0o644, -1, B))], [], [B]),
        ([change("x", ("l", 0o777, T, "t" * 10_000))], [], []),
        ([["x", "f", 0o644, T, B]], [], [B]),
        ([["x", "f", "0o644", T, B, 6]], [], [B]),
        ([], ["../data"], []),
        ([], ["latest", "latest"], []),
    ],
)
def test_a_lying_delta_is_refused_and_nothing_is_stored(store, ledger, changed, deleted, sent):
    before = (store.root / "s-files" / "meta.json").read_bytes()
    with pytest.raises(ProtocolError):
        commit(ledger, 2, changed, deleted, sent)
    assert (store.root / "s-files" / "meta.json").read_bytes() == before and blob_files(store) == {A}


def test_unsaved_paths_are_checked_and_a_delta_without_files_has_none(ledger):
    with pytest.raises(ProtocolError, match="unsaved names an invalid path"):
        commit(ledger, 1, unsaved={"../etc": "no"})
    reply, _ = header(1)
    del reply["checkpoint"]["files"]
    assert "files" not in parse_delta(reply)


def test_a_file_a_restore_could_not_bring_back_is_dropped_with_its_blob(store, ledger):
    commit(ledger, 2, [change("data/b.csv", f(B))], sent=[B])
    ledger.drop({"/workspace/data/b.csv": "its stored blob does not match its digest"})
    record = store.load("s-files")
    assert "data/b.csv" not in record.files and "data" in record.files and B not in record.blob_sizes
