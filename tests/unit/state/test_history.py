"""Kept generations without an engine: the retention rule, which blobs a commit keeps or frees, rewind, and the
validation of a stored history."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import time

import pytest

from orchestrator.errors import CheckpointError, GenerationNotFound, SessionAttachedElsewhere
from orchestrator.state import history
from orchestrator.state.history import Snapshot
from orchestrator.state.ledger import CheckpointLedger, new_owner_token
from orchestrator.state.store import SessionRecord, SessionStore

D1, D2, D3, D4 = "1" * 32, "2" * 32, "3" * 32, "4" * 32


def snap(generation: int, **sizes: int) -> Snapshot:
    """A generation naming blobs ``sizes`` (one variable per blob, named after it)."""
    blobs = {name * 32: size for name, size in ((k[-1], v) for k, v in sizes.items())}
    return Snapshot(generation, float(generation), {f"v{d[0]}": d for d in blobs}, blobs)


def commit(
    ledger: CheckpointLedger,
    generation: int,
    variables: dict[str, str],
    new: dict[str, bytes],
    unsaved: dict[str, str] | None = None,
) -> None:
    """Store ``variables`` as ``generation``, sending the blobs in ``new`` (the others are stored already)."""
    before = ledger.record.variables
    body = bytearray(b"".join(new.values()))
    ledger.commit(
        {
            "generation": generation,
            "blobs": [{"digest": d, "size": len(b)} for d, b in new.items()],
            "vars": {k: v for k, v in variables.items() if before.get(k) != v},
            "deleted": [k for k in before if k not in variables],
            "unsaved": dict(unsaved or {}),
        },
        body,
    )


def blob_files(store: SessionStore, session_id: str = "s-hist") -> set[str]:
    return {p.name for p in (store.root / session_id / "blobs").iterdir()}


@pytest.fixture
def make_ledger(store):
    def make(*, keep: int, quota: int = 1000, session_id: str = "s-hist") -> CheckpointLedger:
        record = SessionRecord(
            session_id=session_id,
            image="img",
            created_at=time.time(),
            last_used_at=0.0,
            owner=new_owner_token(),
            epoch=1,
        )
        return CheckpointLedger.create(store, record, quota, keep=keep)

    return make


# ---------------------------------------------------------------- retention rule


def test_retain_keeps_the_newest_count_oldest_first():
    kept = [snap(g, b1=1) for g in range(1, 6)]
    assert [s.generation for s in history.retain(kept, {}, keep=3, quota=100)] == [3, 4, 5]
    assert [s.generation for s in history.retain(kept, {}, keep=10, quota=100)] == [1, 2, 3, 4, 5]
    assert history.retain(kept, {}, keep=0, quota=100) == []


def test_retain_drops_the_oldest_until_the_quota_holds_counting_shared_blobs_once():
    kept = [snap(1, b1=40), snap(2, b1=40, b2=30), snap(3, b2=30, b3=20)]
    current = {D3: 20, D4: 10}
    # Distinct bytes: 40 (1) + 30 (2) + 20 (3) + 10 (4) = 100, though the snapshots name 40+70+50 bytes.
    assert history.distinct_bytes([current, *(s.blob_sizes for s in kept)]) == 100
    assert [s.generation for s in history.retain(kept, current, keep=5, quota=100)] == [1, 2, 3]
    # Dropping generation 1 alone frees nothing (generation 2 names its blob too): both go, oldest first.
    assert [s.generation for s in history.retain(kept, current, keep=5, quota=99)] == [3]
    assert [s.generation for s in history.retain(kept, current, keep=5, quota=60)] == [3]
    assert history.retain(kept, current, keep=5, quota=59) == []
    assert history.retain(kept, current, keep=5, quota=29) == []  # even the current state alone is over: none kept
    assert [s.generation for s in history.retain(kept, current, keep=1, quota=100)] == [3]


def test_named_blobs_and_distinct_bytes_of_a_record():
    record = SessionRecord(
        "s-rec", "img", 0.0, 0.0, generation=3, variables={"a": D3}, blob_sizes={D3: 5}, history=[snap(1, b1=7)]
    )
    record.history.append(snap(2, b1=7, b3=5))
    assert record.named_blobs() == {D1, D3}
    assert record.history_bytes == 12 and record.checkpoint_bytes == 5


# ---------------------------------------------------------------- commits keep and free blobs


def test_a_blob_named_only_by_a_kept_generation_survives_until_it_is_trimmed(store, make_ledger):
    ledger = make_ledger(keep=2)
    commit(ledger, 1, {"a": D1}, {D1: b"one"})
    commit(ledger, 2, {"a": D2}, {D2: b"two"})
    assert blob_files(store) == {D1, D2}  # D1: only generation 1 names it
    commit(ledger, 3, {"a": D3}, {D3: b"three"})
    assert blob_files(store) == {D1, D2, D3}
    assert [s.generation for s in store.load("s-hist").history] == [1, 2]
    commit(ledger, 4, {"a": D3, "b": D4}, {D4: b"four"})
    assert [s.generation for s in store.load("s-hist").history] == [2, 3]
    assert blob_files(store) == {D2, D3, D4}  # generation 1 left the history: its blob left the disk


def test_no_history_keeps_nothing_but_the_current_blobs(store, make_ledger):
    ledger = make_ledger(keep=0)
    commit(ledger, 1, {"a": D1}, {D1: b"one"})
    commit(ledger, 2, {"a": D2}, {D2: b"two"})
    assert store.load("s-hist").history == [] and blob_files(store) == {D2}
    with pytest.raises(GenerationNotFound, match="keeps generation 2"):
        ledger.rewind(1)


def test_the_quota_trims_the_history_oldest_first(store, make_ledger):
    ledger = make_ledger(keep=10, quota=10)
    commit(ledger, 1, {"a": D1}, {D1: b"1111"})
    commit(ledger, 2, {"a": D2}, {D2: b"2222"})
    assert [s.generation for s in store.load("s-hist").history] == [0, 1]  # 4 + 4 bytes fit in 10
    commit(ledger, 3, {"a": D3}, {D3: b"3333"})
    assert [s.generation for s in store.load("s-hist").history] == [2]  # 12 would not: generation 1 went
    assert blob_files(store) == {D2, D3}
    commit(ledger, 4, {"a": D3, "b": D4}, {D4: b"444444"})
    # 10 bytes: the current state fills the quota; generation 3 names only a blob of it, so it costs nothing.
    assert [s.generation for s in store.load("s-hist").history] == [3] and blob_files(store) == {D3, D4}


def test_a_generation_that_shares_blobs_with_the_current_one_costs_only_its_own(store, make_ledger):
    ledger = make_ledger(keep=10, quota=10)
    commit(ledger, 1, {"a": D1, "b": D2}, {D1: b"11111", D2: b"222"})
    commit(ledger, 2, {"a": D1, "b": D3}, {D3: b"33"})  # 5 + 3 + 2 = 10 distinct bytes: generation 1 stays
    record = store.load("s-hist")
    assert [s.generation for s in record.history] == [0, 1] and record.history_bytes == 10


# ---------------------------------------------------------------- rewind


def test_rewind_makes_a_new_generation_equal_to_the_old(store, make_ledger):
    ledger = make_ledger(keep=5)
    commit(ledger, 1, {"a": D1, "b": D2}, {D1: b"one", D2: b"two"})
    commit(ledger, 2, {"a": D3}, {D3: b"three"})
    old = store.load("s-hist").generation_at(1)
    assert old is not None
    record = ledger.rewind(1)
    stored = store.load("s-hist")
    assert stored == record
    assert stored.generation == 3 and stored.rewound_from == 1
    assert stored.variables == old.variables and stored.blob_sizes == old.blob_sizes
    assert stored.changed == ["a", "b"]
    assert [s.generation for s in stored.history] == [0, 1, 2]  # linear: the generation left is kept as well
    assert blob_files(store) == {D1, D2, D3}
    ledger.rewind(2)  # and can be gone back to in turn
    assert store.load("s-hist").variables == {"a": D3}
    assert store.load("s-hist").generation == 4


def test_rewind_to_the_current_generation_is_a_new_equal_generation(store, make_ledger):
    ledger = make_ledger(keep=1)
    commit(ledger, 1, {"a": D1}, {D1: b"one"})
    ledger.rewind(1)
    record = store.load("s-hist")
    assert (record.generation, record.variables, record.changed, record.rewound_from) == (2, {"a": D1}, [], 1)


def test_a_rewind_frees_the_blobs_of_the_generation_it_trims(store, make_ledger):
    ledger = make_ledger(keep=2)
    commit(ledger, 1, {"a": D1}, {D1: b"one"})
    commit(ledger, 2, {"a": D2}, {D2: b"two"})
    commit(ledger, 3, {"a": D3}, {D3: b"three"})
    ledger.rewind(2)
    record = store.load("s-hist")
    assert [s.generation for s in record.history] == [2, 3] and record.variables == {"a": D2}
    assert blob_files(store) == {D2, D3}


def test_rewind_to_a_generation_not_kept_changes_nothing(store, make_ledger):
    ledger = make_ledger(keep=1)
    commit(ledger, 1, {"a": D1}, {D1: b"one"})
    commit(ledger, 2, {"a": D2}, {D2: b"two"})
    commit(ledger, 3, {"a": D3}, {D3: b"three"})
    before = (store.root / "s-hist" / "meta.json").read_bytes()
    for missing in (0, 1, 4, 99):
        with pytest.raises(GenerationNotFound, match=r"keeps generation 2, 3"):
            ledger.rewind(missing)
    assert (store.root / "s-hist" / "meta.json").read_bytes() == before


# ---------------------------------------------------------------- a crafted history is refused


@pytest.fixture
def stored(store, make_ledger):
    """The session's meta.json path and its JSON, at generation 3 with 0, 1 and 2 kept."""
    ledger = make_ledger(keep=5)
    commit(ledger, 1, {"a": D1}, {D1: b"one"})
    commit(ledger, 2, {"a": D2}, {D2: b"two"})
    commit(ledger, 3, {"a": D3}, {D3: b"three"})
    path = store.root / "s-hist" / "meta.json"
    return path, json.loads(path.read_text())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("generation", -1),
        ("generation", True),
        ("generation", "1"),
        ("at", "yesterday"),
        ("at", None),
        ("variables", {"a": "../../../etc/passwd"}),
        ("variables", {"../a": D1}),
        ("variables", {"a": D4}),  # a blob its blob_sizes does not name
        ("blob_sizes", {"../x": 1}),
        ("blob_sizes", {D1: -1}),
        ("blob_sizes", []),
        ("contexts", {"../c": {}}),
        ("contexts", {"c": {"cwd": "x"}}),
        ("context_count", -2),
        ("history_count", 1.5),
        ("changed", "a"),
        ("changed", [1]),
        ("unsaved", {"a": 1}),
        ("unsaved", ["a"]),
        ("rewound_from", -1),
        ("rewound_from", "1"),
    ],
)
def test_a_crafted_generation_is_refused(store, stored, field, value):
    path, data = stored
    data["history"][1][field] = value
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="history"):
        store.load("s-hist")


CRAFTED_HISTORIES = {
    "not a list": lambda first, second, current: "history",
    "not objects": lambda first, second, current: [1, 2],
    "fields missing": lambda first, second, current: [{"generation": 1}],
    "an unknown field": lambda first, second, current: [{**first, "owner": "x"}, second],
    "unordered": lambda first, second, current: [second, first],
    "duplicate": lambda first, second, current: [first, first],
    "not older than the current": lambda first, second, current: [first, {**second, "generation": current}],
}


@pytest.mark.parametrize("craft", CRAFTED_HISTORIES.values(), ids=CRAFTED_HISTORIES.keys())
def test_a_crafted_history_is_refused(store, stored, craft):
    path, data = stored
    path.write_text(json.dumps({**data, "history": craft(*data["history"][1:], data["generation"])}))
    with pytest.raises(CheckpointError, match="history"):
        store.load("s-hist")


@pytest.mark.parametrize(
    "value",
    [
        {"session_id": "../etc", "generation": 1},
        {"session_id": "s-src", "generation": -1},
        {"session_id": "s-src", "generation": True},
        {"session_id": "s-src"},
        {"session_id": "s-src", "generation": 1, "more": 1},
        ["s-src", 1],
        "s-src",
    ],
)
def test_a_crafted_fork_origin_is_refused(store, stored, value):
    path, data = stored
    path.write_text(json.dumps({**data, "forked_from": value}))
    with pytest.raises(CheckpointError, match="forked_from"):
        store.load("s-hist")


def test_the_stored_history_reads_back_as_written(store, stored):
    record = store.load("s-hist")
    assert [s.generation for s in record.history] == [0, 1, 2]  # the empty generation 0 is one as well
    assert record.history[0].variables == {} and record.history[1].variables == {"a": D1}
    assert record.history[2].changed == ["a"]
    assert record.generation_at(1) == record.history[1]
    assert record.generation_at(3) == record.snapshot()
    assert record.generation_at(4) is None


# ---------------------------------------------------------------- the owner's commits reuse the record they wrote


@pytest.fixture
def labelled(store, make_ledger):
    """A ledger keeping 10 generations at generation 3, with a label to edit on disk, and its meta.json path."""
    ledger = make_ledger(keep=10)
    ledger.update(lambda record: setattr(record, "labels", {"team": "aaa"}))
    commit(ledger, 1, {"a": D1}, {D1: b"one"})
    commit(ledger, 2, {"a": D2}, {D2: b"two"})
    commit(ledger, 3, {"a": D3}, {D3: b"three"})
    return ledger, store.root / "s-hist" / "meta.json"


def edit_in_place(path, old: bytes, new: bytes) -> None:
    """Change the file's bytes without a rename (same inode, same size, likely the same clock tick)."""
    data = path.read_bytes()
    assert len(old) == len(new) and data.count(old) == 1
    with open(path, "r+b") as file:
        file.write(data.replace(old, new))


def test_an_owner_s_commits_do_not_parse_its_history_again(store, labelled, monkeypatch):
    ledger, _ = labelled
    parsed = []
    real = SessionRecord.from_json.__func__
    monkeypatch.setattr(SessionRecord, "from_json", classmethod(lambda cls, *a: parsed.append(1) or real(cls, *a)))
    for generation in range(4, 9):
        blob = {D1: b"one"} if generation % 2 else {D2: b"two"}
        commit(ledger, generation, {"a": next(iter(blob))}, blob)
    assert parsed == []
    stored = store.load("s-hist")  # what any later owner reads: what the owner was told it stored
    assert parsed == [1] and stored == ledger.record and [s.generation for s in stored.history] == list(range(8))


def test_a_record_edited_in_place_between_two_commits_is_read_again(store, labelled):
    ledger, path = labelled
    edit_in_place(path, b'"team":"aaa"', b'"team":"bbb"')
    commit(ledger, 4, {"a": D1}, {D1: b"one"})
    assert store.load("s-hist").labels == ledger.record.labels == {"team": "bbb"}  # kept, not overwritten blindly


def test_a_takeover_written_in_place_between_two_commits_stops_the_owner(store, labelled):
    ledger, path = labelled
    owner = ledger.record.owner.encode()
    edit_in_place(path, owner, bytes(reversed(owner)))
    before = path.read_bytes()
    with pytest.raises(SessionAttachedElsewhere):
        commit(ledger, 4, {"a": D1}, {D1: b"one"})
    assert path.read_bytes() == before


def test_a_history_entry_corrupted_between_two_commits_is_named(store, labelled):
    ledger, path = labelled
    data = json.loads(path.read_text())
    data["history"][1]["blob_sizes"] = {D1: -1}
    path.write_text(json.dumps(data))
    before = path.read_bytes()
    with pytest.raises(CheckpointError, match=r"s-hist .*invalid field\(s\): history"):
        commit(ledger, 4, {"a": D1}, {D1: b"one"})
    assert path.read_bytes() == before


def test_a_change_left_unsaved_by_a_failed_update_does_not_reach_the_next_commit(store, labelled):
    ledger, _ = labelled

    def fail(record: SessionRecord) -> None:
        record.labels["half"] = "done"
        raise RuntimeError("stopped before the save")

    with pytest.raises(RuntimeError):
        ledger.update(fail)
    commit(ledger, 4, {"a": D1}, {D1: b"one"})
    assert store.load("s-hist").labels == ledger.record.labels == {"team": "aaa"}


def test_a_record_is_stored_as_one_json_dumps_of_it_all(labelled):
    ledger, path = labelled
    record = ledger.record
    record.contexts = {"c": {"cwd": "/c", "env": {"history": "x\u00e9\u4e2d"}, "context_count": 1, "history_count": 2}}
    encoded = json.dumps(dataclasses.asdict(record), separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    assert record.to_json() == encoded.encode() and "x\u00e9\u4e2d".encode() in record.to_json()  # UTF-8, unescaped
    stored = path.read_bytes()
    assert stored == json.dumps(json.loads(stored), separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()


def test_a_lone_surrogate_from_a_sandbox_is_stored_and_read_back_as_it_was(labelled, store):
    ledger, _ = labelled
    commit(ledger, 4, {"a": D1}, {D1: b"one"}, unsaved={"x": "half \ud800 a pair"})
    assert store.load("s-hist").unsaved == {"x": "half \ud800 a pair"}


def _take_over(root) -> None:
    CheckpointLedger.take_ownership(SessionStore(root), "s-hist", 1000, keep=10, force=True)


def test_a_takeover_by_another_process_between_two_commits_stops_the_owner(store, labelled):
    ledger, path = labelled
    child = multiprocessing.get_context("fork").Process(target=_take_over, args=(store.base,))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    taken = path.read_bytes()
    with pytest.raises(SessionAttachedElsewhere):
        commit(ledger, 4, {"a": D1}, {D1: b"one"})
    assert path.read_bytes() == taken and store.load("s-hist").epoch == ledger.record.epoch + 1


def test_a_record_s_copy_shares_nothing_that_can_change(labelled):
    """The owner's kept record (``store.Written``) is handed out as copies: a new field must be copied as well."""
    record = labelled[0].record
    record.contexts = {"c": {"cwd": "/c", "env": {"A": "b"}, "context_count": 0, "history_count": 0}}
    copied = record.copy()
    assert copied == record
    for field in dataclasses.fields(record):
        value = getattr(record, field.name)
        assert not isinstance(value, (dict, list)) or getattr(copied, field.name) is not value, field.name
    assert copied.contexts["c"]["env"] is not record.contexts["c"]["env"]
