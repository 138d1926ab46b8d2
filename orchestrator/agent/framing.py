"""Frames: a fixed 12-byte prefix, a strict-JSON header, an optional raw body; their limits and their I/O.

A frame is a fixed 12-byte prefix (magic, header length, body length), a UTF-8 JSON header
object with a ``type`` field, and an optional raw binary body (checkpoint blobs, contexts), so
large payloads never travel as base64 inside JSON. Both sides check every length against a
limit before buffering anything, and a receiver grows its buffer with what has arrived instead
of trusting a declared length.

The agent reads frames with the blocking ``recv_frame``, or with ``recv_head`` when it streams
the body on itself; the controller drives the same ``FrameReader`` from a non-blocking socket
against a deadline (``orchestrator/wire/transport.py``).
"""

from __future__ import annotations

import collections
import json
import math
import re
import socket
import struct
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

MAGIC = b"ORC1"
PREFIX = struct.Struct("!4sII")  # magic, header length, body length
MAX_HEADER_BYTES = 16 << 20
MAX_BODY_BYTES = (2 << 30) - 1
MAX_HEADER_DEPTH = 32  # nesting of objects and arrays in a header, the outer object included
MAX_INT_DIGITS = 24  # an integer in a header has at most this many digits (2**63 has 19)
MAX_FLOAT_CHARS = 64  # a number with a fraction or exponent is at most this long (repr of a float: 24)
RECV_CHUNK = 1 << 20  # a receive buffer grows by at most this much beyond what has arrived
_INLINE_BODY_BYTES = 64 << 10
_SURROGATES = re.compile("[\ud800-\udfff]")


Header = Dict[str, Any]  # a header as received: anything the peer sent, each reader checks what it takes
Message = Mapping[str, Any]  # a header to send: a typed message (below) or a plain dict
Body = Union[bytes, bytearray, memoryview]


class ProtocolViolation(Exception):
    """The peer sent bytes that are not a valid frame, or a frame over a limit."""


class ChannelClosed(Exception):
    """The peer closed the connection, possibly in the middle of a frame."""


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)  # made once, not per frame


def encode_header(header: Message) -> bytes:
    """Serialize a header object; the agent and the controller both call this.

    A str made by user code (an error message, a repr) may hold lone surrogates, which have
    no UTF-8 form: each becomes U+FFFD instead of failing the frame, and with it the worker.

    Raises:
        ProtocolViolation: the header holds a non-finite number (NaN, Infinity), which strict JSON has not.
    """
    try:
        text = _ENCODER.encode(header)
    except ValueError:
        raise ProtocolViolation("a frame header cannot hold a non-finite number (NaN or Infinity)") from None
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATES.sub("\ufffd", text).encode("utf-8")


# The nesting check runs before the parser, so it never recurses deeper than MAX_HEADER_DEPTH
# whatever the recursion limit. The escapes that can hide a string's end go first (``\\`` and
# ``\"``, paired from the left as the parser pairs them; the others, ``\n`` and the like, hold no
# quote and are left for the string they are in), then strings (no quote is left inside one), then
# everything but brackets; each pass of removing "()" then strips exactly one level. UTF-8
# continuation bytes are never ASCII, so working on the raw bytes is exact for valid input; invalid
# input may be misjudged, but the parser rejects it anyway.
_ESCAPE = re.compile(rb'\\[\\"]')
_STRING = re.compile(rb'"[^"]*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_BRACKETS = bytes.maketrans(b"[{]}", b"(())")


def _too_deep(raw: bytes) -> bool:
    brackets = _STRING.sub(b"", _ESCAPE.sub(b"", raw)).translate(_BRACKETS, _NOT_BRACKETS)
    for _ in range(MAX_HEADER_DEPTH):
        if not brackets:
            return False
        brackets = brackets.replace(b"()", b"")
    return bool(brackets)


class _NotStrict(ProtocolViolation):
    """What the strict parser's hooks refuse (``decode_json`` says where it was)."""


def _unique_keys(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        twice = next(key for key, count in collections.Counter(key for key, _ in pairs).items() if count > 1)
        raise _NotStrict("the key %r twice in one object" % twice[:64])
    return found


def _bounded_int(text: str) -> int:
    digits = len(text) - text.startswith("-")
    if digits > MAX_INT_DIGITS:
        raise _NotStrict("an integer of %d digits (at most %d)" % (digits, MAX_INT_DIGITS))
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text) if len(text) <= MAX_FLOAT_CHARS else math.inf
    if not math.isfinite(value):
        raise _NotStrict("a number that is not a finite float: %s" % text[:32])
    return value


def _no_constant(name: str) -> Any:
    raise _NotStrict("%s, which is not JSON" % name)


# Strict JSON (RFC 8259) and nothing the parser would make ambiguous or unbounded: no NaN / Infinity, no key twice
# in an object (which one counts?), no integer so long that int() works for long (or, on 3.11+, refuses).
_STRICT_JSON = json.JSONDecoder(
    object_pairs_hook=_unique_keys, parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_no_constant
)


def decode_json(
    raw: Union[bytes, bytearray, memoryview], what: str = "frame header", *, surrogates: bool = False
) -> Any:
    """Parse UTF-8 strict JSON nested at most MAX_HEADER_DEPTH deep: what a peer sends is never trusted further.

    Strict: no NaN or Infinity, no key twice in one object, no integer of more than MAX_INT_DIGITS
    digits, no number whose float is not finite. ``surrogates``: lone surrogates may come as their
    UTF-8 bytes (a host call's payload holds a str of user code as it is, ``surrogatepass``).

    Raises:
        ProtocolViolation: for every way the bytes can fail to be such JSON, naming ``what`` they were.
    """
    try:
        raw = bytes(raw)
        text = raw.decode("utf-8", "surrogatepass" if surrogates else "strict")
        if raw.count(b"[") + raw.count(b"{") > MAX_HEADER_DEPTH and _too_deep(raw):
            raise ProtocolViolation("%s is nested deeper than %d levels" % (what, MAX_HEADER_DEPTH))
        return _STRICT_JSON.decode(text)
    except UnicodeDecodeError as exc:
        raise ProtocolViolation("%s is not UTF-8: %s" % (what, exc)) from None
    except ValueError as exc:
        raise ProtocolViolation("%s is not JSON: %s" % (what, exc)) from None
    except RecursionError:
        raise ProtocolViolation("%s is nested too deeply to parse" % what) from None
    except MemoryError:
        raise ProtocolViolation("%s of %d B does not fit in memory when parsed" % (what, len(raw))) from None
    except _NotStrict as exc:
        raise ProtocolViolation("%s has %s" % (what, exc)) from None


def decode_header(raw: Union[bytes, bytearray, memoryview]) -> Header:
    """Parse a frame header: a strict-JSON object (``decode_json``) with a string ``type``.

    Raises:
        ProtocolViolation: for every way the bytes can fail to be such a header.
    """
    header = decode_json(raw)
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise ProtocolViolation("frame header is not an object with a string 'type'")
    return header


def parse_prefix(
    prefix: Union[bytes, bytearray, memoryview],
    max_header: int = MAX_HEADER_BYTES,
    max_body: int = MAX_BODY_BYTES,
) -> Tuple[int, int]:
    """Check a frame's 12-byte prefix against the limits; return (header length, body length).

    Raises:
        ProtocolViolation: bad magic, a length over its limit, or not PREFIX.size bytes.
    """
    if len(prefix) != PREFIX.size:
        raise ProtocolViolation("a frame prefix is %d bytes, got %d" % (PREFIX.size, len(prefix)))
    magic, head_len, body_len = PREFIX.unpack(bytes(prefix))
    if magic != MAGIC:
        raise ProtocolViolation("bad frame magic %r" % (magic,))
    if head_len > max_header:
        raise ProtocolViolation("frame header of %d B exceeds the %d B limit" % (head_len, max_header))
    if body_len > max_body:
        raise ProtocolViolation("frame body of %d B exceeds the %d B limit" % (body_len, max_body))
    return head_len, body_len


def frame_head(header: Message, body_len: int) -> bytes:
    """The prefix and header of a frame whose ``body_len`` body bytes are written separately (streamed).

    Raises:
        ProtocolViolation: the header or the body is over the protocol's limits.
    """
    head = encode_header(header)
    if len(head) > MAX_HEADER_BYTES or body_len > MAX_BODY_BYTES:
        raise ProtocolViolation("frame over limit: header %d B, body %d B" % (len(head), body_len))
    return PREFIX.pack(MAGIC, len(head), body_len) + head


def frame_parts(header: Message, body: Union[Body, Sequence[Body]] = b"") -> List[Body]:
    """The buffers of one frame, in order, to be written back to back.

    A body of at most 64 KiB is joined to the prefix and header (one write); a larger one is
    passed through as the caller's own buffers, never copied.

    Raises:
        ProtocolViolation: the header or the body is over the protocol's limits.
    """
    parts = [body] if isinstance(body, (bytes, bytearray, memoryview)) else list(body)
    size = sum(memoryview(part).nbytes for part in parts)
    head = frame_head(header, size)
    if size <= _INLINE_BODY_BYTES:
        return [b"".join([head, *parts])]
    return [head, *parts]


def send_frame(sock: socket.socket, header: Message, body: Union[Body, Sequence[Body]] = b"") -> None:
    """Write one frame whose body is one buffer or several sent back to back (no joined copy).

    Small bodies go out in the same ``send`` as the header.
    """
    for part in frame_parts(header, body):
        sock.sendall(part)


_ZEROS = bytes(RECV_CHUNK)


def recv_growing(sock: socket.socket, buf: bytearray, filled: int, size: int) -> int:
    """One ``recv_into`` at ``buf[filled:]``; returns the count read (0 at EOF).

    When ``buf`` is full it first grows by at most RECV_CHUNK (never past ``size``), so a
    declared length costs nothing until its bytes arrive and ``buf`` ends exactly ``size`` long.
    """
    if filled == len(buf):
        buf.extend(memoryview(_ZEROS)[: min(size - filled, RECV_CHUNK)])
    with memoryview(buf) as view, view[filled:] as tail:
        return sock.recv_into(tail)


def recv_exactly(sock: socket.socket, size: int) -> bytearray:
    """Read exactly ``size`` bytes; raise ChannelClosed on EOF before that."""
    buf = bytearray()
    filled = 0
    while filled < size:
        got = recv_growing(sock, buf, filled, size)
        if not got:
            raise ChannelClosed("connection closed after %d of %d bytes" % (filled, size))
        filled += got
    return buf


class FrameReader(object):
    """Reads one frame incrementally: each ``recv_from`` call is one ``recv_into`` on the socket.

    A blocking socket (the agent) loops on it; a non-blocking one (the controller) waits for
    readability between calls, and ``BlockingIOError`` passes through with nothing lost.
    Lengths are checked before the header or body is read, and buffers grow with what arrives.
    """

    def __init__(self, max_header: int = MAX_HEADER_BYTES, max_body: int = MAX_BODY_BYTES) -> None:
        self._max_header = max_header
        self._max_body = max_body
        self._part = "prefix"
        self._want = PREFIX.size
        self._buf = bytearray()
        self._filled = 0
        self._body_len = 0
        self._header: Optional[Header] = None

    @property
    def done(self) -> bool:
        """True once the whole frame has arrived."""
        return self._part == "done"

    @property
    def started(self) -> bool:
        """True once any byte of the frame has arrived."""
        return self._part != "prefix" or self._filled > 0

    def progress(self) -> str:
        """Where the frame stands, for error messages."""
        if self.done:
            return "the whole frame"
        return "%d of %d bytes of the frame %s" % (self._filled, self._want, self._part)

    def recv_from(self, sock: socket.socket) -> bool:
        """Read what the socket has for this frame (one ``recv_into``); True once the frame is complete.

        Raises:
            ChannelClosed: EOF, at a frame boundary or inside a frame.
            ProtocolViolation: the frame breaks the format or a limit.
            OSError: from the socket (``BlockingIOError`` when a non-blocking socket has nothing).
        """
        if self._part == "done":
            return True
        got = recv_growing(sock, self._buf, self._filled, self._want)
        if not got:
            raise ChannelClosed("connection closed after %s" % self.progress())
        self._filled += got
        while self._filled == self._want and self._part != "done":
            self._advance()
        return self._part == "done"

    def head(self) -> Optional[Tuple[Header, int]]:
        """(header, body length) once the prefix and header have arrived, else None; the body may still be due."""
        if self._header is None:
            return None
        return self._header, self._body_len

    def frame(self) -> Tuple[Header, bytearray]:
        """The complete frame as (header, body).

        Raises:
            ValueError: the frame is not complete yet.
        """
        if self._header is None or self._part != "done":
            raise ValueError("the frame is not complete: %s" % self.progress())
        return self._header, self._buf

    def _advance(self) -> None:
        if self._part == "prefix":
            head_len, self._body_len = parse_prefix(self._buf, self._max_header, self._max_body)
            self._part, self._want = "header", head_len
        elif self._part == "header":
            self._header = decode_header(self._buf)
            self._part, self._want = "body", self._body_len
        else:
            self._part = "done"
            return
        self._buf, self._filled = bytearray(), 0


def recv_frame(
    sock: socket.socket,
    max_header: int = MAX_HEADER_BYTES,
    max_body: int = MAX_BODY_BYTES,
    timeout: Optional[float] = None,
) -> Tuple[Header, bytearray]:
    """Read one frame, enforcing the limits before buffering; return (header, body).

    With ``timeout``, the whole frame must arrive within about that many seconds (as in
    ``recv_head``), so a peer that trickles bytes cannot hold the reader.

    Raises:
        socket.timeout: the deadline (or a read's own limit) passed before the frame was complete.
        ChannelClosed: EOF before the frame is complete.
        ProtocolViolation: the frame breaks the format or a limit.
    """
    reader = FrameReader(max_header, max_body)
    _read_until(sock, reader, timeout, lambda: reader.done)
    return reader.frame()


def _read_until(sock: socket.socket, reader: FrameReader, timeout: Optional[float], enough: Any) -> None:
    """Feed ``reader`` from ``sock`` until ``enough()``; the deadline is checked between reads.

    Raises:
        socket.timeout: ``timeout`` seconds passed, or one read ran past the socket's own limit.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while not enough():
        if deadline is not None and time.monotonic() > deadline:
            raise socket.timeout("timed out after %s" % reader.progress())
        try:
            reader.recv_from(sock)
        except BlockingIOError:
            raise socket.timeout("timed out after %s" % reader.progress()) from None


def limit_each_io(sock: socket.socket, seconds: float) -> None:
    """Make ``sock`` blocking, with a kernel time limit on each read and each write.

    The kernel's limits (SO_RCVTIMEO / SO_SNDTIMEO) cost nothing per call, where a Python
    socket time-out costs a poll() before every read and write. A read or write that runs
    out of time raises BlockingIOError.
    """
    sock.setblocking(True)
    whole = int(seconds)
    limit = struct.pack("@ll", whole, int((seconds - whole) * 1000000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)


def recv_head(
    sock: socket.socket,
    max_header: int = MAX_HEADER_BYTES,
    max_body: int = MAX_BODY_BYTES,
    timeout: Optional[float] = None,
) -> Tuple[Header, int]:
    """Read a frame's prefix and header, all within about ``timeout`` seconds; return (header, body length).

    The body stays on the socket: the caller reads or streams exactly that many bytes next.
    Each read waits as long as the socket allows (``limit_each_io``); the whole header must
    have arrived by ``timeout``, checked between reads, so it is late by at most one read's limit.

    Raises:
        socket.timeout: the deadline (or a read's own limit) passed before the header was complete.
        ChannelClosed: EOF before the header is complete.
        ProtocolViolation: the prefix or the header breaks the format or a limit.
    """
    reader = FrameReader(max_header, max_body)
    _read_until(sock, reader, timeout, lambda: reader.head() is not None)
    head = reader.head()
    assert head is not None
    return head


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
