"""A host that is out of descriptors fails the channel with a typed error, never a raw ``OSError`` (issue 34,
hole 2): a data channel it cannot make, a request loop that meets ``EMFILE``, a wake-up pipe it cannot open."""

from __future__ import annotations

import errno
import os
import socket
import time
from typing import Any

import pytest

from orchestrator.agent import framing, request_table
from orchestrator.errors import ChannelLost, TransportError
from orchestrator.wire.call import Call
from orchestrator.wire.connection import AgentConnection
from orchestrator.wire.data_channel import DataChannel, Descriptors
from orchestrator.wire.transport import Channel
from orchestrator.wire.wakeup import Wakeup

HELLO: Any = {"sandbox_id": "sb-unit", "python": "3", "dill": "0", "nonce": "00"}


def _emfile(*_: object, **__: object) -> Any:
    raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))


def test_a_data_channel_the_host_cannot_make_is_channel_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    ours, theirs = socket.socketpair()
    control = Channel(ours, framing.MAX_HEADER_BYTES, framing.MAX_BODY_BYTES)
    monkeypatch.setattr(socket, "socketpair", _emfile)
    with pytest.raises(ChannelLost, match="no data channel could be made"):
        DataChannel.hand_over(control, deadline=float("inf"))
    control.close()
    theirs.close()


def test_emfile_in_a_request_loop_is_channel_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    ours, theirs = socket.socketpair()
    control, carrier = Channel(ours, framing.MAX_HEADER_BYTES, framing.MAX_BODY_BYTES), Descriptors()
    connection = AgentConnection(HELLO, carrier, control, carrier.hand_over(control, deadline=time.monotonic() + 5))
    monkeypatch.setattr(Channel, "send", _emfile)
    with pytest.raises(ChannelLost, match="failed on this host"):
        connection.request({"type": request_table.EXEC}, b"", Call(float("inf")))  # type: ignore[typeddict-item]
    connection.close()
    theirs.close()


def test_a_wakeup_the_host_cannot_make_is_a_transport_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "pipe", _emfile)
    with pytest.raises(TransportError, match="cannot make a pipe"):
        Wakeup()
