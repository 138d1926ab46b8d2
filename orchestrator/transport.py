"""One open connection to an agent: frames sent and received against absolute deadlines.

A ``Channel`` wraps a connected stream socket in non-blocking mode and waits with
``select.poll`` (no ``FD_SETSIZE`` limit), so one deadline covers a whole frame: a peer that
trickles bytes or is stopped cannot stretch a call. Receive buffers grow with what arrives,
never with what a prefix declares, and large bodies are sent from memoryviews, never copied.
A read for a frame's prefix and header takes up to ``READ_AHEAD`` bytes, so a small frame
costs one ``recv``; what came past that frame waits in the channel for the next one.
Foreign errors (OSError, bad frames) are translated here into the ``TransportError`` family.
How the controller gets such a socket is ``orchestrator/endpoint.py``'s job.
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

from .agent import protocol
from .errors import AgentTimeoutError, ChannelLost, ProtocolError, TransportError

logger = logging.getLogger(__name__)

_SEND_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)  # EPIPE as an error, even where SIGPIPE is not ignored
READ_AHEAD = 4 << 10  # what one read for a frame's prefix and header may take: a small frame whole (one page a channel)
_PREFIX = protocol.PREFIX.size
_ZEROS = bytes(protocol.RECV_CHUNK)
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


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
        # Bytes read and not part of a frame yet are self._buf[self._start:self._end]. The frame in progress:
        # its header length once its prefix is in (else -1), its header once that is in, then its body, of
        # which _filled bytes arrived (read straight into it past what came with the header).
        self._buf = bytearray(READ_AHEAD)
        self._view = memoryview(self._buf)
        self._start = self._end = 0
        self._head_len = -1
        self._body_len = 0
        self._header: protocol.Header | None = None
        self._body = bytearray()
        self._filled = 0
        self._send_broken: str | None = None
        self._recv_broken: str | None = None
        self._outbox: list[memoryview] = []  # queued frames (host-call answers), sent as the socket takes them

    def send(
        self,
        header: protocol.Header,
        body: protocol.Body | Sequence[protocol.Body] = b"",
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
            parts = protocol.frame_parts(header, body)
        except protocol.ProtocolViolation as exc:
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

    def recv(self, *, deadline: float | None) -> tuple[protocol.Header, bytearray]:
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
            wait_for(self._sock, select.POLLIN, deadline, self._receiving)

    def poll_recv(self) -> tuple[protocol.Header, bytearray] | None:
        """Read what has arrived without waiting: a complete frame, or None (the part that came is kept).

        Raises:
            ChannelLost, ProtocolError: as ``recv``.
        """
        if self._recv_broken is not None:
            raise ChannelLost(f"cannot receive from the agent: {self._recv_broken}")
        try:
            header, body = self._read_frame()
        except BlockingIOError:
            return None
        except protocol.ChannelClosed as exc:
            self._fail(ChannelLost(f"the agent closed the channel ({exc})"), exc)
        except protocol.ProtocolViolation as exc:
            self._fail(ProtocolError(f"the agent sent an invalid frame: {exc}"), exc)
        except MemoryError as exc:  # a body within max_body that this host cannot hold
            self._fail(ProtocolError(f"the agent's frame does not fit in this controller's memory ({exc})"), exc)
        except OSError as exc:
            self._fail(ChannelLost(f"reading from the agent failed: {exc}"), exc)
        logger.debug("received a %r frame with a body of %d bytes", header.get("type"), len(body))
        return header, body

    @property
    def has_buffered(self) -> bool:
        """True when bytes already read from the socket wait here: ``poll_recv`` may complete a frame without
        the socket becoming readable first."""
        return self._end > self._start

    def _read_frame(self) -> tuple[protocol.Header, bytearray]:
        """Read until the frame in progress is complete; BlockingIOError when the socket has nothing more now.

        Lengths are checked before the header or the body is read, and buffers grow with what arrives.
        """
        while self._header is None:
            have = self._end - self._start
            if self._head_len < 0 and have >= _PREFIX:
                prefix = self._view[self._start : self._start + _PREFIX]
                self._head_len, self._body_len = protocol.parse_prefix(prefix, self._max_header, self._max_body)
            if self._head_len >= 0 and have >= _PREFIX + self._head_len:
                begin = self._start + _PREFIX
                self._header = protocol.decode_header(self._view[begin : begin + self._head_len])
                self._start = begin + self._head_len
                came = min(self._body_len, self._end - self._start)  # the body bytes that came with the header
                self._body = bytearray(self._view[self._start : self._start + came])
                self._filled = came
                self._start += came
                break
            self._fill()
        body = self._body
        while self._filled < self._body_len:
            if self._filled == len(body):
                body.extend(memoryview(_ZEROS)[: min(self._body_len - self._filled, protocol.RECV_CHUNK)])
            with memoryview(body) as view, view[self._filled :] as tail:
                got = self._sock.recv_into(tail)
            if not got:
                raise protocol.ChannelClosed(f"connection closed after {self._progress()}")
            self._filled += got
        header = self._header
        self._header, self._head_len, self._body = None, -1, bytearray()
        return header, body

    def _fill(self) -> None:
        """One read toward the frame's prefix and header, of as much as the buffer has room for."""
        have = self._end - self._start
        if not have:
            self._start = self._end = 0
            if len(self._buf) > READ_AHEAD:  # a big header came last time: let it go
                self._renew(READ_AHEAD)
        elif self._end == len(self._buf):  # full: a new buffer, as big as the header needs, grown with what came
            want = _PREFIX + max(self._head_len, 0)
            self._renew(max(READ_AHEAD, min(want, have + protocol.RECV_CHUNK)))
        got = self._sock.recv_into(self._view[self._end :])
        if not got:
            raise protocol.ChannelClosed(f"connection closed after {self._progress()}")
        self._end += got

    def _renew(self, size: int) -> None:
        have = self._end - self._start
        buf = bytearray(size)
        buf[:have] = self._view[self._start : self._end]
        self._buf, self._view, self._start, self._end = buf, memoryview(buf), 0, have

    def _progress(self) -> str:
        """Where the frame in progress stands, for error messages."""
        if self._header is not None:
            return f"{self._filled} of {self._body_len} bytes of the frame body"
        have = self._end - self._start
        if self._head_len < 0:
            return f"{have} of {_PREFIX} bytes of the frame prefix"
        return f"{have - _PREFIX} of {self._head_len} bytes of the frame header"

    def enqueue(self, header: protocol.Header, body: protocol.Body = b"") -> None:
        """Queue a frame for ``flush``, so a caller that must keep reading never blocks on a write.

        Raises:
            ProtocolError: the frame is over the protocol's limits (nothing was queued).
        """
        try:
            parts = protocol.frame_parts(header, body)
        except protocol.ProtocolViolation as exc:
            raise ProtocolError(f"refusing to send a {header.get('type')!r} frame: {exc}") from exc
        self._outbox.extend(memoryview(part).cast("B") for part in parts)

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
            self._outbox.clear()
            raise ChannelLost(f"cannot send to the agent: {self._send_broken}")
        while self._outbox:
            view = self._outbox[0]
            try:
                count = self._sock.send(view, _SEND_FLAGS)
            except BlockingIOError:
                if deadline == 0.0:
                    return
                wait_for(self._sock, select.POLLOUT, deadline, lambda: "the agent stopped reading host-call answers")
                continue
            except OSError as exc:
                self._send_broken = f"sending failed: {exc}"
                self._outbox.clear()
                raise ChannelLost(f"sending to the agent failed: {exc}") from exc
            if count == len(view):
                self._outbox.pop(0)
            else:
                self._outbox[0] = view[count:]

    def fileno(self) -> int:
        return self._sock.fileno()

    def has_pending(self) -> bool:
        """True when the agent sent something or hung up, without blocking (between calls it should be silent)."""
        if self._recv_broken is not None or self._end > self._start or self._head_len >= 0:
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
        with contextlib.suppress(OSError):
            self._sock.close()

    def _fail(self, error: TransportError, cause: BaseException) -> NoReturn:
        self._recv_broken = str(error)
        raise error from cause

    def _receiving(self) -> str:
        return f"the agent sent no complete frame (got {self._progress()})"

    @staticmethod
    def _sending(header: protocol.Header, sent: int, total: int) -> str:
        return f"the agent did not take a {header.get('type')!r} frame ({sent} of {total} bytes sent)"
