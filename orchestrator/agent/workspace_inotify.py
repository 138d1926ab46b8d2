"""The workspace's change feed: a Linux inotify descriptor through ctypes, a watch per directory.

The worker is standard library plus dill, so inotify is reached through libc with ``ctypes``.
Watches are added through ``/proc/self/fd/<n>`` of a directory the caller opened without
following links, so the watch is on exactly that directory, whatever the cell renames
meanwhile. The cell runs as the same user in the same process: it can close or ``dup2`` over
any descriptor, so before each read the descriptor is checked to still be the one made here
(``intact``); when it is not, the caller stops trusting events and scans (docs/design/workspace.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import struct
from typing import Any, List, Optional, Tuple

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_CLOSE_WRITE = 0x8
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_UNMOUNT = 0x2000
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000

WATCHED = (
    IN_CREATE | IN_DELETE | IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO
    | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
)  # fmt: skip
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of NUL-padded name
_READ_BYTES = 1 << 16
_MAX_READS = 64  # 4 MiB of events, well past the default queue of 16,384
_PROC_FD = "/proc/self/fd/"

Event = Tuple[int, int, bytes]  # (watch descriptor, mask, name: b"" for the watched directory itself)


def parse_events(data: bytes) -> List[Event]:
    """The events in what one ``read`` of an inotify descriptor returned."""
    events = []
    offset = 0
    while offset + _EVENT.size <= len(data):
        wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
        offset += _EVENT.size
        events.append((wd, mask, data[offset : offset + length].rstrip(b"\0")))
        offset += length
    return events


_libc: Any = None


def _load_libc() -> Any:
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        _libc = libc
    return _libc


class WatchFailed(Exception):
    """A directory could not be watched (``max_user_watches``, or inotify refused it): scan instead."""


class Inotify:
    """One inotify instance: its descriptor and a duplicate kept to prove the descriptor is still ours."""

    def __init__(self, fd: int, twin: int) -> None:
        self.fd = fd
        self.twin = twin  # a dup: the same open file description while nobody replaced ``fd``
        self._via_proc = os.path.isdir(_PROC_FD)

    @classmethod
    def open(cls) -> Optional["Inotify"]:
        """A new instance, or None where the runtime has no inotify (or libc cannot be loaded)."""
        try:
            libc = _load_libc()
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except (OSError, AttributeError):
            return None
        if fd < 0:
            return None
        return cls(fd, os.dup(fd))

    def add(self, dir_fd: int, path: bytes) -> int:
        """Watch the directory open as ``dir_fd`` (``path``, absolute, where /proc is missing); its watch descriptor.

        Raises:
            WatchFailed: inotify refused it.
        """
        if self._via_proc:
            target, mask = (_PROC_FD + str(dir_fd)).encode(), WATCHED
        else:
            target, mask = path, WATCHED | IN_DONT_FOLLOW
        wd = _load_libc().inotify_add_watch(self.fd, target, mask)
        if wd < 0:
            raise WatchFailed(os.strerror(ctypes.get_errno()))
        return int(wd)

    def remove(self, wd: int) -> None:
        _load_libc().inotify_rm_watch(self.fd, wd)

    def intact(self) -> bool:
        """True while ``fd`` is still the inotify descriptor made here (nobody closed it or put another file there).

        ``fd`` and its twin share one open file description, so clearing O_NONBLOCK through one
        shows through the other; a descriptor the cell put in its place does not share it.
        """
        try:
            if self._via_proc and not self._is_inotify(self.fd):
                return False
            was_blocking = os.get_blocking(self.fd)
            os.set_blocking(self.fd, not was_blocking)
            try:
                return os.get_blocking(self.twin) != was_blocking
            finally:
                os.set_blocking(self.fd, was_blocking)
        except OSError:
            return False

    def read(self) -> List[Event]:
        """The events pending now, without waiting (call ``intact`` first).

        A cell that keeps making events as fast as they are read gets an overflow after
        ``_MAX_READS`` reads: the caller scans instead of chasing them.
        """
        events: List[Event] = []
        for _ in range(_MAX_READS):
            try:
                data = os.read(self.fd, _READ_BYTES)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    return events
                raise
            if not data:
                return events
            events.extend(parse_events(data))
        events.append((-1, IN_Q_OVERFLOW, b""))
        return events

    def close(self) -> None:
        """Close what is still ours: a descriptor the cell reused is left alone (at worst ours leaks)."""
        intact = self.intact()
        for fd in (self.fd, self.twin):
            if intact or (fd == self.twin and self._is_inotify(fd)):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _is_inotify(self, fd: int) -> bool:
        try:
            return self._via_proc and os.readlink(_PROC_FD + str(fd)) == "anon_inode:inotify"
        except OSError:
            return False
