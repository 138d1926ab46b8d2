"""The frame format: round trips, limits enforced before buffering, strict JSON headers."""

from __future__ import annotations

import socket
import struct
import sys
import threading
import time
import types

import pytest

from orchestrator.agent import framing


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_round_trip_with_binary_body(pair):
    a, b = pair
    body = bytes(range(256)) * 1000  # larger than the socket buffer: the sender needs its own thread
    sender = threading.Thread(target=framing.send_frame, args=(a, {"type": "exec", "id": "1", "code": "ü"}, body))
    sender.start()
    header, got = framing.recv_frame(b)
    sender.join()
    assert header == {"type": "exec", "id": "1", "code": "ü"}
    assert bytes(got) == body


def test_bad_magic_is_a_violation(pair):
    a, b = pair
    a.sendall(b"garbage!!!!!")
    with pytest.raises(framing.ProtocolViolation, match="magic"):
        framing.recv_frame(b)


def test_oversized_lengths_rejected_before_reading(pair):
    a, b = pair
    a.sendall(framing.PREFIX.pack(framing.MAGIC, 10, 2**31 - 2))
    with pytest.raises(framing.ProtocolViolation, match="body"):
        framing.recv_frame(b, max_body=1 << 20)
    a.sendall(framing.PREFIX.pack(framing.MAGIC, 2**31, 0))
    with pytest.raises(framing.ProtocolViolation, match="header"):
        framing.recv_frame(b)


@pytest.mark.parametrize("raw", [b"not json", b"[1, 2]", b'{"no_type": 1}', b"\xff\xfe"])
def test_header_must_be_a_typed_json_object(pair, raw):
    a, b = pair
    a.sendall(framing.PREFIX.pack(framing.MAGIC, len(raw), 0) + raw)
    with pytest.raises(framing.ProtocolViolation):
        framing.recv_frame(b)


def test_eof_in_the_middle_of_a_frame(pair):
    a, b = pair
    a.sendall(framing.PREFIX.pack(framing.MAGIC, 100, 0) + b'{"type"')
    a.close()
    with pytest.raises(framing.ChannelClosed, match="7 of 100"):
        framing.recv_frame(b)


def test_split_body_checks_sizes():
    assert [bytes(p) for p in framing.split_body(b"abcdef", [2, 4])] == [b"ab", b"cdef"]
    with pytest.raises(framing.ProtocolViolation):
        framing.split_body(b"abc", [2, 2])


def test_prefix_is_twelve_bytes():
    assert framing.PREFIX.size == 12 == struct.calcsize("!4sII")


# --- headers ----------------------------------------------------------------------------------


def _nested(depth: int) -> bytes:
    inner = b'{"type":"x"}'
    for _ in range(depth - 1):
        inner = b'{"type":"x","n":' + inner + b"}"
    return inner


def test_header_nesting_up_to_the_limit_is_accepted_and_one_more_is_not():
    assert framing.decode_header(_nested(framing.MAX_HEADER_DEPTH))["type"] == "x"
    with pytest.raises(framing.ProtocolViolation, match="nested"):
        framing.decode_header(_nested(framing.MAX_HEADER_DEPTH + 1))


@pytest.mark.parametrize(
    "raw",
    [
        b'{"type":"x","a":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"type":"x","a":' + b"[" * 100_000,  # unbalanced: the parser would recurse before seeing the end
        b"[" * 100_000 + b"]" * 100_000,
    ],
    ids=["deep", "unterminated", "bare"],
)
def test_deeply_nested_headers_are_violations_whatever_the_recursion_limit(raw, monkeypatch):
    monkeypatch.setattr(sys, "getrecursionlimit", lambda: 10**9)  # irrelevant: the check comes before parsing
    with pytest.raises(framing.ProtocolViolation, match="nested"):
        framing.decode_header(raw)


def test_brackets_and_quotes_inside_strings_do_not_count_as_nesting():
    tricky = '[[[{{{ \\" ]]] \\\\" ' * 50
    header = {"type": "x", tricky: tricky, "list": [tricky, {"k": tricky}]}
    assert framing.decode_header(framing.encode_header(header)) == header


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


_SCALARS = [1, -2.5, True, None, "", "\\", '"', "[", "]{", '\\"}', "é[", "\u2028", "\\\\[", "a\\u005b", "\n[", '\t\\"{']


def _random_value(rng, depth):
    """A value ``depth`` deep along one random path, with shallow noise (tricky strings) around it."""
    if depth <= 0:
        return rng.choice(_SCALARS)
    children = [_random_value(rng, rng.randint(0, min(2, depth - 1))) for _ in range(rng.randint(0, 2))]
    children.insert(rng.randint(0, len(children)), _random_value(rng, depth - 1))
    if rng.random() < 0.5:
        return children
    keys = ["a", "[", '"}', "\\", "{["]
    return {rng.choice(keys) + str(i): child for i, child in enumerate(children)}


def test_the_nesting_check_agrees_with_the_real_depth():
    import random

    rng = random.Random(1234)
    seen = set()
    for _ in range(400):
        value = {"type": "x", "v": _random_value(rng, rng.randint(28, 35))}
        raw = framing.encode_header(value)
        allowed = _depth(value) <= framing.MAX_HEADER_DEPTH
        seen.add(allowed)
        if allowed:
            assert framing.decode_header(raw) == value
        else:
            with pytest.raises(framing.ProtocolViolation, match="nested"):
                framing.decode_header(raw)
    assert seen == {True, False}


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b'{"type":"\xff"}', "UTF-8"),
        (b'{"type":"\xed\xa0\x80"}', "UTF-8"),  # an encoded surrogate is not UTF-8
        (b"\xff\xfe{\x00}\x00", "UTF-8"),  # json.loads(bytes) would guess UTF-16
        (b'{"type":', "JSON"),
        (b"", "JSON"),
        (b'{"type": 1}', "string 'type'"),
        (b'"just a string"', "string 'type'"),
    ],
)
def test_every_bad_header_is_a_violation(raw, match):
    with pytest.raises(framing.ProtocolViolation, match=match):
        framing.decode_header(raw)


@pytest.mark.parametrize("error", [RecursionError, MemoryError])
def test_parser_exhaustion_is_a_violation(monkeypatch, error):
    def exhausted(*args, **kwargs):
        raise error()

    monkeypatch.setattr(framing, "_STRICT_JSON", types.SimpleNamespace(decode=exhausted))
    with pytest.raises(framing.ProtocolViolation):
        framing.decode_header(b'{"type":"x"}')


def test_parse_prefix_checks_magic_and_limits():
    assert framing.parse_prefix(framing.PREFIX.pack(framing.MAGIC, 5, 7)) == (5, 7)
    with pytest.raises(framing.ProtocolViolation, match="magic"):
        framing.parse_prefix(framing.PREFIX.pack(b"XXXX", 5, 7))
    with pytest.raises(framing.ProtocolViolation, match="header"):
        framing.parse_prefix(framing.PREFIX.pack(framing.MAGIC, 11, 0), max_header=10)
    with pytest.raises(framing.ProtocolViolation, match="body"):
        framing.parse_prefix(framing.PREFIX.pack(framing.MAGIC, 1, 11), max_body=10)
    with pytest.raises(framing.ProtocolViolation, match="12 bytes"):
        framing.parse_prefix(b"ORC1")


# --- receiving without trusting declared lengths -----------------------------------------------


def test_a_declared_body_is_not_allocated_before_it_arrives(pair):
    import tracemalloc

    a, b = pair
    head = framing.encode_header({"type": "exec"})
    a.sendall(framing.PREFIX.pack(framing.MAGIC, len(head), 1 << 30) + head + b"0123456789")
    a.shutdown(socket.SHUT_WR)
    tracemalloc.start()
    try:
        with pytest.raises(framing.ChannelClosed, match="10 of 1073741824 bytes of the frame body"):
            framing.recv_frame(b, max_body=1 << 31)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20


def test_eof_at_a_frame_boundary_is_channel_closed(pair):
    a, b = pair
    a.close()
    with pytest.raises(framing.ChannelClosed, match="0 of 12"):
        framing.recv_frame(b)


def test_recv_exactly_reads_small_and_large_amounts(pair):
    a, b = pair
    data = bytes(range(256)) * 9000  # more than one RECV_CHUNK, more than a socket buffer
    sender = threading.Thread(target=a.sendall, args=(b"abc" + data,))
    sender.start()
    assert framing.recv_exactly(b, 3) == b"abc"
    assert framing.recv_exactly(b, len(data)) == data
    sender.join()
    a.close()
    with pytest.raises(framing.ChannelClosed, match="0 of 1"):
        framing.recv_exactly(b, 1)


def test_frame_reader_resumes_after_a_non_blocking_socket_runs_dry(pair):
    a, b = pair
    b.setblocking(False)
    frame = b"".join(framing.frame_parts({"type": "pong", "generation": 3}, b"body"))
    reader = framing.FrameReader()
    for i, byte in enumerate(frame):
        a.sendall(bytes([byte]))
        done = reader.recv_from(b)
        assert done == (i == len(frame) - 1)
        assert reader.started
        if not done:
            with pytest.raises(BlockingIOError):
                reader.recv_from(b)
    assert reader.frame() == ({"type": "pong", "generation": 3}, bytearray(b"body"))


def test_recv_head_leaves_the_body_on_the_socket(pair):
    a, b = pair
    a.sendall(b"".join(framing.frame_parts({"type": "load", "id": "7"}, b"blob")) + b"next")
    assert framing.recv_head(b, timeout=5) == ({"type": "load", "id": "7"}, 4)
    assert framing.recv_exactly(b, 8) == b"blobnext"
    a.sendall(framing.frame_head({"type": "ping"}, 0))
    assert framing.recv_head(b, max_body=0, timeout=5) == ({"type": "ping"}, 0)


def test_recv_head_checks_limits_before_the_header(pair):
    a, b = pair
    a.sendall(framing.frame_head({"type": "load"}, 11))
    with pytest.raises(framing.ProtocolViolation, match="body"):
        framing.recv_head(b, max_body=10, timeout=5)


def test_recv_head_gives_the_whole_header_one_deadline(pair):
    a, b = pair
    framing.limit_each_io(b, 0.1)  # each read waits at most 0.1 s (a kernel limit: no poll per read)
    a.sendall(framing.frame_head({"type": "exec"}, 0)[:-1])  # the header never completes
    started = time.monotonic()
    with pytest.raises(socket.timeout):
        framing.recv_head(b, timeout=0.2)
    assert time.monotonic() - started < 1.0
    a.close()
    with pytest.raises(framing.ChannelClosed):  # what is left is the rest of a frame, then EOF
        framing.recv_head(b, timeout=5)


def test_a_peer_that_trickles_cannot_stretch_recv_head_past_its_deadline(pair):
    a, b = pair
    framing.limit_each_io(b, 0.2)
    head = framing.frame_head({"type": "exec", "pad": "x" * 50}, 0)

    def trickle() -> None:
        for byte in head[:-1]:
            a.sendall(bytes([byte]))
            time.sleep(0.05)

    sender = threading.Thread(target=trickle, daemon=True)
    sender.start()
    started = time.monotonic()
    with pytest.raises(socket.timeout):
        framing.recv_head(b, timeout=0.5)
    assert time.monotonic() - started < 1.0  # the deadline plus at most one read's limit
    sender.join()


def test_frame_head_is_the_frame_without_its_body():
    header = {"type": "exec_reply", "status": "ok"}
    assert framing.frame_head(header, 3) + b"abc" == b"".join(framing.frame_parts(header, b"abc"))
    with pytest.raises(framing.ProtocolViolation, match="over limit"):
        framing.frame_head(header, framing.MAX_BODY_BYTES + 1)


def test_frame_parts_pass_large_bodies_through_uncopied():
    big = bytearray(1 << 20)
    parts = framing.frame_parts({"type": "load"}, [big, b"tail"])
    assert parts[1] is big and parts[2] == b"tail"
    assert len(framing.frame_parts({"type": "load"}, b"small")) == 1


# --- strict JSON: what a peer may not put in a header ------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b'{"type":"x","d":NaN}', "NaN"),
        (b'{"type":"x","d":Infinity}', "Infinity"),
        (b'{"type":"x","d":-Infinity}', "-Infinity"),
        (b'{"type":"x","d":1e999}', "finite"),
        (b'{"type":"x","d":-1e400}', "finite"),
        (b'{"type":"x","type":"y"}', "'type' twice"),
        (b'{"type":"x","c":{"a":1,"a":2}}', "'a' twice"),
        (b'{"type":"x","n":' + b"9" * 25 + b"}", "25 digits"),
        (b'{"type":"x","n":-' + b"9" * 5000 + b"}", "digits"),  # past 3.11's int limit: still a violation
        (b'{"type":"x","f":1.' + b"5" * 100 + b"}", "finite"),
        (b'{"type":"x","l":' + b"[" * 40 + b"]" * 40 + b"}", "nested deeper"),
    ],
)
def test_headers_are_strict_json(raw, match):
    with pytest.raises(framing.ProtocolViolation, match=match):
        framing.decode_header(raw)


def test_strict_json_keeps_every_honest_value():
    header = {"type": "x", "i": -(2**63), "f": 0.1, "e": 1.5e-300, "s": "\u00e9\x00", "l": [None, True, {"k": []}]}
    assert framing.decode_header(framing.encode_header(header)) == header


def test_a_non_finite_number_is_never_sent():
    with pytest.raises(framing.ProtocolViolation, match="non-finite"):
        framing.encode_header({"type": "x", "d": float("nan")})


def test_decode_json_names_what_it_parsed():
    with pytest.raises(framing.ProtocolViolation, match=r"^an input\(\) prompt has NaN"):
        framing.decode_json(b'{"prompt": NaN}', "an input() prompt")
