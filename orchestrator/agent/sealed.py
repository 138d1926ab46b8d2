"""A sealed in-memory copy of a file: what a worker is handed instead of a stored blob's own file.

A descriptor of a stored file pins its inode: a process that keeps it (one that left the worker's
process group) keeps a blob the host deleted allocated on disk, and ``fstat`` and ``readlink`` through it
show the file's link count (how many forks share the blob) and its path. A copy in a memfd is none of
that: its pages go when its last descriptor and mapping do, it has no path (``/memfd:blob (deleted)``)
and no link (``st_nlink`` 0). Sealed against writing, growing and shrinking (and against new or removed
seals), nobody can change it, its owner included; its mode 0400 and the read-only reopen keep another
uid from even reopening it for writing, and read-only shared mappings of it work on every kernel.

Used by the controller (a deferred value's blob, a value file). Standard library only, Python 3.8+
(``os.memfd_create``, ``fcntl.F_ADD_SEALS``), Linux.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from typing import Optional

_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
_SENDFILE_CHUNK = 1 << 30


def sealed_copy_of(path: str) -> Optional[int]:
    """``sealed_copy`` of the regular file at ``path`` (a symbolic link is not followed); None for any other kind.

    Raises:
        OSError: it cannot be opened or copied.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        return sealed_copy(fd) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    finally:
        os.close(fd)


def sealed_copy(fd: int) -> int:
    """A read-only descriptor (close-on-exec) of a sealed memfd that holds what the regular file behind ``fd`` holds,
    whole, copied by the kernel (``sendfile``); ``fd`` stays the caller's, its offset untouched.

    Raises:
        OSError: no memory for the copy, the file shrank while it was copied, or no memfd (or sealing) here.
    """
    size = os.fstat(fd).st_size
    memfd = os.memfd_create("blob", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        copied = 0
        while copied < size:
            sent = os.sendfile(memfd, fd, copied, min(size - copied, _SENDFILE_CHUNK))
            if not sent:
                raise OSError(errno.EIO, "the file shrank from %d to %d bytes while it was copied" % (size, copied))
            copied += sent
        fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, _SEALS)
        os.fchmod(memfd, 0o400)
        return os.open("/proc/self/fd/%d" % memfd, os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(memfd)
