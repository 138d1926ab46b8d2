"""A self-pipe: another thread makes a connection's ``poll`` return (answers ready, an interrupt asked for)."""

from __future__ import annotations

import contextlib
import os


class Wakeup:
    """``fd`` turns readable after ``notify`` (from any thread) until ``drain``; ``close`` once, when done."""

    def __init__(self) -> None:
        self.fd, self._write_fd = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._write_fd, False)

    def notify(self) -> None:
        with contextlib.suppress(BlockingIOError):  # a full pipe is readable already
            os.write(self._write_fd, b"\0")

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.fd, 4096):
                pass

    def close(self) -> None:
        os.close(self.fd)
        os.close(self._write_fd)
