"""The frame format: round trips, limits enforced before buffering, and a stdlib-only agent."""

from __future__ import annotations

import ast
import socket
import struct
import sys
import threading
from pathlib import Path

import pytest

from orchestrator.agent import protocol

AGENT_DIR = Path(protocol.__file__).parent


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_round_trip_with_binary_body(pair):
    a, b = pair
    body = bytes(range(256)) * 1000  # larger than the socket buffer: the sender needs its own thread
    sender = threading.Thread(target=protocol.send_frame, args=(a, {"type": "exec", "id": "1", "code": "ü"}, body))
    sender.start()
    header, got = protocol.recv_frame(b)
    sender.join()
    assert header == {"type": "exec", "id": "1", "code": "ü"}
    assert bytes(got) == body


def test_bad_magic_is_a_violation(pair):
    a, b = pair
    a.sendall(b"garbage!!!!!")
    with pytest.raises(protocol.ProtocolViolation, match="magic"):
        protocol.recv_frame(b)


def test_oversized_lengths_rejected_before_reading(pair):
    a, b = pair
    a.sendall(protocol.PREFIX.pack(protocol.MAGIC, 10, 2**31 - 2))
    with pytest.raises(protocol.ProtocolViolation, match="body"):
        protocol.recv_frame(b, max_body=1 << 20)
    a.sendall(protocol.PREFIX.pack(protocol.MAGIC, 2**31, 0))
    with pytest.raises(protocol.ProtocolViolation, match="header"):
        protocol.recv_frame(b)


@pytest.mark.parametrize("raw", [b"not json", b"[1, 2]", b'{"no_type": 1}', b"\xff\xfe"])
def test_header_must_be_a_typed_json_object(pair, raw):
    a, b = pair
    a.sendall(protocol.PREFIX.pack(protocol.MAGIC, len(raw), 0) + raw)
    with pytest.raises(protocol.ProtocolViolation):
        protocol.recv_frame(b)


def test_eof_in_the_middle_of_a_frame(pair):
    a, b = pair
    a.sendall(protocol.PREFIX.pack(protocol.MAGIC, 100, 0) + b'{"type"')
    a.close()
    with pytest.raises(protocol.ChannelClosed, match="7 of 100"):
        protocol.recv_frame(b)


def test_split_body_checks_sizes():
    assert [bytes(p) for p in protocol.split_body(b"abcdef", [2, 4])] == [b"ab", b"cdef"]
    with pytest.raises(protocol.ProtocolViolation):
        protocol.split_body(b"abc", [2, 2])


def test_prefix_is_twelve_bytes():
    assert protocol.PREFIX.size == 12 == struct.calcsize("!4sII")


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", sorted(AGENT_DIR.glob("*.py")), ids=lambda p: p.name)
def test_agent_uses_only_stdlib_and_dill(path):
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    if path.name in ("worker.py", "checkpoint.py"):
        allowed.add("dill")
    assert _imports(path) <= allowed, f"{path.name} imports {_imports(path) - allowed}"
