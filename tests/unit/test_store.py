"""The host-side store and the checkpoint ledger: ownership epochs, locked commits, GC, quota, validation."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time

import pytest

from orchestrator import activity
from orchestrator.errors import (
    CheckpointError,
    ConfigError,
    ProtocolError,
    SessionAttachedElsewhere,
    SessionBusy,
    SessionNotFound,
)
from orchestrator.ledger import CheckpointLedger, new_owner_token
from orchestrator.messages import CheckpointDelta
from orchestrator.store import SessionRecord, SessionStore

D1, D2, D3 = "1" * 32, "2" * 32, "3" * 32
QUOTA = 1000


@pytest.fixture
def store(tmp_path):
    return SessionStore(tmp_path, lock_timeout=0.5)


@pytest.fixture
def ledger(store):
    record = SessionRecord(
        session_id="s-test", image="img", created_at=time.time(), last_used_at=0.0, owner=new_owner_token(), epoch=1
    )
    store.create(record)
    return CheckpointLedger(store, record, QUOTA)


def delta(generation, blobs=(), changed=None, deleted=(), unsaved=None) -> tuple[CheckpointDelta, bytearray]:
    entries = [{"digest": d, "size": len(b)} for d, b in blobs]
    body = bytearray(b"".join(b for _, b in blobs))
    return {
        "generation": generation,
        "blobs": entries,
        "vars": dict(changed or {}),
        "deleted": list(deleted),
        "unsaved": dict(unsaved or {}),
    }, body


def blob_files(store, session_id="s-test"):
    return sorted(p.name for p in (store.root / session_id / "blobs").iterdir())


def test_commit_writes_blobs_manifest_and_counters_in_one_record(store, ledger):
    ledger.commit(*delta(1, [(D1, b"one"), (D2, b"two")], {"a": D1, "b": D2}), counters={"context_count": 1})
    loaded = store.load("s-test")
    assert loaded.generation == 1 and loaded.variables == {"a": D1, "b": D2}
    assert loaded.checkpoint_bytes == 6 and loaded.context_count == 1
    with store.mapped_blob("s-test", D1) as blob:
        assert blob == b"one"


def test_unreferenced_blobs_are_collected_under_the_lock(store, ledger):
    ledger.commit(*delta(1, [(D1, b"one"), (D2, b"two")], {"a": D1, "b": D2}))
    ledger.commit(*delta(2, [(D3, b"three")], {"a": D3}, deleted=["b"]))
    assert blob_files(store) == [D3]
    assert store.load("s-test").variables == {"a": D3}


def test_a_stale_owner_cannot_commit_delete_or_touch_the_sandbox(store, ledger):
    ledger.commit(*delta(1, [(D1, b"one")], {"x": D1}))
    newer = CheckpointLedger.take_ownership(store, "s-test", QUOTA)
    assert newer.record.epoch == ledger.record.epoch + 1
    with pytest.raises(SessionAttachedElsewhere, match="epoch"):
        ledger.commit(*delta(2, [(D2, b"two")], {"x": D2}))
    with pytest.raises(SessionAttachedElsewhere):
        ledger.delete()
    with pytest.raises(SessionAttachedElsewhere):
        ledger.set_sandbox("sb-000000000000", "a" * 64)
    # The new owner's state and blobs are untouched by the stale attempts.
    assert store.load("s-test").variables == {"x": D1}
    assert blob_files(store) == [D1]
    newer.commit(*delta(2, [(D2, b"two")], {"y": D2}))
    assert store.load("s-test").variables == {"x": D1, "y": D2}


def test_inconsistent_deltas_store_nothing(ledger, store):
    with pytest.raises(ProtocolError, match="neither sent nor stored"):
        ledger.commit(*delta(1, [], {"a": D1}))
    with pytest.raises(ProtocolError, match="out of step"):
        ledger.commit(*delta(5, [(D1, b"one")], {"a": D1}))
    entries, body = delta(1, [(D1, b"one")], {"a": D1})
    with pytest.raises(ProtocolError):
        ledger.commit(entries, body + b"extra")
    assert store.load("s-test").generation == 0 and blob_files(store) == []


def test_a_delta_over_the_quota_is_refused(ledger, store):
    with pytest.raises(ProtocolError, match="quota"):
        ledger.commit(*delta(1, [(D1, b"x" * (QUOTA + 1))], {"a": D1}))
    assert blob_files(store) == []


def test_dropped_values_leave_the_manifest_and_their_blobs(ledger, store):
    ledger.commit(*delta(1, [(D1, b"one"), (D2, b"two")], {"a": D1, "b": D2}))
    ledger.drop({"b": "RuntimeError: no"})
    assert store.load("s-test").variables == {"a": D1}
    assert blob_files(store) == [D1]


def _hold_lock(root, ready, release):
    with SessionStore(root).transaction("s-test"):
        ready.set()
        release.wait(10)


def test_the_transaction_lock_holds_across_processes(store, ledger, tmp_path):
    ctx = multiprocessing.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(tmp_path, ready, release))
    holder.start()
    try:
        assert ready.wait(10)
        with pytest.raises(SessionBusy):
            ledger.commit(*delta(1, [(D1, b"one")], {"a": D1}))
    finally:
        release.set()
        holder.join(10)
    ledger.commit(*delta(1, [(D1, b"one")], {"a": D1}))


def test_a_crafted_manifest_is_refused(store, ledger):
    path = store.root / "s-test" / "meta.json"
    data = json.loads(path.read_text())
    for field, value in [
        ("variables", {"a": "../../../etc/passwd"}),
        ("blob_sizes", {"../x": 1}),
        ("session_id", "other"),
        ("generation", -1),
        ("sandbox_id", "../../x"),
    ]:
        path.write_text(json.dumps({**data, field: value}))
        with pytest.raises(CheckpointError, match=field):
            store.load("s-test")
    path.write_text(json.dumps({**data, "unknown": 1}))
    with pytest.raises(CheckpointError):
        store.load("s-test")


def test_ids_are_validated_and_taken_ids_refused(store, ledger):
    with pytest.raises(ConfigError):
        store.load("../etc")
    with pytest.raises(ConfigError, match="already exists"):
        store.create(SessionRecord(session_id="s-test", image="i", created_at=0.0, last_used_at=0.0))
    with pytest.raises(SessionNotFound):
        store.load("s-none")
    with pytest.raises(SessionNotFound):
        CheckpointLedger.take_ownership(store, "s-none", QUOTA)


def test_store_id_is_stable_and_state_is_private(tmp_path):
    first = SessionStore(tmp_path / "state")
    assert SessionStore(tmp_path / "state").store_id == first.store_id
    assert SessionStore(tmp_path / "other").store_id != first.store_id
    assert os.stat(first.root).st_mode & 0o077 == 0


def test_fsync_mode_commits(tmp_path):
    store = SessionStore(tmp_path, fsync=True)
    record = SessionRecord(session_id="s-sync", image="i", created_at=0.0, last_used_at=0.0, owner="o", epoch=1)
    store.create(record)
    CheckpointLedger(store, record, QUOTA).commit(*delta(1, [(D1, b"one")], {"a": D1}))
    assert store.load("s-sync").variables == {"a": D1}


def test_a_delete_leaves_nothing_while_others_keep_opening_the_session(store, ledger):
    """Prunes and calls open the lock and activity files (creating them) while a delete runs: once the
    delete is done, the session's directory must be gone, not re-made by one of them."""
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            try:
                with activity.quiet(store.activity_path("s-test")), store.locked("s-test"):
                    pass
            except (SessionNotFound, SessionBusy):  # gone, or three of us queued past lock_timeout on a busy machine
                pass

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for _ in range(50):
            time.sleep(0.002)
        with store.locked("s-test"):
            store.delete("s-test")
        time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(5)
    assert not (store.root / "s-test").exists()
    assert list(store.unfinished_removals()) == []
