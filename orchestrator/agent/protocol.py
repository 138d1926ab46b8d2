"""Wire format shared by the controller and the in-container agent: framed JSON headers plus raw bodies.

Standard library only: this file is copied into sandbox images and must run on the image's
Python (see ``docs/protocol.md`` for the oldest one tested). A frame is a fixed 12-byte prefix (magic, header length, body
length), a UTF-8 JSON header object with a ``type`` field, and an optional raw binary body
(checkpoint blobs, contexts), so large payloads never travel as base64 inside JSON.
Both sides check every length against a limit before buffering anything.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import socket
import struct
from typing import Any, Dict, List, Sequence, Tuple, Union

PROTOCOL_VERSION = 2
MAGIC = b"ORC1"
PREFIX = struct.Struct("!4sII")  # magic, header length, body length
MAX_HEADER_BYTES = 16 << 20
MAX_BODY_BYTES = (2 << 30) - 1
_INLINE_BODY_BYTES = 64 << 10
_SURROGATES = re.compile("[\ud800-\udfff]")

# Connection set-up (docs/protocol.md): hello (agent), auth (controller), auth_ok (agent).
HELLO = "hello"
AUTH = "auth"
AUTH_OK = "auth_ok"
# Requests the controller sends; each carries an ``id`` that its reply echoes.
EXEC = "exec"
SET_VALUE = "set_value"
RESET = "reset"
RESTORE_BEGIN = "restore_begin"
LOAD = "load"
RESTORE_END = "restore_end"
PING = "ping"
# Replies and notices the agent sends.
EXEC_REPLY = "exec_reply"
STATE_REPLY = "state_reply"
LOAD_REPLY = "load_reply"
RESTORE_REPLY = "restore_reply"
PONG = "pong"
GOODBYE = "goodbye"
# Worker -> supervisor only: the cell finished, checkpointing starts (its own time limit).
CELL_DONE = "cell_done"

# Outcomes of a request as the agent reports them in ``status``.
STATUS_OK = "ok"
STATUS_ERROR = "error"
STATUS_TIMEOUT = "timeout"
STATUS_CRASHED = "crashed"
STATUS_PROTOCOL_ERROR = "protocol_error"

NONCE_BYTES = 16


def new_nonce() -> str:
    """A fresh random challenge for the connection handshake (hex)."""
    import secrets

    return secrets.token_hex(NONCE_BYTES)


def auth_proof(secret: bytes, role: str, agent_nonce: str, controller_nonce: str) -> str:
    """Proof that ``role`` ("controller" or "agent") knows the sandbox's secret, bound to both nonces."""
    message = ("%s|%s|%s" % (role, agent_nonce, controller_nonce)).encode("ascii", "replace")
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def proof_matches(expected: str, given: object) -> bool:
    """Constant-time comparison of a handshake proof."""
    return isinstance(given, str) and hmac.compare_digest(expected.encode("ascii", "replace"), given.encode("ascii", "replace"))


Header = Dict[str, Any]


class ProtocolViolation(Exception):
    """The peer sent bytes that are not a valid frame, or a frame over a limit."""


class ChannelClosed(Exception):
    """The peer closed the connection, possibly in the middle of a frame."""


def encode_header(header: Header) -> bytes:
    """Serialize a header object; the agent and the controller both call this.

    A str made by user code (an error message, a repr) may hold lone surrogates, which have
    no UTF-8 form: each becomes U+FFFD instead of failing the frame, and with it the worker.
    """
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATES.sub("\ufffd", text).encode("utf-8")


Body = Union[bytes, bytearray, memoryview]


def send_frame(sock: socket.socket, header: Header, body: Union[Body, Sequence[Body]] = b"") -> None:
    """Write one frame whose body is one buffer or several sent back to back (no joined copy).

    Small bodies go out in the same ``send`` as the header.
    """
    parts = [body] if isinstance(body, (bytes, bytearray, memoryview)) else list(body)
    size = sum(len(part) for part in parts)
    head = encode_header(header)
    if len(head) > MAX_HEADER_BYTES or size > MAX_BODY_BYTES:
        raise ProtocolViolation("frame over limit: header %d B, body %d B" % (len(head), size))
    prefix = PREFIX.pack(MAGIC, len(head), size)
    if size <= _INLINE_BODY_BYTES:
        sock.sendall(b"".join([prefix, head, *parts]))
        return
    sock.sendall(prefix + head)
    for part in parts:
        sock.sendall(part)


def recv_exactly(sock: socket.socket, size: int) -> bytearray:
    """Read exactly ``size`` bytes; raise ChannelClosed on EOF before that."""
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            raise ChannelClosed(f"connection closed after {got} of {size} bytes")
        got += n
    return buf


def recv_frame(
    sock: socket.socket,
    max_header: int = MAX_HEADER_BYTES,
    max_body: int = MAX_BODY_BYTES,
) -> Tuple[Header, bytearray]:
    """Read one frame, enforcing the limits before allocating; return (header, body)."""
    magic, head_len, body_len = PREFIX.unpack(bytes(recv_exactly(sock, PREFIX.size)))
    if magic != MAGIC:
        raise ProtocolViolation(f"bad frame magic {magic!r}")
    if head_len > max_header:
        raise ProtocolViolation(f"frame header of {head_len} B exceeds the {max_header} B limit")
    if body_len > max_body:
        raise ProtocolViolation(f"frame body of {body_len} B exceeds the {max_body} B limit")
    raw = recv_exactly(sock, head_len)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolViolation(f"frame header is not UTF-8 JSON: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise ProtocolViolation("frame header is not an object with a string 'type'")
    body = recv_exactly(sock, body_len) if body_len else bytearray()
    return header, body


def split_body(body: bytes | bytearray | memoryview, sizes: List[int]) -> List[memoryview]:
    """Cut a frame body into consecutive parts of the given sizes (checkpoint blobs)."""
    if sum(sizes) != len(body):
        raise ProtocolViolation(f"body of {len(body)} B does not match declared sizes {sum(sizes)} B")
    view = memoryview(body)
    parts, offset = [], 0
    for size in sizes:
        parts.append(view[offset : offset + size])
        offset += size
    return parts
