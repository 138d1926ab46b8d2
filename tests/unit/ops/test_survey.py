"""What a survey says of forks and history: their origin and bytes from the record; shared bytes only when asked."""

from __future__ import annotations

import time

from fakes import FakeBackend

from orchestrator.ops.survey import survey
from orchestrator.state.history import Snapshot
from orchestrator.state.ledger import CheckpointLedger, new_owner_token
from orchestrator.state.store import SessionRecord, SessionStore

BIG, SMALL, OLD = "a" * 32, "b" * 32, "c" * 32


def _record(session_id: str) -> SessionRecord:
    now = time.time()
    return SessionRecord(
        session_id=session_id, image="img", created_at=now, last_used_at=now, owner=new_owner_token(), epoch=1
    )


def _source(store: SessionStore) -> SessionRecord:
    """A session holding two values now and a kept generation naming a third."""
    record = _record("src")
    store.create(record)
    store.write_blobs("src", {BIG: b"x" * 5000, SMALL: b"y" * 10, OLD: b"z" * 300})
    with store.transaction("src") as current:
        current.generation, current.variables = 2, {"big": BIG, "small": SMALL}
        current.blob_sizes = {BIG: 5000, SMALL: 10}
        current.history = [Snapshot(generation=1, at=1.0, variables={"big": OLD}, blob_sizes={OLD: 300})]
        store.save(current)
    return store.load("src")


def test_a_listing_reads_origin_and_history_from_records_and_stats_no_blob(store: SessionStore) -> None:
    _source(store)
    CheckpointLedger.fork(store, "src", [_record("kid")], 1 << 20, keep=10)
    infos = {info.id: info for info in survey(store, FakeBackend(), now=time.time())}
    assert infos["kid"].forked_from == {"session_id": "src", "generation": 2} and infos["src"].forked_from is None
    assert (infos["src"].generations_kept, infos["src"].history_bytes) == (2, 5310)
    assert (infos["kid"].generations_kept, infos["kid"].history_bytes) == (1, 5010)
    assert infos["src"].shared_bytes is None and infos["kid"].to_json()["shared_bytes"] is None


def test_one_session_measured_counts_the_blobs_another_session_links(store: SessionStore) -> None:
    _source(store)
    (alone,) = survey(store, FakeBackend(), now=time.time(), session_ids=["src"], shared=True)
    assert alone.shared_bytes == 0
    CheckpointLedger.fork(store, "src", [_record("kid")], 1 << 20, keep=10)
    (source,) = survey(store, FakeBackend(), now=time.time(), session_ids=["src"], shared=True)
    (kid,) = survey(store, FakeBackend(), now=time.time(), session_ids=["kid"], shared=True)
    assert source.shared_bytes == kid.shared_bytes == 5010  # the kept generation's blob is the source's alone
