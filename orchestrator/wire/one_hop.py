"""One hop (docs/design/one-hop.md): the controller's requests go to the worker directly.

The supervisor's authenticated connection (C) stays the control channel: it carries the worker's data
channel once per worker (``DataChannel.hand_over``), the caller's interrupts, and the supervisor's
``goodbye`` and ``worker_lost``. A request and its reply go on D, the running cell's output and host
calls on K; the worker (cell code) holds the other ends of both, so everything read there is checked
here as the supervisor checks it in two hops.
"""

from __future__ import annotations

import math
import secrets
import select
import time

from ..agent import protocol
from ..api.events import LiveCall
from ..errors import AgentTimeoutError, ChannelLost, ProtocolError, TransportError
from ..runtime.deferred import DeferredBlobs
from ..runtime.hostcalls import CallDesk, answer_error
from .data_channel import DataChannel
from .host_link import call_number, send_while_quiet, serve_host_call
from .replies import TakenOver, parse_goodbye, reply_reason
from .transport import Channel, FrameBody

_ENDED = "the cell that made this host call has ended"  # as the supervisor answers it in two hops
_HAND_OVER_SECONDS = 5.0  # the supervisor takes a data channel at once
_WORKER_LOST_WAIT = 5.0  # the supervisor says worker_lost once the fresh worker runs
_REPLACE_SECONDS = 5.0  # at least this long for worker_replaced: the supervisor answers once the fresh worker runs


def made_up_reply(header: protocol.Request, **fields: object) -> protocol.Header:
    """A reply the controller makes for ``header`` when the worker could not give one (its worker was lost or
    replaced): the reply type and id of the request, and ``fields``."""
    return {"type": protocol.REPLY_TYPES.get(header["type"], protocol.ERROR), "id": header["id"], **fields}


class _WorkerLost(Exception):
    """The supervisor said ``worker_lost`` on C during a request (its message)."""

    def __init__(self, message: protocol.Header) -> None:
        super().__init__("the worker was lost")
        self.message = message


class _SupervisorSpoke(ProtocolError):
    """The supervisor, not its worker, sent something invalid on C: only a new sandbox helps."""


class OneHop:
    """One worker's data channel, beside its supervisor's connection ``control`` (not this object's to close)."""

    def __init__(self, control: Channel, data: DataChannel, frame_seconds: float = 10.0) -> None:
        self._control = control
        self._data: DataChannel | None = data
        self._frame_seconds = frame_seconds  # a frame the worker began on D may stall this long (two hops: the agent's)
        self._lost_between_calls: str | None = None  # why the worker was replaced since the last request, if it was

    def request(
        self,
        header: protocol.Request,
        body: FrameBody,
        *,
        deadline: float,
        checkpoint_seconds: float | None,
        desk: CallDesk | None,
        live: LiveCall | None,
        blobs: DeferredBlobs | None,
        value_fd: int | None = None,
    ) -> tuple[protocol.Header, bytearray]:
        """``request`` in one hop: the request and its reply on D, the cell's calls and output on K, control on C.
        ``value_fd`` (a request without a body: a ``set_value``'s value file) goes with the request's first bytes.

        Until the controller keeps the ladder (docs/design/one-hop.md, step 2) nothing interrupts a cell past its
        time but the caller's interrupt; the deadline then raises ``AgentTimeoutError`` and the sandbox is replaced,
        as for whatever else goes wrong here (``ChannelLost``: a worker lost, a channel closed). A forged or invalid
        frame on D or K has the worker replaced and is answered ``protocol_error`` (``_worker_misbehaved``).
        """
        lost, self._lost_between_calls = self._lost_between_calls, None
        if lost is not None and header["type"] != protocol.RESTORE_BEGIN:  # a restore wants a fresh worker anyway
            reply = made_up_reply(
                header, status=protocol.STATUS_CRASHED, reason=lost, oom=False, ran=False, worker_restarted=True
            )
            return reply, bytearray()
        data = self._data
        if data is None:
            raise ChannelLost("the worker's data channel could not be handed over after its last worker was lost")
        try:
            if value_fd is None:
                data.requests.send(header, body, deadline=deadline)
            else:
                data.requests.send_fds(header, [value_fd], deadline=deadline)
        except ChannelLost as exc:  # the worker died between calls, or a cell closed D: the request never ran
            return self._worker_lost(data, header, exc, None, ran=False, deadline=deadline)
        try:
            return self._reply(data, header, deadline, checkpoint_seconds, desk, live, blobs)
        except _WorkerLost as lost:
            return self._worker_lost(data, header, None, lost.message, ran=True, deadline=deadline)
        except ChannelLost as exc:  # D, K or C broke: if the worker died, the supervisor says so on C
            return self._worker_lost(data, header, exc, None, ran=True, deadline=deadline)
        except _SupervisorSpoke:
            raise
        except ProtocolError as exc:  # the worker (cell code) wrote it on D or K: the supervisor replaces it
            return self._worker_misbehaved(header, exc, deadline)

    def _worker_misbehaved(
        self, header: protocol.Request, exc: ProtocolError, deadline: float
    ) -> tuple[protocol.Header, bytearray]:
        """A forged or invalid frame on D or K (cell code holds their other ends): the worker is replaced through C
        and the request answered ``protocol_error``, as the supervisor answers a frame it refuses in two hops, so
        recovery restores into the same sandbox. Raises what ``replace_worker`` raises."""
        replaced = self.replace_worker(header["id"], deadline=deadline)
        reason = f"{str(exc)[:200]}; it was killed"
        reply = made_up_reply(
            header,
            status=protocol.STATUS_PROTOCOL_ERROR,
            reason=reason,
            oom=replaced.get("oom") is True,
            ran=True,
            worker_restarted=True,
        )
        return reply, bytearray()

    def _reply(
        self,
        data: DataChannel,
        header: protocol.Request,
        deadline: float,
        checkpoint_seconds: float | None,
        desk: CallDesk | None,
        live: LiveCall | None,
        blobs: DeferredBlobs | None,
    ) -> tuple[protocol.Header, bytearray]:
        """Wait for the reply of the request sent on D, serving K and watching C meanwhile."""
        request_id = header["id"]
        requests, calls, control = data.requests, data.calls, self._control
        phase = "load" if header["type"] == protocol.LOAD else "cell"
        interrupted = False  # an interrupt went out before the cell (or load) ended
        paused_at: float | None = None
        ready: set[int] = set()  # the reply cannot have come yet: wait before the first read
        stalled = math.inf  # when a frame the worker began on D, and stopped feeding, makes it a forger
        while True:
            if live is not None:
                if live.waiting_for_input and paused_at is None:
                    paused_at = time.monotonic()
                elif paused_at is not None and not live.waiting_for_input:
                    deadline += time.monotonic() - paused_at
                    paused_at = None
            if control.fileno() in ready or control.buffered:
                self._read_control(control)
            if calls.fileno() in ready or calls.buffered:
                self._read_calls(calls, request_id, desk, live, blobs, deadline, phase == "checkpoint")
            if requests.fileno() in ready or requests.buffered:
                frame = requests.poll_recv()
                if frame is None and requests.fileno() in ready:  # more of it came
                    stalled = time.monotonic() + self._frame_seconds
                elif frame is None and time.monotonic() >= stalled:
                    raise ProtocolError("the worker stopped in the middle of a frame on its data channel")
                if frame is not None:
                    stalled = math.inf
                    reply, reply_body = frame
                    if reply.get("id") != request_id:
                        raise ProtocolError(
                            f"the worker sent a frame for {str(reply.get('id'))[:64]!r} that does not answer request "
                            f"{request_id!r}"
                        )
                    if reply.get("type") == protocol.CELL_DONE and not reply_body:
                        if phase == "checkpoint":
                            raise ProtocolError(f"the worker said twice that the cell of {request_id!r} ended")
                        phase = "checkpoint"  # its clock runs now, once
                        if checkpoint_seconds is not None:
                            deadline = time.monotonic() + checkpoint_seconds
                        continue
                    self._after_reply(calls, request_id, live, deadline)
                    if interrupted and reply.get("status") == protocol.STATUS_ERROR:
                        # The interrupt stopped it (one that finished just then stays a success): as the supervisor
                        # says it in two hops.
                        reply.update(status=protocol.STATUS_TIMEOUT, worker_restarted=False)
                        reply.setdefault("phase", "load" if header["type"] == protocol.LOAD else "cell")
                    return reply, reply_body
            ready = self._wait(data, min(stalled, math.inf if paused_at is not None else deadline), desk, live)
            if live is not None and live.take_interrupt():
                control.enqueue({"type": protocol.INTERRUPT, "id": request_id, "phase": phase})
                control.flush()
                interrupted = interrupted or phase != "checkpoint"

    def _read_control(self, control: Channel) -> None:
        """What the supervisor said on C during a request: a goodbye or a lost worker end it; nothing else is sent."""
        try:
            frame = control.poll_recv()
        except ProtocolError as exc:
            raise _SupervisorSpoke(str(exc)) from exc
        if frame is None:
            return
        message, _ = frame
        kind = message.get("type")
        if kind == protocol.GOODBYE:
            raise TakenOver(parse_goodbye(message))
        if kind == protocol.WORKER_LOST:
            raise _WorkerLost(message)
        raise _SupervisorSpoke(f"the supervisor sent {str(kind)[:64]!r} on its connection in one hop")

    def _worker_lost(
        self,
        data: DataChannel,
        header: protocol.Request,
        broken: ChannelLost | None,
        lost: protocol.Header | None,
        *,
        ran: bool,
        deadline: float,
    ) -> tuple[protocol.Header, bytearray]:
        """The worker's data channel broke (``broken``) or the supervisor said ``worker_lost`` (``lost``): with the
        supervisor's word (waited for on C, a little), hand its fresh worker a new data channel and answer as the
        supervisor does in two hops, ``crashed`` (recovery restores into the fresh worker). Without it, ``broken``.

        Raises:
            TakenOver: the supervisor said goodbye instead.
            ChannelLost: no ``worker_lost`` came (``broken``), or the new data channel could not be handed over.
        """
        if lost is None:
            assert broken is not None
            try:
                lost, _ = self._control.recv(deadline=min(deadline, time.monotonic() + _WORKER_LOST_WAIT))
            except TransportError:
                raise broken from None
            if lost.get("type") == protocol.GOODBYE:
                raise TakenOver(parse_goodbye(lost)) from None
            if lost.get("type") != protocol.WORKER_LOST:
                raise broken
        self._drop_data()
        self._hand_over()
        reply = made_up_reply(
            header,
            status=protocol.STATUS_CRASHED,
            reason=reply_reason(lost, "the worker died"),
            oom=lost.get("oom") is True,
            ran=ran,
            worker_restarted=True,
        )
        return reply, bytearray()

    def replace_worker(self, kill_id: str | None = None, *, deadline: float) -> protocol.Header:
        """Have the supervisor kill this worker and start a fresh one, and hand that one a new data channel.

        The way out of whatever leaves the worker's data channel unusable while the supervisor is sound: a cell that
        ignored its interrupt, a forged or invalid frame on D or K, a channel the cell closed. Our ends of the old D
        and K are closed first, so nothing the old worker (or a process it left behind) wrote there is ever read.
        ``kill {id}`` goes on C; the supervisor answers ``worker_replaced {id, reason, oom}`` once the fresh worker
        runs (a ``worker_lost`` before it is the old worker's death, which the kill outran: the kill replaces the
        fresh one too). ``kill_id`` is the request's id during a request, else a fresh one is made. Waits until
        ``deadline``, or ``_REPLACE_SECONDS`` if that is later.

        Returns:
            The supervisor's ``worker_replaced``: its ``reason`` and ``oom`` are the supervisor's, not the worker's.

        Raises:
            TakenOver: the supervisor said goodbye instead (another controller took the sandbox over).
            AgentTimeoutError, ChannelLost, ProtocolError: C failed or said something else; the sandbox must be
                replaced (no data channel is left in use).
        """
        kill_id = kill_id if kill_id is not None else secrets.token_hex(16)
        self._drop_data()
        control = self._control
        deadline = max(deadline, time.monotonic() + _REPLACE_SECONDS)
        control.enqueue({"type": protocol.KILL, "id": kill_id})  # behind an interrupt still queued, if any
        control.flush(deadline=deadline)
        while True:
            message, _ = control.recv(deadline=deadline)
            kind = message.get("type")
            if kind == protocol.WORKER_REPLACED and message.get("id") == kill_id:
                break
            if kind == protocol.GOODBYE:
                raise TakenOver(parse_goodbye(message))
            if kind != protocol.WORKER_LOST:
                raise ProtocolError(f"the supervisor sent {str(kind)[:64]!r} while it replaced its worker")
        self._hand_over()
        return message

    def _drop_data(self) -> None:
        """Close our ends of the worker's data channel; until the next is handed over there is none to use."""
        if self._data is not None:
            self._data.close()
            self._data = None

    def _hand_over(self) -> None:
        """Hand the supervisor's fresh worker a new data channel (the old one went with its worker)."""
        self._data = DataChannel.hand_over(self._control, deadline=time.monotonic() + _HAND_OVER_SECONDS)

    def _read_calls(
        self,
        calls: Channel,
        request_id: str,
        desk: CallDesk | None,
        live: LiveCall | None,
        blobs: DeferredBlobs | None,
        deadline: float,
        ended: bool,
    ) -> None:
        """The running cell's output and host calls that came on K (the link is the cell's: frames carry no id);
        once the cell has ``ended`` (its checkpoint runs), a call is refused, as after the reply."""
        while (frame := calls.poll_recv()) is not None:
            message, message_body = frame
            kind = message.get("type")
            if kind == protocol.OUTPUT:
                if live is not None:
                    live.output(str(message.get("stream")), message_body)
            elif kind == protocol.HOST_CALL and ended:
                calls.enqueue(*answer_error(call_number(message), _ENDED))
            elif kind == protocol.HOST_CALL:
                if message.get("name") == protocol.INPUT_CALL and live is not None:
                    live.input_request(call_number(message), message_body)
                else:
                    serve_host_call(calls, message, message_body, desk, blobs)
                    send_while_quiet(calls, deadline)
            else:
                raise ProtocolError(f"a {str(kind)[:64]!r} frame on the host-call link while {request_id!r} ran")

    def _after_reply(self, calls: Channel, request_id: str, live: LiveCall | None, deadline: float) -> None:
        """The cell's last output is in K before its reply is read (a socket pair's write completes in the peer's
        buffer): deliver it; a call that is still open is refused, and every answer goes out whole before return."""
        while (frame := calls.poll_recv()) is not None:
            message, message_body = frame
            kind = message.get("type")
            if kind == protocol.OUTPUT and live is not None:
                live.output(str(message.get("stream")), message_body)
            elif kind == protocol.HOST_CALL:
                calls.enqueue(*answer_error(call_number(message), _ENDED))
            elif kind != protocol.OUTPUT:
                raise ProtocolError(f"a {str(kind)[:64]!r} frame on the host-call link after {request_id!r} ended")
        if calls.has_queued:  # a frame cut in half would break the link for the next cell
            calls.flush(deadline=deadline)

    def _wait(self, data: DataChannel, deadline: float, desk: CallDesk | None, live: LiveCall | None) -> set[int]:
        """Until D, K or C is readable (or K and C writable with answers queued), an answer is ready, or a time limit;
        the descriptors that are ready."""
        poller = select.poll()
        for channel in (data.requests, data.calls, self._control):
            poller.register(channel.fileno(), select.POLLIN | (select.POLLOUT if channel.has_queued else 0))
        wake = deadline
        for source in (desk, live):
            if source is not None:
                poller.register(source.wake_fd, select.POLLIN)
                wake = min(wake, source.next_expiry())
        remaining = wake - time.monotonic()
        if remaining <= 0 and wake == deadline:
            raise AgentTimeoutError("the worker sent no complete reply: the deadline passed")
        ready = {fd for fd, _ in poller.poll(None if remaining == math.inf else max(0, math.ceil(remaining * 1000)))}
        now = time.monotonic()
        for source in (desk, live):
            if source is not None and (source.wake_fd in ready or source.next_expiry() <= now):
                for answer, answer_body in source.answers():
                    data.calls.enqueue(answer, answer_body)
        if data.calls.has_queued:
            data.calls.flush()
        if self._control.has_queued:
            self._control.flush()
        return ready

    def check_idle(self) -> None:
        """Between calls the worker is silent on D and K.

        What it wrote on D, or its hanging up there (cell code holds D's other end: a thread it left, a forged or late
        reply), has the supervisor replace it, and the next request is answered as a worker lost between calls
        (``crashed, ran: false``), as the supervisor answers it in two hops: recovery restores, then sends it again.

        Raises:
            TakenOver: the supervisor said goodbye while the worker was replaced.
            ChannelLost: it wrote or hung up on K, or the worker could not be replaced (the sandbox is not usable).
        """
        data = self._data
        if data is not None and data.requests.has_pending():
            try:
                self.replace_worker(deadline=time.monotonic())
            except (AgentTimeoutError, ProtocolError) as exc:
                raise ChannelLost(
                    f"the worker spoke unasked on its data channel and could not be replaced: {exc}"
                ) from exc
            self._lost_between_calls = "the worker wrote out of turn on its data channel; it was killed"
            return
        if data is not None and data.calls.has_pending():  # step 3 answers a left thread's host calls instead
            raise ChannelLost("the worker hung up or spoke unasked on its data channel between calls")

    def close(self) -> None:
        """Close D and K: the worker sees EOF, goes back to its supervisor and reports itself idle."""
        if self._data is not None:
            self._data.close()
