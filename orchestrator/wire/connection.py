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
from typing import Any

from ..agent import handshake, protocol, request_table
from ..agent.handshake import Hello
from ..config import Timeouts
from ..errors import AgentTimeoutError, ChannelLost, OrchestratorError, ProtocolError, TransportError
from .call import Call
from .data_channel import Carrier, DataChannel, Descriptors
from .endpoint import Endpoint
from .host_link import (
    OutputBudget,
    call_number,
    due_answers,
    send_while_quiet,
    serve_host_call,
    wait_for_sandbox,
)
from .one_hop import OneHop, goodbye_behind
from .relay import Relay
from .replies import TakenOver, parse_auth_ok, parse_goodbye, parse_hello
from .transport import Channel, FrameBody

logger = logging.getLogger(__name__)

Header = dict[str, Any]
Body = FrameBody
_HANDSHAKE_SECONDS = 5.0  # a real agent sends its hello as soon as it connects


_OneHopStart = tuple[Carrier, Channel, DataChannel]  # the carrier, the control channel, the first data channel


def _handshake(
    channel: Channel, secret: bytes, sandbox_id: str, deadline: float, carrier: str | None
) -> tuple[Hello, _OneHopStart | None]:
    """docs/protocol.md "Connection set-up": both ends prove they know the secret, bound to both nonces.

    With a ``carrier`` (one hop, as the settings ask), one hop is taken if the agent offers it (and the relayed
    carrier, if that is the one): the auth says so, and the first data channel is handed over right after
    ``auth_ok`` (docs/design/one-hop.md).
    """
    hello = parse_hello(channel.recv(deadline=deadline)[0])
    if hello["sandbox_id"] != sandbox_id:
        raise ProtocolError(f"the agent of sandbox {hello['sandbox_id'][:64]!r} connected, not {sandbox_id!r}")
    offered = hello.get("capabilities", ())
    if protocol.ONE_HOP not in offered or (carrier == "relayed" and protocol.RELAYED not in offered):
        carrier = None
    nonce = handshake.new_nonce()
    proof = handshake.auth_proof(secret, "controller", hello["nonce"], nonce)
    auth: dict[str, Any] = dict(handshake.auth_message(nonce, proof))
    if carrier is not None:
        auth[protocol.ONE_HOP] = True
    if carrier == "relayed":
        auth[protocol.RELAYED] = True
    channel.send(auth, deadline=deadline)
    expected = handshake.auth_proof(secret, "agent", hello["nonce"], nonce)
    if not handshake.proof_matches(expected, parse_auth_ok(channel.recv(deadline=deadline)[0])):
        raise ProtocolError(f"the peer on the channel of sandbox {sandbox_id} does not know its secret")
    if carrier is None:
        return hello, None
    if carrier == "descriptors":
        descriptors = Descriptors()
        return hello, (descriptors, channel, descriptors.hand_over(channel, deadline=deadline))
    relay = Relay(channel)  # from now on the relay's thread owns ``channel``
    try:
        return hello, (relay, relay.control, relay.hand_over(relay.control, deadline=deadline))
    except BaseException:
        relay.control.close()
        relay.close()
        raise


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

    def __init__(
        self,
        channel: Channel,
        hello: Hello,
        hop: _OneHopStart | None = None,
        interrupt_grace: float = Timeouts.interrupt_grace,
        frame_seconds: float = Timeouts.frame,
    ) -> None:
        """``channel``: the supervisor's connection, or with one ``hop`` its control channel (the relayed carrier's
        local one)."""
        self.hello = hello
        self._carrier: Carrier | None = None
        self._hop: OneHop | None = None
        if hop is not None:
            self._carrier, channel, data = hop
            self._hop = OneHop(channel, data, self._carrier, interrupt_grace, frame_seconds)
        self._channel = channel

    @property
    def one_hop(self) -> bool:
        """Requests go to the worker directly, on a data channel (docs/design/one-hop.md)."""
        return self._hop is not None

    @property
    def passes_descriptors(self) -> bool:
        """Descriptors reach the worker (one hop on the descriptors carrier): a value file, a blob's file."""
        return self._carrier is not None and self._carrier.passes_descriptors

    @classmethod
    def open(
        cls,
        endpoint: Endpoint,
        *,
        sandbox_id: str,
        deadline: float,
        one_hop: bool = False,
        carrier: str = "descriptors",
        interrupt_grace: float = Timeouts.interrupt_grace,
        frame_seconds: float = Timeouts.frame,
    ) -> AgentConnection:
        """Wait for the agent of ``sandbox_id`` on ``endpoint`` and authenticate both ends.

        With ``one_hop``, an agent that offers one hop gets a data channel (docs/design/one-hop.md) on ``carrier``
        (``"descriptors"`` needs a local endpoint; ``"relayed"`` works on any: the caller asks the backend). In one
        hop the controller keeps each request's ladder: ``interrupt_grace`` (the sandbox's, as its agent was started
        with) between the interrupt and the kill; a frame its worker begins there must not stall for
        ``frame_seconds`` (``Settings.timeouts.frame``, the supervisor's bound in two hops).

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
                hello, hop = _handshake(
                    channel,
                    endpoint.secret,
                    sandbox_id,
                    min(deadline, time.monotonic() + _HANDSHAKE_SECONDS),
                    carrier if one_hop else None,
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
                f", one hop ({'descriptors' if hop[0].passes_descriptors else 'relayed'})" if hop is not None else "",
            )
            return cls(channel, hello, hop, interrupt_grace, frame_seconds)

    def request(
        self,
        header: request_table.Request,
        body: Body,
        call: Call,
    ) -> tuple[Header, bytearray]:
        """Send one request and return its reply; every byte both ways must move before ``call.deadline``.

        ``call`` carries the request's side parts (``wire/call.py``). While an ``input()`` waits for its answer the
        deadline stands still, as the agent's clock does. ``call.value_fd`` goes only on a worker's data channel.

        Raises:
            TakenOver: the agent said goodbye (the request was not kept).
            AgentTimeoutError: the deadline passed.
            ChannelLost: the agent's end closed.
            ProtocolError: an invalid frame, or a reply to another request.
            ChannelLost: also when this host failed the channel (``OSError``: out of descriptors or memory).
        """
        if "id" not in header:
            header["id"] = new_request_id()
        try:
            return self._request(header, body, call)
        except OSError as exc:
            if isinstance(exc, OrchestratorError):  # typed already (a ``TimeoutError``, a ``ConnectionError``)
                raise
            # The host, not the sandbox, failed (out of descriptors or memory): the channel is out of step.
            raise ChannelLost(f"the channel to the agent failed on this host: {exc}") from exc

    def _request(
        self,
        header: request_table.Request,
        body: Body,
        call: Call,
    ) -> tuple[Header, bytearray]:
        if self._hop is not None:
            hop = self._hop
            try:
                return hop.request(header, body, call)
            except TakenOver:
                hop.close()  # at once, not when the session is dropped: the worker goes back to its supervisor
                raise
        if call.value_fd is not None:
            raise ValueError("a value file's descriptor goes only on a worker's data channel (one hop)")
        deadline, checkpoint_seconds, live = call.deadline, call.checkpoint_seconds, call.live
        try:
            self._channel.send(header, body, deadline=deadline)
        except ChannelLost:
            self._raise_if_goodbye()  # a takeover's goodbye may wait behind the pipe that just broke
            raise
        channel = self._channel
        output = OutputBudget(live, lambda: channel.enqueue(request_table.interrupt_message(header["id"])))
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
                self._wait(math.inf if paused_at is not None else deadline, call, header["id"])
                continue
            frame = channel.poll_recv()
            if frame is None:
                self._wait(math.inf if paused_at is not None else deadline, call, header["id"])
                continue
            reply, reply_body = frame
            kind = reply.get("type")
            if kind == protocol.OUTPUT and reply.get("id") == header["id"]:
                output.output(str(reply.get("stream")), reply_body)
                continue
            if kind == protocol.HOST_CALL and reply.get("id") == header["id"]:
                if reply.get("name") == protocol.INPUT_CALL and live is not None:
                    live.input_request(call_number(reply), reply_body)
                else:
                    serve_host_call(channel, reply, reply_body, call)
                    send_while_quiet(channel, deadline)
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

    def _wait(self, deadline: float, call: Call, request_id: str) -> None:
        """Until the channel is readable (or writable with answers queued), an answer is ready, or a time limit."""
        channel = self._channel
        poller = select.poll()
        poller.register(channel.fileno(), select.POLLIN | (select.POLLOUT if channel.has_queued else 0))
        ready = wait_for_sandbox(poller, deadline, call, wake_at=deadline, what="the agent")
        for answer, answer_body in due_answers(ready, call):
            channel.enqueue(answer, answer_body)
        if call.live is not None and call.live.take_interrupt():
            channel.enqueue(request_table.interrupt_message(request_id))
        if channel.has_queued:
            channel.flush()

    def check_idle(self) -> None:
        """Between calls the agent is silent; if it spoke, find out why.

        Raises:
            TakenOver: it said goodbye.
            ChannelLost: it hung up or sent something unasked (the sandbox is not usable as is).
        """
        if self._hop is not None:  # its supervisor may say worker_lost between calls
            self._hop.check_idle()
            return
        if self._channel.has_pending():
            self._raise_if_goodbye()
            raise ChannelLost("the agent hung up or spoke unasked between calls")

    def _raise_if_goodbye(self) -> None:
        """Read what the agent sent unasked; TakenOver if it is a goodbye, else return."""
        goodbye = goodbye_behind(self._channel)
        if goodbye is not None:
            if self._hop is not None:
                self._hop.close()  # the worker sees EOF on its data channel and goes back to its supervisor, idle
            raise TakenOver(goodbye)

    def close(self) -> None:
        if self._hop is not None:
            self._hop.close()
        self._channel.close()
        if self._carrier is not None:
            self._carrier.close()
