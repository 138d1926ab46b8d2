"""The store index (``state/index.py``): a listing reads only records that changed, and shows exactly what is stored
whatever the cache file holds (missing, truncated, edited by hand, older than a record, written by another process)."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ledger_support
import pytest
from fakes import FakeBackend, fake_settings

from orchestrator.ops.prune import Pruner
from orchestrator.ops.survey import survey
from orchestrator.state import index as index_module
from orchestrator.state.index import StoreIndex
from orchestrator.state.ledger import CheckpointLedger
from orchestrator.state.store import SessionRecord, SessionStore

from .test_kills import CONTENT, _die_after
from .test_kills import commit as commit_blobs

D1, D2 = "1" * 32, "2" * 32
IDS = ["s-a", "s-b", "s-c"]


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cache what was just written (as if ``RACY`` seconds had passed since): each test sees the cache at work."""
    monkeypatch.setattr(index_module, "RACY", -60.0)


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    store = SessionStore(tmp_path / "state")
    for session_id in IDS:
        ledger = CheckpointLedger.create(store, ledger_support.new_record(session_id), 10_000, keep=2)
        commit_blobs(ledger, 1, {"a": D1})
        commit_blobs(ledger, 2, {"a": D1, "b": D2})
    return store


@pytest.fixture
def reads(store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The ids whose record was read in full, in order."""
    done: list[str] = []
    real = SessionStore.read

    def counted(self: SessionStore, session_id: str) -> tuple[SessionRecord, os.stat_result]:
        done.append(session_id)
        return real(self, session_id)

    monkeypatch.setattr(SessionStore, "read", counted)
    yield done


def listing(store: SessionStore) -> list[dict[str, Any]]:
    """What ``ls --json`` shows of every session, less what moves with the clock."""
    rows = [info.to_json() for info in survey(store, FakeBackend(), now=1e10)]
    for row in rows:
        del row["age_seconds"], row["idle_seconds"]
    return rows


def uncached(store: SessionStore) -> list[dict[str, Any]]:
    """The listing from the records alone (the cache file removed first)."""
    (store.base / "cache" / "sessions.json").unlink(missing_ok=True)
    return listing(store)


def cache_file(store: SessionStore) -> Path:
    return store.base / "cache" / "sessions.json"


def edit(store: SessionStore, change: Any) -> None:
    data = json.loads(cache_file(store).read_bytes())
    change(data)
    cache_file(store).write_text(json.dumps(data))


def test_a_second_listing_reads_no_record_and_shows_the_same(
    store: SessionStore, reads: list[str], settled: None
) -> None:
    first = listing(store)
    assert reads == IDS
    reads.clear()
    assert listing(store) == first
    assert reads == []
    assert [row["generations_kept"] for row in first] == [3, 3, 3]  # 0 (created), 1, 2
    assert first[0]["checkpoint_bytes"] == len(CONTENT[D1]) + len(CONTENT[D2])


def test_a_changed_record_is_read_again(store: SessionStore, reads: list[str], settled: None) -> None:
    listing(store)
    with store.transaction("s-b") as record:
        record.labels = {"team": "x"}
        store.save(record)
    reads.clear()
    rows = listing(store)
    assert reads == ["s-b"]
    assert rows[1]["labels"] == {"team": "x"}
    assert rows == uncached(store)


def test_a_record_edited_in_place_is_read_again_even_with_its_mtime_put_back(
    store: SessionStore, reads: list[str], settled: None
) -> None:
    listing(store)
    path = Path(store.meta_path("s-a"))
    before = path.stat()
    text = path.read_bytes()
    path.write_bytes(text.replace(b'"image":"img"', b'"image":"imx"'))  # same size, same inode
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # the change time cannot be put back
    reads.clear()
    rows = listing(store)
    assert reads == ["s-a"]
    assert rows[0]["image"] == "imx"


def test_what_was_written_just_now_is_not_cached(store: SessionStore, reads: list[str]) -> None:
    """Within ``RACY`` seconds a file could change again without its timestamps changing: it is read every time."""
    listing(store)
    reads.clear()
    listing(store)
    assert reads == IDS
    assert not cache_file(store).exists() or json.loads(cache_file(store).read_bytes())["sessions"] == {}


def test_a_removed_session_leaves_the_listing_and_the_file(store: SessionStore, settled: None) -> None:
    listing(store)
    with store.transaction("s-c"):
        store.delete("s-c")
    assert [row["id"] for row in listing(store)] == ["s-a", "s-b"]
    assert set(json.loads(cache_file(store).read_bytes())["sessions"]) == {"s-a", "s-b"}


def test_a_blob_gone_from_disk_shows_at_once(store: SessionStore, settled: None) -> None:
    listing(store)
    store.blob_path("s-a", D2).unlink()
    row = listing(store)[0]
    assert row["checkpoint_damaged"] and row["status"] == "broken"
    assert "1 blob(s) missing" in row["problem"]


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda path: path.write_bytes(path.read_bytes()[:100]), id="truncated"),
        pytest.param(lambda path: path.write_bytes(b"\x00not json"), id="not-json"),
        pytest.param(lambda path: path.unlink(), id="missing"),
        pytest.param(lambda path: path.write_text('{"format": 999, "sessions": {}}'), id="other-format"),
        pytest.param(lambda path: path.write_text("[1, 2]"), id="not-an-object"),
        pytest.param(lambda path: (path.unlink(), path.mkdir()), id="a-directory"),
    ],
)
def test_a_damaged_cache_file_is_ignored(store: SessionStore, reads: list[str], settled: None, damage: Any) -> None:
    expected = listing(store)
    damage(cache_file(store))
    reads.clear()
    assert listing(store) == expected
    assert reads == IDS


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda e: e["summary"].__setitem__(10, 5), id="labels-not-a-dict"),
        pytest.param(lambda e: e["summary"].__setitem__(3, -1), id="negative-generation"),
        pytest.param(lambda e: e["summary"].__setitem__(3, True), id="bool-generation"),
        pytest.param(lambda e: e["summary"].__setitem__(0, None), id="image-none"),
        pytest.param(lambda e: e["summary"].append(1), id="extra-field"),
        pytest.param(lambda e: e.__setitem__("summary", {"image": "x"}), id="summary-a-dict"),
        pytest.param(lambda e: e["summary"][10].__setitem__("k", 1), id="label-not-a-string"),
        pytest.param(lambda e: e["summary"][14].append(None), id="blob-not-a-string"),
        pytest.param(lambda e: e["summary"].__setitem__(11, {"a": 1}), id="forked-from-without-its-keys"),
        pytest.param(lambda e: e.__setitem__("meta", "x"), id="meta-a-string"),
        pytest.param(lambda e: e.__setitem__("missing", ["x", -1]), id="missing-garbage"),
    ],
)
def test_an_entry_edited_by_hand_into_nonsense_is_read_from_the_record(
    store: SessionStore, reads: list[str], settled: None, change: Any
) -> None:
    expected = listing(store)
    edit(store, lambda data: change(data["sessions"]["s-b"]))
    reads.clear()
    assert listing(store) == expected
    assert "s-b" in reads and "s-a" not in reads


def test_an_entry_for_an_older_record_is_not_used(store: SessionStore, reads: list[str], settled: None) -> None:
    """The cache file kept from before a commit (restored from a backup, or written by a slow process)."""
    listing(store)
    old = cache_file(store).read_bytes()
    commit_blobs(CheckpointLedger(store, store.load("s-a"), 10_000, keep=2), 3, {"a": D2})
    cache_file(store).write_bytes(old)
    reads.clear()
    rows = listing(store)
    assert reads == ["s-a"]
    assert rows[0]["generation"] == 3 and rows[0]["variables"] == 1
    assert rows == uncached(store)


def test_two_processes_writing_the_file_lose_no_change_of_a_record(
    store: SessionStore, reads: list[str], settled: None
) -> None:
    """Each writes its whole view; the last one wins; an entry of a record that changed since is never believed."""
    listing(store)
    slow = StoreIndex(store)  # a process that read the file before the change below ...
    for session_id in IDS:
        assert slow.summary(session_id, os.stat(store.meta_path(session_id))) is not None
    with store.transaction("s-a") as record:
        record.labels = {"v": "2"}
        store.save(record)
    assert listing(store)[0]["labels"] == {"v": "2"}  # the other process rewrote the file with the change
    slow._changed = True
    slow.save()  # ... and writes its older view over it
    reads.clear()
    rows = listing(store)
    assert reads == ["s-a"]
    assert rows[0]["labels"] == {"v": "2"}


def test_a_temp_file_a_killed_writer_left_is_removed_by_the_next_writer(store: SessionStore, settled: None) -> None:
    listing(store)
    cache = store.base / "cache"
    old, new = cache / ".tmp-0123456789ab", cache / ".tmp-ba9876543210"
    old.write_bytes(b"{")
    new.write_bytes(b"{")
    past = time.time() - 2 * index_module.STALE_TEMP
    os.utime(old, (past, past))
    with store.transaction("s-a") as record:
        record.labels = {"v": "3"}
        store.save(record)
    listing(store)
    assert not old.exists()
    assert new.exists()  # maybe another writer's, still being written


def test_a_listing_of_a_read_only_store_works_without_the_file(
    store: SessionStore, settled: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = uncached(store)

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise PermissionError("read-only")

    monkeypatch.setattr(index_module, "replace_file", refuse)
    cache_file(store).unlink(missing_ok=True)
    assert listing(store) == expected
    assert not cache_file(store).exists()


# ---------------------------------------------------------------- prune's orphan blobs


def prune(store: SessionStore, *, dry_run: bool = False) -> list[tuple[str, str]]:
    settings = fake_settings(store.base.parent)
    report = Pruner(store, FakeBackend(), settings, dry_run=dry_run, now=time.time()).run(None, None, False)
    assert not report.failed
    return [(a.action, a.target) for a in report.actions]


def test_a_clean_session_is_not_locked_again_until_its_directories_change(
    store: SessionStore, settled: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert prune(store) == []
    locked: list[str] = []
    real = SessionStore.locked

    def counted(self: SessionStore, session_id: str) -> Any:
        locked.append(session_id)
        return real(self, session_id)

    monkeypatch.setattr(SessionStore, "locked", counted)
    assert prune(store) == []
    assert locked == []
    edit(store, lambda data: data["sessions"]["s-a"].__setitem__("clean", 7))
    assert prune(store) == []
    assert locked == ["s-a"]
    locked.clear()

    stray = store.blob_path("s-b", "f" * 32)
    stray.write_bytes(b"nobody names me")
    temp = Path(store.session_path("s-c")) / ".tmp-0123456789ab"
    temp.write_bytes(b"half a record")
    assert prune(store, dry_run=True) == [("remove-orphan-blobs", "s-b"), ("remove-orphan-blobs", "s-c")]
    assert locked == ["s-b", "s-c"]
    assert prune(store) == [("remove-orphan-blobs", "s-b"), ("remove-orphan-blobs", "s-c")]
    assert not stray.exists() and not temp.exists()
    for session_id in IDS:  # nothing named was touched
        for blob_id in store.load(session_id).named_blobs():
            assert store.blob_path(session_id, blob_id).read_bytes() == CONTENT[blob_id]


def test_a_stray_whose_directory_timestamps_were_put_back_is_still_found(store: SessionStore, settled: None) -> None:
    """``utime`` can put a directory's mtime back, not its change time: the stamp holds both."""
    prune(store)
    blobs = store.blob_path("s-a", D1).parent
    before = blobs.stat()
    stray = blobs / ("e" * 32)
    stray.write_bytes(b"x")
    os.utime(blobs, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert prune(store) == [("remove-orphan-blobs", "s-a")]
    assert not stray.exists()


# ---------------------------------------------------------------- killed while writing the file


def _list_in_child(root: Path, step: int) -> None:
    index_module.RACY = -60.0
    store = SessionStore(root)
    _die_after(step)
    survey(store, FakeBackend(), now=1e10)


def test_a_listing_killed_at_any_step_of_writing_the_cache_leaves_listings_exact(
    store: SessionStore, settled: None
) -> None:
    expected = uncached(store)
    context = multiprocessing.get_context("fork")
    for step in range(1, 20):
        cache_file(store).unlink(missing_ok=True)
        child = context.Process(target=_list_in_child, args=(store.base, step))
        child.start()
        child.join(60)
        assert child.exitcode in (0, -signal.SIGKILL), f"step {step}: the child failed ({child.exitcode})"
        assert listing(store) == expected, f"step {step}"
        assert listing(store) == expected, f"step {step}: from the file the listing wrote"
        if child.exitcode == 0:
            break
    else:
        pytest.fail("the listing did not complete")
    assert step > 1, "the kill hook was not reached"


# ---------------------------------------------------------------- nothing is deleted on the index's word


def test_an_index_that_lies_with_the_right_stamp_deletes_nothing_named(store: SessionStore, settled: None) -> None:
    """An entry edited by hand, its stamp kept, says the session names no blob: prune finds strays there, reads the
    record itself before deleting, and removes only the file no record names."""
    prune(store)
    edit(store, lambda data: data["sessions"]["s-a"]["summary"].__setitem__(14, []))
    stray = store.blob_path("s-a", "f" * 32)
    stray.write_bytes(b"stray")
    assert prune(store) == [("remove-orphan-blobs", "s-a")]
    assert not stray.exists()
    for blob_id in store.load("s-a").named_blobs():
        assert store.blob_path("s-a", blob_id).read_bytes() == CONTENT[blob_id]


def test_an_index_that_makes_a_session_look_old_does_not_get_it_removed(store: SessionStore, settled: None) -> None:
    """The listing believes the entry (a dry run says what it would do on it); a real prune decides on the record."""
    listing(store)
    edit(store, lambda data: data["sessions"]["s-b"]["summary"].__setitem__(1, 1.0))  # created in 1970
    settings = fake_settings(store.base.parent)
    dry = Pruner(store, FakeBackend(), settings, dry_run=True, now=time.time()).run(None, 3600.0, False)
    assert [(a.action, a.target) for a in dry.actions] == [("remove", "s-b")]
    real = Pruner(store, FakeBackend(), settings, dry_run=False, now=time.time()).run(None, 3600.0, False)
    assert [(a.action, a.target, a.reason) for a in real.actions] == [("skip", "s-b", "used meanwhile")]
    assert store.exists("s-b")
    assert listing(store) == uncached(store)  # the entry was put right from the record


def test_recorded_containers_come_from_the_index_and_follow_a_changed_record(
    store: SessionStore, reads: list[str], settled: None
) -> None:
    with store.transaction("s-a") as record:
        record.container_id, record.sandbox_id = "a" * 12, "sb-" + "1" * 12
        store.save(record)
    assert StoreIndex(store).recorded_containers() == store.recorded_containers() == {"a" * 12: "s-a"}
    listing(store)  # writes the index
    reads.clear()
    assert StoreIndex(store).recorded_containers() == {"a" * 12: "s-a"}
    assert reads == []
    with store.transaction("s-a") as record:
        record.container_id = "b" * 12
        store.save(record)
    reads.clear()
    assert StoreIndex(store).recorded_containers() == {"b" * 12: "s-a"}
    assert reads == ["s-a"]


def test_a_look_at_one_session_reads_its_record_not_the_cache_file(
    store: SessionStore, reads: list[str], settled: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    listing(store)
    monkeypatch.setattr(StoreIndex, "_load", lambda self: pytest.fail("the cache file was read"))
    reads.clear()
    (info,) = survey(store, FakeBackend(), now=1e10, session_ids=["s-b"], shared=True)
    assert reads == ["s-b"] and info.id == "s-b" and info.shared_bytes == 0
