"""The one host file an MCP client can make the server read: ``add_context``'s, opened beneath an allowed root.

The path is never resolved and then opened again by name (a local user who can write under the root could
swap a component for a symbolic link in between): it is walked one component at a time from ``/``, each
directory opened with ``O_NOFOLLOW`` relative to the descriptor of the one before, and the file itself opened
with ``O_NOFOLLOW`` relative to its directory's descriptor. No symbolic link is followed anywhere, so what is
opened is beneath the root whatever changes meanwhile; type and size are checked on the opened descriptor, and
only that descriptor is read.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from ..api.answers import field
from ..units import describe_bytes

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
"""A directory on the way (O_PATH where there is one: search permission is enough, as for a path lookup)."""
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | _CLOEXEC
"""The file: never a link, and a FIFO or a device must not block the open (refused after ``fstat``)."""


class BadCall(Exception):
    """The client's call cannot be run; the message tells the model what to fix."""


class FileRefused(BadCall):
    """``add_context``'s file was not read; ``reason`` says why in one word (the message, in a sentence)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def read_context_file(path: str, roots: Sequence[Path], limit: int) -> str | bytes:
    """A file the client named, read on the host: its text (bytes when it is not UTF-8).

    ``path`` is taken as written (made absolute; ``..`` removed by name, not by following anything) and must lie
    under one of ``roots`` (resolved directories); no component may be a symbolic link, and the file must be a
    regular file (a FIFO or a device could block the server or never end) of at most ``limit`` bytes.

    Raises:
        FileRefused: no roots were given (``none``), it is no path (``invalid``), not under them (``outside``), a
            component is a symbolic link (``link``), it does not exist (``missing``), is not a regular file
            (``not-a-file``), is larger than ``limit`` (``too-big``), or cannot be read (``unreadable``).
    """
    if not roots:
        raise FileRefused(
            "none",
            "This server reads no files: pass the text instead, or ask its user to start it with --allow-files DIR.",
        )
    shown = field(path, 200)
    if "\0" in path:
        raise FileRefused("invalid", f"{shown} is not a path: it holds a NUL character.")
    wanted = Path(os.path.abspath(os.path.expanduser(path)))
    if not any(wanted == root or root in wanted.parents for root in roots):
        allowed = ", ".join(str(root) for root in roots)
        raise FileRefused("outside", f"{shown} is not under a directory this server may read from ({allowed}).")
    fd = _open_beneath(wanted, shown)
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise FileRefused("not-a-file", f"{shown} is not a regular file.")
        if status.st_size > limit:
            raise FileRefused(
                "too-big", f"{shown} has {describe_bytes(status.st_size)}; the most is {describe_bytes(limit)}."
            )
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as file:
            data = file.read(limit + 1)
    except OSError as exc:
        raise FileRefused("unreadable", f"{shown} cannot be read: {exc.strerror}.") from None
    finally:
        os.close(fd)
    if len(data) > limit:  # it grew meanwhile
        raise FileRefused("too-big", f"{shown} has more than {describe_bytes(limit)}, the most this server reads.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data


def _open_beneath(path: Path, shown: str) -> int:
    """A descriptor of ``path`` (absolute, normalized) opened without following any symbolic link."""
    *directories, name = path.parts[1:] or (".",)
    current = os.open("/", _DIRECTORY)
    try:
        for part in directories:
            step = _open_at(part, _DIRECTORY, current, shown)
            os.close(current)
            current = step
        return _open_at(name, _FILE, current, shown)
    finally:
        os.close(current)


def _open_at(name: str, flags: int, directory: int, shown: str) -> int:
    try:
        return os.open(name, flags, dir_fd=directory)
    except OSError as exc:
        raise _refusal(exc, name, directory, shown) from None


def _refusal(exc: OSError, name: str, directory: int, shown: str) -> FileRefused:
    """Why ``name`` could not be opened in ``directory``, in words (the ``lstat`` only words it: nothing is read)."""
    if exc.errno == errno.ENOENT:
        return FileRefused("missing", f"{shown} does not exist.")
    try:
        link = stat.S_ISLNK(os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode)
    except OSError:
        link = False
    if link or exc.errno == errno.ELOOP:
        return FileRefused(
            "link", f"{shown} goes through a symbolic link ({field(name, 100)}); this server follows none."
        )
    if exc.errno == errno.ENOTDIR:
        return FileRefused("missing", f"{shown} does not exist ({field(name, 100)} is not a directory).")
    return FileRefused("unreadable", f"{shown} cannot be opened: {exc.strerror}.")
