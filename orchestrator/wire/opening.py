"""Opening a connection to one agent: wait for it on an ``Endpoint``, the handshake, its worker's first data channel.

Both sides prove they know the sandbox's secret (docs/protocol.md, "Connection set-up"); the auth asks for the relayed
carrier if that is the one, and the first data channel is handed over right after ``auth_ok``
(docs/design/one-hop.md). An agent of another protocol version is refused at its hello; one that does not offer the
relayed carrier when that is asked is too old for this controller: refused, never served another way.
"""

from __future__ import annotations

import logging
import time
from typing import Any, NamedTuple

from ..agent import handshake, protocol
from ..agent.handshake import Hello
from ..errors import AgentTimeoutError, ProtocolError, TransportError
from .data_channel import Carrier, DataChannel, Descriptors
from .endpoint import Endpoint
from .relay import Relay
from .replies import parse_auth_ok, parse_hello
from .transport import Channel

logger = logging.getLogger(__name__)

_HANDSHAKE_SECONDS = 5.0  # a real agent sends its hello as soon as it connects


class AgentTooOld(ProtocolError):
    """The sandbox's own agent (it proved it knows the secret) does not offer the carrier asked for."""


class Opened(NamedTuple):
    """An authenticated agent: its hello, its carrier, the control channel and its worker's first data channel."""

    hello: Hello
    carrier: Carrier
    control: Channel
    data: DataChannel


def accept_agent(endpoint: Endpoint, *, sandbox_id: str, deadline: float, carrier: str) -> Opened:
    """Wait for the agent of ``sandbox_id`` on ``endpoint``, authenticate both ends and take one hop on ``carrier``
    (``"descriptors"`` needs a local endpoint; ``"relayed"`` works on any: the caller asks the backend).

    A peer that fails the handshake (or stalls in it for ``_HANDSHAKE_SECONDS``) is dropped and the wait goes on, so a
    process that knocks on the socket cannot stop the real agent.

    Raises:
        AgentTimeoutError: no agent completed the handshake by ``deadline``.
        AgentTooOld: the sandbox's agent does not offer ``carrier``: its image must be rebuilt.
        ProtocolError: by ``deadline``, only peers that are not this sandbox's agent came (wrong version, id or
            proof); the last one's reason.
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
            opened = _handshake(
                channel, endpoint.secret, sandbox_id, min(deadline, time.monotonic() + _HANDSHAKE_SECONDS), carrier
            )
        except AgentTooOld:
            channel.close()
            raise
        except TransportError as exc:
            channel.close()
            logger.warning("sandbox %s: dropped a peer on its channel: %s", sandbox_id, exc)
            refused = exc
            continue
        except BaseException:
            channel.close()
            raise
        hello = opened.hello
        logger.info(
            "agent of sandbox %s connected (Python %s, dill %s, carrier %s)",
            sandbox_id,
            hello["python"],
            hello["dill"],
            carrier,
        )
        return opened


def _handshake(channel: Channel, secret: bytes, sandbox_id: str, deadline: float, carrier: str) -> Opened:
    """docs/protocol.md "Connection set-up": both ends prove they know the secret, bound to both nonces."""
    hello = parse_hello(channel.recv(deadline=deadline)[0])
    if hello["sandbox_id"] != sandbox_id:
        raise ProtocolError(f"the agent of sandbox {hello['sandbox_id'][:64]!r} connected, not {sandbox_id!r}")
    offered = hello.get("capabilities", ())
    needed = (protocol.RELAYED,) if carrier == "relayed" else ()
    usable = all(name in offered for name in needed)
    nonce = handshake.new_nonce()
    proof = handshake.auth_proof(secret, "controller", hello["nonce"], nonce)
    auth: dict[str, Any] = dict(handshake.auth_message(nonce, proof))
    if usable and carrier == "relayed":
        auth[protocol.RELAYED] = True
    channel.send(auth, deadline=deadline)
    expected = handshake.auth_proof(secret, "agent", hello["nonce"], nonce)
    if not handshake.proof_matches(expected, parse_auth_ok(channel.recv(deadline=deadline)[0])):
        raise ProtocolError(f"the peer on the channel of sandbox {sandbox_id} does not know its secret")
    if not usable:  # only the sandbox's own agent is refused for good: a peer without the secret is only dropped
        raise AgentTooOld(
            f"the agent of sandbox {sandbox_id} speaks protocol {hello['protocol']} and offers "
            f"{', '.join(offered) or 'no capabilities'}, not {' and '.join(needed)}: the image's agent is too old for "
            "this controller; rebuild the image"
        )
    if carrier == "descriptors":
        descriptors = Descriptors()
        return Opened(hello, descriptors, channel, descriptors.hand_over(channel, deadline=deadline))
    relay = Relay(channel)  # from now on the relay's thread owns ``channel``
    try:
        return Opened(hello, relay, relay.control, relay.hand_over(relay.control, deadline=deadline))
    except BaseException:
        relay.control.close()
        relay.close()
        raise
