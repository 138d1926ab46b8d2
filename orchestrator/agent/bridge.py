"""Bytes both ways between a TLS connection and a plain socket, both non-blocking, moved as readiness allows.

The node relay bridges a controller's TLS connection to an agent's Unix socket with this, and
the controller bridges the relay's TLS connection to its channel's socket pair: the same code
on both ends. The owner's event loop watches what ``interest`` asks for and calls ``pump`` with
what it saw; ``pump`` moves whatever can move without waiting. One thread uses a bridge (an SSL
object must never be read and written from two threads at once). Each direction holds at most
``CHUNK`` bytes and reads its source again only once they are delivered: that is the
backpressure. When one side ends, what it sent still goes to the other, then both close; a
peer that does not take it within ``CLOSE_SECONDS`` is cut off.

Standard library only, Python 3.9+: the relay runs this inside the sandbox image.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import ssl
import time
from typing import Callable, Dict, Optional

READ = selectors.EVENT_READ
WRITE = selectors.EVENT_WRITE
CHUNK = 256 << 10
CLOSE_SECONDS = 10.0


class _PlainGone(Exception):
    """The plain side was reset: nothing more can move either way."""


class Bridge:
    """One TLS connection and one plain socket, and the bytes on their way between them.

    Attributes:
        to_tls: bytes delivered from the plain socket to the TLS connection so far.
        to_plain: bytes delivered the other way.
        ends_by: once one side ended, the ``clock()`` time by which the other must have taken the rest.
    """

    def __init__(
        self,
        tls: ssl.SSLSocket,
        plain: socket.socket,
        *,
        early: bytes = b"",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Take over both sockets (made non-blocking; ``close`` closes them).

        Args:
            tls: a connected TLS socket whose handshake is done; bytes SSL holds already are read first.
            plain: a connected stream socket.
            early: what the TLS side sent before the bridge began: it goes to the plain side first.
        """
        tls.setblocking(False)
        plain.setblocking(False)
        self.tls = tls
        self.plain = plain
        self.tls_fd = tls.fileno()
        self.plain_fd = plain.fileno()
        self.up: Optional[memoryview] = None  # plain -> tls
        self.down: Optional[memoryview] = memoryview(early) if early else None  # tls -> plain
        self.plain_ended = False
        self.tls_ended = False
        self.to_tls = 0
        self.to_plain = 0
        self.ends_by: Optional[float] = None
        self._clock = clock
        # What each operation waits for, and whether it may be tried now: True until it would block.
        self._plain_readable = True
        self._plain_writable = True
        self._tls_readable = True
        self._tls_writable = True
        self._recv_wants = READ  # SSL_read may need the socket writable (and SSL_write readable) mid-handshake
        self._send_wants = WRITE

    def pump(self, plain_events: int = 0, tls_events: int = 0) -> bool:
        """Move what can move now, given the events the owner's loop saw on each socket.

        Returns:
            False once the bridge is finished: both sides ended (or one failed), or the other side
            did not take what remained by ``ends_by``; the owner then stops watching and calls ``close``.
        """
        if plain_events & READ:
            self._plain_readable = True
        if plain_events & WRITE:
            self._plain_writable = True
        if tls_events & self._recv_wants:
            self._tls_readable = True
        if tls_events & self._send_wants:
            self._tls_writable = True
        try:
            moved = True
            while moved:  # each direction in turn, until neither moves
                moved = self._plain_to_up()
                moved = self._up_to_tls() or moved
                moved = self._tls_to_down() or moved
                moved = self._down_to_plain() or moved
        except _PlainGone:
            return False  # reset: nothing more can be delivered to it either
        if (self.plain_ended and self.up is None) or (self.tls_ended and self.down is None):
            return False
        if self.plain_ended or self.tls_ended:
            if self.ends_by is None:
                self.ends_by = self._clock() + CLOSE_SECONDS
            elif self._clock() >= self.ends_by:
                return False
        return True

    def _plain_to_up(self) -> bool:
        """Read a chunk from the plain side when the one before it went up; whether one came."""
        if self.up is not None or not self._plain_readable or self.plain_ended:
            return False
        try:
            data = self.plain.recv(CHUNK)
        except (BlockingIOError, InterruptedError):
            self._plain_readable = False
            return False
        except OSError:
            raise _PlainGone from None
        if not data:
            self.plain_ended = True
            return False
        self.up = memoryview(data)
        if len(data) < CHUNK:
            self._plain_readable = False  # drained (level-triggered: the loop says if more came)
        return True

    def _up_to_tls(self) -> bool:
        """Send what the plain side gave to the TLS side; whether any went."""
        if self.up is None or not self._tls_writable:
            return False
        try:
            sent = self.tls.send(self.up)
        except ssl.SSLWantWriteError:
            self._tls_writable, self._send_wants = False, WRITE
        except ssl.SSLWantReadError:
            self._tls_writable, self._send_wants = False, READ
        except OSError:
            self.up, self.tls_ended = None, True
        else:
            self.to_tls += sent
            self.up = self.up[sent:] if sent < len(self.up) else None
            return True
        return False

    def _tls_to_down(self) -> bool:
        """Read what the TLS side has, up to a chunk, when the one before it went down; whether any came."""
        if self.down is not None or not self._tls_readable or self.tls_ended:
            return False
        received = bytearray()
        try:
            while len(received) < CHUNK:  # SSL hands out one record per call: gather what it has
                data = self.tls.recv(CHUNK - len(received))
                if not data:
                    self.tls_ended = True
                    break
                received += data
        except ssl.SSLWantReadError:
            self._tls_readable, self._recv_wants = False, READ
        except ssl.SSLWantWriteError:
            self._tls_readable, self._recv_wants = False, WRITE
        except OSError:  # a reset, or EOF without close_notify: that side is gone
            self.tls_ended = True
        if not received:
            return False
        self.down = memoryview(received)
        return True

    def _down_to_plain(self) -> bool:
        """Send what the TLS side gave to the plain side; whether any went."""
        if self.down is None or not self._plain_writable:
            return False
        try:
            sent = self.plain.send(self.down)
        except (BlockingIOError, InterruptedError):
            self._plain_writable = False
            return False
        except OSError:
            raise _PlainGone from None
        self.to_plain += sent
        if sent < len(self.down):
            self.down, self._plain_writable = self.down[sent:], False
        else:
            self.down = None
        return True

    def interest(self) -> Dict[int, int]:
        """File descriptor -> the events (READ, WRITE) ``pump`` waits for on it; 0 for none."""
        plain = 0
        if self.up is None and not self.plain_ended:
            plain |= READ
        if self.down is not None:
            plain |= WRITE
        tls = 0
        if self.up is not None:
            tls |= self._send_wants
        if self.down is None and not self.tls_ended:
            tls |= self._recv_wants
        return {self.tls_fd: tls, self.plain_fd: plain}

    def close(self) -> None:
        """Close both sockets (idempotent); the TLS side says close_notify if its socket takes it now."""
        with contextlib.suppress(OSError, ValueError):
            self.tls.unwrap()
        for sock in (self.tls, self.plain):
            with contextlib.suppress(OSError):
                sock.close()
