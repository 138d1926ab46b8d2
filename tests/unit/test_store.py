"""The host-side store: atomic checkpoint commits, blob garbage collection, typed errors."""

from __future__ import annotations

import time

import pytest

from orchestrator.errors import CheckpointError, ConfigError, SessionNotFound
from orchestrator.store import SessionRecord, SessionStore

D1, D2, D3 = "1" * 32, "2" * 32, "3" * 32


@pytest.fixture
def store(tmp_path):
    return SessionStore(tmp_path)


@pytest.fixture
def record(store):
    rec = SessionRecord(session_id="s-test", image="img", created_at=time.time(), last_used_at=0.0)
    store.create(rec)
    return rec


def blob_files(store, rec):
    return sorted(p.name for p in (store.root / rec.session_id / "blobs").iterdir())


def test_commit_writes_blobs_and_manifest(store, record):
    store.commit(record, generation=1, blobs={D1: b"one", D2: b"two"}, changed={"a": D1, "b": D2}, deleted=[])
    loaded = store.load("s-test")
    assert loaded.generation == 1 and loaded.variables == {"a": D1, "b": D2}
    assert loaded.checkpoint_bytes == 6
    assert dict(store.read_blobs(loaded)) == {D1: b"one", D2: b"two"}


def test_unreferenced_blobs_are_collected(store, record):
    store.commit(record, generation=1, blobs={D1: b"one", D2: b"two"}, changed={"a": D1, "b": D2}, deleted=[])
    store.commit(record, generation=2, blobs={D3: b"three"}, changed={"a": D3}, deleted=["b"])
    assert record.variables == {"a": D3}
    assert blob_files(store, record) == [D3]


def test_shared_blob_survives_while_one_name_uses_it(store, record):
    store.commit(record, generation=1, blobs={D1: b"doc"}, changed={"context": D1, "context_0": D1}, deleted=[])
    store.commit(record, generation=2, blobs={}, changed={}, deleted=["context"])
    assert blob_files(store, record) == [D1]


def test_a_delta_naming_a_blob_never_sent_is_refused(store, record):
    with pytest.raises(CheckpointError, match="not sent"):
        store.commit(record, generation=1, blobs={}, changed={"a": D1}, deleted=[])
    assert store.load("s-test").generation == 0


def test_invalid_digest_cannot_escape_the_blob_directory(store, record):
    with pytest.raises(CheckpointError):
        store.commit(record, generation=1, blobs={"../../etc": b"x"}, changed={"a": "../../etc"}, deleted=[])


def test_unknown_session(store):
    with pytest.raises(SessionNotFound):
        store.load("nope")


@pytest.mark.parametrize("bad", ["", "ab", "UPPER", "a/b", "../x", "x" * 64, "-lead"])
def test_session_ids_are_restricted(store, bad):
    with pytest.raises(ConfigError):
        store.load(bad)


def test_ids_and_delete(store, record):
    assert list(store.ids()) == ["s-test"]
    store.delete("s-test")
    assert list(store.ids()) == []
    assert not store.exists("s-test")
