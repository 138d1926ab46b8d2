"""Frames on a stream socket: reading them with limits, and moving their bodies from one socket to another.

The supervisor never holds a body whole: request bodies (restore blobs, set_value payloads) go from
the controller to the worker, and reply bodies (checkpoint blobs) from the worker to the
controller, through a pipe with ``os.splice`` (Linux, Python >= 3.10: the bytes never enter
this process, which leaves more of the sandbox's CPU to the worker), else in chunks of at most
``CHUNK_BYTES``. Frame heads are relayed as they came, not decoded and encoded again, and each
read takes up to ``READ_AHEAD`` bytes, so a small frame (prefix, header and body) costs one
``recv``. See docs/protocol.md.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import time
from typing import Any, Dict, Optional, Tuple, Union

from . import framing

CHUNK_BYTES = 1 << 20
READ_AHEAD = 64 << 10  # one read from a socket takes up to this much: a small frame and whatever came after it
PIPE_BYTES = 1 << 20  # the splice pipe's capacity (fs.pipe-max-size allows 1 MiB to anyone by default)
SPLICE_MIN_BYTES = 64 << 10  # a body smaller than this is copied: a splice saves nothing on it
PEEK_NOW = int(socket.MSG_PEEK | socket.MSG_DONTWAIT)  # an int: or-ing the enum members costs a microsecond a call
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)


class Inbox(object):
    """Frames from one stream socket, read up to READ_AHEAD bytes at a time.

    A small frame's prefix, header and body usually arrive in one ``recv``. Bytes read past
    the frame stay here for the next one, so whoever waits for the socket to become readable
    must look here first (``buffered``). Bodies are read from here first, then from the socket.
    """

    __slots__ = ("buf", "end", "mark", "sock", "start", "view")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray(READ_AHEAD)
        self.view = memoryview(self.buf)
        self.start = 0  # the bytes read and not taken yet are buf[start:end]
        self.end = 0
        self.mark = 0  # where the last frame began (``head``)

    def buffered(self) -> int:
        return self.end - self.start

    def peek(self) -> bytes:
        """The first byte read and not taken yet (b"" when there is none)."""
        return bytes(self.view[self.start : self.start + 1]) if self.end > self.start else b""

    def head(self, max_header: int, max_body: int, timeout: float) -> Tuple[Dict[str, Any], int, int]:
        """The next frame's header, body length and head size (prefix and header), all within about ``timeout``.

        The body is not read. ``raw()`` gives the frame's head as it came until the next ``head``.

        Raises:
            socket.timeout: ``timeout`` passed (or one read ran past the socket's own limit) first.
            ChannelClosed: EOF before the header was complete.
            ProtocolViolation: the prefix or the header breaks the format or a limit.
        """
        header, body_len, size = self.raw_head(max_header, max_body, timeout)
        return framing.decode_header(header), body_len, size

    def raw_head(self, max_header: int, max_body: int, timeout: float) -> Tuple[memoryview, int, int]:
        """As ``head``, with the header's bytes as they came (not decoded: the caller checks them), valid until the
        next ``head``; the prefix's limits are checked."""
        if self.start == self.end:
            self.start = self.end = 0
            if len(self.buf) > READ_AHEAD:  # a big header came last time: let it go
                self._replace(READ_AHEAD)
        prefix_size = framing.PREFIX.size
        want = prefix_size
        head_len = body_len = -1
        deadline = -1.0
        while True:
            have = self.end - self.start
            if head_len < 0 and have >= prefix_size:
                head_len, body_len = framing.parse_prefix(
                    self.view[self.start : self.start + prefix_size], max_header, max_body
                )
                want = prefix_size + head_len
            if head_len >= 0 and have >= want:
                header = self.view[self.start + prefix_size : self.start + want]
                self.mark = self.start
                self.start += want
                return header, body_len, want
            if deadline < 0:
                deadline = time.monotonic() + timeout
            elif time.monotonic() > deadline:
                raise socket.timeout("timed out after %s" % self._progress(head_len, want))
            if self.end == len(self.buf):  # full: a new buffer, as big as the head needs, grown with what arrived
                self._replace(max(READ_AHEAD, min(want, have + framing.RECV_CHUNK)))
            try:
                got = self.sock.recv_into(self.view[self.end :])
            except BlockingIOError:  # the socket's own limit (limit_each_io)
                raise socket.timeout("timed out after %s" % self._progress(head_len, want)) from None
            if not got:
                raise framing.ChannelClosed("connection closed after %s" % self._progress(head_len, want))
            self.end += got

    def _progress(self, head_len: int, want: int) -> str:
        have = self.end - self.start
        if head_len < 0:
            return "%d of %d bytes of the frame prefix" % (have, want)
        return "%d of %d bytes of the frame header" % (have - framing.PREFIX.size, head_len)

    def _replace(self, size: int) -> None:
        """Move the bytes not taken yet to the front of a new buffer (views of the old one stay valid)."""
        have = self.end - self.start
        buf = bytearray(size)
        buf[:have] = self.view[self.start : self.end]
        self.buf, self.view, self.start, self.end = buf, memoryview(buf), 0, have

    def take(self, size: int) -> memoryview:
        """Up to ``size`` bytes that were read already (no read); valid until the next ``head``."""
        count = min(size, self.end - self.start)
        self.start += count
        return self.view[self.start - count : self.start]

    def raw(self) -> memoryview:
        """The last frame as it came, from its prefix up to what was taken since (valid until the next ``head``)."""
        return self.view[self.mark : self.start]

    def read_exactly(self, size: int) -> bytearray:
        """``size`` bytes: those read already, then from the socket; ChannelClosed on EOF before that."""
        body = bytearray(self.take(size))
        if len(body) < size:
            body += framing.recv_exactly(self.sock, size - len(body))
        return body


class Copier(object):
    """Moves a body between sockets through one buffer of this process: a read, then a write of what it got."""

    def __init__(self, size: int) -> None:
        self.view = memoryview(bytearray(min(size, CHUNK_BYTES)))

    def fill(self, src: socket.socket, size: int) -> int:
        """One read of at most ``size`` bytes from ``src`` (0 at EOF)."""
        return src.recv_into(self.view[: min(size, CHUNK_BYTES)])

    def drain(self, dst: socket.socket, count: int) -> None:
        """Write the ``count`` bytes the last ``fill`` got to ``dst``."""
        dst.sendall(self.view[:count])


class SplicePipe(object):
    """Moves a body between sockets through a kernel pipe with ``os.splice``: no copy into this process.

    The same interface as Copier, and the same errors: the sockets' own time limits apply to
    ``os.splice`` as to ``recv`` and ``send``. The pipe is empty between a ``drain`` and the next
    ``fill``; a ``drain`` that fails leaves bytes in it, so it closes the pipe (``closed``).
    """

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        self.closed = False
        try:
            with contextlib.suppress(OSError):  # beyond fs.pipe-max-size or the user's pipe quota: the size it has
                fcntl.fcntl(self.w, _F_SETPIPE_SZ, PIPE_BYTES)
            self.size = fcntl.fcntl(self.w, _F_GETPIPE_SZ)
        except BaseException:
            self.close()
            raise

    def fill(self, src: socket.socket, size: int) -> int:
        return os.splice(src.fileno(), self.w, min(size, self.size))

    def drain(self, dst: socket.socket, count: int) -> None:
        try:
            while count:
                moved = os.splice(self.r, dst.fileno(), count)
                if not moved:
                    raise OSError(errno.EIO, "the splice into the socket moved nothing")
                count -= moved
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.r)
            os.close(self.w)


def open_splice_pipe() -> Optional[SplicePipe]:
    """A splice pipe, if this Python and kernel can splice between Unix sockets (tried once on a socket pair)."""
    if not hasattr(os, "splice"):  # Python < 3.10
        return None
    try:
        pipe = SplicePipe()
    except OSError:
        return None
    works = False
    try:
        a, b = socket.socketpair()
        try:
            a.sendall(b"?")
            works = pipe.fill(b, 1) == 1
            pipe.drain(b, 1)
            works = works and a.recv(1) == b"?"
        finally:
            a.close()
            b.close()
    except OSError:
        works = False
    if not works:
        pipe.close()
        return None
    return pipe


class Movers(object):
    """Chooses what moves each body: the splice pipe where it works (made on first use, again after one closed
    itself), a copy through this process otherwise."""

    def __init__(self) -> None:
        self.pipe: Optional[SplicePipe] = None  # the splice pipe, made on first use
        self.can_splice = True  # until a pipe could not be made

    def mover(self, size: int) -> Union[SplicePipe, Copier]:
        """What moves a body of ``size`` bytes from one socket to the other: the splice pipe where it works."""
        if size >= SPLICE_MIN_BYTES and self.can_splice:
            if self.pipe is None or self.pipe.closed:
                self.pipe = open_splice_pipe()
                self.can_splice = self.pipe is not None
            if self.pipe is not None:
                return self.pipe
        return Copier(size)
