"""The host-call relay: host calls and a cell's output from the worker to the controller, and the answers back.

Host calls come from the worker on a link of their own (hostcall.py). The supervisor relays
them to the controller only while a cell runs, relays the controller's answers back, and
answers every call still open when the cell ends (or any call made outside a cell) with an
error itself. The cell's output comes on the same link and goes to the controller as the
running exec's. A cell waiting for an answer to its ``input()`` stops its clock (the ladder
asks ``waiting_for_input``). Calls and answers are bounded (``ORCH_HOST_CALL_MAX_BYTES``,
a header of at most ``protocol.HOST_CALL_HEADER_BYTES``, ``_CALL_SECONDS`` per frame).
"""

from __future__ import annotations

import contextlib
import selectors
import time
from typing import Any, Callable, Dict, Optional, Sequence, Set

from . import framing, protocol
from .channel import ControllerLink
from .config import Config
from .frames import PEEK_NOW, Copier, Movers
from .log import log
from .worker_process import WorkerProcess

_CALL_SECONDS = 2.0  # a host call frame is at most a few MB over a socket pair: a slower one is trickled


class HostCallRelay(object):
    """The host calls of the running exec's cell, open until the controller answers them or the cell ends.

    Args:
        config: the supervisor's settings (the bounds of a call and its answer).
        controller: the controller's connection being served.
        worker: the worker now running (it is replaced after a crash or a kill).
        watchers: the selectors that wait on the worker's host-call link.
    """

    def __init__(
        self,
        config: Config,
        controller: ControllerLink,
        worker: Callable[[], WorkerProcess],
        watchers: Sequence[selectors.BaseSelector],
        movers: Optional[Movers] = None,
    ) -> None:
        self.config = config
        self._movers = movers or Movers()
        self.controller = controller
        self._worker = worker
        self._selectors = watchers
        self.open_calls: Dict[int, Any] = {}  # host calls relayed for the running exec: call -> its request id
        self.blob_calls: Set[int] = set()  # open calls for a deferred value's blob: answered up to max_body
        self.input_waits: Dict[int, float] = {}  # open calls that are input() of the cell: call -> since when
        self.cell_running = False  # an exec's cell runs: the controller may interrupt it
        self.input_allowed = False  # the running exec lets its cell's input() ask the controller

    def start_cell(self, input_allowed: bool) -> None:
        """An exec's cell starts: read the controller (an interrupt may come), relay its host calls."""
        self.cell_running = True
        self.input_allowed = input_allowed
        self.controller.watch(True)

    def waiting_for_input(self) -> bool:
        """Whether the cell waits for an answer to its input() (its clock stops meanwhile)."""
        return bool(self.input_waits)

    def worker_gone(self) -> None:
        """The worker is being replaced: its link goes with it, and its callers are gone."""
        self.open_calls.clear()
        self.blob_calls.clear()
        self.controller.watch(False)

    def link_fd(self) -> int:
        calls = self._worker().calls
        return calls.fileno() if calls is not None else -1

    def take_call(self, request_id: Any, refusal: Optional[str]) -> None:
        """Read one frame from the worker's host-call link: relay a call to the controller for ``request_id``
        (or refuse it), and the cell's output for ``request_id`` (or drop it: no cell of an exec runs)."""
        worker = self._worker()
        assert worker.calls is not None
        try:
            header, body = framing.recv_frame(
                worker.calls,
                protocol.HOST_CALL_HEADER_BYTES,
                self.config.host_call_max,
                min(self.config.frame_timeout, _CALL_SECONDS),
            )
            call, name = header.get("call"), header.get("name")
            if header["type"] == protocol.OUTPUT and header.get("stream") in protocol.OUTPUT_STREAMS:
                self._relay_output(request_id, header["stream"], body)
                return
            if header["type"] != protocol.HOST_CALL or type(call) is not int or not isinstance(name, str):
                raise framing.ProtocolViolation("a %r frame that is not a host call" % header["type"])
        except (OSError, framing.ChannelClosed, framing.ProtocolViolation) as exc:
            # Cell code can write on this link too; once it is out of step, no call can be trusted on it.
            log("closed the worker's host-call link: %s" % (exc or type(exc).__name__))
            self._forget_link(worker)
            return
        if refusal is None and not self.controller.usable():
            refusal = "the controller is not connected"
        if refusal is None:
            try:
                self.controller.send({"type": protocol.HOST_CALL, "id": request_id, "call": call, "name": name}, body)
                self.open_calls[call] = request_id
                if name == protocol.BLOB_CALL:
                    self.blob_calls.add(call)
                if name == protocol.INPUT_CALL and self.input_allowed:  # a forged one does not stop the clock
                    self.input_waits[call] = time.monotonic()
                self.controller.watch(True)
                return
            except OSError:
                self._lose_controller("sending a host call failed")
                refusal = "the controller connection was lost"
        self._answer_worker({"call": call, "status": protocol.STATUS_ERROR, "error": refusal})

    def _relay_output(self, request_id: Any, stream: str, body: Any) -> None:
        if request_id is None or not self.controller.usable():
            return  # output of no exec's cell, or no one to tell: dropped (the reply keeps its head)
        try:
            self.controller.send({"type": protocol.OUTPUT, "id": request_id, "stream": stream}, body)
        except OSError:
            self._lose_controller("sending output failed")

    def drain(self, request_id: Any) -> None:
        """Relay the output the worker sent before its cell ended (and refuse the calls that came with it)."""
        worker = self._worker()
        while worker.calls is not None:
            try:
                if not worker.calls.recv(1, PEEK_NOW):
                    return  # the link closed: take_call finds out next time
            except (BlockingIOError, InterruptedError):
                return  # nothing waits (the usual case: one syscall per reply)
            except OSError:
                return
            self.take_call(request_id, protocol.CALL_ENDED)

    def take_reply(self, request_id: Any) -> bool:
        """Read a frame the controller sent while a cell runs: a host call's answer goes to the worker (a late one
        is dropped). Returns True when it is an interrupt of request ``request_id``."""
        inbox = self.controller.inbox
        assert inbox is not None
        try:
            header, body_len, _ = inbox.head(framing.MAX_HEADER_BYTES, self.config.max_body, self.config.frame_timeout)
            call = header.get("call")
            if header["type"] == protocol.INTERRUPT:
                self.controller.discard(body_len)
                return header.get("id") == request_id
            if header["type"] != protocol.HOST_REPLY or call not in self.open_calls:
                self.controller.discard(body_len)
                return False
            limit = self.config.max_body if call in self.blob_calls else self.config.host_call_max
            if body_len > limit:
                self.controller.discard(body_len)
                header = {
                    "status": protocol.STATUS_ERROR,
                    "error": "the result is %d bytes, over the sandbox's %d-byte limit for host calls"
                    % (body_len, limit),
                }
                body: Any = b""
            elif call in self.blob_calls and header.get("status") == protocol.STATUS_OK:
                self._settle(call)
                self._stream_blob(call, body_len)
                return False
            else:
                body = inbox.read_exactly(body_len)
        except (OSError, framing.ChannelClosed, framing.ProtocolViolation) as exc:
            self._lose_controller("reading a host call's answer: %s" % (exc or type(exc).__name__))
            return False
        self._settle(call)
        self._answer_worker({"call": call, "status": header.get("status"), "error": header.get("error")}, body)
        return False

    def _settle(self, call: int) -> None:
        """Host call ``call`` is answered: it is open no more."""
        del self.open_calls[call]
        self.blob_calls.discard(call)
        self.input_waits.pop(call, None)
        self.controller.watch(self.cell_running or bool(self.open_calls))

    def _stream_blob(self, call: int, size: int) -> None:
        """Pass a deferred value's blob (``size`` bytes, up to the request body limit) from the controller to the
        worker without holding it here: spliced or copied through, as a request's body is. A controller that stops
        in the middle is lost; a worker that stops reading loses its link, and the rest of the body is read and
        dropped, so the controller's stream stays in step."""
        inbox = self.controller.inbox
        assert inbox is not None
        worker = self._worker()
        first = inbox.take(size)  # the body bytes that came with the head
        remaining = size - len(first)
        head = framing.frame_head({"type": protocol.HOST_REPLY, "call": call, "status": protocol.STATUS_OK}, size)
        target = worker.calls
        try:
            if target is not None:
                target.sendall(head)
                target.sendall(first)
        except OSError as exc:
            log("closed the worker's host-call link: %s" % (exc or type(exc).__name__))
            self._forget_link(worker)
            target = None
        mover = self._movers.mover(remaining)
        while remaining:
            try:
                got = mover.fill(inbox.sock, remaining)
                if not got:
                    raise framing.ChannelClosed("the controller closed the connection in the middle of a frame")
            except (OSError, framing.ChannelClosed) as exc:
                if target is not None:
                    self._forget_link(worker)  # it holds half a frame
                self._lose_controller("reading a deferred value's blob: %s" % (exc or type(exc).__name__))
                return
            remaining -= got
            if target is None:
                continue  # read and dropped
            try:
                mover.drain(target, got)
            except OSError as exc:
                log("closed the worker's host-call link while passing a blob on: %s" % (exc or type(exc).__name__))
                self._forget_link(worker)
                target = None
                mover = Copier(remaining)  # (a pipe that failed closed itself, with the bytes in it)

    def _answer_worker(self, header: Dict[str, Any], body: Any = b"") -> None:
        worker = self._worker()
        if worker.calls is None:
            return
        header["type"] = protocol.HOST_REPLY
        try:
            framing.send_frame(worker.calls, header, body)
        except OSError as exc:
            log("closed the worker's host-call link: %s" % (exc or type(exc).__name__))
            self._forget_link(worker)

    def end_calls(self, reason: str) -> None:
        """Answer every host call still open with an error: its cell ended (or its answer cannot come)."""
        calls, self.open_calls = list(self.open_calls), {}
        self.blob_calls.clear()
        self.input_waits.clear()
        self.cell_running = False
        self.controller.watch(False)
        for call in calls:
            self._answer_worker({"call": call, "status": protocol.STATUS_ERROR, "error": reason})

    def _forget_link(self, worker: WorkerProcess) -> None:
        """Stop serving the worker's host-call link (its callers see it close and fail)."""
        self.open_calls.clear()
        self.blob_calls.clear()
        self.input_waits.clear()
        self.controller.watch(False)
        if worker.calls is not None:
            for sel in self._selectors:
                with contextlib.suppress(KeyError, ValueError):
                    sel.unregister(worker.calls)
        worker.close_calls()

    def _lose_controller(self, why: str) -> None:
        """The controller's connection broke in the middle of a request: finish the request without it."""
        log("the controller's connection broke during a request (%s)" % why)
        self.controller.lost = True
        self.end_calls("the controller connection was lost")
