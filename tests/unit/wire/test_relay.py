"""The relayed carrier's pump (wire/relay.py) on real local sockets: bytes both ways, a hostile supervisor's relay
frames refused with a typed error, memory bounded under a flood, and no deadlock when both directions are full."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from orchestrator.agent import control as control_frames
from orchestrator.agent import framing, protocol, request_table
from orchestrator.errors import ChannelLost
from orchestrator.wire.data_channel import DataChannel
from orchestrator.wire.relay import RELAY_BUFFER, Relay
from orchestrator.wire.transport import Channel

LIMITS = (1 << 16, 1 << 26)


class Supervisor:
    """The far end of C: frames written and read by hand, as a supervisor (honest or not) sends them."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.channel = Channel(sock.dup(), *LIMITS)

    def send(self, header: framing.Message, body: bytes = b"") -> None:
        self.sock.setblocking(True)
        framing.send_frame(self.sock, header, body)

    def relay(self, stream: str, body: bytes, number: int = 1) -> None:
        self.send(control_frames.relay_message(stream, number), body)

    def recv(self) -> tuple[framing.Header, bytearray]:
        return self.channel.recv(deadline=time.monotonic() + 5)


@pytest.fixture
def relayed() -> Iterator[tuple[Relay, DataChannel, Supervisor]]:
    ours, theirs = socket.socketpair()
    relay = Relay(Channel(ours, *LIMITS))
    supervisor = Supervisor(theirs)
    data = relay.hand_over(relay.control, deadline=time.monotonic() + 5)
    assert supervisor.recv()[0] == {"type": protocol.DATA_CHANNEL, "channel": 1}
    yield relay, data, supervisor
    data.close()
    relay.control.close()
    relay.close()
    supervisor.channel.close()
    theirs.close()


def frame(header: framing.Message, body: bytes = b"") -> bytes:
    return bytes(framing.frame_head(header, len(body))) + body


def test_bytes_go_both_ways_and_control_frames_pass(relayed: tuple[Relay, DataChannel, Supervisor]) -> None:
    relay, data, supervisor = relayed
    reply = frame({"type": request_table.EXEC_REPLY, "id": "e1"}, b"x" * 300_000)
    for start in range(0, len(reply), 1000):  # cut anywhere: the stream's bytes, not its frames, are relayed
        supervisor.relay(protocol.RELAY_REQUESTS, reply[start : start + 1000])
    header, body = data.requests.recv(deadline=time.monotonic() + 5)
    assert header == {"type": request_table.EXEC_REPLY, "id": "e1"} and body == b"x" * 300_000
    request = {"type": request_table.EXEC, "id": "e2"}
    sender = threading.Thread(target=lambda: data.requests.send(request, b"y" * 600_000, deadline=time.monotonic() + 5))
    sender.start()
    sent = bytearray()
    while len(sent) < len(frame({"type": request_table.EXEC, "id": "e2"}, b"y" * 600_000)):
        header, body = supervisor.recv()
        assert header == {"type": protocol.RELAY, "stream": protocol.RELAY_REQUESTS, "channel": 1}
        assert 0 < len(body) <= protocol.RELAY_CHUNK
        sent += body
    assert sent == frame(request, b"y" * 600_000)
    sender.join(5)
    supervisor.send({"type": protocol.WORKER_LOST, "reason": "gone"})
    assert relay.control.recv(deadline=time.monotonic() + 5)[0]["type"] == protocol.WORKER_LOST
    supervisor.relay(protocol.RELAY_CALLS, b"")  # the worker's K closed: so does the loop's
    with raw(data.calls.fileno()) as calls:
        assert calls.recv(1) == b""


def raw(fd: int) -> socket.socket:
    """The stream under a channel, read as bytes (what a flood sends is not framed)."""
    sock = socket.socket(fileno=os.dup(fd))
    sock.settimeout(10)
    return sock


@pytest.mark.parametrize(
    "hostile",
    [
        frame(control_frames.relay_message("X", 1), b"abc"),  # a stream that does not exist
        frame(control_frames.relay_message(protocol.RELAY_REQUESTS, 7), b"abc"),  # a data channel never handed over
        frame({"type": protocol.RELAY, "stream": protocol.RELAY_REQUESTS}, b"abc"),  # no number
        struct.pack("!4sII", framing.MAGIC, 2, protocol.RELAY_CHUNK + (64 << 10)) + b"{}",  # over a relay frame's size
    ],
    ids=["stream", "channel", "unnumbered", "oversized"],
)
def test_a_hostile_relay_frame_is_a_protocol_error(
    relayed: tuple[Relay, DataChannel, Supervisor], hostile: bytes
) -> None:
    relay, data, supervisor = relayed
    supervisor.sock.sendall(hostile)
    message, _ = relay.control.recv(deadline=time.monotonic() + 5)
    assert message["type"] == "relay_failed" and message["reason"], message
    with pytest.raises(ChannelLost):  # then the connection is gone
        relay.control.recv(deadline=time.monotonic() + 5)
    with pytest.raises(ChannelLost):
        data.requests.recv(deadline=time.monotonic() + 5)


def test_a_flood_is_held_to_the_bound_until_the_loop_reads(relayed: tuple[Relay, DataChannel, Supervisor]) -> None:
    relay, data, supervisor = relayed
    chunk = frame(control_frames.relay_message(protocol.RELAY_REQUESTS, 1), b"z" * protocol.RELAY_CHUNK)
    supervisor.sock.setblocking(False)
    frames = at = 0
    stalled = time.monotonic() + 1.0
    while time.monotonic() < stalled:
        try:
            at += supervisor.sock.send(chunk[at:])
        except BlockingIOError:
            time.sleep(0.01)
            continue
        stalled = time.monotonic() + 1.0
        if at == len(chunk):
            frames, at = frames + 1, 0
    # What the loop does not read waits in the kernel's buffers and at most RELAY_BUFFER and a frame in the pump.
    assert frames * len(chunk) < RELAY_BUFFER + (16 << 20), frames

    def rest() -> None:  # the frame cut off, then a control frame behind the flood
        supervisor.sock.setblocking(True)
        supervisor.sock.sendall(chunk[at:])
        supervisor.send({"type": request_table.PONG, "id": "p"})

    finisher = threading.Thread(target=rest)
    finisher.start()
    got = 0
    with raw(data.requests.fileno()) as stream:
        while got < (frames + 1) * protocol.RELAY_CHUNK:
            got += len(stream.recv(1 << 20))
    assert relay.control.recv(deadline=time.monotonic() + 10)[0]["type"] == request_table.PONG
    finisher.join(10)


def test_both_directions_full_do_not_deadlock(relayed: tuple[Relay, DataChannel, Supervisor]) -> None:
    _, data, supervisor = relayed
    size = 8 << 20
    outgoing = threading.Thread(
        target=lambda: data.requests.send(
            {"type": request_table.EXEC, "id": "e"}, b"o" * size, deadline=time.monotonic() + 30
        )
    )
    outgoing.start()
    incoming = frame({"type": request_table.EXEC_REPLY, "id": "e"}, b"i" * size)
    writer = threading.Thread(
        target=lambda: [
            supervisor.relay(protocol.RELAY_REQUESTS, incoming[at : at + protocol.RELAY_CHUNK])
            for at in range(0, len(incoming), protocol.RELAY_CHUNK)
        ]
    )
    writer.start()
    time.sleep(0.5)  # both directions fill up before anyone reads
    received = 0
    while received < size:
        header, body = supervisor.channel.recv(deadline=time.monotonic() + 10)
        received += len(body)
    header, body = data.requests.recv(deadline=time.monotonic() + 10)
    assert header["type"] == request_table.EXEC_REPLY and len(body) == size
    outgoing.join(10)
    writer.join(10)
    assert not outgoing.is_alive() and not writer.is_alive()
