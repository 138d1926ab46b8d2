"""Files written whole: a temporary file beside the target, then one rename over it.

A reader sees the old file or the new one, never a part of either, and a controller that dies
mid-write leaves at most a temporary file, whose name (``TEMP_PREFIX``) tells prune what it is.
A rename survives a crash of the controller; ``fsync`` (of the file, then of its directory with
``fsync_dir``) makes it survive a power loss too.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

Chunk = bytes | bytearray | memoryview

TEMP_PREFIX = ".tmp-"
"""How every temporary file made here begins: files a crash left behind are recognised by it."""
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def write_temp(directory: Path, *chunks: Chunk, fsync: bool = False, mode: int | None = None) -> Path:
    """A new temporary file in ``directory`` holding ``chunks``, complete (and on disk with ``fsync``).

    ``mode``: the file's permissions exactly; None gives what ``open()`` gives (0o666 less the umask).
    The file is created, never opened through a link or over another; when writing fails it is removed.
    """
    while True:
        path = Path(directory) / f"{TEMP_PREFIX}{secrets.token_hex(6)}"
        try:
            fd = os.open(path, _NEW, 0o666 if mode is None else mode)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as file:
            if mode is not None:
                os.fchmod(file.fileno(), mode)  # the umask may have taken bits off
            for chunk in chunks:
                file.write(chunk)
            if fsync:
                file.flush()
                os.fsync(file.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    return path


def replace_file(path: Path, *chunks: Chunk, fsync: bool = False, mode: int | None = None) -> None:
    """Replace (or create) ``path`` with ``chunks`` in one rename; see ``write_temp`` for ``fsync`` and ``mode``.

    The directory itself is not flushed: a caller writing several files there calls ``fsync_dir`` once.
    """
    temporary = write_temp(Path(path).parent, *chunks, fsync=fsync, mode=mode)
    try:
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (renames, new and removed files) to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
