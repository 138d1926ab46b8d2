"""Wire format shared by the controller and the in-container agent: framed JSON headers plus raw bodies.

Standard library only: this file is copied into sandbox images and must run on the image's
Python (3.9 and later: no ``X | Y`` at run time, no ``match``). A frame is a fixed 12-byte
prefix (magic, header length, body length), a UTF-8 JSON header object with a ``type`` field,
and an optional raw binary body (checkpoint blobs, contexts), so large payloads never travel
as base64 inside JSON.
Both sides check every length against a limit before buffering anything, and a receiver grows
its buffer with what has arrived instead of trusting a declared length.

The agent reads frames with the blocking ``recv_frame``, or with ``recv_head`` when it streams
the body on itself; the controller drives the same ``FrameReader`` from a non-blocking socket
against a deadline (``orchestrator/wire/transport.py``).

The "Messages" section at the end defines every message type, and each request once for both
sides: its fields (a TypedDict), the builder the controller sends it with, and the reader the
agent checks it with; ``REPLY_TYPES`` says which reply answers which request.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import json
import math
import re
import socket
import struct
import time
from typing import Any, Callable, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, TypedDict, Union, cast

PROTOCOL_VERSION = 7
MAGIC = b"ORC1"
PREFIX = struct.Struct("!4sII")  # magic, header length, body length
MAX_HEADER_BYTES = 16 << 20
MAX_BODY_BYTES = (2 << 30) - 1
MAX_HEADER_DEPTH = 32  # nesting of objects and arrays in a header, the outer object included
MAX_INT_DIGITS = 24  # an integer in a header has at most this many digits (2**63 has 19)
MAX_FLOAT_CHARS = 64  # a number with a fraction or exponent is at most this long (repr of a float: 24)
RECV_CHUNK = 1 << 20  # a receive buffer grows by at most this much beyond what has arrived
SECRET_BYTES = 32  # the sandbox secret: this many random bytes, stored as twice as many hex characters
_INLINE_BODY_BYTES = 64 << 10
_SURROGATES = re.compile("[\ud800-\udfff]")

# Contexts (docs/protocol.md): more namespaces in the one worker; requests name theirs in ``context``.
CONTEXT_SEPARATOR = "/"  # a context's variable ``x`` is ``<context>/x`` in checkpoints (names have no "/")
CONTEXT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")  # a context id: also a directory name and a key prefix
# The checkpoint manifest's bounds (docs/trust.md, "Names"): the agent keeps within them by itself (a name past
# them is reported in ``unsaved``), and the controller refuses a delta that would take the manifest past them.
MAX_NAME_CHARS = 128  # a variable name in a checkpoint: an identifier of at most this many characters
MAX_CHECKPOINT_NAMES = 10000  # names (keys) in a session's checkpoint, all contexts together
MAX_CHECKPOINT_NAME_BYTES = 1 << 20  # UTF-8 bytes of those keys together
MAX_UNSAVED_NAMES = 1000  # entries of a delta's ``unsaved``: the agent lists this many at most
MAX_UNSAVED_KEY_CHARS = 64 + 1 + MAX_NAME_CHARS + 16  # an ``unsaved`` key: a context, "/", a name shown clipped
MAX_REASON_CHARS = 2000  # a reason in ``unsaved`` (the agent clips its own to 200)
# Host-made blobs (docs/protocol.md, "Host-made blobs"): a str or bytes value the controller made
# (set_value with ``blob``) is checkpointed as a protocol-4 pickle the controller writes by hand
# around the raw bytes, and named by a fresh random id of its own shape, not by a content digest.
HOST_BLOB_KINDS = ("str", "bytes")
HOST_BLOB_ID = re.compile(r"h[0-9a-f]{32}")  # content digests are 32 lowercase hex: never an "h"
HOST_BLOB_OVERHEAD = 12  # PROTO 4 (2 bytes), BINUNICODE8 or BINBYTES8 with its 8-byte length (9), STOP (1)
_HOST_BLOB_OPCODES = {"str": b"\x8d", "bytes": b"\x8e"}  # pickle.BINUNICODE8, pickle.BINBYTES8 (PEP 3154)
_HOST_BLOB_LENGTH = struct.Struct("<Q")
HOST_CALL_MAX_BYTES = 16 << 20  # default bound of one host call's JSON payload or result
HOST_CALL_HEADER_BYTES = 64 << 10  # a host call's frame header holds its number and handler name
# Why a host call is answered ``error`` without reaching a handler: no exec's cell ran when it was made, or the cell
# that made it ended before its answer came (a late answer is dropped, never given to a later cell).
CALL_NO_CELL = "no cell is running: host calls are answered only while a cell runs"
CALL_ENDED = "the cell that made this host call has ended"
OUTPUT_STREAMS = ("stdout", "stderr")  # the ``stream`` of an ``output`` frame
# input() of a cell is a host call of this reserved name; its wait does not count toward the cell's timeout.
INPUT_CALL = "__input__"
# A value a restore deferred (``defer``) is fetched on first use by a host call of this reserved name: the
# controller answers it itself from the store, with the raw blob as the body (docs/protocol.md, "Deferred values").
BLOB_CALL = "__blob__"
# ... and unpickled while the controller checks the blob against its digest; this call (same payload) asks its
# verdict before the value is bound: the answer is JSON true, or an error saying why the value is lost.
BLOB_CHECK_CALL = "__blob_check__"
# How the controller's refusal of either call begins: the value is lost. Any other failure of the call (no cell
# running, the link or the controller gone) leaves it deferred.
BLOB_REFUSED = "deferred value not served: "
# How the controller's answer to either call begins when it cannot serve the blob now but may later (the host is out
# of descriptors or memory, or the key was handed out as often as it may be until the next restore): the value stays
# deferred. It does not begin with BLOB_REFUSED, so an agent of protocol 7 (which keeps the value on any other
# failure of the call) reads it as this one does: ``DeferredValueUnavailable``.
BLOB_UNAVAILABLE = "deferred value not available now, try later: "

NONCE_BYTES = 16


def name_problem(name: object) -> Optional[str]:
    """Why ``name`` cannot be a variable name in a checkpoint, or None when it can (an identifier, not too long)."""
    if not isinstance(name, str):
        return "the name is not a str"
    if len(name) > MAX_NAME_CHARS:
        return "the name is longer than %d characters" % MAX_NAME_CHARS
    if not name.isidentifier():
        return "the name is not a Python identifier"
    return None


def checkpoint_key_problem(key: object) -> Optional[str]:
    """Why ``key`` cannot be a key of a checkpoint manifest, or None when it can: a name, or ``<context id>/<name>``.

    The one rule for stored names (docs/trust.md): the agent reports a name that breaks it in
    ``unsaved``, the controller refuses a delta naming one before it commits anything, and the
    store refuses a record holding one, so whatever is committed can be read back.
    """
    if not isinstance(key, str):
        return "the name is not a str"
    context, separator, name = key.rpartition(CONTEXT_SEPARATOR)
    if separator and CONTEXT_ID.fullmatch(context) is None:
        return "the context id is not 1-64 letters, digits, '_' and '-'"
    return name_problem(name)


def key_bytes(key: str) -> int:
    """What a checkpoint key counts against MAX_CHECKPOINT_NAME_BYTES: its UTF-8 length."""
    return len(key.encode("utf-8", "surrogatepass"))


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
    return isinstance(given, str) and hmac.compare_digest(
        expected.encode("ascii", "replace"), given.encode("ascii", "replace")
    )


def format_secret(key: bytes) -> bytes:
    """The contents of a sandbox's ``secret`` file for a key of SECRET_BYTES random bytes (lower-case hex)."""
    if len(key) != SECRET_BYTES:
        raise ValueError("a sandbox secret is %d bytes, got %d" % (SECRET_BYTES, len(key)))
    return key.hex().encode("ascii")


def parse_secret(text: bytes) -> bytes:
    """The key (SECRET_BYTES raw bytes, what ``auth_proof`` takes) from a ``secret`` file's contents.

    Raises:
        ValueError: the contents are not 2 * SECRET_BYTES hex characters (a final newline is allowed).
    """
    text = text[:-1] if text.endswith(b"\n") else text
    try:
        key = bytes.fromhex(text.decode("ascii"))
    except ValueError:  # UnicodeDecodeError included
        key = b""
    if len(text) != 2 * SECRET_BYTES or len(key) != SECRET_BYTES:
        raise ValueError("a sandbox secret file holds %d hex characters" % (2 * SECRET_BYTES))
    return key


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


def blob_hash(data: Union[bytes, bytearray, memoryview] = b"") -> Any:
    """A running content digest of blob bytes (``.update``, ``.hexdigest``): blob names on both sides of the channel."""
    return hashlib.blake2b(data, digest_size=16)


def blob_digest(data: Union[bytes, bytearray, memoryview]) -> str:
    """The content digest naming a blob."""
    return str(blob_hash(data).hexdigest())


def is_host_blob(blob_id: object) -> bool:
    """True for the id of a host-made blob (``h`` and 32 lowercase hex), False for a content digest or anything else."""
    return isinstance(blob_id, str) and HOST_BLOB_ID.fullmatch(blob_id) is not None


def host_blob_parts(kind: str, raw: Union[bytes, bytearray, memoryview]) -> List[Body]:
    """The blob of a host-made str (``raw`` its UTF-8 with surrogatepass) or bytes value, as parts, ``raw`` not copied.

    Back to back they are a protocol-4 pickle (``PROTO 4``, ``BINUNICODE8`` or ``BINBYTES8`` and
    the 8-byte little-endian length, the bytes, ``STOP``) that ``pickle.loads`` turns into the value.
    """
    return [b"\x80\x04" + _HOST_BLOB_OPCODES[kind] + _HOST_BLOB_LENGTH.pack(len(raw)), raw, b"."]


def host_blob_framed(blob: Union[bytes, bytearray, memoryview]) -> bool:
    """True when ``blob`` has the frame of a host-made blob, whole (it has no digest to check)."""
    view = memoryview(blob).cast("B")
    size = len(view)
    return (
        size >= HOST_BLOB_OVERHEAD
        and view[0] == 0x80
        and view[1] == 4
        and bytes(view[2:3]) in (b"\x8d", b"\x8e")
        and _HOST_BLOB_LENGTH.unpack_from(view, 3)[0] == size - HOST_BLOB_OVERHEAD
        and view[size - 1] == 0x2E
    )


# --- Messages ----------------------------------------------------------------------------------------------
# Every message type, and each request's fields: one definition for both sides. The controller builds its
# requests with the functions below; the agent reads them with the ``read_*`` functions, which check each field
# it uses (a field of the wrong type is an error reply, or counts as absent where docs/protocol.md says so).
# Replies are checked on the host (orchestrator/wire/replies.py): every byte from a sandbox is hostile.

# Connection set-up (docs/protocol.md): hello (agent), auth (controller), auth_ok (agent).
HELLO = "hello"  # also the worker's first frame to the supervisor: {python, dill, pid}
AUTH = "auth"
AUTH_OK = "auth_ok"
# Requests the controller sends; each carries an ``id`` that its reply echoes.
EXEC = "exec"
SET_VALUE = "set_value"
RESET = "reset"
RESTORE_BEGIN = "restore_begin"
LOAD = "load"
DEFER = "defer"
RESTORE_END = "restore_end"
PING = "ping"
INSTALL = "install"  # the session's scaffold: code run in its own module of every worker (docs/protocol.md)
CONTEXT_CREATE = "context_create"
CONTEXT_DESTROY = "context_destroy"
# Replies and notices the agent sends.
EXEC_REPLY = "exec_reply"
STATE_REPLY = "state_reply"
LOAD_REPLY = "load_reply"
RESTORE_REPLY = "restore_reply"
PONG = "pong"
INSTALL_REPLY = "install_reply"
ERROR = "error"  # the reply to a request of a type the agent does not know: status protocol_error, ran false
GOODBYE = "goodbye"
# Worker -> supervisor only: the cell finished, checkpointing starts (its own time limit).
CELL_DONE = "cell_done"
# Supervisor -> controller, during an exec whose checkpoint takes a while: its own time limit runs now.
CHECKPOINTING = "checkpointing"
# Host calls (docs/protocol.md): worker -> supervisor -> controller while a cell runs, and the answer back.
HOST_CALL = "host_call"
HOST_REPLY = "host_reply"
# Output (docs/protocol.md): worker -> supervisor (on the host-call link) -> controller while a cell runs.
OUTPUT = "output"
# Controller -> supervisor while an exec runs: stop the cell (the timeout ladder), as when its time is up.
INTERRUPT = "interrupt"
# One hop (docs/design/one-hop.md, not on by default): the agent offers it in its hello's ``capabilities``, the
# controller takes it with ``one_hop: true`` in its auth and sends, on the connection, a ``data_channel`` frame
# carrying (SCM_RIGHTS) one end of each of two socket pairs it made: requests and replies, then host calls. The
# supervisor passes them to its worker, which serves them directly; when the controller closes them the worker
# tells the supervisor ``idle {generation}`` and waits for the next. ``worker_lost {reason, oom}``: supervisor ->
# controller, the worker died or misbehaved and a fresh one replaced it (the data channel died with it). The
# controller keeps the ladder's clock and asks: ``interrupt {id, phase}`` (the signal of ``phase``: SIGINT for a
# cell or a load, SIGUSR2 for a checkpoint) and ``kill {id}``, answered ``worker_replaced {id, reason, oom}``.
ONE_HOP = "one_hop"
# In one hop, a deferred value's blob may come as a descriptor of its file (``host_reply {file}``): offered by an
# agent whose worker maps it; an older one gets the body.
BLOB_FILES = "blob_files"
DATA_CHANNEL = "data_channel"
DATA_CHANNEL_FDS = 2  # requests and replies, host calls: a data_channel frame carries exactly these
WORKER_IDLE = "idle"
WORKER_LOST = "worker_lost"
KILL = "kill"
WORKER_REPLACED = "worker_replaced"
INTERRUPT_PHASES = ("cell", "load", "checkpoint")

# The reply type that answers each request type (any other type is answered ``ERROR``).
REPLY_TYPES = {
    EXEC: EXEC_REPLY,
    SET_VALUE: STATE_REPLY,
    RESET: STATE_REPLY,
    RESTORE_BEGIN: RESTORE_REPLY,
    LOAD: LOAD_REPLY,
    DEFER: LOAD_REPLY,
    RESTORE_END: RESTORE_REPLY,
    INSTALL: INSTALL_REPLY,
    CONTEXT_CREATE: STATE_REPLY,
    CONTEXT_DESTROY: STATE_REPLY,
    PING: PONG,
}

# Outcomes of a request as the agent reports them in ``status``.
STATUS_OK = "ok"
STATUS_ERROR = "error"
STATUS_TIMEOUT = "timeout"
STATUS_CRASHED = "crashed"
STATUS_PROTOCOL_ERROR = "protocol_error"
Status = Literal["ok", "error", "timeout", "crashed", "protocol_error"]


class BadRequest(Exception):
    """A request lacks a field the agent needs, or has it of the wrong type: the agent replies with this reason."""


# In the shapes below a key the agent can do without is optional (a TypedDict of ``total=False``), even where
# the controller always sends it. Time limits (``timeout``, ``checkpoint_timeout``) are seconds the supervisor
# enforces; absent, or not a positive finite number, it uses its own default.


class _Envelope(TypedDict, total=False):
    id: str  # set by the controller's connection when it sends the request; the reply echoes it


class _Request(_Envelope):
    type: str


class InContext(_Request, total=False):
    context: str  # the context the request runs in (a CONTEXT_ID); absent: the default context


class _ExecFields(InContext):
    code: str


class ExecRequest(_ExecFields, total=False):
    """Run a cell, then checkpoint (docs/protocol.md, "Requests and replies" and "Output, input() and interrupts")."""

    timeout: float
    checkpoint_timeout: float
    send_limit: int  # output bytes per stream that may travel as ``output`` frames (> 0; else none)
    stream: bool  # true: every byte of output travels as ``output`` frames
    input: bool  # true: the cell's input() asks the controller (a host call of INPUT_CALL)
    stdin: str  # the text sys.stdin and Python's own input() read; then ``input`` is ignored
    output_cap: int  # bytes of stdout and stderr together past which the cell's writes raise (>= 0)
    checkpoint: bool  # false: no checkpoint (an empty delta)


def exec_request(
    code: str,
    timeout: float,
    *,
    checkpoint_timeout: Optional[float] = None,
    send_limit: Optional[int] = None,
    stream: bool = False,
    input: bool = False,
    stdin: Optional[str] = None,
    output_cap: Optional[int] = None,
    checkpoint: bool = True,
) -> ExecRequest:
    request = ExecRequest(type=EXEC, code=code, timeout=timeout)
    if checkpoint_timeout is not None:
        request["checkpoint_timeout"] = checkpoint_timeout
    if not checkpoint:
        request["checkpoint"] = False
    if stream:
        request["stream"] = True
    if input:
        request["input"] = True
    if send_limit is not None:
        request["send_limit"] = send_limit
    if output_cap is not None:
        request["output_cap"] = output_cap
    if stdin is not None:
        request["stdin"] = stdin
    return request


_EXEC_OPTIONS: Dict[str, Callable[[Any], bool]] = {
    "send_limit": lambda value: type(value) is int and value > 0,
    "output_cap": lambda value: type(value) is int and value >= 0,
    "stdin": lambda value: isinstance(value, str),
    "stream": lambda value: value is True,
    "input": lambda value: value is True,
    "checkpoint": lambda value: value is False,
}


def read_exec(header: Header) -> ExecRequest:
    """The exec request; an option of the wrong type (or its default value) is dropped: it counts as absent.

    Raises:
        BadRequest: no code.
    """
    if not isinstance(header.get("code"), str):
        raise BadRequest("no code")
    kept = {key: value for key, value in header.items() if key not in _EXEC_OPTIONS or _EXEC_OPTIONS[key](value)}
    return cast(ExecRequest, kept)


class _SetValueFields(InContext):
    name: str
    kind: str  # how the body is the value: "str" (UTF-8, surrogatepass), "bytes", "json"


class SetValueRequest(_SetValueFields, total=False):
    """Bind a value the controller sends as the body to ``name`` and ``aliases`` (docs/protocol.md)."""

    aliases: List[str]
    checkpoint_timeout: float
    blob: str  # kind str or bytes: the id of the host-made blob the controller stored (HOST_BLOB_ID) ...
    blob_size: int  # ... and its size: the body's length plus HOST_BLOB_OVERHEAD
    file: str  # with blob, local sandboxes only: the blob is this file of the channel directory, the body empty


VALUE_FILE = re.compile(r"value-h[0-9a-f]{32}")
"""The name of a host-made blob's file in the channel directory (``set_value``'s ``file``): ``value-<blob id>``."""
VALUE_FILE_MIN_BYTES = 1 << 20
"""A host-made blob at least this big goes to a local sandbox as a file, not as the frame's body."""


def value_file_name(blob_id: str) -> str:
    return "value-" + blob_id


def set_value_request(name: str, kind: str, aliases: List[str], checkpoint_timeout: float) -> SetValueRequest:
    return SetValueRequest(type=SET_VALUE, name=name, kind=kind, aliases=aliases, checkpoint_timeout=checkpoint_timeout)


def read_set_value(header: Header, body_size: int, reserved: Callable[[str], bool]) -> SetValueRequest:
    """The set_value request whose body is ``body_size`` bytes, with ``aliases`` a list (absent: empty).

    Raises:
        BadRequest: a name or alias that is not a non-empty str or is ``reserved``; a ``blob`` without
            the kind, id and size of a host-made blob (the worker decodes the body by ``kind``); a
            ``file`` that is not that blob's file name, or comes with a body.
    """
    kind = header.get("kind")
    aliases = header.get("aliases") or []
    names = [header.get("name"), *(aliases if isinstance(aliases, list) else [None])]
    if not all(isinstance(name, str) and name and not reserved(name) for name in names):
        raise BadRequest("bad variable name")
    blob_id, blob_size, file = header.get("blob"), header.get("blob_size"), header.get("file")
    if file is not None and not (isinstance(blob_id, str) and file == value_file_name(blob_id) and body_size == 0):
        raise BadRequest("a value file must be named after its host-made blob, with an empty body")
    if blob_id is not None and not (
        kind in HOST_BLOB_KINDS
        and is_host_blob(blob_id)
        and type(blob_size) is int
        and blob_size >= HOST_BLOB_OVERHEAD
        and (file is not None or blob_size == body_size + HOST_BLOB_OVERHEAD)
    ):
        raise BadRequest("a host-made blob needs kind str or bytes, its id and its size")
    return cast(SetValueRequest, dict(header, aliases=aliases))


class ResetRequest(InContext, total=False):
    """Clear the context's namespace, then checkpoint."""

    checkpoint_timeout: float


def reset_request(checkpoint_timeout: float) -> ResetRequest:
    return ResetRequest(type=RESET, checkpoint_timeout=checkpoint_timeout)


class RestoreBeginRequest(_Request, total=False):
    """Clear every namespace and drop every context but the default one: a restore starts."""

    generation: int  # the generation being restored (the agent does not use it)
    prepare: bool  # true: an empty restore that readies a pooled sandbox (the worker imports dill now)


def restore_begin_request(generation: int, prepare: bool = False) -> RestoreBeginRequest:
    request = RestoreBeginRequest(type=RESTORE_BEGIN, generation=generation)
    if prepare:
        request["prepare"] = True
    return request


class _LoadFields(InContext):
    name: str  # the bare name (its context in ``context``)
    digest: str  # the blob's content digest, or a host-made blob's id


class LoadRequest(_LoadFields, total=False):
    """Unpickle the body (one blob) into ``name`` (docs/protocol.md, "Restore")."""

    timeout: float
    verified: bool  # true: the controller checks the digest itself, the worker does not


def load_request(name: str, digest: str, timeout: float, context: Optional[str] = None) -> LoadRequest:
    request = LoadRequest(type=LOAD, name=name, digest=digest, timeout=timeout)
    if context is not None:
        request["context"] = context
    return request


def read_load(header: Header, reserved: Callable[[str], bool]) -> LoadRequest:
    """The load request.

    Raises:
        BadRequest: the name is not a non-empty str or is ``reserved``, or the digest is not a str.
    """
    name = header.get("name")
    if not isinstance(name, str) or not name or reserved(name) or not isinstance(header.get("digest"), str):
        raise BadRequest("the load request needs a name and a digest")
    return cast(LoadRequest, header)


class _DeferFields(_LoadFields):
    size: int  # the blob's size in bytes (the checkpoint and its quota count it)


class DeferRequest(_DeferFields, total=False):
    """Bind ``name`` to a stored blob that is loaded on first use, not now (docs/protocol.md, "Deferred values")."""


def defer_request(name: str, digest: str, size: int, context: Optional[str] = None) -> DeferRequest:
    request = DeferRequest(type=DEFER, name=name, digest=digest, size=size)
    if context is not None:
        request["context"] = context
    return request


def read_defer(header: Header, reserved: Callable[[str], bool]) -> DeferRequest:
    """The defer request.

    Raises:
        BadRequest: the name is not a non-empty str or is ``reserved``, the digest is not a str, or the size
            is not an int >= 0.
    """
    read_load(header, reserved)
    size = header.get("size")
    if type(size) is not int or size < 0:
        raise BadRequest("the defer request needs a size")
    return cast(DeferRequest, header)


class BlobCall(TypedDict):
    """The payload of a ``BLOB_CALL`` host call: the checkpoint key of a deferred value and its blob."""

    key: str  # the checkpoint key (``<context>/<name>`` in a context)
    digest: str  # the blob the ``defer`` named


def blob_call(key: str, digest: str) -> BlobCall:
    return BlobCall(key=key, digest=digest)


def read_blob_call(payload: object) -> BlobCall:
    """A ``BLOB_CALL``'s payload, as the controller reads it (it comes from the sandbox: hostile).

    Raises:
        BadRequest: it is not an object with a str key and a str digest.
    """
    if not isinstance(payload, dict) or not isinstance(payload.get("key"), str):
        raise BadRequest("a blob call needs a key and a digest")
    if not isinstance(payload.get("digest"), str):
        raise BadRequest("a blob call needs a key and a digest")
    return cast(BlobCall, payload)


class RestoreEndRequest(_Request):
    """The restore is complete: the checkpoint generation the worker holds now."""

    generation: int


def restore_end_request(generation: int) -> RestoreEndRequest:
    return RestoreEndRequest(type=RESTORE_END, generation=generation)


def read_restore_end(header: Header) -> RestoreEndRequest:
    """The restore_end request.

    Raises:
        BadRequest: the generation is not an int >= 0.
    """
    generation = header.get("generation")
    if type(generation) is not int or generation < 0:
        raise BadRequest("restore_end needs a generation")
    return cast(RestoreEndRequest, header)


class _InstallFields(_Request):
    code: str
    names: List[str]  # session names the scaffold makes: never checkpointed


class InstallRequest(_InstallFields, total=False):
    """Run the session's scaffold in a module of its own (docs/protocol.md, "The scaffold")."""

    timeout: float


def install_request(code: str, names: List[str], timeout: float) -> InstallRequest:
    return InstallRequest(type=INSTALL, code=code, names=names, timeout=timeout)


def read_install(header: Header) -> InstallRequest:
    """The install request.

    Raises:
        BadRequest: the code is not a str, or the names not a list of str.
    """
    code, names = header.get("code"), header.get("names")
    if not isinstance(code, str) or not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise BadRequest("install needs code (a str) and names (a list of str)")
    return cast(InstallRequest, header)


class _ContextCreateFields(_Request):
    context: str
    cwd: str  # absolute; the worker creates it
    env: Dict[str, str]  # on top of the worker's own environment


class ContextCreateRequest(_ContextCreateFields, total=False):
    """Make an empty context (an existing one of that id is destroyed first)."""

    checkpoint_timeout: float


def context_create_request(
    context: str, cwd: str, env: Dict[str, str], checkpoint_timeout: Optional[float] = None
) -> ContextCreateRequest:
    request = ContextCreateRequest(type=CONTEXT_CREATE, context=context, cwd=cwd, env=env)
    if checkpoint_timeout is not None:
        request["checkpoint_timeout"] = checkpoint_timeout
    return request


class _ContextDestroyFields(_Request):
    context: str


class ContextDestroyRequest(_ContextDestroyFields, total=False):
    """Delete a context and its names."""

    checkpoint_timeout: float


def context_destroy_request(context: str, checkpoint_timeout: float) -> ContextDestroyRequest:
    return ContextDestroyRequest(type=CONTEXT_DESTROY, context=context, checkpoint_timeout=checkpoint_timeout)


def read_context(header: Header) -> Union[ContextCreateRequest, ContextDestroyRequest]:
    """A context_create or context_destroy request.

    Raises:
        BadRequest: no context id (a non-empty str without the separator); for context_create, a ``cwd``
            that is not absolute or an ``env`` that is not an object of strings.
    """
    context_id, cwd, env = header.get("context"), header.get("cwd"), header.get("env")
    if not isinstance(context_id, str) or not context_id or CONTEXT_SEPARATOR in context_id:
        raise BadRequest("the request needs a context id")
    if header["type"] == CONTEXT_DESTROY:
        return cast(ContextDestroyRequest, header)
    if not (
        isinstance(cwd, str)
        and cwd.startswith("/")
        and isinstance(env, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise BadRequest("context_create needs an absolute cwd and env (an object of strings)")
    return cast(ContextCreateRequest, header)


class PingRequest(_Request):
    """Is the agent there? It answers ``pong {generation}`` itself, without the worker."""


# What the controller sends through ``AgentConnection.request``: each answered by its REPLY_TYPES entry.
Request = Union[
    ExecRequest,
    SetValueRequest,
    ResetRequest,
    RestoreBeginRequest,
    LoadRequest,
    DeferRequest,
    RestoreEndRequest,
    InstallRequest,
    ContextCreateRequest,
    ContextDestroyRequest,
    PingRequest,
]


class Auth(TypedDict):
    """The controller's answer to the hello (docs/protocol.md, "Connection set-up")."""

    type: str
    nonce: str
    proof: str  # auth_proof(secret, "controller", agent nonce, this nonce)


def auth_message(nonce: str, proof: str) -> Auth:
    return Auth(type=AUTH, nonce=nonce, proof=proof)


MAX_NONCE_CHARS = 256  # a nonce the agent takes (the controller's are 2 * NONCE_BYTES hex characters)


def read_auth(header: Header) -> Auth:
    """The controller's auth frame; its proof is checked by ``proof_matches`` (any value, in constant time).

    Raises:
        BadRequest: not an auth frame, or its nonce is not a str of 1 to MAX_NONCE_CHARS characters.
    """
    nonce = header.get("nonce")
    if header.get("type") != AUTH or not isinstance(nonce, str) or not 0 < len(nonce) <= MAX_NONCE_CHARS:
        raise BadRequest("not an auth frame with a nonce")
    return cast(Auth, header)


class Interrupt(TypedDict):
    """Stop the running cell of exec ``id`` (the timeout ladder at once)."""

    type: str
    id: str


def interrupt_message(request_id: str) -> Interrupt:
    return Interrupt(type=INTERRUPT, id=request_id)


class _HostReplyFields(TypedDict):
    type: str
    call: int  # the host call's number
    status: str  # STATUS_OK (the body is the JSON result) or STATUS_ERROR


class HostReply(_HostReplyFields, total=False):
    """The controller's answer to a host call; the supervisor passes it on to the worker."""

    error: str  # why it failed (status error): the cell's host_call raises HostCallError with it
    file: int  # one hop, a BLOB_CALL's answer only: no body, the blob is the read-only file that came with the
    # frame's first byte (SCM_RIGHTS), and this is its size


def host_reply(call: int, error: Optional[str] = None) -> HostReply:
    """The answer to host call ``call``: ok (its result is the body), or failed with ``error``."""
    if error is None:
        return HostReply(type=HOST_REPLY, call=call, status=STATUS_OK)
    return HostReply(type=HOST_REPLY, call=call, status=STATUS_ERROR, error=error)


def host_reply_file(call: int, size: int) -> HostReply:
    """The answer to a ``BLOB_CALL`` whose blob comes as a descriptor of its file, of ``size`` bytes."""
    return HostReply(type=HOST_REPLY, call=call, status=STATUS_OK, file=size)


# Replies: their fields besides ``type`` and ``id``, as the agent sends them (docs/protocol.md says what each
# means). The host trusts none of them: wire/replies.py checks every field it returns in these shapes, and
# fills in the optional ones it uses.


class _HelloFields(TypedDict):
    protocol: int  # PROTOCOL_VERSION
    sandbox_id: str
    generation: int  # the checkpoint generation the agent's memory holds (0: a fresh worker)
    python: str
    dill: str
    nonce: str  # the agent's challenge for the handshake


class Hello(_HelloFields, total=False):
    """The agent's first frame on a connection (docs/protocol.md, "Connection set-up")."""

    agent_pid: int  # for a person reading logs: the controller does not use them
    worker_pid: int
    capabilities: List[str]  # what the agent can do besides the protocol's version: ONE_HOP


class Goodbye(TypedDict):
    """The agent leaves this connection for another controller's (docs/protocol.md, "Takeover")."""

    reason: str
    in_flight: Optional[str]  # the id of the request it abandoned, if one ran


class BlobEntry(TypedDict):
    digest: str  # blob_digest of the blob: the blobs travel in the reply's body in this order
    size: int


class CheckpointDelta(TypedDict):
    """What a request changed in the checkpoint (docs/protocol.md, "Requests and replies")."""

    generation: int
    blobs: List[BlobEntry]
    vars: Dict[str, str]  # checkpoint key -> blob id
    deleted: List[str]
    unsaved: Dict[str, str]  # checkpoint key -> why it is not saved


class _ExecReplyFields(TypedDict):
    status: Status
    stdout: str  # the first output_limit bytes of each stream ...
    stderr: str
    stdout_bytes: int  # ... of this many the cell wrote
    stderr_bytes: int
    return_value: Optional[str]  # the repr of the cell's last expression
    error: Optional[Dict[str, Any]]  # what the cell raised
    duration: float
    checkpoint_duration: float
    checkpoint: CheckpointDelta


class ExecReply(_ExecReplyFields, total=False):
    """The reply to ``exec``."""

    scaffold: Optional[Dict[str, Any]]  # what the scaffold's after_cell returned
    output_limited: bool  # true: the cell's output passed the exec's ``output_cap``


class _LoadReplyFields(TypedDict):
    status: Status


class LoadReply(_LoadReplyFields, total=False):
    """The reply to ``load``."""

    reason: str  # why it failed


# The controller's control frames to the supervisor in one hop (docs/design/one-hop.md), built here as the other
# messages are.
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


# The relayed carrier (docs/design/one-hop.md, "Carriers"): an agent that offers RELAYED in its hello takes it when the
# controller's auth says ``relayed: true`` beside ``one_hop: true``. The ``data_channel`` frame then carries no
# descriptors: the supervisor makes the worker's pairs and forwards their bytes on its connection, both ways, in
# ``relay {stream, channel}`` frames: the body is the stream's next bytes (at most RELAY_CHUNK), an empty one says
# that end closed.
RELAYED = "relayed"
RELAY = "relay"
RELAY_REQUESTS = "D"  # requests and replies
RELAY_CALLS = "K"  # host calls and output
RELAY_STREAMS = (RELAY_REQUESTS, RELAY_CALLS)
RELAY_CHUNK = 256 << 10


class Relay(TypedDict):
    """A relay frame's header; the body is the stream's bytes."""

    type: str
    stream: str
    channel: int


def relay_message(stream: str, number: int) -> Relay:
    return Relay(type=RELAY, stream=stream, channel=number)
