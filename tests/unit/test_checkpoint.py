"""Incremental checkpoints: what is pickled, sent, skipped and reported (agent side, no container)."""

from __future__ import annotations

import threading

import pytest

from orchestrator.agent import checkpoint


@pytest.fixture
def counted_dumps(monkeypatch):
    calls: list[str] = []
    real = checkpoint.dumps

    def dumps(name, value):
        calls.append(name)
        return real(name, value)

    monkeypatch.setattr(checkpoint, "dumps", dumps)
    return calls


def test_first_delta_holds_every_variable_and_skips_dunders():
    tracker = checkpoint.Tracker()
    delta, blobs = tracker.delta({"__builtins__": {}, "x": 1, "s": "text"})
    assert set(delta["vars"]) == {"x", "s"}
    assert len(blobs) == len(delta["blobs"]) == 2
    assert delta["generation"] == 1


def test_untouched_immutable_value_is_not_pickled_again(counted_dumps):
    tracker = checkpoint.Tracker()
    ns = {"big": "x" * 1_000_000, "n": [1]}
    tracker.delta(ns)
    counted_dumps.clear()
    ns["y"] = 2
    delta, _blobs = tracker.delta(ns)
    assert "big" not in counted_dumps
    assert set(delta["vars"]) == {"y"}
    assert delta["generation"] == 2


def test_mutable_value_is_repickled_but_sent_only_when_changed():
    tracker = checkpoint.Tracker()
    ns = {"items": [1, 2]}
    tracker.delta(ns)
    delta, blobs = tracker.delta(ns)
    assert delta["vars"] == {} and blobs == [] and delta["generation"] == 1
    ns["items"].append(3)
    delta, blobs = tracker.delta(ns)
    assert set(delta["vars"]) == {"items"} and len(blobs) == 1


def test_two_names_for_one_object_send_one_blob():
    tracker = checkpoint.Tracker()
    doc = "d" * 10_000
    delta, blobs = tracker.delta({"context": doc, "context_0": doc})
    assert delta["vars"]["context"] == delta["vars"]["context_0"]
    assert len(blobs) == 1


def test_unsaveable_values_are_named_and_the_rest_saved():
    tracker = checkpoint.Tracker()
    ns = {"gen": (i for i in range(3)), "lock": threading.Lock(), "x": 5}
    delta, _ = tracker.delta(ns)
    assert "gen" in delta["unsaved"] and "generator" in delta["unsaved"]["gen"]
    assert "x" in delta["vars"]
    again, _ = tracker.delta(ns)
    assert "gen" in again["unsaved"]  # still reported while it is in the namespace


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


def test_restore_round_trip_and_generation():
    tracker = checkpoint.Tracker()
    ns = {"a": {"k": [1, 2]}, "b": b"bytes"}
    delta, blobs = tracker.delta(ns)
    by_digest = {entry["digest"]: blob for entry, blob in zip(delta["blobs"], blobs, strict=True)}
    fresh: dict = {}
    other = checkpoint.Tracker()
    failed = other.restore(fresh, 7, delta["vars"], by_digest)
    assert failed == {} and fresh == ns and other.generation == 7
    # the restored values count as saved: nothing to send next time
    assert other.delta(fresh)[0]["vars"] == {}


def test_restore_reports_blobs_that_cannot_load():
    fresh: dict = {}
    failed = checkpoint.Tracker().restore(fresh, 1, {"bad": "d"}, {"d": b"not a pickle"})
    assert "bad" in failed and "bad" not in fresh


def test_deeply_immutable():
    assert checkpoint.deeply_immutable(("a", 1, (2.0, None), frozenset({3})))
    assert not checkpoint.deeply_immutable(("a", [1]))
    assert not checkpoint.deeply_immutable(tuple(range(20_000)))  # too big to prove cheaply
