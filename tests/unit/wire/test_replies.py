"""Agent messages are validated field by field by one parse function per kind; anything malformed is a ProtocolError."""

from __future__ import annotations

import pytest

from orchestrator import ExecResult, ProtocolError
from orchestrator.agent import protocol
from orchestrator.wire.replies import parse_exec_reply, parse_goodbye, parse_hello, worker_failure

DELTA = {"generation": 0, "blobs": [], "vars": {}, "deleted": [], "unsaved": {}}
GOOD = {
    "type": "exec_reply",
    "status": "ok",
    "stdout": "hi\n",
    "stderr": "",
    "stdout_bytes": 3,
    "stderr_bytes": 0,
    "return_value": "42",
    "error": None,
    "duration": 0.01,
    "checkpoint_duration": 0.002,
    "checkpoint": DELTA,
}


def test_good_reply():
    r = ExecResult.from_reply(parse_exec_reply(GOOD), {}, 3, {})
    assert r.ok and r.return_value == "42" and r.stdout == "hi\n" and r.generation == 3
    assert r.checkpoint_duration == 0.002


def test_error_is_data():
    err = {"ename": "ValueError", "evalue": "bad", "line": 2, "snippet": "raise ValueError('bad')", "traceback": "tb"}
    r = ExecResult.from_reply(
        parse_exec_reply({**GOOD, "status": "error", "return_value": None, "error": err}), {}, 1, {}
    )
    assert not r.ok and r.error is not None and r.error.type == "ValueError"
    assert str(r.error) == "ValueError: bad (line 2: raise ValueError('bad'))"


@pytest.mark.parametrize(
    "bad",
    [
        {**GOOD, "stdout": 5},
        {**GOOD, "duration": "fast"},
        {**GOOD, "duration": True},
        {**GOOD, "error": "boom"},
        {**GOOD, "status": "fine"},
        {**GOOD, "type": "state_reply"},
        {**GOOD, "checkpoint": {**DELTA, "vars": {"a": "../x"}}},
        {**GOOD, "checkpoint": {**DELTA, "blobs": [{"digest": "1" * 32, "size": -1}]}},
        {**GOOD, "checkpoint": {**DELTA, "deleted": [1]}},
        {k: v for k, v in GOOD.items() if k != "stderr"},
    ],
)
def test_malformed_replies(bad):
    with pytest.raises(ProtocolError):
        ExecResult.from_reply(parse_exec_reply(bad), {}, 0, {})


def test_worker_failures_are_told_apart_from_answers():
    assert worker_failure(GOOD) is None
    assert worker_failure({**GOOD, "status": "timeout", "worker_restarted": False}) is None
    killed = worker_failure({"status": "timeout", "worker_restarted": True, "phase": "checkpoint", "reason": "r"})
    assert killed is not None and killed["phase"] == "checkpoint" and killed["ran"]
    idle = worker_failure({"status": "crashed", "ran": False, "oom": True})
    assert idle is not None and not idle["ran"] and idle["oom"]


def test_the_signal_that_ended_the_worker_is_a_signals_name_or_none():
    def signal_of(value):
        failure = worker_failure({"status": "crashed", "signal": value})
        assert failure is not None
        return failure["signal"]

    assert signal_of("SIGSEGV") == "SIGSEGV" and signal_of("SIG40") == "SIG40"
    for hostile in (None, 11, "signal 40", "SIGSEGV\x1b[2J", "sigkill", "SIG" + "X" * 13, ["SIGKILL"]):
        assert signal_of(hostile) is None, hostile


def test_hello_and_goodbye():
    hello = {
        "type": "hello",
        "protocol": protocol.PROTOCOL_VERSION,
        "sandbox_id": "sb-1",
        "generation": 0,
        "nonce": "ab" * 16,
    }
    assert parse_hello(hello)["sandbox_id"] == "sb-1"
    with pytest.raises(ProtocolError, match="rebuild the image"):
        parse_hello({**hello, "protocol": 1})
    with pytest.raises(ProtocolError, match="nonce"):
        parse_hello({**hello, "nonce": ""})
    assert parse_goodbye({"type": "goodbye", "reason": "takeover", "in_flight": 3})["in_flight"] is None


def test_the_hellos_capabilities_are_a_few_short_strings_and_anything_else_is_ignored():
    hello = {"type": "hello", "protocol": protocol.PROTOCOL_VERSION, "sandbox_id": "s", "generation": 0}
    hello["nonce"] = "ab" * 16
    assert parse_hello(hello)["capabilities"] == []
    assert parse_hello({**hello, "capabilities": [protocol.RELAYED]})["capabilities"] == [protocol.RELAYED]
    for hostile in ("relayed", {"relayed": True}, None, 7):
        assert parse_hello({**hello, "capabilities": hostile})["capabilities"] == []
    offered = [protocol.RELAYED, 3, None, "x" * 65, *["more"] * 20]
    assert parse_hello({**hello, "capabilities": offered})["capabilities"] == [
        protocol.RELAYED,
        "more",
        "more",
        "more",
        "more",
    ]
