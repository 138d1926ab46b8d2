"""The controller's Channel: one deadline per frame, bounded buffers, no select() limit, errors mapped."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
from contextlib import ExitStack

import pytest

from orchestrator.agent import framing
from orchestrator.errors import AgentTimeoutError, ChannelLost, ProtocolError
from orchestrator.wire.transport import Channel, PeerCredentials, peer_credentials

MAX_HEADER = 8 << 20
MAX_BODY = 1 << 30


@pytest.fixture
def pair():
    """(channel, peer): the controller's Channel and the agent's plain blocking socket."""
    ours, theirs = socket.socketpair()
    channel = Channel(ours, MAX_HEADER, MAX_BODY)
    yield channel, theirs
    channel.close()
    theirs.close()


def soon(seconds: float) -> float:
    return time.monotonic() + seconds


def in_thread(target, *args) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def test_round_trip_both_ways_with_large_bodies(pair):
    channel, peer = pair
    body = os.urandom(3 << 20)
    receiver_result = {}

    def agent() -> None:
        header, got = framing.recv_frame(peer)
        receiver_result["frame"] = (header, bytes(got))
        framing.send_frame(peer, {"type": "exec_reply", "id": header["id"]}, [got[:10], got[10:]])

    thread = in_thread(agent)
    channel.send({"type": "exec", "id": "r1"}, [body[:1000], memoryview(body)[1000:]], deadline=soon(10))
    header, got = channel.recv(deadline=soon(10))
    thread.join()
    assert receiver_result["frame"] == ({"type": "exec", "id": "r1"}, body)
    assert header == {"type": "exec_reply", "id": "r1"} and got == body


def test_deadline_none_waits_for_the_frame(pair):
    channel, peer = pair
    timer = threading.Timer(0.2, framing.send_frame, args=(peer, {"type": "pong"}))
    timer.start()
    assert channel.recv(deadline=None) == ({"type": "pong"}, bytearray())
    timer.join()


def test_a_trickling_peer_times_out_at_the_deadline_not_later(pair):
    channel, peer = pair
    frame = b"".join(framing.frame_parts({"type": "exec_reply", "id": "x", "pad": "p" * 100}))
    stop = threading.Event()

    def trickle() -> None:
        for byte in frame:
            if stop.wait(0.2):
                return
            peer.sendall(bytes([byte]))

    thread = in_thread(trickle)
    started = time.monotonic()
    with pytest.raises(AgentTimeoutError, match="bytes of the frame"):
        channel.recv(deadline=started + 1.0)
    elapsed = time.monotonic() - started
    stop.set()
    thread.join()
    assert 1.0 <= elapsed < 1.3


def test_a_stopped_peer_mid_frame_times_out_and_the_frame_resumes_later(pair):
    channel, peer = pair
    frame = b"".join(framing.frame_parts({"type": "pong", "generation": 7}, b"body"))
    peer.sendall(frame[:15])  # the prefix and a little of the header, then nothing (as if SIGSTOPped)
    started = time.monotonic()
    with pytest.raises(AgentTimeoutError, match="3 of"):
        channel.recv(deadline=started + 0.3)
    assert time.monotonic() - started < 0.6
    assert channel.has_pending()  # half a frame is waiting
    peer.sendall(frame[15:])
    assert channel.recv(deadline=soon(5)) == ({"type": "pong", "generation": 7}, bytearray(b"body"))


def test_a_frame_that_already_arrived_is_returned_after_the_deadline(pair):
    channel, peer = pair
    framing.send_frame(peer, {"type": "pong"})
    time.sleep(0.05)
    assert channel.recv(deadline=time.monotonic() - 1)[0] == {"type": "pong"}


def test_a_sigstopped_agent_process_times_out_at_the_deadline(pair):
    channel, peer = pair
    head = framing.encode_header({"type": "exec_reply", "pad": "x" * 100})
    # The child keeps writing header bytes (1 MiB declared) until it is stopped.
    script = (
        "import socket, sys, time\n"
        "s = socket.socket(fileno=int(sys.argv[1]))\n"
        "s.sendall(bytes.fromhex(sys.argv[2]))\n"
        "while True:\n"
        "    s.sendall(b' ')\n"
        "    time.sleep(0.01)\n"
    )
    prefix = framing.PREFIX.pack(framing.MAGIC, 1 << 20, 0)
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(peer.fileno()), (prefix + head[:-1]).hex()], pass_fds=[peer.fileno()]
    )
    try:
        give_up = soon(30)
        while not channel.has_pending() and time.monotonic() < give_up:
            time.sleep(0.01)
        time.sleep(0.1)
        os.kill(child.pid, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(AgentTimeoutError, match="bytes of the frame header"):
            channel.recv(deadline=started + 0.5)
        assert 0.5 <= time.monotonic() - started < 1.0
    finally:
        child.kill()
        os.kill(child.pid, signal.SIGCONT)
        child.wait()


def test_frames_that_arrive_together_are_returned_one_by_one(pair):
    channel, peer = pair
    big = os.urandom(100_000)  # more than one read takes ahead
    frames = [({"type": "output", "n": 1}, b"ab"), ({"type": "output", "n": 2}, big), ({"type": "pong", "n": 3}, b"")]
    wire = b"".join(b"".join(framing.frame_parts(header, body)) for header, body in frames)
    last = b"".join(framing.frame_parts({"type": "pong", "n": 4}, b"xyz"))
    peer.sendall(wire + last[:20])
    for header, body in frames:
        assert channel.recv(deadline=soon(5)) == (header, bytearray(body))
    assert channel.has_pending()  # part of the fourth came with them
    assert channel.poll_recv() is None
    peer.sendall(last[20:])
    assert channel.recv(deadline=soon(5)) == ({"type": "pong", "n": 4}, bytearray(b"xyz"))
    assert not channel.has_pending()


class CountingSocket(socket.socket):
    """A socket that counts its reads."""

    reads = 0

    def recv_into(self, *args, **kwargs):
        self.reads += 1
        return super().recv_into(*args, **kwargs)


def test_a_small_frame_costs_one_read():
    ours, peer = socket.socketpair()
    counting = CountingSocket(fileno=ours.detach())
    channel = Channel(counting, MAX_HEADER, MAX_BODY)
    try:
        framing.send_frame(peer, {"type": "exec_reply", "stdout": "x" * 1000}, b"body")
        assert channel.recv(deadline=soon(5)) == ({"type": "exec_reply", "stdout": "x" * 1000}, bytearray(b"body"))
        assert counting.reads == 1
        assert not channel.buffered
    finally:
        channel.close()
        peer.close()


def test_a_header_larger_than_a_read_is_assembled(pair):
    channel, peer = pair
    header = {"type": "exec_reply", "stdout": "s" * (3 << 20)}
    thread = in_thread(framing.send_frame, peer, header, b"body")
    assert channel.recv(deadline=soon(10)) == (header, bytearray(b"body"))
    thread.join()
    framing.send_frame(peer, {"type": "pong"})
    assert channel.recv(deadline=soon(5)) == ({"type": "pong"}, bytearray())


def test_a_declared_gigabyte_is_never_allocated(pair):
    channel, peer = pair
    head = framing.encode_header({"type": "exec_reply"})
    peer.sendall(framing.PREFIX.pack(framing.MAGIC, len(head), MAX_BODY) + head + b"x" * 1000)
    tracemalloc.start()
    try:
        started = time.monotonic()
        with pytest.raises(AgentTimeoutError, match="1000 of 1073741824 bytes of the frame body"):
            channel.recv(deadline=started + 0.3)
        elapsed = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 0.6
    assert peak < 10 << 20


def test_sending_a_large_body_does_not_copy_it(pair):
    channel, peer = pair
    body = bytearray(64 << 20)
    sink = bytearray(1 << 20)
    received = []

    def drain() -> None:
        total = 0
        while True:
            count = peer.recv_into(sink)
            if not count:
                break
            total += count
        received.append(total)

    thread = in_thread(drain)
    tracemalloc.start()
    try:
        channel.send({"type": "load", "name": "v"}, body, deadline=soon(30))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    channel.close()
    thread.join()
    assert received[0] > len(body)
    assert peak < 4 << 20


def test_sending_to_a_peer_that_never_reads_times_out(pair):
    channel, peer = pair
    started = time.monotonic()
    with pytest.raises(AgentTimeoutError, match="did not take"):
        channel.send({"type": "load"}, bytes(16 << 20), deadline=started + 0.5)
    assert 0.5 <= time.monotonic() - started < 0.9
    # The frame was cut off: sending again would put the agent out of step ...
    with pytest.raises(ChannelLost, match="cut off"):
        channel.send({"type": "ping"}, deadline=soon(1))
    # ... but what the agent says can still be read.
    framing.send_frame(peer, {"type": "goodbye", "reason": "takeover"})
    assert channel.recv(deadline=soon(5))[0]["type"] == "goodbye"


def test_a_goodbye_waiting_behind_a_broken_pipe_can_still_be_read(pair):
    channel, peer = pair
    framing.send_frame(peer, {"type": "goodbye", "reason": "takeover", "in_flight": None})
    peer.close()
    with pytest.raises(ChannelLost, match="sending"):
        channel.send({"type": "exec", "id": "1"}, bytes(1 << 20), deadline=soon(5))
    assert channel.recv(deadline=soon(5))[0]["type"] == "goodbye"
    with pytest.raises(ChannelLost, match="closed"):
        channel.recv(deadline=soon(5))


def test_many_open_files_do_not_break_waiting():
    """select.select fails on descriptors past 1024; poll does not."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit on open files is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200) if hard == resource.RLIM_INFINITY else hard, hard))
    try:
        with ExitStack() as stack:
            null = os.open(os.devnull, os.O_RDONLY)
            stack.callback(os.close, null)
            for _ in range(1100):
                fd = os.dup(null)
                stack.callback(os.close, fd)
            ours, theirs = socket.socketpair()
            stack.callback(theirs.close)
            assert ours.fileno() > 1024
            channel = Channel(ours, MAX_HEADER, MAX_BODY)
            stack.callback(channel.close)
            assert not channel.has_pending()
            timer = threading.Timer(0.1, framing.send_frame, args=(theirs, {"type": "pong"}, b"late"))
            timer.start()
            assert channel.recv(deadline=soon(5)) == ({"type": "pong"}, bytearray(b"late"))
            timer.join()
            channel.send({"type": "ping"}, deadline=soon(5))
            assert framing.recv_frame(theirs)[0] == {"type": "ping"}
            with pytest.raises(AgentTimeoutError):
                channel.recv(deadline=soon(0.05))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b'{"type":"x","a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested"),
        (b'{"type":"\xff\xfe"}', "UTF-8"),
        (b'{"type":3}', "string 'type'"),
    ],
    ids=["deep", "utf8", "untyped"],
)
def test_bad_headers_are_protocol_errors_and_end_receiving(pair, raw, match):
    channel, peer = pair
    peer.sendall(framing.PREFIX.pack(framing.MAGIC, len(raw), 0) + raw)
    with pytest.raises(ProtocolError, match=match):
        channel.recv(deadline=soon(5))
    framing.send_frame(peer, {"type": "pong"})
    with pytest.raises(ChannelLost, match="invalid frame"):
        channel.recv(deadline=soon(5))
    assert channel.has_pending()


def test_oversized_frames_are_protocol_errors_before_any_body_is_read():
    ours, theirs = socket.socketpair()
    strict, sender = Channel(ours, 100, 1000), Channel(theirs, MAX_HEADER, MAX_BODY)
    try:
        sender.send({"type": "x", "pad": "y" * 200}, deadline=soon(5))
        with pytest.raises(ProtocolError, match="header of 221 B exceeds the 100 B limit"):
            strict.recv(deadline=soon(5))
    finally:
        strict.close()
        sender.close()


def test_bad_magic_is_a_protocol_error(pair):
    channel, peer = pair
    peer.sendall(b"HTTP/1.1 200")
    with pytest.raises(ProtocolError, match="magic"):
        channel.recv(deadline=soon(5))


def test_eof_mid_frame_is_channel_lost(pair):
    channel, peer = pair
    peer.sendall(framing.PREFIX.pack(framing.MAGIC, 50, 0) + b'{"type"')
    peer.close()
    with pytest.raises(ChannelLost, match="7 of 50"):
        channel.recv(deadline=soon(5))


def test_a_reset_connection_is_channel_lost(pair):
    channel, peer = pair
    peer.close()
    with pytest.raises(ChannelLost):
        channel.recv(deadline=soon(5))


def test_sending_over_the_protocol_limit_is_refused_before_anything_is_sent(pair, monkeypatch):
    channel, peer = pair
    monkeypatch.setattr(framing, "MAX_BODY_BYTES", 10)
    with pytest.raises(ProtocolError, match="over limit"):
        channel.send({"type": "set_value"}, b"x" * 11, deadline=soon(5))
    monkeypatch.undo()
    channel.send({"type": "ping"}, deadline=soon(5))  # nothing went out, so the channel is fine
    assert framing.recv_frame(peer)[0] == {"type": "ping"}


def test_has_pending(pair):
    channel, peer = pair
    assert not channel.has_pending()
    framing.send_frame(peer, {"type": "goodbye"})
    assert channel.has_pending()
    channel.recv(deadline=soon(5))
    assert not channel.has_pending()
    peer.close()
    assert channel.has_pending()  # a hang-up counts


def test_peer_credentials_of_a_unix_socket(pair):
    channel, _ = pair
    assert channel.peer_credentials() == PeerCredentials(os.getpid(), os.geteuid(), os.getegid())


def test_peer_credentials_of_a_non_unix_socket_is_none():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        assert peer_credentials(server) is None
    finally:
        server.close()


def test_a_closed_channel_refuses_everything(pair):
    channel, _ = pair
    channel.close()
    channel.close()
    with pytest.raises(ChannelLost, match="closed"):
        channel.send({"type": "ping"}, deadline=soon(1))
    with pytest.raises(ChannelLost, match="closed"):
        channel.recv(deadline=soon(1))
    assert channel.has_pending()
