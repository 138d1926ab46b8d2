"""Deferred values in a real agent (agent/lazy.py): a restore's big value is loaded when a cell first uses it."""

from __future__ import annotations

import json
import uuid
from typing import Any

import dill
import pytest

from orchestrator.agent import blob_format, control, protocol, reply_types, request_table
from tests.agent_process import Agent


class Store:
    """The controller's side: blobs it serves to BLOB_CALLs, and which keys were asked for."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.asked: list[str] = []
        self.refuse: set[str] = set()  # keys whose blob is not handed out
        self.damaged: set[str] = set()  # keys whose blob is handed out, then found damaged
        self.unreachable: set[str] = set()  # keys whose call fails on the way (the controller is not connected)

    def answer(self, call: dict, body: bytearray) -> tuple[dict, bytes]:
        """The controller's answer to a BLOB_CALL or BLOB_CHECK_CALL."""
        key = json.loads(body)["key"]
        if call["name"] == protocol.BLOB_CHECK_CALL:
            if key in self.damaged:
                return reply_types.host_reply(call["call"], protocol.BLOB_REFUSED + "it does not match its digest"), b""
            return reply_types.host_reply(call["call"]), b"true"
        assert call["name"] == protocol.BLOB_CALL, call
        self.asked.append(key)
        blob = self.blobs.get(json.loads(body)["digest"])
        if key in self.unreachable:
            return reply_types.host_reply(call["call"], "the controller is not connected"), b""
        if blob is None or key in self.refuse:
            return reply_types.host_reply(call["call"], protocol.BLOB_REFUSED + "gone"), b""
        return reply_types.host_reply(call["call"]), blob

    def add(self, value: Any) -> str:
        blob = dill.dumps(value)
        digest = blob_format.blob_digest(blob)
        self.blobs[digest] = blob
        return digest


def run(agent: Agent, store: Store, code: str, context: str | None = None) -> dict:
    """An exec whose BLOB_CALLs are answered from ``store``; the reply (its ``checkpoint``'s blobs dropped)."""
    fields = {} if context is None else {"context": context}
    return agent.run(code, timeout=20, on_call=store.answer, **fields)[0]


def restore(agent: Agent, store: Store, eager: dict[str, Any], deferred: dict[str, Any], **contexts: str) -> None:
    """A restore as the controller sends it: contexts, deferred values (``<context>/<name>`` keys), then loads."""
    assert agent.request(request_table.RESTORE_BEGIN, generation=3)[0]["status"] == "ok"
    for context_id, cwd in contexts.items():
        assert agent.request(request_table.CONTEXT_CREATE, context=context_id, cwd=cwd, env={})[0]["status"] == "ok"
    for key, value in deferred.items():
        digest = store.add(value)
        context, _, name = key.rpartition("/")
        header = request_table.defer_request(name, digest, len(store.blobs[digest]), context or None)
        reply, _ = agent.request(request_table.DEFER, **{k: v for k, v in header.items() if k != "type"})
        assert reply == {"type": request_table.LOAD_REPLY, "status": "ok", "id": reply["id"]}
    for name, value in eager.items():
        digest = store.add(value)
        header = request_table.load_request(name, digest, 10)
        fields = {k: v for k, v in header.items() if k != "type"}
        assert agent.request(request_table.LOAD, store.blobs[digest], **fields)[0]["status"] == "ok"
    assert agent.request(request_table.RESTORE_END, generation=3)[0]["status"] == "ok"


@pytest.fixture
def store() -> Store:
    return Store()


BIG = "x" * 100_000


def test_a_cell_that_does_not_use_a_deferred_value_does_not_load_it(agent: Agent, store: Store) -> None:
    restore(agent, store, {"small": 1}, {"big": BIG})
    reply = run(agent, store, "y = small + 1")
    assert reply["status"] == "ok" and store.asked == []
    assert reply["checkpoint"]["deleted"] == [] and list(reply["checkpoint"]["vars"]) == ["y"]
    assert run(agent, store, "len(big)")["return_value"] == "100000"
    assert store.asked == ["big"]
    assert run(agent, store, "big[:3]")["return_value"] == "'xxx'" and store.asked == ["big"]  # loaded once


def test_a_function_defined_before_the_restore_loads_the_value_it_reads(agent: Agent, store: Store) -> None:
    reply, body = agent.run("def size():\n    return len(big)")
    (blob,) = reply["checkpoint"]["blobs"]
    assert blob["size"] == len(body)
    restore(agent, store, {"size": dill.loads(bytes(body))}, {"big": BIG})
    assert store.asked == []
    assert run(agent, store, "[size() for _ in range(2)][0]")["return_value"] == "100000"
    assert store.asked == ["big"]


@pytest.mark.parametrize(
    "code, shown",
    [
        ("globals()['big'][:2]", "'xx'"),
        ("'big' in dir()", "True"),
        ("vars().get('big', '')[:1]", "'x'"),
        ("get = lambda name: globals()[name]\nget('big')[:1]", "'x'"),
    ],
)
def test_a_cell_that_reads_the_namespace_loads_what_it_may_read(
    agent: Agent, store: Store, code: str, shown: str
) -> None:
    restore(agent, store, {}, {"big": BIG, "other": [1, 2]})
    reply = run(agent, store, code)
    assert reply["status"] == "ok", reply["error"]
    assert reply["return_value"] == shown and "big" in store.asked


def test_deleting_a_deferred_value_is_a_deletion(agent: Agent, store: Store) -> None:
    restore(agent, store, {}, {"big": BIG, "kept": "k" * 10})
    reply = run(agent, store, "del big")
    assert reply["status"] == "ok", reply["error"]
    assert reply["checkpoint"]["deleted"] == ["big"]
    assert run(agent, store, "'big' in globals(), kept[:1]")["return_value"] == "(False, 'k')"


def test_rebinding_a_deferred_value_does_not_load_it(agent: Agent, store: Store) -> None:
    restore(agent, store, {}, {"big": BIG})
    reply = run(agent, store, "big = 5")
    assert store.asked == [] and list(reply["checkpoint"]["vars"]) == ["big"]


def test_a_value_that_cannot_be_loaded_fails_its_cell_by_name_and_leaves(agent: Agent, store: Store) -> None:
    restore(agent, store, {}, {"big": BIG, "other": "o"})
    store.refuse.add("big")
    reply = run(agent, store, "len(big)")
    assert reply["error"]["ename"] == "DeferredValueLost"
    assert "'big'" in reply["error"]["evalue"] and "gone" in reply["error"]["evalue"]
    assert reply["checkpoint"]["deleted"] == ["big"]
    again = run(agent, store, "big")
    assert again["error"]["ename"] == "NameError" and store.asked == ["big"]
    assert run(agent, store, "other")["return_value"] == "'o'"


def test_a_value_whose_blob_is_found_damaged_is_not_bound(agent: Agent, store: Store) -> None:
    restore(agent, store, {}, {"big": BIG})
    store.damaged.add("big")
    reply = run(agent, store, "len(big)")
    assert reply["error"]["ename"] == "DeferredValueLost" and "digest" in reply["error"]["evalue"]
    assert store.asked == ["big"] and reply["checkpoint"]["deleted"] == ["big"]


def test_a_value_that_cannot_be_asked_for_now_stays(agent: Agent, store: Store) -> None:
    restore(agent, store, {}, {"big": BIG})
    store.unreachable.add("big")
    for code in ("len(big)", "del big"):  # by a miss, and by the scan before the cell
        reply = run(agent, store, code)
        assert (
            reply["error"]["ename"] == "DeferredValueUnavailable" and "still in the session" in reply["error"]["evalue"]
        )
        assert reply["checkpoint"]["deleted"] == []
    store.unreachable.clear()
    assert run(agent, store, "len(big)")["return_value"] == "100000"


def test_a_scanned_value_that_cannot_be_loaded_stops_the_cell(agent: Agent, store: Store) -> None:
    restore(agent, store, {}, {"big": BIG})
    store.refuse.add("big")
    reply = run(agent, store, "ran = 1\ndel big")
    assert reply["error"]["ename"] == "DeferredValueLost" and "ran" not in reply["checkpoint"]["vars"]


def test_reset_and_set_value_replace_a_deferred_value(agent: Agent, store: Store) -> None:
    restore(agent, store, {}, {"big": BIG, "gone": BIG + "y"})
    reply, _ = agent.request(request_table.SET_VALUE, b"7", name="big", kind="json", checkpoint_timeout=10)
    assert reply["checkpoint"]["vars"].keys() == {"big"} and reply["checkpoint"]["deleted"] == []
    assert run(agent, store, "big")["return_value"] == "7" and store.asked == []
    reply, _ = agent.request(request_table.RESET, checkpoint_timeout=10)
    assert sorted(reply["checkpoint"]["deleted"]) == ["big", "gone"]
    assert run(agent, store, "gone")["error"]["ename"] == "NameError" and store.asked == []


def test_a_context_loads_its_own_deferred_value(agent: Agent, store: Store, tmp_path: Any) -> None:
    restore(agent, store, {}, {"big": "default", "c1/big": BIG}, c1=str(tmp_path / "c1"))
    assert run(agent, store, "len(big)", context="c1")["return_value"] == "100000"
    assert store.asked == ["c1/big"]
    assert run(agent, store, "big")["return_value"] == "'default'" and store.asked == ["c1/big", "big"]


def test_builtins_and_input_stay_live_while_values_are_pending(agent: Agent, store: Store) -> None:
    restore(agent, store, {}, {"big": BIG})
    run(agent, store, "def f():\n    return len([1]), undefined_name")
    reply = run(agent, store, "import builtins\nbuiltins.extra = 3\nextra")
    assert reply["return_value"] == "3"
    assert run(agent, store, "f()")["error"]["ename"] == "NameError"
    assert "input() has no one" in run(agent, store, "input()")["error"]["evalue"]
    assert store.asked == []


def test_an_interrupt_while_loading_leaves_the_value_pending(agent: Agent, store: Store) -> None:
    restore(agent, store, {}, {"big": BIG})
    request_id = uuid.uuid4().hex

    def interrupt(call: dict, body: bytearray) -> None:
        assert call["name"] == protocol.BLOB_CALL, call
        agent.link.send(control.phase_interrupt_message(request_id, "cell"))  # the answer never comes

    reply, _ = agent.run("len(big)", timeout=20, on_call=interrupt, id=request_id)
    assert reply["error"]["ename"] == "KeyboardInterrupt" and reply["checkpoint"]["deleted"] == []
    assert run(agent, store, "len(big)")["return_value"] == "100000"


def test_a_context_destroyed_with_a_pending_value_reports_it_deleted(agent: Agent, store: Store, tmp_path: Any) -> None:
    restore(agent, store, {}, {"c1/big": BIG}, c1=str(tmp_path / "c1"))
    reply, _ = agent.request(request_table.CONTEXT_DESTROY, context="c1", checkpoint_timeout=10)
    assert reply["checkpoint"]["deleted"] == ["c1/big"] and store.asked == []


def test_names_of_one_immutable_blob_load_as_one_object(agent: Agent, store: Store, tmp_path: Any) -> None:
    restore(agent, store, {}, {"a": BIG, "b": BIG, "c1/c": BIG, "m": [1], "n": [1]}, c1=str(tmp_path / "c1"))
    assert run(agent, store, "a is b")["return_value"] == "True"
    assert store.asked == ["a"]
    assert run(agent, store, "len(c)", context="c1")["return_value"] == "100000" and store.asked == ["a"]
    assert run(agent, store, "m is n, m == n")["return_value"] == "(False, True)"  # mutable: one copy each
