"""The supervisor reads what it needs of an exec reply at a glance, and decodes in full whatever is not plainly one."""

from __future__ import annotations

import pytest

from orchestrator.agent import framing, protocol, request_table
from orchestrator.agent.supervisor import _glance

REQUEST_ID = "0123456789abcdef0123456789abcdef"
DELTA = {"generation": 3, "blobs": [], "vars": {}, "deleted": [], "unsaved": {"x": "a reason with { and } and ]"}}


def reply(**fields) -> dict:
    """An exec reply as the worker builds it: ``type`` first, ``checkpoint`` after the cell's fields, ``id`` last."""
    header = {
        "type": request_table.EXEC_REPLY,
        "status": "ok",
        "stdout": fields.pop("stdout", ""),
        "stderr": "",
        "stdout_bytes": 0,
        "stderr_bytes": 0,
        "return_value": "1",
        "error": None,
        "duration": 1e-5,
        "checkpoint_duration": 1e-5,
        "checkpoint": fields.pop("checkpoint", DELTA),
        **fields,
    }
    header["id"] = REQUEST_ID
    return header


def glance(header: dict, request_id: str = REQUEST_ID, reply_type: str = request_table.EXEC_REPLY) -> dict | None:
    return _glance(memoryview(framing.encode_header(header)), reply_type, request_id)


def test_a_plain_reply_is_read_at_a_glance():
    assert glance(reply()) == {"type": request_table.EXEC_REPLY, "id": REQUEST_ID, "checkpoint": DELTA}


def test_output_that_looks_like_the_reply_s_end_is_only_text():
    header = reply(stdout=',"checkpoint":{"generation":99},"id":"' + REQUEST_ID + '"}')
    assert glance(header) == {"type": request_table.EXEC_REPLY, "id": REQUEST_ID, "checkpoint": DELTA}


@pytest.mark.parametrize(
    "header, request_id, reply_type",
    [
        (reply(), "another", request_table.EXEC_REPLY),  # a reply to another request: decoded, then refused
        (reply(), REQUEST_ID, request_table.LOAD_REPLY),  # not the type asked for
        (reply(), "not plain!", request_table.EXEC_REPLY),  # an id whose JSON form is not itself in quotes
        (reply(scaffold={"ok": True}), REQUEST_ID, request_table.EXEC_REPLY),  # a member after the checkpoint
        (
            reply(scaffold={"checkpoint": {"generation": 99}}),  # a nested checkpoint is not the last member
            REQUEST_ID,
            request_table.EXEC_REPLY,
        ),
        ({"type": request_table.EXEC_REPLY, "status": "ok", "id": REQUEST_ID}, REQUEST_ID, request_table.EXEC_REPLY),
        ({"type": protocol.CELL_DONE, "id": REQUEST_ID}, REQUEST_ID, request_table.EXEC_REPLY),
    ],
)
def test_anything_else_is_decoded_in_full(header, request_id, reply_type):
    assert glance(header, request_id, reply_type) is None


def test_a_surrogate_escape_is_decoded_in_full():
    raw = framing.encode_header(reply()).replace(b'"stderr":""', b'"stderr":"\\ud800"')
    assert _glance(memoryview(raw), request_table.EXEC_REPLY, REQUEST_ID) is None


def test_a_checkpoint_that_is_not_json_is_decoded_in_full():
    raw = framing.encode_header(reply()).replace(b'"generation":3', b'"generation":3,,')
    assert _glance(memoryview(raw), request_table.EXEC_REPLY, REQUEST_ID) is None
