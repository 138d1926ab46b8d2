"""Forks in the store without an engine: shared blobs (hard links), whole-or-nothing children, independent removal."""

from __future__ import annotations

import os

import ledger_support
import pytest

from orchestrator.errors import CheckpointError, ConfigError, GenerationNotFound, SessionNotFound
from orchestrator.state.ledger import CheckpointLedger
from orchestrator.state.store import SessionStore

D1, D2, D3 = "1" * 32, "2" * 32, "3" * 32
CONTENT = {D1: b"one" * 100, D2: b"two" * 10, D3: b"three"}
QUOTA = 10_000


def commit(ledger: CheckpointLedger, generation: int, variables: dict[str, str]) -> None:
    ledger_support.commit(ledger, generation, variables, CONTENT)


def make_source(store: SessionStore, session_id: str = "s-src") -> CheckpointLedger:
    """Generation 1 {a: D1}, 2 {a: D1, b: D2}, 3 {a: D3, b: D2}; all kept."""
    ledger = CheckpointLedger.create(store, ledger_support.new_record(session_id), QUOTA, keep=5)
    commit(ledger, 1, {"a": D1})
    commit(ledger, 2, {"a": D1, "b": D2})
    commit(ledger, 3, {"a": D3, "b": D2})
    return ledger


def fork(store: SessionStore, *ids: str, at: int | None = None, source: str = "s-src") -> list[CheckpointLedger]:
    return CheckpointLedger.fork(store, source, [ledger_support.new_record(i) for i in ids], QUOTA, at=at, keep=5)


def blob(store: SessionStore, session_id: str, blob_id: str) -> os.stat_result:
    return os.stat(store.blob_path(session_id, blob_id))


def assert_whole(store: SessionStore, session_id: str) -> None:
    """The session's record loads and every blob any of its manifests names is on disk with its bytes."""
    record = store.load(session_id)
    for blob_id in record.named_blobs():
        assert store.blob_path(session_id, blob_id).read_bytes() == CONTENT[blob_id], (session_id, blob_id)


@pytest.fixture
def source(store):
    return make_source(store)


def test_a_fork_links_every_blob_of_the_source(store, source):
    (child,) = fork(store, "s-child")
    record = store.load("s-child")
    assert record == child.record
    assert (record.generation, record.variables) == (3, {"a": D3, "b": D2})
    assert record.forked_from == {"session_id": "s-src", "generation": 3}
    assert record.history == [] and record.owner == child.record.owner and record.epoch == 1
    assert sorted(os.listdir(store.root / "s-child" / "blobs")) == [D2, D3]
    for blob_id in (D2, D3):
        assert blob(store, "s-child", blob_id).st_ino == blob(store, "s-src", blob_id).st_ino
        assert blob(store, "s-src", blob_id).st_nlink == 2
    assert blob(store, "s-src", D1).st_nlink == 1  # named only by the source's history, not linked
    assert store.lease("s-child").read() is not None  # held by its maker from the start
    assert store.load("s-src") == source.record  # the source is only read


def test_a_fork_at_a_kept_generation_gets_that_state(store, source):
    (child,) = fork(store, "s-old", at=1)
    assert (child.record.generation, child.record.variables) == (1, {"a": D1})
    assert child.record.forked_from == {"session_id": "s-src", "generation": 1}
    assert sorted(os.listdir(store.root / "s-old" / "blobs")) == [D1]
    with pytest.raises(GenerationNotFound, match="keeps generation 0, 1, 2, 3"):
        fork(store, "s-none", at=7)
    assert not (store.root / "s-none").exists()


def test_many_forks_share_one_copy(store, source):
    fork(store, "s-f1", "s-f2", "s-f3")
    assert blob(store, "s-src", D3).st_nlink == 4
    shared = len(CONTENT[D2]) + len(CONTENT[D3])
    assert store.shared_bytes(store.load("s-src")) == shared
    assert store.shared_bytes(store.load("s-f2")) == shared


def test_shared_bytes_count_only_blobs_another_session_holds(store, source):
    assert store.shared_bytes(source.record) == 0
    fork(store, "s-old", at=1)
    assert store.shared_bytes(store.load("s-src")) == len(CONTENT[D1])  # D1: its history and the fork
    assert store.shared_bytes(store.load("s-old")) == len(CONTENT[D1])
    store.delete("s-old")
    assert store.shared_bytes(store.load("s-src")) == 0


def test_a_missing_source_blob_fails_the_fork_and_leaves_no_child(store, source):
    store.blob_path("s-src", D2).unlink()
    with pytest.raises(CheckpointError, match="damaged"):
        fork(store, "s-child")
    assert not (store.root / "s-child").exists()
    assert list(store.ids()) == ["s-src"]
    (older,) = fork(store, "s-child", at=1)  # a generation that does not name the lost blob still forks
    assert older.record.variables == {"a": D1}


def test_a_fork_into_an_existing_id_fails_and_changes_neither(store, source):
    other = make_source(store, "s-other")
    before = (store.root / "s-other" / "meta.json").read_bytes()
    with pytest.raises(ConfigError, match="already exists"):
        fork(store, "s-other")
    assert (store.root / "s-other" / "meta.json").read_bytes() == before
    assert store.load("s-other") == other.record
    assert blob(store, "s-src", D3).st_nlink == 1  # nothing was linked
    assert_whole(store, "s-other")


def test_a_failed_child_takes_back_the_ones_made_before_it(store, source):
    """Orchestrator.fork promises that the forks made by a call that fails are removed: the store does not keep
    the first of three children when the third cannot be made."""
    make_source(store, "s-taken")
    with pytest.raises(ConfigError, match="already exists"):
        fork(store, "s-c1", "s-c2", "s-taken")
    assert sorted(store.ids()) == ["s-src", "s-taken"]
    assert not (store.root / "s-c1").exists() and not (store.root / "s-c2").exists()
    assert blob(store, "s-src", D3).st_nlink == 1
    assert_whole(store, "s-taken")


def test_a_fork_of_a_missing_source_is_refused(store):
    with pytest.raises(SessionNotFound):
        fork(store, "s-child", source="s-ghost")
    assert not (store.root / "s-child").exists()


def test_removing_the_source_leaves_every_fork_whole(store, source):
    fork(store, "s-f1", "s-f2")
    fork(store, "s-old", at=1)
    source.delete()
    assert list(store.ids()) == ["s-f1", "s-f2", "s-old"]
    for child in store.ids():
        assert_whole(store, child)
    assert blob(store, "s-f1", D3).st_nlink == 2
    assert store.load("s-f1").forked_from == {"session_id": "s-src", "generation": 3}  # a name, not a dependency


def test_removing_a_fork_leaves_the_source_and_the_other_forks_whole(store, source):
    first, _ = fork(store, "s-f1", "s-f2")
    first.delete()
    assert list(store.ids()) == ["s-f2", "s-src"]
    assert_whole(store, "s-src")
    assert_whole(store, "s-f2")
    assert blob(store, "s-src", D3).st_nlink == 2


def test_a_fork_goes_its_own_way(store, source):
    """A fork's commits and trims free only its own links; the source's blobs and history are untouched."""
    (child,) = fork(store, "s-child")
    child.keep = 0
    commit(child, 4, {"a": D1})  # D2 and D3 leave the fork's manifests (no history kept)
    assert sorted(os.listdir(store.root / "s-child" / "blobs")) == [D1]
    assert_whole(store, "s-src")
    assert store.load("s-src").generation == 3
    commit(source, 4, {"b": D2})  # and the source's future does not reach the fork
    assert store.load("s-child").variables == {"a": D1}
    assert_whole(store, "s-child")


def test_a_fork_of_a_fork(store, source):
    fork(store, "s-child")
    fork(store, "s-grandchild", source="s-child")
    assert store.load("s-grandchild").forked_from == {"session_id": "s-child", "generation": 3}
    assert blob(store, "s-src", D3).st_nlink == 3
    store.delete("s-child")
    source.delete()
    assert_whole(store, "s-grandchild")
