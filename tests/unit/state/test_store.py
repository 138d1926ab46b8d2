"""The host-side store and the checkpoint ledger: ownership epochs, locked commits, GC, quota, validation."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time

import pytest

from orchestrator.agent import checkpoint_names
from orchestrator.agent.reply_types import CheckpointDelta
from orchestrator.errors import (
    CheckpointError,
    CheckpointLimitExceeded,
    CheckpointQuotaExceeded,
    ConfigError,
    ProtocolError,
    SessionAttachedElsewhere,
    SessionBusy,
    SessionNotFound,
)
from orchestrator.state import activity
from orchestrator.state.ledger import CheckpointLedger
from orchestrator.state.store import SessionRecord, SessionStore

D1, D2, D3 = "1" * 32, "2" * 32, "3" * 32
QUOTA = 1000  # of the ledgers this module makes itself (the ledger fixture is in tests/unit/conftest.py)


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
    newer = CheckpointLedger.take_ownership(store, "s-test", ledger.quota, keep=0)
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
        ledger.commit(*delta(1, [(D1, b"x" * (ledger.quota + 1))], {"a": D1}))
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
        CheckpointLedger.take_ownership(store, "s-none", QUOTA, keep=0)


def test_store_id_is_stable_and_state_is_private(tmp_path):
    first = SessionStore(tmp_path / "state")
    assert SessionStore(tmp_path / "state").store_id == first.store_id
    assert SessionStore(tmp_path / "other").store_id != first.store_id
    assert os.stat(first.root).st_mode & 0o077 == 0


def test_fsync_mode_commits(tmp_path):
    store = SessionStore(tmp_path, fsync=True)
    record = SessionRecord(session_id="s-sync", image="i", created_at=0.0, last_used_at=0.0, owner="o", epoch=1)
    store.create(record)
    CheckpointLedger(store, record, QUOTA, keep=0).commit(*delta(1, [(D1, b"one")], {"a": D1}))
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


# --- one rule for names: what the ledger commits, the store reads back -------------------------------------------

CANDIDATE_KEYS = [
    "x",
    "caf\u00e9",
    "n" * checkpoint_names.MAX_NAME_CHARS,
    "n" * (checkpoint_names.MAX_NAME_CHARS + 1),
    "n" * 10_000,
    "a b",
    "esc\x1b[2J",
    "x\u202e",
    "",
    "1x",
    "ctx/x",
    "ghost/x",
    "ctx/a b",
    "/x",
    "ctx/",
    "a/b/c",
    "x\n",
]


@pytest.mark.parametrize("key", CANDIDATE_KEYS)
def test_every_name_the_ledger_commits_the_store_reads_back(ledger, store, key):
    contexts = {"ctx": {"cwd": "/tmp/ctx", "env": {}, "context_count": 0, "history_count": 0}}
    try:
        ledger.commit(*delta(1, [(D1, b"one")], {key: D1}), contexts=contexts)
    except ProtocolError:
        assert store.load("s-test").variables == {}, "a refused delta stored nothing"
        assert blob_files(store) == []
        return
    assert checkpoint_names.checkpoint_key_problem(key) is None
    assert store.load("s-test").variables == {key: D1}


def test_a_hostile_name_is_refused_before_anything_is_stored(ledger, store):
    ledger.commit(*delta(1, [(D1, b"one")], {"a": D1}))
    with pytest.raises(ProtocolError, match="cannot be stored"):
        ledger.commit(*delta(2, [(D2, b"two")], {"b": D2, "evil\x1b]52;c;": D2}))
    assert store.load("s-test").variables == {"a": D1}
    assert store.load("s-test").generation == 1
    assert blob_files(store) == [D1]


def test_the_store_refuses_a_record_whose_names_break_the_rule(store, ledger):
    path = store.root / "s-test" / "meta.json"
    data = json.loads(path.read_text())
    data.update(variables={"a b": D1}, blob_sizes={D1: 1})
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="variables"):
        store.load("s-test")


# --- the manifest's bounds --------------------------------------------------------------------------------------


def test_names_past_the_manifest_bound_are_refused_and_nothing_stored(ledger, store, monkeypatch):
    monkeypatch.setattr(checkpoint_names, "MAX_CHECKPOINT_NAMES", 3)
    ledger.commit(*delta(1, [(D1, b"one")], {"a": D1, "b": D1}))
    with pytest.raises(CheckpointLimitExceeded, match="3 names") as info:
        ledger.commit(*delta(2, [], {f"v{i}": D1 for i in range(5)}))
    assert isinstance(info.value, CheckpointQuotaExceeded) and isinstance(info.value, ProtocolError)
    assert (info.value.unit, info.value.held, info.value.quota, info.value.size) == ("names", 7, 3, 5)
    assert store.load("s-test").variables == {"a": D1, "b": D1}
    # Replacing names within the bound, and deleting, still work.
    ledger.commit(*delta(2, [], {"c": D1}, deleted=["a"]))
    assert set(store.load("s-test").variables) == {"b", "c"}


def test_name_bytes_past_the_manifest_bound_are_refused(ledger, store, monkeypatch):
    monkeypatch.setattr(checkpoint_names, "MAX_CHECKPOINT_NAME_BYTES", 10)
    ledger.commit(*delta(1, [(D1, b"one")], {"abcde": D1}))
    with pytest.raises(CheckpointLimitExceeded, match="name bytes"):
        ledger.commit(*delta(2, [], {"fghijk": D1}))
    assert store.load("s-test").variables == {"abcde": D1}


def test_the_quota_counts_the_bytes_received_not_a_claimed_size(ledger, store):
    """A blob's size is the length of its part of the body: a claim that does not add up is refused."""
    entries, body = delta(1, [(D1, b"x" * 10)], {"a": D1})
    entries["blobs"][0]["size"] = 1  # the body holds 10
    with pytest.raises(ProtocolError, match="does not match"):
        ledger.commit(entries, body)
    with pytest.raises(CheckpointLimitExceeded) as info:
        ledger.commit(*delta(1, [(D1, b"x" * (ledger.quota + 1))], {"a": D1}))
    assert (info.value.unit, info.value.held) == ("bytes", ledger.quota + 1)


def test_a_stored_blob_sent_again_with_another_size_is_refused(ledger, store):
    """The size of a stored blob is the host's: sent again smaller (or larger) under its digest, it is refused, and
    the record keeps counting the bytes on disk."""
    ledger.commit(*delta(1, [(D1, b"x" * 100)], {"a": D1}))
    for body in (b"x", b"x" * 101):
        with pytest.raises(ProtocolError, match="stores it with 100 bytes"):
            ledger.commit(*delta(2, [(D1, body), (D2, b"two")], {"b": D2}))
    assert store.load("s-test").blob_sizes == {D1: 100}
    ledger.commit(*delta(2, [(D1, b"x" * 100), (D2, b"two")], {"b": D2}))  # the same size: kept, not written again
    assert store.load("s-test").blob_sizes == {D1: 100, D2: 3}


def test_a_blob_a_kept_generation_names_keeps_its_size(store):
    record = SessionRecord(session_id="s-kept", image="img", created_at=time.time(), last_used_at=0.0, owner="t")
    store.create(record)
    ledger = CheckpointLedger(store, record, QUOTA, keep=5)
    ledger.commit(*delta(1, [(D1, b"x" * 100)], {"a": D1}))
    ledger.commit(*delta(2, [(D2, b"two")], {"a": D2}))  # D1 is only in the kept generation 1
    with pytest.raises(ProtocolError, match="stores it with 100 bytes"):
        ledger.commit(*delta(3, [(D1, b"x")], {"b": D1}))
    assert store.load("s-kept").blob_sizes == {D2: 3}


def test_the_store_refuses_an_existing_blob_file_of_another_size(store, ledger):
    """A blob file no manifest names (left by a failed commit) is the host's too: another size is refused, nothing
    written."""
    store.write_blobs("s-test", {D1: b"x" * 10})
    with pytest.raises(ProtocolError, match="stores it with 10 bytes"):
        store.write_blobs("s-test", {D2: b"two", D1: b"x"})
    assert blob_files(store) == [D1] and store.blob_path("s-test", D1).stat().st_size == 10
    store.write_blobs("s-test", {D1: b"y" * 10})  # content-addressed: a file of the right size is kept as it is
    assert store.blob_path("s-test", D1).read_bytes() == b"x" * 10


def test_a_host_made_value_past_the_names_bound_is_refused_before_it_is_sent(ledger, monkeypatch):
    monkeypatch.setattr(checkpoint_names, "MAX_CHECKPOINT_NAMES", 2)
    ledger.commit(*delta(1, [(D1, b"one")], {"a": D1, "b": D1}))
    ledger.check_room({"a"}, 10, "the str value for a")  # replaces a name: fits
    with pytest.raises(CheckpointQuotaExceeded, match="2 names"):
        ledger.check_room({"c"}, 10, "the str value for c")


def test_the_name_rule_and_the_stored_record_agree_on_random_names():
    """Whatever the ledger's rule accepts survives the record's JSON round trip; whatever it refuses, the store does."""
    import random

    rng = random.Random(22)
    alphabet = "aZ_9/-é€ \x00\x1b\u202e\ud800\n" + "x" * 20
    for _ in range(3000):
        key = "".join(rng.choice(alphabet) for _ in range(rng.choice([1, 3, 8, 70, 130, 200])))
        record = SessionRecord(
            session_id="s-test",
            image="img",
            created_at=1.0,
            last_used_at=1.0,
            variables={key: D1},
            blob_sizes={D1: 1},
            contexts={key.partition("/")[0]: {"cwd": "/tmp", "env": {}, "context_count": 0, "history_count": 0}}
            if "/" in key and checkpoint_names.CONTEXT_ID.match(key.rpartition("/")[0])
            else {},
        )
        raw = json.loads(record.to_json())
        if checkpoint_names.checkpoint_key_problem(key) is None:
            assert SessionRecord.from_json(raw, "s-test").variables == {key: D1}
        else:
            with pytest.raises(ValueError):
                SessionRecord.from_json(raw, "s-test")
