"""Every field of an agent's reply is typed and bounded before the controller uses it (docs/trust.md)."""

from __future__ import annotations

from typing import Any

import pytest
from reply_support import exec_reply

from orchestrator.agent import checkpoint_names, framing, protocol, request_table
from orchestrator.api.results import ExecResult
from orchestrator.errors import ProtocolError
from orchestrator.wire.replies import (
    parse_exec_reply,
    parse_goodbye,
    parse_hello,
    parse_load_reply,
    parse_restore_reply,
    worker_failure,
)

D1 = "1" * 32


def test_an_honest_reply_parses() -> None:
    parsed = parse_exec_reply(exec_reply())
    assert parsed["duration"] == 0.25 and parsed["checkpoint"]["vars"] == {"x": D1}


ERROR = {"ename": "E", "evalue": "", "snippet": "", "traceback": "", "line": 1}


@pytest.mark.parametrize(
    "changes",
    [
        {"duration": -1.0},
        {"duration": 1e300},
        {"duration": True},
        {"duration": "1"},
        {"checkpoint_duration": -0.5},
        {"stdout_bytes": -1},
        {"stderr_bytes": 1 << 64},
        {"stdout_bytes": 1.5},
        {"checkpoint__generation": -1},
        {"checkpoint__generation": True},
        {"checkpoint__blobs": [{"digest": D1, "size": -3}]},
        {"checkpoint__blobs": [{"digest": D1, "size": framing.MAX_BODY_BYTES + 1}]},
        {"checkpoint__blobs": [{"digest": D1, "size": 3}, {"digest": D1, "size": 3}]},
        {"checkpoint__blobs": [{"digest": D1, "size": 3}] * (4 * checkpoint_names.MAX_CHECKPOINT_NAMES + 1)},
        {"checkpoint__vars": {"x" * 300: D1}},
        {"checkpoint__vars": {"x": "not a blob id"}},
        {"checkpoint__deleted": ["x" * 300]},
        {"checkpoint__deleted": [1]},
        {"checkpoint__deleted": ["x"] * (4 * checkpoint_names.MAX_CHECKPOINT_NAMES + 1)},
        {"checkpoint__unsaved": {f"v{i}": "r" for i in range(checkpoint_names.MAX_UNSAVED_NAMES + 1)}},
        {"checkpoint__unsaved": {"v": "r" * (checkpoint_names.MAX_REASON_CHARS + 1)}},
        {"checkpoint__unsaved": {"v" * (checkpoint_names.MAX_UNSAVED_KEY_CHARS + 1): "r"}},
        {"checkpoint__unsaved": {"v": 1}},
    ],
    ids=lambda changes: next(iter(changes)),
)
def test_a_lie_in_any_field_is_a_protocol_error(changes: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError):
        parse_exec_reply(exec_reply(**changes))


@pytest.mark.parametrize(
    "error",
    [
        dict(ERROR, line=-1),
        dict(ERROR, column=1 << 40),
        dict(ERROR, end_column="3"),
        dict(ERROR, ename=5),
        {k: v for k, v in ERROR.items() if k != "traceback"},
    ],
    ids=["line", "column", "end_column", "ename", "missing"],
)
def test_a_lie_in_the_user_error_is_a_protocol_error(error: dict[str, Any]) -> None:
    parsed = parse_exec_reply(exec_reply(error=error))
    with pytest.raises(ProtocolError):
        ExecResult.from_reply(parsed, {}, 1, {})


def test_labels_are_clipped_and_made_visible() -> None:
    hello = {
        "type": protocol.HELLO,
        "protocol": protocol.PROTOCOL_VERSION,
        "sandbox_id": "sb-" + "a" * 1000,
        "generation": 0,
        "python": "3.11\x1b]52;c;aGk=\x07" + "x" * 1000,
        "dill": ["not", "a", "str"],
        "nonce": "n" * 32,
    }
    parsed = parse_hello(hello)
    assert "\x1b" not in parsed["python"] and "\\x1b" in parsed["python"] and len(parsed["python"]) <= 80
    assert parsed["dill"] == "" and len(parsed["sandbox_id"]) == 64
    with pytest.raises(ProtocolError):
        parse_hello(dict(hello, generation=-5))
    goodbye = parse_goodbye({"type": protocol.GOODBYE, "reason": "\r" * 10_000, "in_flight": "i" * 10_000})
    assert len(goodbye["reason"]) <= 64 * 4 and goodbye["in_flight"] is not None and len(goodbye["in_flight"]) == 64


def test_reasons_are_clipped_and_only_text() -> None:
    failure = worker_failure(
        {"type": request_table.EXEC_REPLY, "status": "crashed", "reason": "r" * 10**6, "phase": {}}
    )
    assert (
        failure is not None
        and len(failure["reason"]) == checkpoint_names.MAX_REASON_CHARS
        and failure["phase"] == "cell"
    )
    load = parse_load_reply({"type": request_table.LOAD_REPLY, "status": "error", "reason": ["x"] * 10})
    assert load["reason"] == ""
    with pytest.raises(ProtocolError):
        parse_restore_reply({"type": request_table.RESTORE_REPLY, "status": "ok", "generation": -1})
