"""A session's activity file: whether a call is in progress and when the last one ran, for every process to see.

``sessions/<id>/activity`` beside the record. A call holds a *shared* ``flock`` on it for its
whole length, and sets the file's modification time when it ends (``futimens`` on an open
descriptor: microseconds, and no write of the record). Whoever acts on idle sessions
(prune, hibernate, the running-session cap) takes the *exclusive* lock without waiting: that
fails while any call runs, and while it is held no call can begin. So "busy" is exact, and idle
time is ``now - mtime`` to the second, for a session no controller holds as well.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from ..errors import CheckpointError, SessionBusy, SessionNotFound

ACTIVITY_FILE = "activity"
_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


def _open(path: Path) -> int:
    try:
        return os.open(path, _FLAGS, 0o600)
    except FileNotFoundError:
        raise SessionNotFound(f"no session at {path.parent}") from None
    except OSError as exc:
        raise CheckpointError(f"cannot open the activity file {path}: {exc}") from exc


def lock_within(fd: int, mode: int, seconds: float, busy: str) -> None:
    """``flock(fd, mode)``, trying without blocking for up to ``seconds`` (a process may hold it for ever).

    Raises:
        SessionBusy: with ``busy`` as the message, when the lock stayed taken.
    """
    try:
        for attempt in Retrying(
            retry=retry_if_exception_type(BlockingIOError),
            stop=stop_after_delay(seconds),
            wait=wait_fixed(0.005),
            reraise=True,
        ):
            with attempt:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SessionBusy(busy) from None


class Activity:
    """One session handle's side of the activity file: held shared during its calls."""

    def __init__(self, path: Path, *, wait: float) -> None:
        """Open (creating) the file; ``wait`` bounds how long a call waits for a prune or hibernate to finish.

        Raises:
            SessionNotFound: the session's directory is gone.
        """
        self.path = path
        self._wait = wait
        self._fd: int | None = _open(path)
        self._depth = 0
        self._closing = False

    def __enter__(self) -> Activity:
        """Mark a call (re-entrant; the caller serializes threads): busy for others until it ends.

        Raises:
            SessionBusy: another process held the exclusive lock (acting on the session) past ``wait``.
        """
        if self._fd is not None and self._depth == 0 and not _try_lock(self._fd, fcntl.LOCK_SH):
            lock_within(
                self._fd,
                fcntl.LOCK_SH,
                self._wait,
                f"session {self.path.parent.name} is being pruned or hibernated by another process "
                f"(it held the session for more than {self._wait:g} s)",
            )
        self._depth += 1
        return self

    def __exit__(self, *exc_info: object) -> None:
        """The call ended: it is the last use now (the file's mtime), and the session is free."""
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            with contextlib.suppress(OSError):  # the session may have been deleted meanwhile
                os.utime(self._fd)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            if self._closing:
                self.close()

    def close(self) -> None:
        """Close the file (inside a call: when the call ends, so the lock is released on this descriptor)."""
        if self._depth > 0:
            self._closing = True
        elif self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _try_lock(fd: int, mode: int) -> bool:
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def quiet(path: Path) -> Iterator[bool]:
    """Hold the session still if no call runs: yields True with the exclusive lock held, False if busy.

    A file this has to create (a session from before activity files) gets mtime 0: holding a
    session still is not using it, so ``last_active`` goes on falling back to the record.

    Raises:
        SessionNotFound: the session's directory is gone.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = _open(path)
        os.utime(fd, (0, 0))
    try:
        yield _try_lock(fd, fcntl.LOCK_EX)
    finally:
        os.close(fd)  # releases the lock


def is_busy(path: str | Path) -> bool:
    """Whether a call runs on the session now (a snapshot: it may start or end the next moment)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False  # no file: no handle ever called it since activity files exist
    try:
        return not _try_lock(fd, fcntl.LOCK_EX)
    finally:
        os.close(fd)


def last_active(path: str | Path, fallback: float) -> float:
    """When a call last ended (``fallback`` when no call left its time in the file)."""
    try:
        return os.stat(path).st_mtime or fallback
    except OSError:
        return fallback


def observe(path: str | Path, fallback: float) -> tuple[bool, float]:
    """``is_busy`` and ``last_active`` at once, through one descriptor (a listing does this for every session)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False, fallback  # no handle ever called it since activity files exist (a fork not used yet)
    except OSError:
        return False, last_active(path, fallback)
    try:
        active = os.fstat(fd).st_mtime or fallback
        return not _try_lock(fd, fcntl.LOCK_EX), active
    finally:
        os.close(fd)
