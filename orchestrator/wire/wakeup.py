"""A self-pipe: another thread makes a connection's ``poll`` return (answers ready, an interrupt asked for)."""

from __future__ import annotations

import contextlib
import os
import threading

from ..errors import TransportError


class Wakeup:
    """``fd`` turns readable after ``notify`` (from any thread) until ``drain``.

    After ``close``, ``notify`` does nothing: a late notifier never writes to a closed descriptor,
    or to one the process has reused for something else meanwhile.
    """

    def __init__(self) -> None:
        """A fresh pipe, not notified.

        Raises:
            TransportError: this host cannot make one now (out of descriptors): nothing was sent.
        """
        try:
            self.fd, self._write_fd = os.pipe()
        except OSError as exc:
            raise TransportError(f"this host cannot make a pipe for the call now: {exc}") from exc
        os.set_blocking(self.fd, False)
        os.set_blocking(self._write_fd, False)
        self._lock = threading.Lock()
        self._closed = False

    def notify(self) -> None:
        with self._lock, contextlib.suppress(BlockingIOError):  # a full pipe is readable already
            if not self._closed:
                os.write(self._write_fd, b"\0")

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.fd, 4096):
                pass

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self.fd)
                os.close(self._write_fd)
