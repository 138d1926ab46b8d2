"""An authenticated connection to one agent: the handshake, then one request at a time under one deadline.

Knows nothing of containers or sessions. ``open`` waits for the agent on an ``Endpoint`` and
runs the handshake of docs/protocol.md (both sides prove they know the sandbox's secret);
``request`` sends one request and returns the reply that echoes its id, with every byte of
both directions under the caller's deadline. A ``goodbye`` (another controller took the
sandbox over) ends the connection with ``TakenOver``. Host calls that arrive while a request
waits for its reply go to the request's ``CallDesk``; the loop keeps reading while their
answers are written, so neither side can block the other. A deferred value's blob
(``protocol.BLOB_CALL``) is answered by the connection's ``blobs`` itself (runtime/deferred.py).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import secrets
import select
import time
from collections.abc import Sequence
from typing import Any

from ..agent import protocol
from ..agent.protocol import Goodbye, Hello
from ..api.events import LiveCall
from ..errors import AgentTimeoutError, ChannelLost, ProtocolError, TransportError
from ..runtime.deferred import BlobRefused, DeferredBlobs
from ..runtime.hostcalls import CallDesk, answer_error, answer_ok
from .data_channel import DataChannel
from .endpoint import Endpoint, UnixSocketEndpoint
from .replies import parse_auth_ok, parse_goodbye, parse_hello, reply_reason
from .transport import Channel

logger = logging.getLogger(__name__)

Header = dict[str, Any]
Body = protocol.Body | Sequence[protocol.Body]
_GOODBYE_WAIT = 1.0
_ENDED = "the cell that made this host call has ended"  # as the supervisor answers it in two hops
_HANDSHAKE_SECONDS = 5.0  # a real agent sends its hello as soon as it connects
_WORKER_LOST_WAIT = 5.0  # the supervisor says worker_lost once the fresh worker runs


class _WorkerLost(Exception):
    """One hop: the supervisor said ``worker_lost`` on C during a request (its message)."""

    def __init__(self, message: Header) -> None:
        super().__init__("the worker was lost")
        self.message = message


class TakenOver(TransportError):
    """The agent said goodbye: another controller owns this sandbox now."""

    def __init__(self, goodbye: Goodbye) -> None:
        super().__init__(f"the agent moved to another controller ({goodbye['reason']})")
        self.goodbye = goodbye


def _handshake(
    channel: Channel, secret: bytes, sandbox_id: str, deadline: float, one_hop: bool
) -> tuple[Hello, DataChannel | None]:
    """docs/protocol.md "Connection set-up": both ends prove they know the secret, bound to both nonces.

    With ``one_hop`` (a local endpoint, and the settings ask), one hop is taken if the agent offers it: the auth says
    so, and the first data channel is handed over right after ``auth_ok`` (docs/design/one-hop.md).
    """
    hello = parse_hello(channel.recv(deadline=deadline)[0])
    if hello["sandbox_id"] != sandbox_id:
        raise ProtocolError(f"the agent of sandbox {hello['sandbox_id'][:64]!r} connected, not {sandbox_id!r}")
    one_hop = one_hop and protocol.ONE_HOP in hello.get("capabilities", ())
    nonce = protocol.new_nonce()
    proof = protocol.auth_proof(secret, "controller", hello["nonce"], nonce)
    auth: dict[str, Any] = dict(protocol.auth_message(nonce, proof))
    if one_hop:
        auth[protocol.ONE_HOP] = True
    channel.send(auth, deadline=deadline)
    expected = protocol.auth_proof(secret, "agent", hello["nonce"], nonce)
    if not protocol.proof_matches(expected, parse_auth_ok(channel.recv(deadline=deadline)[0])):
        raise ProtocolError(f"the peer on the channel of sandbox {sandbox_id} does not know its secret")
    return hello, DataChannel.hand_over(channel, deadline=deadline) if one_hop else None


_request_ids = itertools.count()
_id_prefix = secrets.token_hex(8)


def _new_id_prefix() -> None:
    global _id_prefix
    _id_prefix = secrets.token_hex(8)


os.register_at_fork(after_in_child=_new_id_prefix)  # a forked child must not repeat its parent's ids


def new_request_id() -> str:
    """A request id unique to this process (a random prefix, then a counter): 32 hex digits, like a UUID's.

    Cheaper than ``uuid.uuid4()`` (no system call), which the trivial cell notices.
    """
    return f"{_id_prefix}{next(_request_ids):016x}"


class AgentConnection:
    """One authenticated channel to an agent, and in one hop the data channel to its worker."""

    def __init__(self, channel: Channel, hello: Hello, data: DataChannel | None = None) -> None:
        self._channel = channel
        self.hello = hello
        self._data = data

    @property
    def one_hop(self) -> bool:
        """Requests go to the worker directly, on a data channel (docs/design/one-hop.md)."""
        return self._data is not None

    @classmethod
    def open(cls, endpoint: Endpoint, *, sandbox_id: str, deadline: float, one_hop: bool = False) -> AgentConnection:
        """Wait for the agent of ``sandbox_id`` on ``endpoint`` and authenticate both ends.

        With ``one_hop``, a local endpoint's agent that offers one hop gets a data channel (docs/design/one-hop.md);
        a remote one (a Swarm node's relay) always takes two hops.

        A peer that fails the handshake (or stalls in it for ``_HANDSHAKE_SECONDS``) is dropped
        and the wait goes on, so a process that knocks on the socket cannot stop the real agent.

        Raises:
            AgentTimeoutError: no agent completed the handshake by ``deadline``.
            ProtocolError: by ``deadline``, only peers that are not this sandbox's agent came
                (wrong version, id or proof); the last one's reason.
        """
        refused: TransportError | None = None
        while True:
            try:
                channel = endpoint.accept(deadline)
            except AgentTimeoutError:
                if refused is not None:
                    raise refused from None
                raise
            try:
                hello, data = _handshake(
                    channel,
                    endpoint.secret,
                    sandbox_id,
                    min(deadline, time.monotonic() + _HANDSHAKE_SECONDS),
                    one_hop and isinstance(endpoint, UnixSocketEndpoint),
                )
            except TransportError as exc:
                channel.close()
                logger.warning("sandbox %s: dropped a peer on its channel: %s", sandbox_id, exc)
                refused = exc
                continue
            except BaseException:
                channel.close()
                raise
            logger.info(
                "agent of sandbox %s connected (Python %s, dill %s%s)",
                sandbox_id,
                hello["python"],
                hello["dill"],
                ", one hop" if data is not None else "",
            )
            return cls(channel, hello, data)

    def request(
        self,
        header: protocol.Request,
        body: Body = b"",
        *,
        deadline: float,
        checkpoint_seconds: float | None = None,
        desk: CallDesk | None = None,
        live: LiveCall | None = None,
        blobs: DeferredBlobs | None = None,
    ) -> tuple[Header, bytearray]:
        """Send one request and return its reply; every byte both ways must move before ``deadline``.

        With ``checkpoint_seconds``, the agent's ``checkpointing`` notice (the cell ended) moves
        the deadline to that many seconds from its arrival, once. Host calls made meanwhile go
        to ``desk`` (without one, each is answered with an error); the cell's output and its
        ``input()`` requests go to ``live``, which may also ask for an interrupt. While an
        ``input()`` waits for its answer the deadline stands still, as the agent's clock does. ``blobs``
        answers the agent's requests for deferred values (``protocol.BLOB_CALL``; without it, refused).

        Raises:
            TakenOver: the agent said goodbye (the request was not kept).
            AgentTimeoutError: the deadline passed.
            ChannelLost: the agent's end closed.
            ProtocolError: an invalid frame, or a reply to another request.
        """
        if "id" not in header:
            header["id"] = new_request_id()
        if self._data is not None:
            return self._one_hop_request(self._data, header, body, deadline, checkpoint_seconds, desk, live, blobs)
        try:
            self._channel.send(header, body, deadline=deadline)
        except ChannelLost:
            self._raise_if_goodbye()  # a takeover's goodbye may wait behind the pipe that just broke
            raise
        channel = self._channel
        paused_at: float | None = None
        # The reply cannot have come yet: wait before the first read, unless the deadline passed or bytes wait in the
        # channel already (what arrived is then read first, as always).
        read_first = channel.buffered or time.monotonic() >= deadline
        while True:
            if live is not None:
                if live.waiting_for_input and paused_at is None:
                    paused_at = time.monotonic()
                elif paused_at is not None and not live.waiting_for_input:
                    deadline += time.monotonic() - paused_at
                    paused_at = None
            if not read_first:
                read_first = True
                self._wait(math.inf if paused_at is not None else deadline, desk, live, header["id"])
                continue
            frame = channel.poll_recv()
            if frame is None:
                self._wait(math.inf if paused_at is not None else deadline, desk, live, header["id"])
                continue
            reply, reply_body = frame
            kind = reply.get("type")
            if kind == protocol.OUTPUT and reply.get("id") == header["id"]:
                if live is not None:
                    live.output(str(reply.get("stream")), reply_body)
                continue
            if kind == protocol.HOST_CALL and reply.get("id") == header["id"]:
                if reply.get("name") == protocol.INPUT_CALL and live is not None:
                    live.input_request(_call_number(reply), reply_body)
                else:
                    self._host_call(channel, reply, reply_body, desk, blobs)
                    self._send_while_quiet(channel, deadline)
                continue
            if kind == protocol.GOODBYE:
                raise TakenOver(parse_goodbye(reply))
            if reply.get("id") != header["id"]:
                raise ProtocolError(f"a reply for {str(reply.get('id'))[:64]!r} while waiting for {header['id']!r}")
            if kind == protocol.CHECKPOINTING and checkpoint_seconds is not None and not reply_body:
                deadline, checkpoint_seconds = time.monotonic() + checkpoint_seconds, None
                continue
            if channel.has_queued:  # the agent drops these answers; a frame cut in half would not be dropped
                channel.flush(deadline=deadline)
            return reply, reply_body

    def _one_hop_request(
        self,
        data: DataChannel,
        header: protocol.Request,
        body: Body,
        deadline: float,
        checkpoint_seconds: float | None,
        desk: CallDesk | None,
        live: LiveCall | None,
        blobs: DeferredBlobs | None,
    ) -> tuple[Header, bytearray]:
        """``request`` in one hop: the request and its reply on D, the cell's calls and output on K, control on C.

        Until the controller keeps the ladder (docs/design/one-hop.md, step 2) nothing interrupts a cell past its
        time but the caller's interrupt; the deadline then raises ``AgentTimeoutError`` and the sandbox is replaced,
        as for whatever else goes wrong here (``ChannelLost``: a worker lost, a channel closed; ``ProtocolError``).
        """
        try:
            data.requests.send(header, body, deadline=deadline)
        except ChannelLost as exc:  # the worker died between calls, or a cell closed D: the request never ran
            return self._worker_lost(data, header, exc, None, ran=False, deadline=deadline)
        try:
            return self._one_hop_reply(data, header, deadline, checkpoint_seconds, desk, live, blobs)
        except _WorkerLost as lost:
            return self._worker_lost(data, header, None, lost.message, ran=True, deadline=deadline)
        except ChannelLost as exc:  # D, K or C broke: if the worker died, the supervisor says so on C
            return self._worker_lost(data, header, exc, None, ran=True, deadline=deadline)

    def _one_hop_reply(
        self,
        data: DataChannel,
        header: protocol.Request,
        deadline: float,
        checkpoint_seconds: float | None,
        desk: CallDesk | None,
        live: LiveCall | None,
        blobs: DeferredBlobs | None,
    ) -> tuple[Header, bytearray]:
        """Wait for the reply of the request sent on D, serving K and watching C meanwhile."""
        request_id = header["id"]
        requests, calls, control = data.requests, data.calls, self._channel
        phase = "load" if header["type"] == protocol.LOAD else "cell"
        interrupted = False  # an interrupt went out before the cell (or load) ended
        paused_at: float | None = None
        ready: set[int] = set()  # the reply cannot have come yet: wait before the first read
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
                if frame is not None:
                    reply, reply_body = frame
                    if reply.get("id") != request_id:
                        raise ProtocolError(
                            f"a reply for {str(reply.get('id'))[:64]!r} while waiting for {request_id!r}"
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
            ready = self._wait_one_hop(data, math.inf if paused_at is not None else deadline, desk, live)
            if live is not None and live.take_interrupt():
                control.enqueue({"type": protocol.INTERRUPT, "id": request_id, "phase": phase})
                control.flush()
                interrupted = interrupted or phase != "checkpoint"

    def _read_control(self, control: Channel) -> None:
        """What the supervisor said on C during a request: a goodbye or a lost worker end it; nothing else is sent."""
        frame = control.poll_recv()
        if frame is None:
            return
        message, _ = frame
        kind = message.get("type")
        if kind == protocol.GOODBYE:
            raise TakenOver(parse_goodbye(message))
        if kind == protocol.WORKER_LOST:
            raise _WorkerLost(message)
        raise ProtocolError(f"the supervisor sent {str(kind)[:64]!r} on its connection in one hop")

    def _worker_lost(
        self,
        data: DataChannel,
        header: protocol.Request,
        broken: ChannelLost | None,
        lost: Header | None,
        *,
        ran: bool,
        deadline: float,
    ) -> tuple[Header, bytearray]:
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
                lost, _ = self._channel.recv(deadline=min(deadline, time.monotonic() + _WORKER_LOST_WAIT))
            except TransportError:
                raise broken from None
            if lost.get("type") == protocol.GOODBYE:
                raise TakenOver(parse_goodbye(lost)) from None
            if lost.get("type") != protocol.WORKER_LOST:
                raise broken
        data.close()
        self._data = None  # until the next is handed over: a failure below leaves no broken channel in use
        self._data = DataChannel.hand_over(self._channel, deadline=time.monotonic() + _HANDSHAKE_SECONDS)
        reply: Header = {
            "type": protocol.REPLY_TYPES.get(header["type"], protocol.ERROR),
            "id": header["id"],
            "status": protocol.STATUS_CRASHED,
            "reason": reply_reason(lost, "the worker died"),
            "oom": lost.get("oom") is True,
            "ran": ran,
            "worker_restarted": True,
        }
        return reply, bytearray()

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
                calls.enqueue(*answer_error(_call_number(message), _ENDED))
            elif kind == protocol.HOST_CALL:
                if message.get("name") == protocol.INPUT_CALL and live is not None:
                    live.input_request(_call_number(message), message_body)
                else:
                    self._host_call(calls, message, message_body, desk, blobs)
                    self._send_while_quiet(calls, deadline)
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
                calls.enqueue(*answer_error(_call_number(message), _ENDED))
            elif kind != protocol.OUTPUT:
                raise ProtocolError(f"a {str(kind)[:64]!r} frame on the host-call link after {request_id!r} ended")
        if calls.has_queued:  # a frame cut in half would break the link for the next cell
            calls.flush(deadline=deadline)

    def _wait_one_hop(
        self, data: DataChannel, deadline: float, desk: CallDesk | None, live: LiveCall | None
    ) -> set[int]:
        """Until D, K or C is readable (or K and C writable with answers queued), an answer is ready, or a time limit;
        the descriptors that are ready."""
        poller = select.poll()
        for channel in (data.requests, data.calls, self._channel):
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
        if self._channel.has_queued:
            self._channel.flush()
        return ready

    def _wait(self, deadline: float, desk: CallDesk | None, live: LiveCall | None, request_id: str) -> None:
        """Until the channel is readable (or writable with answers queued), an answer is ready, or a time limit."""
        channel = self._channel
        poller = select.poll()
        poller.register(channel.fileno(), select.POLLIN | (select.POLLOUT if channel.has_queued else 0))
        wake = deadline
        for source in (desk, live):
            if source is not None:
                poller.register(source.wake_fd, select.POLLIN)
                wake = min(wake, source.next_expiry())
        remaining = wake - time.monotonic()
        if remaining <= 0 and wake == deadline:
            raise AgentTimeoutError("the agent sent no complete reply: the deadline passed")
        ready = {fd for fd, _ in poller.poll(None if remaining == math.inf else max(0, math.ceil(remaining * 1000)))}
        now = time.monotonic()
        for source in (desk, live):
            if source is not None and (source.wake_fd in ready or source.next_expiry() <= now):
                for answer, answer_body in source.answers():
                    channel.enqueue(answer, answer_body)
        if live is not None and live.take_interrupt():
            channel.enqueue(protocol.interrupt_message(request_id))
        if channel.has_queued:
            channel.flush()

    def _send_while_quiet(self, channel: Channel, deadline: float) -> None:
        """Send the queued answers while the agent sends nothing: a deferred value's blob (100 MB) moves in one tight
        loop instead of one round of ``_wait`` per socket buffer. Stops as soon as the agent has something to say
        (it may be waiting for us to read before it reads), or at ``deadline``."""
        if not channel.has_queued:
            return
        poller = select.poll()
        poller.register(channel.fileno(), select.POLLIN | select.POLLOUT)
        while channel.has_queued and not channel.buffered:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            events = poller.poll(math.ceil(remaining * 1000))
            if any(event & ~select.POLLOUT for _, event in events):
                return  # readable (or hung up): the main loop reads first
            channel.flush()

    def _host_call(
        self, channel: Channel, frame: Header, body: bytearray, desk: CallDesk | None, blobs: DeferredBlobs | None
    ) -> None:
        """A host call of the running cell (its answer queued on ``channel``): to the desk, or refused at once."""
        call, name = _call_number(frame), frame.get("name")
        if not isinstance(name, str):
            raise ProtocolError("a host_call frame without a handler name")
        if name in (protocol.BLOB_CALL, protocol.BLOB_CHECK_CALL):
            channel.enqueue(*_blob_answer(call, name, body, blobs))
        elif desk is None:
            error = f"host call {name[:64]!r}: this cell was run without host calls"
            channel.enqueue(*answer_error(call, error))
        else:
            desk.submit(call, name, body)

    def check_idle(self) -> None:
        """Between calls the agent is silent; if it spoke, find out why.

        Raises:
            TakenOver: it said goodbye.
            ChannelLost: it hung up or sent something unasked (the sandbox is not usable as is).
        """
        if self._channel.has_pending():
            self._raise_if_goodbye()
            raise ChannelLost("the agent hung up or spoke unasked between calls")
        if self._data is not None and self._data.pending():  # step 3 answers a left thread's host calls instead
            raise ChannelLost("the worker hung up or spoke unasked on its data channel between calls")

    def _raise_if_goodbye(self) -> None:
        """Read what the agent sent unasked; TakenOver if it is a goodbye, else return."""
        try:
            message, _ = self._channel.recv(deadline=time.monotonic() + _GOODBYE_WAIT)
        except TransportError:
            return
        if message.get("type") == protocol.GOODBYE:
            raise TakenOver(parse_goodbye(message))

    def close(self) -> None:
        if self._data is not None:
            self._data.close()
        self._channel.close()


def _call_number(frame: Header) -> int:
    call = frame.get("call")
    if type(call) is not int:
        raise ProtocolError("a host_call frame without a call number")
    return call


def _blob_answer(
    call: int, name: str, body: bytearray, blobs: DeferredBlobs | None
) -> tuple[protocol.HostReply, protocol.Body]:
    """The answer to a deferred value's blob call (the blob) or check call (``true``), or why not (the sandbox's
    request is hostile)."""
    if blobs is None:
        return answer_error(call, protocol.BLOB_REFUSED + "this sandbox has no deferred values")
    try:
        payload = protocol.decode_json(body, "blob call payload")
        if name == protocol.BLOB_CHECK_CALL:
            return answer_ok(call, b"true" if blobs.verdict(payload) else b"false")
        return protocol.host_reply(call), blobs.serve(payload)  # mapped: sent before the request ends
    except protocol.ProtocolViolation as exc:
        return answer_error(call, protocol.BLOB_REFUSED + str(exc))
    except BlobRefused as exc:
        return answer_error(call, protocol.BLOB_REFUSED + str(exc))
