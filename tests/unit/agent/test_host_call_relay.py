"""The host-call relay on socket pairs (no process): calls and output out only during a cell, answers back, bounds."""

from __future__ import annotations

import os
import selectors
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.agent import framing, protocol
from orchestrator.agent.channel import ControllerLink
from orchestrator.agent.config import Config
from orchestrator.agent.host_call_relay import HostCallRelay

ENDED = "the cell that made this host call has ended"


class FakeWorker:
    """The supervisor's end of a worker's host-call link, as WorkerProcess holds it."""

    def __init__(self, calls: socket.socket) -> None:
        self.calls: socket.socket | None = calls

    def close_calls(self) -> None:
        if self.calls is not None:
            self.calls.close()
            self.calls = None


class Sandbox:
    """A relay between a fake worker's link (``worker_end``) and a fake controller (``controller_end``)."""

    def __init__(self, **environ: str) -> None:
        ours, self.worker_end = socket.socketpair()
        conn, self.controller_end = socket.socketpair()
        for sock in (self.worker_end, self.controller_end):
            sock.settimeout(5)
        self.worker = FakeWorker(ours)
        self.selector = selectors.DefaultSelector()
        self.controller = ControllerLink(self.selector)
        self.controller.attach(conn)
        config = Config({"ORCH_WORKER_UID": str(os.geteuid()), "ORCH_FRAME_TIMEOUT": "1", **environ})
        self.relay = HostCallRelay(config, self.controller, lambda: self.worker, [self.selector])  # type: ignore[arg-type,return-value]

    def call(self, call: Any, name: str = "lookup", body: bytes = b"payload") -> None:
        framing.send_frame(self.worker_end, {"type": protocol.HOST_CALL, "call": call, "name": name}, body)

    def answer(self, header: dict[str, Any], body: bytes = b"") -> None:
        framing.send_frame(self.controller_end, {"type": protocol.HOST_REPLY, **header}, body)

    def worker_gets(self) -> tuple[dict[str, Any], bytes]:
        header, body = framing.recv_frame(self.worker_end)
        return header, bytes(body)

    def controller_gets(self) -> tuple[dict[str, Any], bytes]:
        header, body = framing.recv_frame(self.controller_end)
        return header, bytes(body)

    def nothing_for(self, sock: socket.socket) -> bool:
        sock.setblocking(False)
        try:
            sock.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return True
        finally:
            sock.settimeout(5)
        return False

    def close(self) -> None:
        self.worker.close_calls()
        for sock in (self.worker_end, self.controller_end):
            sock.close()
        if self.controller.conn is not None:
            self.controller.conn.close()
        self.selector.close()


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    made = Sandbox()
    yield made
    made.close()


def test_a_call_outside_a_cell_is_refused_by_the_relay_itself(sandbox: Sandbox) -> None:
    sandbox.call(1)
    sandbox.relay.take_call(None, "no cell is running")
    assert sandbox.worker_gets() == (
        {"type": protocol.HOST_REPLY, "call": 1, "status": "error", "error": "no cell is running"},
        b"",
    )
    assert sandbox.nothing_for(sandbox.controller_end)
    assert not sandbox.relay.open_calls


def test_a_call_of_the_cell_goes_to_the_controller_and_its_answer_back(sandbox: Sandbox) -> None:
    sandbox.relay.start_cell(input_allowed=False)
    assert sandbox.controller.watching
    sandbox.call(7)
    sandbox.relay.take_call("r1", None)
    assert sandbox.controller_gets() == (
        {"type": protocol.HOST_CALL, "id": "r1", "call": 7, "name": "lookup"},
        b"payload",
    )
    assert sandbox.relay.open_calls == {7: "r1"}
    sandbox.answer({"call": 7, "status": "ok"}, b"result")
    assert sandbox.relay.take_reply("r1") is False
    header, body = sandbox.worker_gets()
    assert (header["call"], header["status"], body) == (7, "ok", b"result")
    assert not sandbox.relay.open_calls
    assert sandbox.controller.watching, "the cell still runs: the controller may interrupt it"


def test_an_answer_to_no_open_call_is_dropped(sandbox: Sandbox) -> None:
    sandbox.relay.start_cell(input_allowed=False)
    sandbox.answer({"call": 3, "status": "ok"}, b"late")
    assert sandbox.relay.take_reply("r1") is False
    assert sandbox.nothing_for(sandbox.worker_end)


def test_an_interrupt_counts_only_for_the_running_request(sandbox: Sandbox) -> None:
    framing.send_frame(sandbox.controller_end, {"type": protocol.INTERRUPT, "id": "old"})
    framing.send_frame(sandbox.controller_end, {"type": protocol.INTERRUPT, "id": "r1"})
    assert sandbox.relay.take_reply("r1") is False
    assert sandbox.relay.take_reply("r1") is True


def test_an_answer_over_the_sandboxs_bound_reaches_the_worker_as_an_error() -> None:
    sandbox = Sandbox(ORCH_HOST_CALL_MAX_BYTES="10")
    try:
        sandbox.relay.start_cell(input_allowed=False)
        sandbox.call(1, body=b"")
        sandbox.relay.take_call("r1", None)
        sandbox.controller_gets()
        sandbox.answer({"call": 1, "status": "ok"}, b"x" * 20)
        sandbox.relay.take_reply("r1")
        header, body = sandbox.worker_gets()
        assert header["status"] == "error" and body == b""
        assert "20 bytes, over the sandbox's 10-byte limit" in header["error"]
    finally:
        sandbox.close()


def test_a_deferred_values_blob_passes_the_host_call_bound_and_streams_through() -> None:
    sandbox = Sandbox(ORCH_HOST_CALL_MAX_BYTES="30", ORCH_MAX_BODY="300000")
    try:
        sandbox.relay.start_cell(input_allowed=False)
        sandbox.call(1, protocol.BLOB_CALL, b'{"key": "x", "digest": "d"}')
        sandbox.relay.take_call("r1", None)
        sandbox.controller_gets()
        blob = bytes(range(256)) * 1000  # past a splice's minimum, within the body bound
        threading.Thread(target=sandbox.answer, args=({"call": 1, "status": "ok"}, blob)).start()
        got: list[tuple[dict[str, Any], bytes]] = []
        reader = threading.Thread(target=lambda: got.append(sandbox.worker_gets()))  # the worker's reader thread
        reader.start()
        sandbox.relay.take_reply("r1")
        reader.join(5)
        assert got == [({"type": protocol.HOST_REPLY, "call": 1, "status": "ok"}, blob)]
        assert not sandbox.relay.open_calls and not sandbox.relay.blob_calls
        sandbox.call(2, "lookup", b"")  # a call of another name keeps the host-call bound
        sandbox.relay.take_call("r1", None)
        sandbox.controller_gets()
        sandbox.answer({"call": 2, "status": "ok"}, b"x" * 40)
        sandbox.relay.take_reply("r1")
        assert sandbox.worker_gets()[0]["status"] == "error"
    finally:
        sandbox.close()


def test_the_end_of_the_cell_answers_every_open_call(sandbox: Sandbox) -> None:
    sandbox.relay.start_cell(input_allowed=False)
    for call in (1, 2):
        sandbox.call(call)
        sandbox.relay.take_call("r1", None)
        sandbox.controller_gets()
    sandbox.relay.end_calls(ENDED)
    answers = [sandbox.worker_gets()[0] for _ in range(2)]
    assert [(a["call"], a["status"], a["error"]) for a in answers] == [(1, "error", ENDED), (2, "error", ENDED)]
    assert not sandbox.relay.open_calls and not sandbox.relay.cell_running
    assert not sandbox.controller.watching


def test_only_an_allowed_input_call_stops_the_cells_clock(sandbox: Sandbox) -> None:
    sandbox.relay.start_cell(input_allowed=False)
    sandbox.call(1, name=protocol.INPUT_CALL)
    sandbox.relay.take_call("r1", None)
    assert not sandbox.relay.waiting_for_input(), "a forged input() does not stop the clock"
    sandbox.relay.end_calls(ENDED)
    sandbox.worker_gets()
    sandbox.controller_gets()
    sandbox.relay.start_cell(input_allowed=True)
    sandbox.call(2, name=protocol.INPUT_CALL)
    sandbox.relay.take_call("r2", None)
    assert sandbox.relay.waiting_for_input()
    sandbox.answer({"call": 2, "status": "ok"}, b"typed")
    sandbox.relay.take_reply("r2")
    assert not sandbox.relay.waiting_for_input()


def test_output_goes_out_as_the_running_execs_and_is_dropped_outside_one(sandbox: Sandbox) -> None:
    framing.send_frame(sandbox.worker_end, {"type": protocol.OUTPUT, "stream": "stdout"}, b"hello\n")
    sandbox.relay.take_call("r1", None)
    assert sandbox.controller_gets() == ({"type": protocol.OUTPUT, "id": "r1", "stream": "stdout"}, b"hello\n")
    framing.send_frame(sandbox.worker_end, {"type": protocol.OUTPUT, "stream": "stderr"}, b"late\n")
    sandbox.relay.take_call(None, ENDED)
    assert sandbox.nothing_for(sandbox.controller_end)


def test_drain_relays_the_output_sent_before_the_reply(sandbox: Sandbox) -> None:
    for line in (b"a\n", b"b\n"):
        framing.send_frame(sandbox.worker_end, {"type": protocol.OUTPUT, "stream": "stdout"}, line)
    sandbox.relay.drain("r1")
    assert [sandbox.controller_gets()[1] for _ in range(2)] == [b"a\n", b"b\n"]
    sandbox.relay.drain("r1")  # nothing waits: returns at once


@pytest.mark.parametrize(
    "header",
    [{"type": protocol.HOST_CALL, "call": "1", "name": "f"}, {"type": protocol.HOST_CALL, "call": 1}, {"type": "exec"}],
)
def test_a_frame_that_is_not_a_call_closes_the_link(sandbox: Sandbox, header: dict[str, Any]) -> None:
    sandbox.selector.register(sandbox.worker.calls, selectors.EVENT_READ)  # type: ignore[arg-type]
    framing.send_frame(sandbox.worker_end, header)
    sandbox.relay.take_call("r1", None)
    assert sandbox.worker.calls is None and sandbox.relay.link_fd() == -1
    assert not sandbox.selector.get_map()
    assert sandbox.worker_end.recv(1) == b"", "the cell sees its link closed"


def test_a_controller_gone_mid_cell_gets_the_call_refused_and_the_request_finishes_without_it(
    sandbox: Sandbox,
) -> None:
    sandbox.relay.start_cell(input_allowed=False)
    sandbox.controller_end.close()
    sandbox.call(1)
    sandbox.relay.take_call("r1", None)
    header, _ = sandbox.worker_gets()
    assert (header["status"], header["error"]) == ("error", "the controller connection was lost")
    assert sandbox.controller.lost and not sandbox.controller.usable()
    sandbox.call(2)
    sandbox.relay.take_call("r1", None)
    assert sandbox.worker_gets()[0]["error"] == "the controller is not connected"
