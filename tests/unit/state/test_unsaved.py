"""The record's unsaved report: each context's names replaced by its own deltas only, and the whole report bounded
in entries and stored bytes, kept generations holding its names only."""

from __future__ import annotations

import json
import time

import pytest

from orchestrator.agent.checkpoint_names import MAX_UNSAVED_NAMES
from orchestrator.errors import ProtocolError
from orchestrator.state.ledger import CheckpointLedger, new_owner_token
from orchestrator.state.store import SessionRecord, SessionStore
from orchestrator.state.unsaved import MAX_UNSAVED_BYTES, merged

SPEC = {"cwd": "/tmp/c", "env": {}, "context_count": 0, "history_count": 0}
KNOWN = ("c", "d")


def stored_bytes(unsaved: dict[str, str]) -> int:
    return len(json.dumps(unsaved, separators=(",", ":"), ensure_ascii=False).encode())


@pytest.mark.parametrize("key", ["x", "d/x", "+3 more", "zz/x"])
def test_a_contexts_delta_reporting_a_name_outside_its_prefix_lies(key: str) -> None:
    with pytest.raises(ProtocolError, match="of context c reports an unsaved name of another"):
        merged({}, {key: "r"}, context="c", known=KNOWN)


def test_each_delta_replaces_its_own_contexts_names_only() -> None:
    record = merged({}, {"c/a": "r"}, context="c", known=KNOWN)
    record = merged(record, {"d/b": "r"}, context="d", known=KNOWN)
    record = merged(record, {"x": "r"}, context=None, known=KNOWN)
    assert record == {"c/a": "r", "d/b": "r", "x": "r"}
    record = merged(record, {}, context="c", known=KNOWN)
    assert record == {"d/b": "r", "x": "r"}
    assert merged(record, {}, context=None, known=("c",)) == {}  # d was destroyed: its names go with it


def test_a_default_name_that_reads_as_a_contexts_is_the_default_contexts() -> None:
    """``globals()['c/x'] = 1`` is honest in the default context: kept apart from c's names, replaced by the next
    default report, never by c's."""
    record = merged({"c/a": "r"}, {"c/x": "not an identifier", "a/b": "not one either"}, context=None, known=KNOWN)
    assert record == {"'c/x'": "not an identifier", "'a/b'": "not one either", "c/a": "r"}
    assert merged(record, {}, context="c", known=KNOWN) == {"'c/x'": "not an identifier", "'a/b'": "not one either"}
    assert merged(record, {}, context=None, known=KNOWN) == {"c/a": "r"}


def test_the_workspaces_paths_are_their_own_and_replaced_only_by_a_delta_with_files() -> None:
    """``/workspace/<path>`` keys: kept through variables' reports of any context, replaced by ``workspace``; a
    default name that reads as one is the default context's (its ``repr``), a context's is a lie."""
    record = merged({"x": "r"}, {}, context=None, known=KNOWN, workspace={"/workspace/fifo": "a FIFO"})
    assert record == {"/workspace/fifo": "a FIFO"}
    record = merged(
        record,
        {
            "c/a": "r",
        },
        context="c",
        known=KNOWN,
    )
    record = merged(record, {"/workspace/x": "odd global"}, context=None, known=KNOWN)
    assert record == {"'/workspace/x'": "odd global", "/workspace/fifo": "a FIFO", "c/a": "r"}
    assert merged(record, {}, context="c", known=KNOWN, workspace={}) == {"'/workspace/x'": "odd global"}
    with pytest.raises(ProtocolError):
        merged({}, {"/workspace/x": "r"}, context="c", known=KNOWN)


def test_the_report_is_bounded_in_entries_across_contexts() -> None:
    def report(context: str) -> dict[str, str]:
        return {f"{context}/v{i}": "r" for i in range(MAX_UNSAVED_NAMES)}

    record = merged({}, report("c"), context="c", known=KNOWN)
    assert record == report("c")  # it fits
    for context in ["d", "c", "d", "c"]:
        others = [key for key in record if not key.startswith(f"{context}/") and not key.endswith(" more")]
        names = MAX_UNSAVED_NAMES + len(others)
        record = merged(record, report(context), context=context, known=KNOWN)
        assert len(record) == MAX_UNSAVED_NAMES
        assert list(record)[:-1] == list(report(context))[:-1]  # the delta's own names first
        left_out = names - (MAX_UNSAVED_NAMES - 1)
        assert record[f"+{left_out} more"].startswith(f"{left_out} more names were not saved")
    assert merged(record, {}, context="c", known=KNOWN) == {}  # d's were all left out (counted) until d reports


def test_the_report_is_bounded_in_stored_bytes() -> None:
    """Reasons of 2,000 characters, each 3 bytes in UTF-8 (or 6 as escapes), from two contexts."""
    reason = "\u4e2d" * 2000
    record: dict[str, str] = {}
    for context in KNOWN:
        total = MAX_UNSAVED_NAMES + len(record) - (1 if record else 0)  # the delta's names and the others (no marker)
        record = merged(
            record, {f"{context}/v{i}": reason for i in range(MAX_UNSAVED_NAMES)}, context=context, known=KNOWN
        )
        assert MAX_UNSAVED_BYTES - 6_100 < stored_bytes(record) <= MAX_UNSAVED_BYTES  # full but for one entry's room
        left_out = [key for key in record if key.endswith(" more")]
        assert left_out == [f"+{total - (len(record) - 1)} more"]


@pytest.fixture
def ledger(tmp_path) -> CheckpointLedger:
    store = SessionStore(tmp_path)
    record = SessionRecord(
        session_id="s-unsaved", image="img", created_at=time.time(), last_used_at=0.0, owner=new_owner_token(), epoch=1
    )
    record.contexts = {"c": SPEC}
    return CheckpointLedger.create(store, record, 1000, keep=10)


def test_the_stored_record_stays_bounded_however_big_the_reasons(ledger: CheckpointLedger, tmp_path) -> None:
    """Every call's delta reports 1,000 names with 2,000-character UTF-8 reasons: the record holds them once, its
    kept generations the names only, and ``meta.json`` stays within the bound plus the names of the history."""
    meta = tmp_path / "sessions" / "s-unsaved" / "meta.json"
    reason = "\u00e9" * 2000
    for generation in range(1, 13):
        delta = {
            "generation": generation,
            "blobs": [],
            "vars": {},
            "deleted": [f"v{generation - 1}"] if generation > 1 else [],
            "unsaved": {f"n{generation}_{i}": reason for i in range(MAX_UNSAVED_NAMES)},
        }
        if generation == 1:
            delta["blobs"], delta["vars"] = [{"digest": "1" * 32, "size": 1}], {"v0": "1" * 32}
        ledger.commit(delta, bytearray(b"x" if generation == 1 else b""))  # type: ignore[arg-type]
        assert all(reason == "" for s in ledger.record.history for reason in s.unsaved.values())
        assert meta.stat().st_size < MAX_UNSAVED_BYTES + 10 * 25_000, meta.stat().st_size
    assert stored_bytes(ledger.record.unsaved) <= MAX_UNSAVED_BYTES


def test_a_default_delta_cannot_grow_a_contexts_names(ledger: CheckpointLedger) -> None:
    """Before: a default delta's ``c/...`` names were c's, which no default delta removed again (2,000 -> 6,000)."""
    for generation in range(5):
        reported = {f"c/n{generation}_{i}": "r" for i in range(MAX_UNSAVED_NAMES)}
        delta = {"generation": 0, "blobs": [], "vars": {}, "deleted": [], "unsaved": reported}
        ledger.commit(delta, bytearray())  # type: ignore[arg-type]
        assert len(ledger.record.unsaved) == MAX_UNSAVED_NAMES
        assert all(key.startswith(f"'c/n{generation}_") for key in ledger.record.unsaved)
