"""The checked writer: a stored workspace's file or directory written under a local destination, never outside it.

What it writes comes from a sandbox (names, modes, link targets; the bytes were hashed by the host when
they were stored), and the destination may hold what someone else put there. So (issue 36, "Zero trust
on the way out"):

- every directory is opened ``O_DIRECTORY | O_NOFOLLOW`` relative to its parent's descriptor, from the
  destination down: a link placed at a directory's name is never followed, it is an error;
- every file is written to a new temporary name (``O_CREAT | O_EXCL | O_NOFOLLOW``) in its directory and
  renamed over its name: a file or a link already there is replaced, not written through (``docker cp``
  replaces files too); a directory there is not replaced (an error, as ``docker cp`` refuses);
- its bytes are the blob's own, counted as they are copied: a blob longer or shorter than the record says
  is an error (``CheckpointError``) and the partial file is removed; a size claim is never trusted ahead
  (a 1 TB claim reserves nothing and reads at most one byte past the blob);
- modes are ``& 0o777`` (no setuid, setgid or sticky bit); only files, directories and links are made,
  never a device, FIFO or socket;
- a link is made only when its target, followed through the download's own entries, stays inside the
  download (``FileTree.resolve`` with the download's root as floor); any other (absolute, ``..`` out, to a
  name the download lacks, a loop) is skipped and named in ``Downloaded.skipped``.

Names are written as the bytes the sandbox had (``surrogateescape``) and shown escaped in messages.
The destination itself is the caller's own path and is followed like any path they give.
An error stops the download: what was written before it stays, each file whole.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CheckpointError
from ..files import TEMP_PREFIX
from .file_tree import Entry, FileTree, Unreachable, original_bytes, os_name, parent_of, shown, tree_order

BlobOpener = Callable[[Entry], int]
"""A file entry's blob opened for reading (a descriptor the writer closes); raises ``CheckpointError``."""

CHUNK = 1 << 20
_PERMISSIONS = 0o777
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class Downloaded:
    """What a download wrote.

    Attributes:
        files: regular files written.
        directories: directories made or merged into.
        links: symlinks made.
        bytes: bytes of the files, as counted while writing them.
        skipped: stored path -> why it was not written (a link that leads out of the download, a name the
            host's filesystem cannot hold, an entry whose directory was not written).
    """

    files: int = 0
    directories: int = 0
    links: int = 0
    bytes: int = 0
    skipped: dict[str, str] = field(default_factory=dict)


def download_file(entry: Entry, target: Path, open_blob: BlobOpener) -> Downloaded:
    """Write file ``entry`` at ``target`` (its directory must exist; a file or link there is replaced).

    Raises:
        CheckpointError: the blob is missing, or its length is not the stored size.
        OSError: the destination cannot be written (``IsADirectoryError``: a directory is at ``target``).
    """
    directory = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        written = _write_file(directory, os.fsencode(target.name), entry, open_blob, str(target))
    finally:
        os.close(directory)
    return Downloaded(files=1, bytes=written)


def download_tree(tree: FileTree, root: str, destination: Path, open_blob: BlobOpener) -> Downloaded:
    """Write directory ``root`` of ``tree`` (``""``: the whole workspace) into ``destination``: made if it is
    missing (its parent must exist), merged into if it is a directory.

    Raises:
        CheckpointError: a blob is missing, or its length is not the stored size.
        OSError: the destination cannot be written: ``NotADirectoryError`` (not a directory, or something else
            than a directory, a link included, at a directory's name), ``IsADirectoryError`` (a directory at a
            file's or a link's name), a permission, a full disk.
    """
    report = Downloaded()
    made_root = _make_root(destination)
    root_fd = os.open(destination, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    levels = _Levels(_Level(root, b"", str(destination), tree.entry(root) if root and made_root else None, root_fd))
    try:
        for entry in sorted(tree.below(root, recursive=True), key=lambda e: tree_order(e.path)):
            parent = parent_of(entry.path)
            if not levels.holds(parent):
                report.skipped[entry.path] = f"its directory '{shown(parent)}' was not written"
                continue
            directory = levels.back_to(parent)
            local = os.path.join(destination, entry.path[len(root) + 1 :] if root else entry.path)
            name = os_name(entry.name)
            if name is None:
                report.skipped[entry.path] = "its name cannot be a file name on this host"
            elif entry.kind == "d":
                levels.enter(_Level(entry.path, name, local, entry, _open_directory(directory, name, local)))
                report.directories += 1
            elif entry.kind == "f":
                report.bytes += _write_file(directory, name, entry, open_blob, local)
                report.files += 1
            elif entry.kind == "l":
                why = _link_problem(tree, entry, root)
                if why is None:
                    _write_link(directory, name, entry, local)
                    report.links += 1
                else:
                    report.skipped[entry.path] = why
            else:
                report.skipped[entry.path] = f"its kind {entry.kind!r} is not a file, a directory or a link"
        levels.finish()
    finally:
        levels.close()
    return report


@dataclass
class _Level:
    """A directory on the way from the download's root to the one being written."""

    path: str
    name: bytes
    local: str
    """Its path on the host, for messages (an OSError shows it as a repr: escaped)."""
    entry: Entry | None
    """What gives it its mode and time once its entries are written (None: it is left as it was)."""
    fd: int | None


class _Levels:
    """The directories from the download's root down to the one being written, each opened from its parent's
    descriptor. At most ``MAX_OPEN`` below the root hold a descriptor at once (a tree may be 2,048 deep, past a
    process's limit); one that gave its up is opened again, the same checked way, when the walk comes back to it."""

    MAX_OPEN = 64

    def __init__(self, root: _Level) -> None:
        self._levels = [root]

    def holds(self, path: str) -> bool:
        return any(level.path == path for level in self._levels)

    def enter(self, level: _Level) -> None:
        self._levels.append(level)
        self._trim()

    def back_to(self, path: str) -> int:
        """Finish the directories below ``path`` (one the walk holds); its descriptor."""
        while self._levels[-1].path != path:
            self._finish_top()
        return self._open_top()

    def finish(self) -> None:
        while self._levels:
            self._finish_top()

    def close(self) -> None:
        """Close what is still open (after an error: those directories keep the mode they were made with)."""
        for level in self._levels:
            _close(level)

    def _finish_top(self) -> None:
        """Give the deepest directory its mode and time (after its entries: they change its time, and a mode
        without ``w`` would have stopped them), then close it and leave it."""
        fd = self._open_top()
        entry = self._levels.pop().entry
        try:
            if entry is not None:
                os.fchmod(fd, entry.mode & _PERMISSIONS)
                os.utime(fd, ns=(entry.mtime_ns, entry.mtime_ns))
        finally:
            os.close(fd)

    def _open_top(self) -> int:
        """The deepest directory's descriptor, opened again (with those between it and the deepest one still
        held) when it was given up."""
        held = len(self._levels) - 1
        while self._levels[held].fd is None:  # the root's is never given up
            held -= 1
        for index in range(held + 1, len(self._levels)):
            parent, level = self._levels[index - 1].fd, self._levels[index]
            assert parent is not None
            level.fd = _open_directory(parent, level.name, level.local, make=False)
            self._trim()
        top = self._levels[-1].fd
        assert top is not None
        return top

    def _trim(self) -> None:
        """Give up the shallowest descriptor held below the root past ``MAX_OPEN`` (held ones are always the
        deepest levels: entered last, or opened again from the shallowest up)."""
        held = [level for level in self._levels[1:] if level.fd is not None]
        if len(held) > self.MAX_OPEN:
            _close(held[0])


def _close(level: _Level) -> None:
    if level.fd is not None:
        os.close(level.fd)
        level.fd = None


def _make_root(destination: Path) -> bool:
    """Make the destination directory unless it is there; True when it was made."""
    try:
        os.mkdir(destination, 0o700)
    except FileExistsError:
        if not destination.is_dir():
            raise NotADirectoryError(
                errno.ENOTDIR, "not a directory: a directory is downloaded into a directory", str(destination)
            ) from None
        return False
    return True


def _open_directory(parent: int, name: bytes, local: str, *, make: bool = True) -> int:
    """Make directory ``name`` in ``parent`` (0700 until it is finished), or take the one there; never a link."""
    if make:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=parent)
    try:
        return os.open(name, _DIRECTORY, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise NotADirectoryError(
                errno.ENOTDIR, "something other than a directory is there (never followed nor replaced)", local
            ) from None
        raise _located(exc, local) from None


def _write_file(directory: int, name: bytes, entry: Entry, open_blob: BlobOpener, local: str) -> int:
    """Write ``entry``'s blob to a new temporary file in ``directory``, then rename it to ``name``; its length."""
    blob = open_blob(entry)
    try:
        temporary, fd = _new_temporary(directory, local)
        try:
            try:
                written = _copy_counted(blob, fd, entry)
                os.fchmod(fd, entry.mode & _PERMISSIONS)
                os.utime(fd, ns=(entry.mtime_ns, entry.mtime_ns))
            finally:
                os.close(fd)
            _rename(directory, temporary, name, local)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=directory)
            raise
    finally:
        os.close(blob)
    return written


def _write_link(directory: int, name: bytes, entry: Entry, local: str) -> None:
    target = original_bytes(entry.ref)
    assert target is not None  # _link_problem refused it otherwise
    while True:
        temporary = _temporary_name()
        try:
            os.symlink(target, temporary, dir_fd=directory)
            break
        except FileExistsError:
            continue
        except OSError as exc:
            raise _located(exc, local) from None
    try:
        os.utime(temporary, ns=(entry.mtime_ns, entry.mtime_ns), dir_fd=directory, follow_symlinks=False)
        _rename(directory, temporary, name, local)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=directory)
        raise


def _link_problem(tree: FileTree, link: Entry, root: str) -> str | None:
    """Why link ``link`` may not be made in a download of ``root`` (None: its target stays inside it)."""
    target = link.ref
    if original_bytes(target) is None or "\x00" in target or not target:
        return "its target cannot be a link's target on this host"
    try:
        tree.resolve(target, start=parent_of(link.path), floor=root)
    except Unreachable as exc:
        place = "the download" if root else "the workspace"
        return f"a link to '{shown(target)}', which does not lead to an entry inside {place} ({exc.reason})"
    return None


def _copy_counted(source: int, target: int, entry: Entry) -> int:
    """Copy the blob to ``target``, counting: at most one byte past the stored size is ever read."""
    size = entry.size
    buffer = memoryview(bytearray(min(CHUNK, size + 1)))
    copied = 0
    while True:
        got = os.readv(source, [buffer[: min(len(buffer), size + 1 - copied)]])
        if not got:
            break
        if copied + got > size:
            raise _wrong_length(entry, "more than")
        _write_all(target, buffer[:got])
        copied += got
    if copied != size:
        raise _wrong_length(entry, f"{copied} bytes, not")
    return copied


def read_counted(source: int, entry: Entry) -> bytes:
    """The blob of file ``entry``, read whole into memory (the caller bounded ``entry.size``), counted.

    Raises:
        CheckpointError: the blob is shorter or longer than the stored size.
    """
    parts: list[bytes] = []
    got = 0
    while got <= entry.size:
        chunk = os.read(source, entry.size + 1 - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    if got != entry.size:
        raise _wrong_length(entry, "more than" if got > entry.size else f"{got} bytes, not")
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _wrong_length(entry: Entry, holds: str) -> CheckpointError:
    return CheckpointError(
        f"the stored blob of '{shown(entry.path)}' holds {holds} the {entry.size} bytes its record says: the "
        "session's store is damaged; nothing was kept of that file"
    )


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data) :]


def _temporary_name() -> bytes:
    return f"{TEMP_PREFIX}{secrets.token_hex(6)}".encode()


def _new_temporary(directory: int, local: str) -> tuple[bytes, int]:
    while True:
        name = _temporary_name()
        try:
            return name, os.open(name, _NEW_FILE, 0o600, dir_fd=directory)
        except FileExistsError:
            continue
        except OSError as exc:
            raise _located(exc, local) from None


def _rename(directory: int, temporary: bytes, name: bytes, local: str) -> None:
    try:
        os.rename(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
    except OSError as exc:
        if exc.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
            raise IsADirectoryError(errno.EISDIR, "a directory is there; it is not replaced", local) from None
        raise _located(exc, local) from None


def _located(exc: OSError, local: str) -> OSError:
    """``exc`` again, naming the whole local path (an ``*at`` call names only the last component)."""
    return type(exc)(exc.errno, exc.strerror, local)
