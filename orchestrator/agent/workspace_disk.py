"""The workspace on disk, touched without ever following a link: paths, directories, race-safe reads, writes.

The cell runs as the owner of every file and may race the worker (swap a file for a link to
``/etc/shadow``, grow a file, rename a directory): every name is opened relative to its
directory's descriptor with ``O_NOFOLLOW``, a file is read between two ``fstat`` calls that must
agree, and nothing here resolves a path from the root in one go (docs/design/workspace.md).

Record paths are ``str``: the name's bytes decoded as UTF-8 with ``surrogateescape``, so a name
that is not UTF-8 survives the round trip whatever the locale.
"""

from __future__ import annotations

import codecs
import errno
import os
import stat
import sys
from typing import Callable, Dict, List, Optional, Tuple, Union

from .workspace_paths import MAX_PATH_BYTES

MAX_LINK_BYTES = 4096
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_FS_UTF8 = (
    codecs.lookup(sys.getfilesystemencoding()).name == "utf-8" and sys.getfilesystemencodeerrors() == "surrogateescape"
)
_TEMP_PREFIX = b".orch-restore-"
_MAX_OPEN = 64  # directory descriptors DirFds keeps open at once
_GONE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)  # not there, or not a directory (a link is never followed)

Content = Union[bytes, bytearray, memoryview]


class Unsaved(Exception):
    """This entry cannot be saved now; the message is the reason ``unsaved`` gives."""


class Raced(Exception):
    """The entry changed between looking at it and reading it: look again."""


def os_name(path: str) -> bytes:
    """A record path's bytes, as the kernel knows them."""
    return path.encode("utf-8", "surrogateescape")


def record_name(name: Union[str, bytes]) -> str:
    """A name as the kernel gave it (bytes, or ``str`` from ``os.scandir``) as record text."""
    if isinstance(name, bytes):
        return name.decode("utf-8", "surrogateescape")
    return name if _FS_UTF8 else os.fsencode(name).decode("utf-8", "surrogateescape")


def record_path(parent: str, name: str) -> str:
    return parent + "/" + name if parent else name


def split(path: str) -> Tuple[str, bytes]:
    """(parent record path, last name as bytes)."""
    parent, _, name = path.rpartition("/")
    return parent, os_name(name)


def kind_of(mode: int) -> Optional[str]:
    """The record's kind for a file type ("f", "d", "l"), or None for one that cannot be saved."""
    if stat.S_ISREG(mode):
        return "f"
    if stat.S_ISDIR(mode):
        return "d"
    if stat.S_ISLNK(mode):
        return "l"
    return None


def special_reason(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO cannot be saved"
    if stat.S_ISSOCK(mode):
        return "a socket cannot be saved"
    return "a device cannot be saved"


def stat_key(st: os.stat_result) -> Tuple[int, int, int, int, int]:
    """What must stay the same for an entry to be unchanged: type and mode, inode, size, mtime, ctime."""
    return (st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class DirFds:
    """Directory descriptors by record path, each opened relative to its parent's, never through a link."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._fds: Dict[str, int] = {}

    def get(self, path: str) -> Optional[int]:
        """The open directory at ``path`` ("" is the root); None when it is gone or not a directory.

        Valid until the next ``get``: past ``_MAX_OPEN`` descriptors all are closed and reopened as needed.
        """
        fd = self._fds.get(path)
        if fd is not None:
            return fd
        if len(self._fds) >= _MAX_OPEN:
            self.close()
        return self._open(path)

    def _open(self, path: str) -> Optional[int]:
        """Open ``path`` from its nearest open ancestor down, one level at a time (a path may be 2,000 deep).

        Raises:
            OSError: a directory on the way cannot be opened for another reason than being gone or not one.
        """
        names: List[str] = []
        ancestor = path
        while ancestor not in self._fds:
            if not ancestor:
                self._fds[""] = os.open(self.root, DIR_FLAGS)
                break
            ancestor, _, name = ancestor.rpartition("/")
            names.append(name)
        fd = self._fds[ancestor]
        for name in reversed(names):
            ancestor = ancestor + "/" + name if ancestor else name
            try:
                fd = os.open(os_name(name), DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in _GONE:
                    return None
                raise
            self._fds[ancestor] = fd
        return fd

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def listing(dir_fd: int) -> List[Tuple[str, os.stat_result]]:
    """The entries of an open directory, names as record text, with their own ``lstat`` (none that vanished).

    Raises:
        OSError: the directory cannot be listed.
    """
    found = []
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            try:
                found.append((record_name(entry.name), entry.stat(follow_symlinks=False)))
            except FileNotFoundError:
                continue
    return found


def walk(
    start: str,
    start_fd: int,
    watch: Callable[[str, int], None],
    seen: Dict[str, os.stat_result],
    unlisted: Dict[str, str],
) -> None:
    """Put everything under the directory ``start`` (open as ``start_fd``, left open) in ``seen``, by record path.

    Each directory is given to ``watch`` before it is listed, so what is made after its listing
    has an event; one that cannot be opened or listed goes in ``unlisted`` with the reason.
    Directories are entered depth first, one descriptor per level; one whose path is past the
    record's bound is not entered (nothing in it could be saved).
    """

    def enter(path: str, fd: int) -> List[str]:
        watch(path, fd)
        try:
            entries = listing(fd)
        except OSError as exc:
            unlisted[path] = os.strerror(exc.errno or 0)
            return []
        subdirectories = []
        for name, st in entries:
            child = record_path(path, name)
            seen[child] = st
            if stat.S_ISDIR(st.st_mode) and len(os_name(child)) < MAX_PATH_BYTES:
                subdirectories.append(name)
        return subdirectories

    stack = [(start, start_fd, enter(start, start_fd))]
    while stack:
        path, fd, subdirectories = stack[-1]
        if not subdirectories:
            stack.pop()
            if stack:
                os.close(fd)
            continue
        name = subdirectories.pop()
        child = record_path(path, name)
        try:
            child_fd = os.open(os_name(name), DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            unlisted[child] = os.strerror(exc.errno or 0)
            continue
        stack.append((child, child_fd, enter(child, child_fd)))


def lstat(dir_fd: int, name: bytes) -> Optional[os.stat_result]:
    """``name``'s own ``lstat``; None when it is not there.

    Raises:
        OSError: it cannot be looked at (a directory without search permission).
    """
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in _GONE:
            return None
        raise


def read_link(dir_fd: int, name: bytes) -> str:
    """A link's target as record text (never followed).

    Raises:
        Raced: it is no longer a link.
        Unsaved: the target is too long.
    """
    try:
        target = os.readlink(name, dir_fd=dir_fd)
    except OSError as exc:
        raise Raced() from exc
    if len(target) > MAX_LINK_BYTES:
        raise Unsaved("the link's target is longer than %d bytes" % MAX_LINK_BYTES)
    return target.decode("utf-8", "surrogateescape")


def _same(before: os.stat_result, after: os.stat_result) -> bool:
    return stat_key(before) == stat_key(after) and before.st_nlink == after.st_nlink


def read_file(dir_fd: int, name: bytes, max_bytes: int) -> Tuple[bytearray, os.stat_result]:
    """A regular file's bytes and the ``fstat`` they belong to, read without following a link.

    Raises:
        Raced: it is not a regular file any more, or it changed while it was read.
        Unsaved: it cannot be saved (a hard-link set, too big, unreadable).
    """
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _GONE or exc.errno == errno.ENXIO:
            raise Raced() from exc
        raise Unsaved("it cannot be read: %s" % os.strerror(exc.errno or 0)) from exc
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            raise Raced()
        size = before.st_size
        if before.st_nlink != 1:
            raise Unsaved("a file with %d hard links cannot be saved" % before.st_nlink)
        if size > max_bytes:
            raise Unsaved("the file is larger than %d bytes" % max_bytes)
        data = bytearray(size)
        view = memoryview(data)
        got = 0
        while got < size:
            count = os.readv(fd, [view[got:]])
            if not count:
                break
            got += count
        grew = bool(os.read(fd, 1))
        after = os.fstat(fd)
    except OSError as exc:
        raise Unsaved("it cannot be read: %s" % os.strerror(exc.errno or 0)) from exc
    finally:
        os.close(fd)
    if got != size or grew or not _same(before, after):
        raise Raced()
    return data, after


def empty(root: str) -> None:
    """Remove everything under ``root`` (not ``root``): directories the cell made unreadable too."""
    _empty_open(os.open(root, DIR_FLAGS))


def remove_tree(dir_fd: int, name: bytes) -> None:
    """Remove the directory ``name`` of ``dir_fd`` and everything in it, never following a link."""
    chmod_dir(dir_fd, name, 0o700)
    _empty_open(os.open(name, DIR_FLAGS, dir_fd=dir_fd))
    os.rmdir(name, dir_fd=dir_fd)


def _empty_open(root_fd: int) -> None:
    """Remove everything in the open directory ``root_fd``, which is closed after."""
    stack: List[Tuple[int, bytes, List[bytes]]] = [(root_fd, b"", _names(root_fd))]
    while stack:
        fd, name, names = stack[-1]
        if names:
            child = names.pop()
            st = lstat(fd, child)
            if st is None:
                continue
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(child, dir_fd=fd)
                continue
            chmod_dir(fd, child, 0o700)
            child_fd = os.open(child, DIR_FLAGS, dir_fd=fd)
            stack.append((child_fd, child, _names(child_fd)))
        else:
            stack.pop()
            os.close(fd)
            if stack:
                os.rmdir(name, dir_fd=stack[-1][0])


def _names(dir_fd: int) -> List[bytes]:
    return [os.fsencode(name) for name in os.listdir(dir_fd)]


def write_file(dir_fd: int, name: bytes, data: Content, mode: int, mtime_ns: int) -> None:
    """Write a file whole under a temporary name, with its mode and mtime, then rename it into place."""
    view = memoryview(data).cast("B")
    for attempt in range(100):
        temp = _TEMP_PREFIX + str(attempt).encode()
        try:
            fd = os.open(
                temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd
            )
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(errno.EEXIST, "no free temporary name", name)
    try:
        written = 0
        while written < len(view):
            written += os.write(fd, view[written:])
        os.fchmod(fd, mode)
        os.utime(fd, ns=(mtime_ns, mtime_ns))
    finally:
        os.close(fd)
    os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def write_link(dir_fd: int, name: bytes, target: str, mtime_ns: int) -> None:
    os.symlink(os_name(target), name, dir_fd=dir_fd)
    os.utime(name, ns=(mtime_ns, mtime_ns), dir_fd=dir_fd, follow_symlinks=False)


def chmod_dir(dir_fd: int, name: bytes, mode: int) -> None:
    """Change a directory's mode without following a link: through ``/proc/self/fd`` of an ``O_PATH`` descriptor.

    ``chmod`` has no "do not follow" on Linux; a directory the cell made unreadable cannot be
    opened for ``fchmod``, but an ``O_PATH`` descriptor needs no permission on it.
    """
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.chmod("/proc/self/fd/%d" % fd, mode)
    finally:
        os.close(fd)


def set_dir(dir_fd: int, name: bytes, mode: int, mtime_ns: int) -> os.stat_result:
    """Give a restored directory its mode and mtime (after everything in it was written); its ``lstat``."""
    chmod_dir(dir_fd, name, mode)
    os.utime(name, ns=(mtime_ns, mtime_ns), dir_fd=dir_fd, follow_symlinks=False)
    return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)


ReadContent = Callable[[str, int], Content]
