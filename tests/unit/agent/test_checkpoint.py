"""Incremental checkpoints: what is pickled, sent, skipped and reported (agent side, no container)."""

from __future__ import annotations

import pickle
import sys
import threading
import types

import pytest

from orchestrator.agent import blob_format, checkpoint, checkpoint_names


@pytest.fixture
def counted_dumps(monkeypatch):
    calls: list[str] = []
    real = checkpoint.dumps

    def dumps(name, value):
        calls.append(name)
        return real(name, value)

    monkeypatch.setattr(checkpoint, "dumps", dumps)
    return calls


def by_digest(delta: dict, parts: list) -> dict[str, bytes]:
    """digest -> blob bytes, checked against the description."""
    body = b"".join(parts)
    out, offset = {}, 0
    for entry in delta["blobs"]:
        blob = body[offset : offset + entry["size"]]
        offset += entry["size"]
        assert blob_format.blob_digest(blob) == entry["digest"]
        out[entry["digest"]] = blob
    assert offset == len(body)
    return out


def test_first_delta_holds_every_variable_and_skips_dunders():
    tracker = checkpoint.Tracker()
    delta, parts = tracker.delta({"__builtins__": {}, "x": 1, "s": "text"})
    assert set(delta["vars"]) == {"x", "s"}
    assert len(by_digest(delta, parts)) == len(delta["blobs"]) == 2
    assert delta["generation"] == 1


def test_untouched_immutable_value_is_not_pickled_again(counted_dumps):
    tracker = checkpoint.Tracker()
    ns = {"big": "x" * 1_000_000, "n": [1]}
    tracker.delta(ns)
    counted_dumps.clear()
    ns["y"] = 2
    delta, _parts = tracker.delta(ns)
    assert "big" not in counted_dumps
    assert set(delta["vars"]) == {"y"}
    assert delta["generation"] == 2


def test_mutable_value_is_repickled_but_sent_only_when_changed():
    tracker = checkpoint.Tracker()
    ns = {"items": [1, 2]}
    tracker.delta(ns)
    delta, parts = tracker.delta(ns)
    assert delta["vars"] == {} and parts == [] and delta["generation"] == 1
    ns["items"].append(3)
    delta, parts = tracker.delta(ns)
    assert set(delta["vars"]) == {"items"} and len(by_digest(delta, parts)) == 1


def test_two_names_for_one_object_send_one_blob():
    tracker = checkpoint.Tracker()
    doc = "d" * 10_000
    delta, _ = tracker.delta({"context": doc, "context_0": doc})
    assert delta["vars"]["context"] == delta["vars"]["context_0"]
    assert len(delta["blobs"]) == 1


def test_equal_values_send_their_blob_once_and_a_held_blob_not_again():
    tracker = checkpoint.Tracker()
    delta, _ = tracker.delta({"a": [1, 2], "b": [1, 2]})
    assert delta["vars"]["a"] == delta["vars"]["b"] and len(delta["blobs"]) == 1
    delta, parts = tracker.delta({"a": [1, 2], "b": [1, 2], "c": [1, 2]})
    assert delta["vars"] == {"c": delta["vars"]["c"]} and delta["blobs"] == [] and parts == []


def test_big_payloads_are_referenced_not_copied():
    text = "y" * 1_000_000
    blob = checkpoint.dumps("text", text)
    assert blob.size == len(blob.tobytes()) and blob_format.blob_digest(blob.tobytes()) == blob.digest
    assert any(type(part) is bytes and len(part) == len(text) for part in blob.parts)
    payload = b"z" * 500_000
    assert any(part is payload for part in checkpoint.dumps("payload", payload).parts)


def test_unsaveable_values_are_named_and_the_rest_saved():
    tracker = checkpoint.Tracker()
    ns = {"gen": (i for i in range(3)), "lock": threading.Lock(), "x": 5}
    delta, _ = tracker.delta(ns)
    assert "gen" in delta["unsaved"] and "generator" in delta["unsaved"]["gen"]
    assert "x" in delta["vars"]
    again, _ = tracker.delta(ns)
    assert "gen" in again["unsaved"]  # still reported while it is in the namespace


def test_an_unsaveable_value_is_tried_again_and_saved_once_it_can_be(counted_dumps):
    tracker = checkpoint.Tracker()
    box = [(i for i in range(2))]
    ns = {"box": box}
    assert "box" in tracker.delta(ns)[0]["unsaved"]
    box.pop()  # the very same object, saveable now
    counted_dumps.clear()
    delta, _ = tracker.delta(ns)
    assert counted_dumps == ["box"] and "box" in delta["vars"] and delta["unsaved"] == {}


def test_a_saved_name_that_becomes_unsaveable_is_deleted():
    tracker = checkpoint.Tracker()
    ns = {"v": 1}
    tracker.delta(ns)
    ns["v"] = (i for i in range(2))
    delta, _ = tracker.delta(ns)
    assert delta["deleted"] == ["v"] and "v" in delta["unsaved"]


def test_deleted_names_are_reported():
    tracker = checkpoint.Tracker()
    ns = {"a": 1, "b": 2}
    tracker.delta(ns)
    del ns["a"]
    delta, _ = tracker.delta(ns)
    assert delta["deleted"] == ["a"]


class _Exits:
    def __reduce__(self):
        raise SystemExit(1)


def test_anything_a_reduce_raises_means_unsaved():
    delta, _ = checkpoint.Tracker().delta({"e": _Exits(), "ok": 1})
    assert delta["unsaved"]["e"].startswith("SystemExit") and "ok" in delta["vars"]


# --- running out of time ------------------------------------------------------------------------------------


def out_of_time_at(stop: str):
    """A pickling function that runs out of time when it reaches ``stop``."""
    seen: list[str] = []

    def dumps(name, value):
        seen.append(name)
        if name == stop:
            raise KeyboardInterrupt
        return checkpoint.dumps(name, value)

    return dumps, seen


def test_out_of_time_names_the_value_and_every_later_one_unsaved():
    tracker = checkpoint.Tracker()
    frozen = "f" * 100
    ns = {"frozen": frozen, "items": [1]}
    tracker.delta(ns)
    ns.update(a=[10], slow=[20], b=[30], alias=ns["items"])
    ns["items"].append(2)
    dumps, seen = out_of_time_at("slow")
    delta, parts = tracker.delta(ns, dumps)
    reason = checkpoint.TIMEOUT_REASON
    assert seen == ["items", "a", "slow"]  # nothing is pickled after time ran out
    assert set(delta["vars"]) == {"items", "a", "alias"}  # alias: the same object, already pickled
    assert delta["unsaved"] == {"slow": reason, "b": reason}
    assert "frozen" not in delta["unsaved"]  # unchanged and known without pickling: still saved
    assert len(by_digest(delta, parts)) == 2


def test_out_of_time_deletes_a_saved_value_it_could_not_pickle_again():
    tracker = checkpoint.Tracker()
    ns = {"slow": [1], "other": [2]}
    tracker.delta(ns)
    dumps, _ = out_of_time_at("slow")
    delta, _ = tracker.delta(ns, dumps)
    assert sorted(delta["deleted"]) == ["other", "slow"] and set(delta["unsaved"]) == {"slow", "other"}
    assert delta["generation"] == 2
    delta, _ = tracker.delta(ns)  # tried again next time
    assert set(delta["vars"]) == {"slow", "other"}


def test_values_that_failed_last_time_go_last():
    tracker = checkpoint.Tracker()
    ns = {"slow": [0]}
    dumps, _ = out_of_time_at("slow")
    tracker.delta(ns, dumps)
    ns["later"] = [1]
    dumps, seen = out_of_time_at("slow")
    delta, _ = tracker.delta(ns, dumps)
    assert seen == ["later", "slow"] and "later" in delta["vars"]


# --- quota --------------------------------------------------------------------------------------------------


def test_quota_leaves_out_a_value_that_does_not_fit():
    tracker = checkpoint.Tracker(quota=10_000)
    ns = {"small": "s" * 1000, "big": "b" * 20_000, "other": "o" * 1000}
    delta, _ = tracker.delta(ns)
    assert set(delta["vars"]) == {"small", "other"}
    assert delta["unsaved"] == {"big": "checkpoint quota of 10000 bytes reached"}
    assert tracker.held_bytes == sum(b["size"] for b in delta["blobs"]) <= 10_000


def test_quota_removes_a_saved_value_that_grew_too_big_and_deletions_free_space():
    tracker = checkpoint.Tracker(quota=10_000)
    ns = {"a": ["a" * 6000], "b": "b" * 3000}
    tracker.delta(ns)
    ns["a"].append("more" * 2000)
    delta, _ = tracker.delta(ns)
    assert delta["deleted"] == ["a"] and "a" in delta["unsaved"] and tracker.held_bytes < 4000
    del ns["b"]
    ns["a"].pop()
    ns["a"].append("x" * 3000)
    delta, _ = tracker.delta(ns)
    assert delta["deleted"] == ["b"] and "a" in delta["vars"] and tracker.held_bytes <= 10_000


def test_quota_counts_a_shared_blob_once():
    tracker = checkpoint.Tracker(quota=15_000)
    doc = "d" * 10_000
    delta, _ = tracker.delta({"context": doc, "context_0": doc})
    assert set(delta["vars"]) == {"context", "context_0"} and tracker.held_bytes < 15_000


# --- restore ------------------------------------------------------------------------------------------------


def test_restore_round_trip_and_record():
    tracker = checkpoint.Tracker()
    ns = {"a": {"k": [1, 2]}, "b": b"bytes", "c": "x" * 200_000}
    delta, parts = tracker.delta(ns)
    blobs = by_digest(delta, parts)
    fresh: dict = {}
    other = checkpoint.Tracker()
    for name, digest in delta["vars"].items():
        fresh[name] = checkpoint.loads(bytearray(blobs[digest]))
        other.record(name, fresh[name], digest, len(blobs[digest]))
    assert fresh == ns and other.held_bytes == tracker.held_bytes
    # the restored values count as saved: nothing to send next time
    assert other.delta(fresh)[0]["vars"] == {}


def test_loads_reads_straight_from_the_buffer():
    for value in ["t" * 300_000, b"b" * 300_000, list(range(50_000)), {"k": ("v", 1.5, None)}]:
        blob = checkpoint.dumps("v", value).tobytes()
        assert checkpoint.loads(bytearray(blob)) == value
        assert checkpoint.loads(memoryview(blob)) == value
    assert checkpoint.loads(pickle.dumps({"old": [1, "x"]}, protocol=0)) == {"old": [1, "x"]}  # readline opcodes
    with pytest.raises(Exception):  # noqa: B017  (whatever the unpickler raises)
        checkpoint.loads(b"not a pickle")


@pytest.fixture
def session_main(monkeypatch):
    """A stand-in for the worker's session module as ``__main__``."""
    module = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", module)
    return module.__dict__


def test_a_session_class_is_saved_by_value_under_its_name_and_by_reference_elsewhere(session_main):
    exec("class Point:\n    def __init__(self, x):\n        self.x = x\np = Point(3)\nAlias = Point", session_main)
    point = checkpoint.dumps("Point", session_main["Point"]).tobytes()
    instance = checkpoint.dumps("p", session_main["p"]).tobytes()
    alias = checkpoint.dumps("Alias", session_main["Alias"]).tobytes()
    assert b"__init__" in point and b"__init__" not in instance and b"__init__" not in alias
    del session_main["Point"], session_main["p"], session_main["Alias"]
    with pytest.raises(AttributeError, match="Point"):  # an instance before its class: the caller retries
        checkpoint.loads(instance)
    session_main["Point"] = checkpoint.loads(point)
    restored = checkpoint.loads(instance)
    assert isinstance(restored, session_main["Point"]) and restored.x == 3
    assert checkpoint.loads(alias) is session_main["Point"]


def test_deeply_immutable():
    assert checkpoint.deeply_immutable(("a", 1, (2.0, None), frozenset({3})))
    assert not checkpoint.deeply_immutable(("a", [1]))
    assert not checkpoint.deeply_immutable(tuple(range(20_000)))  # too big to prove cheaply


# --- names the store could not read back, and the manifest's bounds ---------------------------------------------


def test_names_the_store_would_refuse_are_named_unsaved_never_saved():
    tracker = checkpoint.Tracker()
    long_name = "n" * (checkpoint_names.MAX_NAME_CHARS + 1)
    namespace = {"ok": 1, "a b": 2, "esc\x1b[2J": 3, long_name: 4, 7: 5}
    delta, _ = tracker.delta(namespace)
    assert set(delta["vars"]) == {"ok"}
    assert delta["unsaved"]["a b"] == "the name is not a Python identifier"
    assert "esc\x1b[2J" in delta["unsaved"]
    assert delta["unsaved"]["7"] == "the name is not a str"
    shown = long_name[: checkpoint_names.MAX_NAME_CHARS] + "..."
    assert delta["unsaved"][shown] == f"the name is longer than {checkpoint_names.MAX_NAME_CHARS} characters"
    assert all(checkpoint_names.checkpoint_key_problem(key) is None for key in delta["vars"])


def test_names_past_the_manifest_bound_are_unsaved_and_the_rest_saved(monkeypatch):
    monkeypatch.setattr(checkpoint_names, "MAX_CHECKPOINT_NAMES", 5)
    tracker = checkpoint.Tracker()
    first, _ = tracker.delta({f"v{i}": i for i in range(8)})
    assert len(first["vars"]) == 5 and len(first["unsaved"]) == 3
    assert all(reason == checkpoint.names_reason() for reason in first["unsaved"].values())
    # Deleting names frees room for the waiting ones on the next checkpoint.
    second, _ = tracker.delta({f"v{i}": i for i in range(2, 8)})
    assert set(second["deleted"]) == {"v0", "v1"}
    assert set(second["vars"]) == {"v5", "v6"} and set(second["unsaved"]) == {"v7"}
    assert tracker.held.names == 5


def test_name_bytes_count_with_the_context_prefix_across_contexts(monkeypatch):
    monkeypatch.setattr(checkpoint_names, "MAX_CHECKPOINT_NAME_BYTES", 19)
    default = checkpoint.Tracker()
    other = checkpoint.Tracker(held=default.held, prefix="ctx/")
    assert set(default.delta({"abcdefgh": 1})[0]["vars"]) == {"abcdefgh"}
    delta, _ = other.delta({"abcdefgh": 1, "x": 2})  # "ctx/abcdefgh" is 12 bytes: 8 + 12 > 19; "ctx/x" fits
    assert "abcdefgh" in delta["unsaved"] and set(delta["vars"]) == {"x"}
    assert default.held.name_bytes == len("abcdefgh") + len("ctx/x")


def test_unsaved_lists_at_most_the_protocol_bound(monkeypatch):
    monkeypatch.setattr(checkpoint_names, "MAX_CHECKPOINT_NAMES", 3)
    tracker = checkpoint.Tracker()
    delta, _ = tracker.delta({f"v{i}": i for i in range(checkpoint_names.MAX_UNSAVED_NAMES + 50)})
    assert len(delta["vars"]) == 3
    assert len(delta["unsaved"]) == checkpoint_names.MAX_UNSAVED_NAMES
    unsaved_in_all = checkpoint_names.MAX_UNSAVED_NAMES + 50 - 3
    listed = checkpoint_names.MAX_UNSAVED_NAMES - 1
    summary = f"+{unsaved_in_all - listed} more"
    assert [key for key in delta["unsaved"] if not key.startswith("v")] == [summary]
    assert delta["unsaved"][summary].startswith(f"{unsaved_in_all - listed} more names were not saved")
