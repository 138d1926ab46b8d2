"""One open connection to an agent: frames sent and received against absolute deadlines.

A ``Channel`` wraps a connected stream socket in non-blocking mode and waits with
``select.poll`` (no ``FD_SETSIZE`` limit), so one deadline covers a whole frame: a peer that
trickles bytes or is stopped cannot stretch a call. Receive buffers grow with what arrives,
never with what a prefix declares, and large bodies are sent from memoryviews, never copied.
A read takes up to ``READ_AHEAD`` bytes, so a small frame (prefix, header and body) costs one
``recv`` (bytes past it are kept for the next frame: ``buffered``). Foreign errors (OSError, bad
frames) are translated here into the ``TransportError`` family. How the controller gets such a
socket is ``endpoint.py``'s job.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import select
import socket
import struct
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple, NoReturn

from ..agent import framing, handover
from ..errors import AgentTimeoutError, ChannelLost, ProtocolError, TransportError

logger = logging.getLogger(__name__)

_SEND_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)  # EPIPE as an error, even where SIGPIPE is not ignored
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
READ_AHEAD = 8 << 10  # one read takes up to this much: a small frame and what came after it (held only meanwhile)
_PREFIX = framing.PREFIX.size
FrameBody = framing.Body | Sequence[framing.Body]  # one buffer, or several sent back to back


class PeerCredentials(NamedTuple):
    """Who is at the other end of a Unix socket, as the kernel saw it when the peer connected."""

    pid: int
    uid: int
    gid: int


def peer_credentials(sock: socket.socket) -> PeerCredentials | None:
    """The peer's process, user and group ids via ``SO_PEERCRED``; None where the OS does not tell (not Linux).

    Ids are as seen from the caller's user namespace.
    """
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None or sock.family != socket.AF_UNIX:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, option, _PEERCRED.size)
    except OSError:
        return None
    return PeerCredentials(*_PEERCRED.unpack(raw))


def wait_for(sock: socket.socket, events: int, deadline: float | None, what: Callable[[], str]) -> None:
    """Block until ``sock`` reports one of the poll ``events`` (or an error / hang-up), at most until ``deadline``.

    Args:
        sock: the socket to watch.
        events: ``select.POLLIN`` and/or ``select.POLLOUT``.
        deadline: absolute ``time.monotonic()`` value; None waits for ever.
        what: says what was awaited, for the timeout's message.

    Raises:
        AgentTimeoutError: the deadline passed first.
    """
    poller = select.poll()
    poller.register(sock, events)
    while True:
        if deadline is None:
            timeout_ms = None
        else:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AgentTimeoutError(f"{what()}: the deadline passed")
            timeout_ms = max(1, math.ceil(remaining * 1000))
        if poller.poll(timeout_ms):
            return


class _ReadAhead:
    """One frame at a time from a non-blocking socket, each read taking up to ``READ_AHEAD`` bytes.

    The prefix and header are read into a small buffer, which usually holds the whole frame after one
    ``recv_into``; the limits are checked as soon as the prefix is there. A body longer than what came
    with the head is read into its own buffer, which grows with what arrives (at most ``RECV_CHUNK``
    past it), never with what the prefix declares. Bytes past the frame stay for the next one.
    """

    __slots__ = ("_body", "_body_len", "_buf", "_end", "_filled", "_head_len", "_header", "_max_body", "_max_header")
    _buf: bytearray | None

    def __init__(self, max_header: int, max_body: int) -> None:
        self._max_header = max_header
        self._max_body = max_body
        self._buf = None  # held only while a frame, or bytes past one, wait here
        self._end = 0  # bytes of ``_buf`` read from the socket, the frame's first byte at 0
        self._head_len = -1
        self._body_len = 0
        self._header: framing.Header | None = None
        self._body = bytearray()
        self._filled = 0

    @property
    def buffered(self) -> bool:
        """True when bytes read from the socket wait here (a frame begun, or one read with the last)."""
        return self._end > 0 or self._header is not None

    def progress(self) -> str:
        if self._header is not None:
            return f"{self._filled} of {self._body_len} bytes of the frame body"
        if self._head_len < 0:
            return f"{self._end} of {_PREFIX} bytes of the frame prefix"
        return f"{self._end - _PREFIX} of {self._head_len} bytes of the frame header"

    def poll(self, sock: socket.socket) -> tuple[framing.Header, bytearray]:
        """The next frame, read without waiting.

        Raises:
            BlockingIOError: the frame is not complete yet (what came is kept).
            framing.ChannelClosed: EOF.
            framing.ProtocolViolation: the frame breaks the format or a limit.
        """
        if self._header is None:
            self._read_head(sock)
        while self._filled < self._body_len:
            got = framing.recv_growing(sock, self._body, self._filled, self._body_len)
            if not got:
                raise framing.ChannelClosed(f"connection closed after {self.progress()}")
            self._filled += got
        header, body = self._header, self._body
        assert header is not None
        self._header, self._head_len, self._body, self._filled, self._body_len = None, -1, bytearray(), 0, 0
        return header, body

    def _read_head(self, sock: socket.socket) -> None:
        """Read until the prefix and header are here; take them and the body bytes that came with them."""
        while True:
            buf, end = self._buf, self._end
            if buf is not None:
                if self._head_len < 0 and end >= _PREFIX:
                    self._head_len, self._body_len = framing.parse_prefix(
                        memoryview(buf)[:_PREFIX], self._max_header, self._max_body
                    )
                want = _PREFIX + self._head_len
                if self._head_len >= 0 and end >= want:
                    with memoryview(buf) as view:
                        self._header = framing.decode_header(view[_PREFIX:want])
                        taken = min(end, want + self._body_len)
                        self._body = bytearray(view[want:taken])
                        self._filled = taken - want
                        rest = view[taken:end]
                        self._buf = bytearray(rest) if rest.nbytes else None  # the next frame's first bytes
                        self._end = rest.nbytes
                    return
            self._fill(sock)

    def _fill(self, sock: socket.socket) -> None:
        """One ``recv_into`` after what is buffered; the buffer grows by at most ``RECV_CHUNK`` past what came."""
        buf, end = self._buf, self._end
        if buf is None:
            buf = self._buf = bytearray(READ_AHEAD)
        elif end == len(buf):
            want = _PREFIX + self._head_len if self._head_len >= 0 else _PREFIX
            buf.extend(bytes(max(min(want - end, framing.RECV_CHUNK), READ_AHEAD)))
        with memoryview(buf) as view:
            got = sock.recv_into(view[end:])
        if not got:
            raise framing.ChannelClosed(f"connection closed after {self.progress()}")
        self._end = end + got


class _Queued:
    """A part of a queued frame: what is left of it to send, the descriptors its first byte carries, and what runs
    once the frame's last part is sent or dropped."""

    __slots__ = ("fds", "sent", "view")

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.fds: list[int] = []
        self.sent: Callable[[], None] | None = None

    def done(self) -> None:
        """Sent or dropped: let go of its bytes first (a mapping cannot close under a view), then run ``sent``."""
        self.view.release()
        sent, self.sent = self.sent, None
        if sent is not None:
            sent()


class Channel:
    """One open connection to an agent, with the host's frame limits.

    After ``AgentTimeoutError`` from ``recv`` the part of a frame that arrived is kept and the
    next ``recv`` goes on with it. A direction that failed otherwise (``ChannelLost``, a
    ``ProtocolError`` from ``recv``, a ``send`` cut off in the middle of a frame) is out of step,
    and every later call in that direction raises ``ChannelLost``; the other direction still
    works (a reply or ``goodbye`` may wait behind a broken pipe). After ``close`` both fail.
    """

    def __init__(self, sock: socket.socket, max_header: int, max_body: int) -> None:
        """Take over ``sock`` (a connected stream socket; it is made non-blocking).

        Args:
            sock: the connection; the channel owns and closes it.
            max_header: largest frame header accepted from the peer, in bytes.
            max_body: largest frame body accepted from the peer, in bytes.
        """
        sock.setblocking(False)
        self._sock = sock
        self._max_header = max_header
        self._max_body = max_body
        self._reader = _ReadAhead(max_header, max_body)
        self._send_broken: str | None = None
        self._recv_broken: str | None = None
        self._outbox: list[_Queued] = []  # queued frames (host-call answers), sent as the socket takes them
        self.carrying = 0
        """Queued frames that carry something until they are sent (``enqueue``'s ``sent``: a blob's mapping or
        descriptor)."""

    def send(
        self,
        header: framing.Message,
        body: FrameBody = b"",
        *,
        deadline: float | None,
    ) -> None:
        """Send one frame whose body is one buffer or several sent back to back (none is copied).

        Args:
            header: the JSON header; it must have a ``type``.
            body: raw bytes after the header.
            deadline: absolute ``time.monotonic()`` value by which the whole frame must be
                handed to the kernel; None waits for ever.

        Raises:
            AgentTimeoutError: the agent did not take the frame in time (it stopped reading).
            ChannelLost: the agent's end is closed, or the channel failed before.
            ProtocolError: the frame is over the protocol's limits (nothing was sent).
        """
        if self._send_broken is not None:
            raise ChannelLost(f"cannot send to the agent: {self._send_broken}")
        try:
            parts = framing.frame_parts(header, body)
        except framing.ProtocolViolation as exc:
            raise ProtocolError(f"refusing to send a {header.get('type')!r} frame: {exc}") from exc
        total = sum(memoryview(part).nbytes for part in parts)
        sent = 0
        try:
            for part in parts:
                with memoryview(part) as raw, raw.cast("B") as view:
                    offset = 0
                    while offset < len(view):
                        try:
                            count = self._sock.send(view[offset:], _SEND_FLAGS)
                        except BlockingIOError:
                            wait_for(
                                self._sock,
                                select.POLLOUT,
                                deadline,
                                functools.partial(self._sending, header, sent, total),
                            )
                            continue
                        offset += count
                        sent += count
        except TransportError as exc:
            if sent:
                self._send_broken = f"a frame was cut off after {sent} of {total} bytes ({exc})"
            raise
        except OSError as exc:
            self._send_broken = f"sending failed: {exc}"
            raise ChannelLost(f"sending to the agent failed: {exc}") from exc
        logger.debug("sent a %r frame of %d bytes", header.get("type"), total)

    def recv(self, *, deadline: float | None) -> tuple[framing.Header, bytearray]:
        """Receive one frame, all of it by ``deadline``.

        Args:
            deadline: absolute ``time.monotonic()`` value; None waits for ever. It is checked
                whenever the channel would wait, so bytes that have already arrived are read
                (and a complete frame returned) even after it.

        Returns:
            The header and the body (empty when the frame has none).

        Raises:
            AgentTimeoutError: no complete frame arrived in time; what did arrive is kept for the next call.
            ChannelLost: the agent's end closed, or the channel failed before.
            ProtocolError: the bytes were not a valid frame within the limits.
        """
        while True:
            frame = self.poll_recv()
            if frame is not None:
                return frame
            wait_for(self._sock, select.POLLIN, deadline, functools.partial(self._receiving, self._reader))

    def poll_recv(self) -> tuple[framing.Header, bytearray] | None:
        """Read what has arrived without waiting: a complete frame, or None (the part that came is kept).

        Raises:
            ChannelLost, ProtocolError: as ``recv``.
        """
        if self._recv_broken is not None:
            raise ChannelLost(f"cannot receive from the agent: {self._recv_broken}")
        try:
            header, body = self._reader.poll(self._sock)
        except BlockingIOError:
            return None
        except framing.ChannelClosed as exc:
            self._fail(ChannelLost(f"the agent closed the channel ({exc})"), exc)
        except framing.ProtocolViolation as exc:
            self._fail(ProtocolError(f"the agent sent an invalid frame: {exc}"), exc)
        except MemoryError as exc:  # a body within max_body that this host cannot hold
            self._fail(ProtocolError(f"the agent's frame does not fit in this controller's memory ({exc})"), exc)
        except OSError as exc:
            self._fail(ChannelLost(f"reading from the agent failed: {exc}"), exc)
        logger.debug("received a %r frame with a body of %d bytes", header.get("type"), len(body))
        return header, body

    @property
    def buffered(self) -> bool:
        """True when bytes of a next frame were read already: look here before waiting for the socket."""
        return self._reader.buffered

    def enqueue(
        self,
        header: framing.Message,
        body: framing.Body = b"",
        fds: Sequence[int] = (),
        *,
        sent: Callable[[], None] | None = None,
    ) -> None:
        """Queue a frame for ``flush``, so a caller that must keep reading never blocks on a write; ``fds`` go with
        its first byte (SCM_RIGHTS: a deferred value's blob). ``sent`` runs once the frame is sent or dropped (also
        when it cannot be queued): it closes what the frame carried, so nothing outlives its answer.

        Raises:
            ProtocolError: the frame is over the protocol's limits (nothing was queued).
        """
        try:
            parts = framing.frame_parts(header, body)
        except framing.ProtocolViolation as exc:
            if sent is not None:
                sent()
            raise ProtocolError(f"refusing to send a {header.get('type')!r} frame: {exc}") from exc
        queued = [_Queued(memoryview(part).cast("B")) for part in parts]
        queued[0].fds = list(fds)
        if sent is not None:
            self.carrying += 1
            queued[-1].sent = functools.partial(self._delivered, sent)
        self._outbox.extend(queued)

    def _delivered(self, sent: Callable[[], None]) -> None:
        self.carrying -= 1
        sent()

    @property
    def has_queued(self) -> bool:
        return bool(self._outbox)

    def flush(self, *, deadline: float | None = 0.0) -> None:
        """Send queued frames: as much as the socket takes now (deadline 0.0), or all of them by ``deadline``.

        Raises:
            AgentTimeoutError: a deadline other than 0.0 passed with frames still queued.
            ChannelLost: the agent's end is closed (the queue is dropped).
        """
        if self._send_broken is not None:
            self._drop_outbox()
            raise ChannelLost(f"cannot send to the agent: {self._send_broken}")
        while self._outbox:
            part = self._outbox[0]
            try:
                if not part.fds:
                    count = self._sock.send(part.view, _SEND_FLAGS)
                else:
                    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(part.fds)}i", *part.fds))]
                    count = self._sock.sendmsg([part.view], rights, _SEND_FLAGS)
            except BlockingIOError:
                if deadline == 0.0:
                    return
                wait_for(self._sock, select.POLLOUT, deadline, lambda: "the agent stopped reading host-call answers")
                continue
            except OSError as exc:
                self._send_broken = f"sending failed: {exc}"
                self._drop_outbox()
                raise ChannelLost(f"sending to the agent failed: {exc}") from exc
            part.fds = []  # they went with the first byte
            if count < len(part.view):
                part.view = part.view[count:]
                continue
            self._outbox.pop(0)
            part.done()

    def fileno(self) -> int:
        return self._sock.fileno()

    @property
    def limits(self) -> tuple[int, int]:
        """The largest header and body accepted from the peer (a data channel of one hop takes the same)."""
        return self._max_header, self._max_body

    def limit_body(self, max_body: int) -> None:
        """From the next frame on, accept bodies of at most ``max_body`` bytes (the relayed carrier's frames)."""
        self._max_body = self._reader._max_body = max_body

    def send_fds(self, header: framing.Message, fds: Sequence[int], *, deadline: float) -> None:
        """Send a frame without a body with ``fds`` attached (SCM_RIGHTS: one hop's ``data_channel``, a value file).

        Raises:
            AgentTimeoutError: the agent did not take the frame in time.
            ChannelLost: the agent's end is closed, or the channel failed before.
        """
        if self._send_broken is not None or self._outbox:
            raise ChannelLost(f"cannot send to the agent: {self._send_broken or 'answers are still queued'}")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AgentTimeoutError(f"no time left to send a {header.get('type')!r} frame")
        try:
            self._sock.settimeout(remaining)  # a control frame: the first write takes it whole unless the peer is stuck
            handover.send_with_fds(self._sock, header, fds)
        except TimeoutError as exc:
            self._send_broken = f"a {header.get('type')!r} frame may be cut off"
            raise AgentTimeoutError(f"the agent did not take a {header.get('type')!r} frame") from exc
        except OSError as exc:
            self._send_broken = f"sending failed: {exc}"
            raise ChannelLost(f"sending to the agent failed: {exc}") from exc
        finally:
            self._sock.setblocking(False)

    def has_pending(self) -> bool:
        """True when the agent sent something or hung up, without blocking (between calls it should be silent)."""
        if self._recv_broken is not None or self._reader.buffered:
            return True
        try:
            poller = select.poll()
            poller.register(self._sock, select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError):
            return True

    def peer_credentials(self) -> PeerCredentials | None:
        """The agent's pid, uid and gid as the kernel saw them at connect time; None where the OS does not tell."""
        return peer_credentials(self._sock)

    def close(self) -> None:
        """Close the connection (idempotent); later calls raise ``ChannelLost``."""
        self._send_broken = self._recv_broken = "the channel was closed"
        self._drop_outbox()
        with contextlib.suppress(OSError):
            self._sock.close()

    def _drop_outbox(self) -> None:
        """Forget the queued frames, closing what they would have carried."""
        dropped, self._outbox = self._outbox, []
        for part in dropped:
            part.done()

    def _fail(self, error: TransportError, cause: BaseException) -> NoReturn:
        self._recv_broken = str(error)
        self._reader = _ReadAhead(self._max_header, self._max_body)  # drop what was read
        raise error from cause

    @staticmethod
    def _receiving(reader: _ReadAhead) -> str:
        return f"the agent sent no complete frame (got {reader.progress()})"

    @staticmethod
    def _sending(header: framing.Message, sent: int, total: int) -> str:
        return f"the agent did not take a {header.get('type')!r} frame ({sent} of {total} bytes sent)"
