"""The controller's control frames to the supervisor (docs/design/one-hop.md), typed as the requests are.

``kill`` and ``ping`` (answered ``worker_replaced`` and ``pong``), the ladder's ``interrupt {phase}``, the handover
of a worker's data channel, and on the relayed carrier the ``relay`` frames that carry its bytes.
"""

from __future__ import annotations

from typing import Optional, TypedDict

from .framing import Header
from .protocol import DATA_CHANNEL, INTERRUPT, KILL, RELAY
from .request_table import PING


class ControlRequest(TypedDict):
    """``kill {id}`` or ``ping {id}``: answered ``worker_replaced {id}`` or ``pong {id}``."""

    type: str
    id: str


class PhaseInterrupt(ControlRequest):
    """The ladder's ``interrupt {id, phase}``: the signal of ``phase`` (one of INTERRUPT_PHASES)."""

    phase: str


def kill_message(request_id: str) -> ControlRequest:
    return ControlRequest(type=KILL, id=request_id)


def ping_message(ping_id: str) -> ControlRequest:
    return ControlRequest(type=PING, id=ping_id)


def phase_interrupt_message(request_id: str, phase: str) -> PhaseInterrupt:
    return PhaseInterrupt(type=INTERRUPT, id=request_id, phase=phase)


def data_channel_message(number: Optional[int] = None) -> Header:
    """The frame that hands over a worker's data channel: its descriptors (SCM_RIGHTS), D then K; or, relayed, none
    and the data channel's ``number`` (1, 2, ... on one connection), which its relay frames carry."""
    return {"type": DATA_CHANNEL} if number is None else {"type": DATA_CHANNEL, "channel": number}


class Relay(TypedDict):
    """A relay frame's header; the body is the stream's bytes."""

    type: str
    stream: str
    channel: int


def relay_message(stream: str, number: int) -> Relay:
    return Relay(type=RELAY, stream=stream, channel=number)
