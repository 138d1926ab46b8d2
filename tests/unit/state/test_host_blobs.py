"""Host-made blobs: the pickle the controller writes around a str or bytes value, the agent adopting it without
pickling, and the store naming it only in the commit that stores the reply (docs/protocol.md, "Host-made blobs")."""

from __future__ import annotations

import os
import pickle
import re
import time

import pytest
from agent_process import load

from orchestrator.agent import blob_format, checkpoint, request_table
from orchestrator.errors import CheckpointError, CheckpointQuotaExceeded, ProtocolError, SessionAttachedElsewhere
from orchestrator.state.ledger import CheckpointLedger, new_owner_token
from orchestrator.state.store import SessionRecord, new_host_blob_id
from orchestrator.wire.replies import BLOB_ID, DIGEST

H1, H2 = "h" + "1" * 32, "h" + "2" * 32
D1 = "1" * 32


def joined(kind: str, raw: bytes) -> bytes:
    return b"".join(blob_format.host_blob_parts(kind, raw))


def host_delta(generation, changed, deleted=()):
    return {"generation": generation, "blobs": [], "vars": dict(changed), "deleted": list(deleted), "unsaved": {}}


# --- the hand-made pickle -----------------------------------------------------------------------------------


def test_the_opcodes_are_the_pickle_modules():
    assert blob_format._HOST_BLOB_OPCODES == {"str": pickle.BINUNICODE8, "bytes": pickle.BINBYTES8}
    head = blob_format.host_blob_parts("str", b"ab")[0]
    assert head[:1] == pickle.PROTO and head[1] == 4 and blob_format.host_blob_parts("str", b"")[2] == pickle.STOP
    assert len(joined("str", b"ab")) == 2 + blob_format.HOST_BLOB_OVERHEAD


@pytest.mark.parametrize(
    "text",
    [
        "",
        "plain ASCII text",
        "héllo wörld ✓ 𝄞 日本語",
        "lone \ud800 and \udfff surrogates",
        "\udc80" * 3,
        "x" * 300_000,
    ],
)
def test_a_str_blob_unpickles_to_the_str(text):
    raw = text.encode("utf-8", errors="surrogatepass")
    blob = joined("str", raw)
    assert pickle.loads(blob) == text and type(pickle.loads(blob)) is str
    assert checkpoint.loads(bytearray(blob)) == text  # as the agent restores it: from its receive buffer
    assert blob_format.host_blob_framed(blob) and blob_format.host_blob_framed(memoryview(bytearray(blob)))


@pytest.mark.parametrize("data", [b"", b"\x00\xff raw", os.urandom(3 << 20)])
def test_a_bytes_blob_unpickles_to_the_bytes(data):
    blob = joined("bytes", data)
    assert pickle.loads(blob) == data and type(pickle.loads(blob)) is bytes
    assert checkpoint.loads(memoryview(blob)) == data


def test_the_payload_is_not_copied_into_the_parts():
    raw = b"y" * 100_000
    assert blob_format.host_blob_parts("bytes", raw)[1] is raw


def test_a_damaged_blob_is_not_whole():
    blob = joined("str", b"abc")
    for bad in (blob[:-1], blob + b".", b"\x80\x03" + blob[2:], blob[:-1] + b"!", blob[:5], b"", pickle.dumps("abc")):
        assert not blob_format.host_blob_framed(bad), bad


def test_host_ids_and_content_digests_are_told_apart():
    fresh = new_host_blob_id()
    assert blob_format.is_host_blob(fresh) and BLOB_ID.match(fresh) and not DIGEST.match(fresh)
    assert fresh != new_host_blob_id()
    digest = blob_format.blob_digest(b"x")
    assert not blob_format.is_host_blob(digest) and BLOB_ID.match(digest) and DIGEST.match(digest)
    for bad in ("h" + "A" * 32, "h" * 33, "h" + "1" * 31, "g" + "1" * 32, H1 + "\n", D1 + "\n", None, 7):
        assert not blob_format.is_host_blob(bad)
        assert not (isinstance(bad, str) and BLOB_ID.match(bad))


# --- the tracker adopts a host-made blob --------------------------------------------------------------------


@pytest.fixture
def counted_dumps():
    calls: list[str] = []

    def dumps(name, value):
        calls.append(name)
        return checkpoint.dumps(name, value)

    dumps.calls = calls  # type: ignore[attr-defined]
    return dumps


def test_an_adopted_value_is_changed_without_a_blob_and_then_left_alone(counted_dumps):
    tracker = checkpoint.Tracker()
    ns = {"x": 1}
    tracker.delta(ns, counted_dumps)
    value = "context " * 1000
    ns["context_0"] = ns["context"] = value
    size = len(value) + blob_format.HOST_BLOB_OVERHEAD
    tracker.adopt(["context_0", "context"], value, H1, size)
    counted_dumps.calls.clear()
    delta, parts = tracker.delta(ns, counted_dumps)
    assert delta == {
        "generation": 2,
        "blobs": [],
        "vars": {"context_0": H1, "context": H1},
        "deleted": [],
        "unsaved": {},
    }
    assert parts == [] and counted_dumps.calls == []
    assert tracker.held.sizes[H1] == size and tracker.held.refs[H1] == 2
    # Untouched: nothing to say, nothing pickled, the generation stays.
    delta, parts = tracker.delta(ns, counted_dumps)
    assert (delta["vars"], delta["deleted"], delta["generation"], parts, counted_dumps.calls) == ({}, [], 2, [], [])


def test_rebinding_an_adopted_name_sends_a_pickle_and_drops_the_host_blob(counted_dumps):
    tracker = checkpoint.Tracker()
    value = b"raw bytes" * 100
    ns = {"doc": value}
    tracker.adopt(["doc"], value, H1, len(value) + blob_format.HOST_BLOB_OVERHEAD)
    tracker.delta(ns, counted_dumps)
    ns["doc"] = b"other bytes"
    delta, parts = tracker.delta(ns, counted_dumps)
    digest = delta["vars"]["doc"]
    assert DIGEST.match(digest) and delta["blobs"] == [{"digest": digest, "size": len(b"".join(parts))}]
    assert pickle.loads(b"".join(parts)) == b"other bytes" and counted_dumps.calls == ["doc"]
    assert H1 not in tracker.held.refs and delta["generation"] == 2


def test_a_new_name_for_an_adopted_object_shares_its_blob_without_pickling(counted_dumps):
    tracker = checkpoint.Tracker()
    value = "shared " * 1000
    ns = {"context": value}
    tracker.adopt(["context"], value, H1, len(value) + blob_format.HOST_BLOB_OVERHEAD)
    tracker.delta(ns, counted_dumps)
    ns["copy"] = ns["context"]
    delta, parts = tracker.delta(ns, counted_dumps)
    assert delta["vars"] == {"copy": H1} and delta["blobs"] == [] and parts == []
    assert counted_dumps.calls == [] and tracker.held.refs[H1] == 2
    # Equal but another object: pickled, as any new value.
    ns["other"] = "".join(["shared "] * 1000)
    delta, _ = tracker.delta(ns, counted_dumps)
    assert DIGEST.match(delta["vars"]["other"]) and counted_dumps.calls == ["other"]


def test_an_adopted_name_deleted_before_the_delta_is_reported_deleted():
    tracker = checkpoint.Tracker()
    tracker.adopt(["gone"], "text", H1, 16)
    delta, parts = tracker.delta({})
    assert delta["vars"] == {} and delta["deleted"] == ["gone"] and parts == [] and tracker.held_bytes == 0


def test_adopting_replaces_what_the_name_held_and_counts_the_quota_once():
    tracker = checkpoint.Tracker(quota=10_000)
    ns = {"a": "x" * 5000}
    tracker.delta(ns)
    ns["a"] = ns["b"] = "y" * 8000
    tracker.adopt(["a", "b"], ns["a"], H1, 8012)
    delta, _ = tracker.delta(ns)
    assert delta["vars"] == {"a": H1, "b": H1} and tracker.held_bytes == 8012
    # What is left of the quota is the rest of the checkpoint's.
    ns["c"] = "z" * 5000
    delta, _ = tracker.delta(ns)
    assert "c" in delta["unsaved"]


# --- the agent ----------------------------------------------------------------------------------------------


def test_set_value_with_a_host_blob_sends_no_blob_and_restores_from_it(agent):
    text = "héllo \ud800 wörld " * 10_000
    raw = text.encode("utf-8", errors="surrogatepass")
    size = len(raw) + blob_format.HOST_BLOB_OVERHEAD
    reply, body = agent.request(
        request_table.SET_VALUE, raw, name="context_0", kind="str", aliases=["context"], blob=H1, blob_size=size
    )
    assert reply["status"] == "ok" and len(body) == 0
    assert reply["checkpoint"]["vars"] == {"context_0": H1, "context": H1} and reply["checkpoint"]["blobs"] == []
    assert reply["checkpoint"]["generation"] == 1
    assert agent.value("context == context_0 and context is context_0") == "True"
    reply, _ = agent.run("n = len(context)")  # the context is not sent again
    assert reply["checkpoint"]["vars"].keys() == {"n"} and reply["checkpoint"]["generation"] == 2
    data = b"\x00\xff" * 50_000
    reply, body = agent.request(
        request_table.SET_VALUE,
        data,
        name="raw",
        kind="bytes",
        blob=H2,
        blob_size=len(data) + blob_format.HOST_BLOB_OVERHEAD,
    )
    assert reply["checkpoint"]["vars"] == {"raw": H2} and len(body) == 0
    # A restore loads them from the blobs the controller made (no digest to check), context and context_0 as one.
    agent.run("import os; os._exit(1)")
    agent.request(request_table.RESTORE_BEGIN, generation=3)
    for name, blob_id, blob in (("context_0", H1, joined("str", raw)), ("context", H1, joined("str", raw))):
        assert load(agent, name, blob, digest=blob_id)["status"] == "ok"
    assert load(agent, "raw", joined("bytes", data), digest=H2)["status"] == "ok"
    agent.request(request_table.RESTORE_END, generation=3)
    assert agent.value(f"context == {text!r} and context is context_0 and raw == {data!r}") == "True"
    reply, _ = agent.run("m = 1")
    assert reply["checkpoint"]["vars"].keys() == {"m"}


def test_a_host_blob_that_is_not_whole_or_does_not_fit_is_refused(agent):
    blob = joined("str", b"abcdef")
    agent.request(request_table.RESTORE_BEGIN, generation=1)
    for bad in (blob[:-1], blob[:-2] + b"."):
        reply = load(agent, "x", bad, digest=H1)
        assert reply["status"] == "error" and "not whole" in reply["reason"]
    # A content digest is still checked.
    reply = load(agent, "x", blob, digest=D1)
    assert reply["status"] == "error" and "digest" in reply["reason"]
    agent.request(request_table.RESTORE_END, generation=1)
    for fields in (
        {"kind": "str", "blob": H1, "blob_size": 3},  # wrong size
        {"kind": "json", "blob": H1, "blob_size": 4 + blob_format.HOST_BLOB_OVERHEAD},  # JSON is pickled by the agent
        {"kind": "str", "blob": D1, "blob_size": 4 + blob_format.HOST_BLOB_OVERHEAD},  # not a host-made id
    ):
        reply, _ = agent.request(request_table.SET_VALUE, b'"ab"', name="v", **fields)
        assert reply["status"] == "error" and "host-made blob" in reply["reason"], fields
    assert agent.value("'v' in globals()") == "False"


# --- the store and the ledger -------------------------------------------------------------------------------


def blob_files(store, session_id="s-test"):
    return sorted(p.name for p in (store.root / session_id / "blobs").iterdir())


def test_a_staged_blob_is_named_by_the_commit_with_the_manifest(store, ledger):
    raw = "ünïcode".encode()
    staged = ledger.stage(blob_format.host_blob_parts("str", raw))
    assert blob_format.is_host_blob(staged.blob_id) and staged.size == len(raw) + blob_format.HOST_BLOB_OVERHEAD
    delta = host_delta(1, {"context_0": staged.blob_id, "context": staged.blob_id})
    ledger.commit(delta, bytearray(), counters={"context_count": 1}, staged=[staged])
    staged.discard()
    record = store.load("s-test")
    assert record.variables == {"context_0": staged.blob_id, "context": staged.blob_id}
    assert record.blob_sizes == {staged.blob_id: staged.size} and record.context_count == 1
    assert blob_files(store) == [staged.blob_id]  # one file for both names, no temp left
    with store.mapped_blob("s-test", staged.blob_id) as blob:
        assert pickle.loads(blob) == "ünïcode"
    # Replaced: the host-made blob goes like any other.
    ledger.commit(host_delta(2, {"context_0": D1, "context": D1}) | {"blobs": [{"digest": D1, "size": 3}]}, b"one")
    assert blob_files(store) == [D1]


def test_a_staged_blob_the_reply_does_not_name_leaves_nothing(store, ledger):
    staged = ledger.stage(blob_format.host_blob_parts("bytes", b"abc"))
    ledger.commit(host_delta(1, {"x": D1}) | {"blobs": [{"digest": D1, "size": 3}]}, b"one", staged=[staged])
    staged.discard()
    assert blob_files(store) == [D1] and store.load("s-test").variables == {"x": D1}


def test_a_failed_commit_leaves_no_staged_file(store, ledger):
    staged = ledger.stage(blob_format.host_blob_parts("bytes", b"abc"))
    with pytest.raises(ProtocolError, match="out of step"):
        ledger.commit(host_delta(7, {"x": staged.blob_id}), bytearray(), staged=[staged])
    with pytest.raises(ProtocolError, match="neither sent nor stored"):
        ledger.commit(host_delta(1, {"x": H2}), bytearray(), staged=[staged])
    staged.discard()
    assert blob_files(store) == [] and store.load("s-test").generation == 0


def test_a_staged_file_a_prune_removed_meanwhile_is_written_again_under_the_lock(store, ledger):
    staged = ledger.stage(blob_format.host_blob_parts("bytes", b"abc"))
    staged._written.result()  # written; now a prune judges it unnamed and removes it
    with store.transaction("s-test") as record:
        stray = store.stray_files("s-test", record.blob_sizes)
        assert len(stray) == 1 and next(iter(stray)).name.startswith(".tmp-")
        for path in stray:
            path.unlink()
    ledger.commit(host_delta(1, {"x": staged.blob_id}), bytearray(), staged=[staged])
    staged.discard()
    assert blob_files(store) == [staged.blob_id]
    with store.mapped_blob("s-test", staged.blob_id) as blob:
        assert pickle.loads(blob) == b"abc"


def test_a_stale_owner_cannot_place_a_staged_blob(store, ledger):
    staged = ledger.stage(blob_format.host_blob_parts("bytes", b"abc"))
    CheckpointLedger.take_ownership(store, "s-test", ledger.quota, keep=0)
    with pytest.raises(SessionAttachedElsewhere):
        ledger.commit(host_delta(1, {"x": staged.blob_id}), bytearray(), staged=[staged])
    staged.discard()
    assert blob_files(store) == []


def test_the_quota_is_checked_before_anything_is_sent(store, ledger):
    quota = ledger.quota
    ledger.commit(host_delta(1, {"a": D1, "b": D1}) | {"blobs": [{"digest": D1, "size": 600}]}, b"x" * 600)
    ledger.check_room({"c"}, quota - 600, "the str value for c")  # fits exactly
    with pytest.raises(CheckpointQuotaExceeded) as caught:
        ledger.check_room({"c"}, quota - 599, "the str value for c")
    error = caught.value
    assert (error.size, error.held, error.quota) == (quota - 599, quota + 1, quota)
    assert re.search(
        rf"the str value for c .*{quota - 599} bytes.*{quota + 1} bytes.*quota of {quota} bytes", str(error)
    )
    assert "checkpoint_quota" in str(error) and "nothing was sent or stored" in str(error)
    ledger.check_room({"a"}, quota - 600, "a")  # "b" still holds the 600-byte blob
    with pytest.raises(CheckpointQuotaExceeded):
        ledger.check_room({"a"}, quota - 599, "a")
    ledger.check_room({"a", "b"}, quota, "a")  # replacing both frees it
    assert store.load("s-test").variables == {"a": D1, "b": D1}


def test_a_record_holds_host_ids_and_refuses_other_shapes(store):
    record = SessionRecord(
        session_id="s-ids", image="i", created_at=time.time(), last_used_at=0.0, owner=new_owner_token()
    )
    store.create(record)
    record.variables, record.blob_sizes = {"c": H1, "d": D1}, {H1: 12, D1: 3}
    store.save(record)
    assert store.load("s-ids").variables == {"c": H1, "d": D1}
    for bad in ("H" + "1" * 32, "h" + "1" * 33, "../" + "1" * 32):
        record.variables, record.blob_sizes = {"c": bad}, {bad: 12}
        store.save(record)
        with pytest.raises(CheckpointError, match="variables"):
            store.load("s-ids")
    with pytest.raises(CheckpointError, match="invalid blob id"):
        store.blob_path("s-ids", "h" + "1" * 32 + "/x")
