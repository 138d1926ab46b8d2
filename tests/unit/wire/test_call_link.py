"""The worker's host-call link, the controller's end (wire/call_link.py): what the controller does for K.

The worker's end is a plain socket of a real socket pair; the test writes frames there as cell code could.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.agent import framing, protocol, request_table
from orchestrator.runtime.hostcalls import CallDesk, HandlerPool, HostCalls
from orchestrator.wire.call import Call, answer_ok
from orchestrator.wire.call_link import ANSWER_MAX_BYTES, CallLink
from orchestrator.wire.transport import Channel

LATER = time.monotonic() + 3600


@pytest.fixture
def pair() -> Iterator[tuple[CallLink, socket.socket]]:
    ours, theirs = socket.socketpair()
    link = CallLink(Channel(ours, protocol.HOST_CALL_HEADER_BYTES, protocol.HOST_CALL_MAX_BYTES), blob_files=True)
    theirs.settimeout(5)
    yield link, theirs
    link.close()
    theirs.close()


def call(sock: socket.socket, number: int, name: str = "echo", payload: Any = None) -> None:
    framing.send_frame(sock, {"type": protocol.HOST_CALL, "call": number, "name": name}, json.dumps(payload).encode())


def answer(sock: socket.socket) -> tuple[dict[str, Any], bytearray]:
    return framing.recv_frame(sock, framing.MAX_HEADER_BYTES, framing.MAX_BODY_BYTES)


def nothing_more(sock: socket.socket) -> bool:
    return not select.select([sock], [], [], 0.2)[0]


def read(link: CallLink, desk: CallDesk | None = None, refusal: str | None = None) -> None:
    link.read(Call(LATER, desk=desk), refusal=refusal, output=None, deadline=LATER)


def test_a_call_open_when_its_cell_ends_is_answered_at_once_and_its_late_answer_dropped(
    pair: tuple[CallLink, socket.socket],
) -> None:
    link, worker = pair
    release = threading.Event()
    desk = CallDesk(HostCalls({"slow": lambda p: release.wait(5) and "LATE"}), HandlerPool(4), max_held=4)
    call(worker, 1, "slow")
    read(link, desk)
    link.end_cell()
    header, _ = answer(worker)
    assert header == {"type": protocol.HOST_REPLY, "call": 1, "status": "error", "error": protocol.CALL_ENDED}
    release.set()
    deadline = time.monotonic() + 5
    while not (late := desk.answers()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert late, "the handler finished"
    link.answer(late)
    assert nothing_more(worker), "the late answer never reaches the worker"
    desk.close()


def test_an_answer_over_the_sandboxs_own_bound_is_an_error(pair: tuple[CallLink, socket.socket]) -> None:
    link, worker = pair
    desk = CallDesk(HostCalls({"echo": lambda p: p}), HandlerPool(4), max_held=4)
    call(worker, 1, "echo")
    read(link, desk)
    link.answer([answer_ok(1, b"z" * (ANSWER_MAX_BYTES + 1))])
    header, body = answer(worker)
    assert header["status"] == "error" and str(ANSWER_MAX_BYTES) in header["error"] and not body, header
    desk.close()


def test_between_calls_a_call_is_answered_and_output_dropped(pair: tuple[CallLink, socket.socket]) -> None:
    link, worker = pair
    framing.send_frame(worker, {"type": protocol.OUTPUT, "stream": "stdout"}, b"left behind\n")
    call(worker, 7)
    link.idle()
    header, _ = answer(worker)
    assert (header["call"], header["status"], header["error"]) == (7, "error", protocol.CALL_NO_CELL)
    assert not link.closed and nothing_more(worker)


@pytest.mark.parametrize(
    "hostile",
    [
        b"\x00garbage, not a frame\xff" * 64,
        struct.pack("!4sII", b"ORC1", 40, 0xFFFFFFF0) + b'{"type": "host_call", "call": 1, "name": "x"}',
        struct.pack("!4sII", b"ORC1", 0x7FFFFFFF, 0) + b"{",
        framing.frame_head({"type": request_table.EXEC_REPLY, "id": "x"}, 0),
        framing.frame_head({"type": protocol.OUTPUT, "stream": "nowhere"}, 0),
        framing.frame_head({"type": protocol.HOST_CALL, "call": "1", "name": "echo"}, 0),
    ],
    ids=["garbage", "huge-body", "huge-header", "not-a-call", "bad-stream", "bad-call-number"],
)
def test_a_frame_that_is_not_a_call_or_output_closes_the_link(
    pair: tuple[CallLink, socket.socket], hostile: bytes
) -> None:
    link, worker = pair
    worker.sendall(hostile)
    read(link)
    assert link.closed and link.poll_events() == 0
    assert worker.recv(1) == b"", "the worker sees its link close"
    link.idle()
    link.after_reply(None)  # nothing to do on a closed link, and nothing raises


def test_a_worker_that_sends_calls_without_taking_the_answers_is_not_read_on_and_then_closed(
    pair: tuple[CallLink, socket.socket],
) -> None:
    link, worker = pair
    worker.setblocking(False)
    frame = framing.frame_head({"type": protocol.HOST_CALL, "call": 1, "name": "echo"}, 0)
    for sent in range(1, 2000):  # forged calls until K's buffer is full; the answers are never read
        try:
            worker.send(frame)
        except BlockingIOError:
            break
        if sent % 16 == 0:
            read(link)
    for _ in range(200):
        read(link)
    assert link.poll_events() == select.POLLOUT, "no call is read while answers wait for the worker"
    started = time.monotonic()
    link.after_reply(None)
    assert link.closed, "a worker that does not take its answers breaks its link"
    assert time.monotonic() - started < 10


def test_calls_are_refused_when_no_cell_runs(pair: tuple[CallLink, socket.socket]) -> None:
    link, worker = pair
    call(worker, 3)
    read(link, refusal=protocol.CALL_ENDED)
    header, _ = answer(worker)
    assert (header["call"], header["error"]) == (3, protocol.CALL_ENDED)
