"""One hop's data channel, the controller's side (docs/design/one-hop.md): two socket pairs this controller makes.

In one hop the controller talks to the worker directly: requests and replies go on D, the cell's host calls and
output on K, and the supervisor's connection (C) carries only control frames. The controller makes both pairs
itself and hands one end of each to the supervisor in a ``data_channel`` frame on C (SCM_RIGHTS); the supervisor
passes them to its worker and keeps no copy. So the controller never accepts a descriptor from a sandbox: the
only sockets it talks to are ones it made or accepted. Every worker gets a fresh pair of pairs.
"""

from __future__ import annotations

import socket
from typing import Protocol

from ..agent import control as control_frames
from ..agent import protocol
from ..errors import ChannelLost, TransportError
from .call_link import CallLink
from .transport import Channel


class DataChannel:
    """The controller's ends of one worker's data channel: ``requests`` (D) and ``calls`` (K)."""

    def __init__(self, requests: Channel, calls: CallLink) -> None:
        self.requests = requests
        self.calls = calls

    @classmethod
    def hand_over(cls, control: Channel, *, deadline: float) -> DataChannel:
        """Make the two pairs, send the worker's ends on ``control`` and keep ours: D with ``control``'s limits, K
        with a host call's.

        Raises:
            AgentTimeoutError, ChannelLost: the frame could not be sent (our ends are closed), or this host could not
                make the pairs (out of descriptors).
        """
        ours: list[socket.socket] = []
        theirs: list[socket.socket] = []
        try:
            for _ in range(protocol.DATA_CHANNEL_FDS):
                mine, other = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)  # close-on-exec, as Python makes
                ours.append(mine)
                theirs.append(other)
            control.send_fds(
                control_frames.data_channel_message(), [sock.fileno() for sock in theirs], deadline=deadline
            )
        except OSError as exc:
            for sock in ours:
                sock.close()
            if isinstance(exc, TransportError):
                raise
            raise ChannelLost(f"no data channel could be made on this host: {exc}") from exc
        except BaseException:
            for sock in ours:
                sock.close()
            raise
        finally:
            for sock in theirs:
                sock.close()
        max_header, max_body = control.limits
        requests, calls = ours
        return cls(
            Channel(requests, max_header, max_body),
            CallLink(Channel(calls, protocol.HOST_CALL_HEADER_BYTES, protocol.HOST_CALL_MAX_BYTES), blob_files=True),
        )

    def close(self) -> None:
        """Close our ends: the worker sees EOF, goes back to its supervisor and reports itself idle."""
        self.requests.close()
        self.calls.close()


class Carrier(Protocol):
    """How a worker's data channel reaches the controller's request loop: its descriptors handed over on C
    (``Descriptors``), or its bytes multiplexed on C (``relay.Relay``). The loop asks, never tests types."""

    @property
    def passes_descriptors(self) -> bool:
        """Descriptors may go on D and K (a value file, a blob's file)."""

    def hand_over(self, control: Channel, *, deadline: float) -> DataChannel:
        """A fresh data channel for the supervisor's current worker, announced on ``control``."""

    def close(self) -> None:
        """Let go of what the carrier holds (idempotent)."""


class Descriptors:
    """The local engine's carrier: the controller makes the pairs and hands the worker's ends over C (SCM_RIGHTS)."""

    passes_descriptors = True

    def hand_over(self, control: Channel, *, deadline: float) -> DataChannel:
        return DataChannel.hand_over(control, deadline=deadline)

    def close(self) -> None:
        pass
