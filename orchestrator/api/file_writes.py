"""``session.files``, its write side: ``write``, ``remove`` and ``upload`` as requests to the sandbox's worker.

Each is a call of the session (its turn, a sandbox started and restored if it has none, recovery as
for ``set_value``): the worker writes or removes under ``/workspace`` and replies with the
checkpoint delta, which is committed before the call returns, so acknowledged means durable
(docs/design/workspace.md, "The files API"). Bounds are checked here before anything is sent: a
file past ``Settings.limits.workspace_bytes`` is ``WorkspaceFileTooBig``, an upload of more entries
than ``workspace_files`` a ``ConfigError``; the worker's own bound (its file system's) answers the rest.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from ..agent import protocol, request_table
from ..errors import (
    ConfigError,
    FileNotFoundInWorkspace,
    PathOutsideWorkspace,
    WorkspaceError,
    WorkspaceFileTooBig,
)
from ..state.files import UNSAVED_PREFIX
from ..wire.replies import reply_reason
from .file_tree import WORKSPACE, normalized, shown
from .transactions import Transactions

DEFAULT_MODE = 0o644
FileData = bytes | bytearray | memoryview | str | BinaryIO
"""What ``files.write`` takes: bytes, a str (written as UTF-8), or a binary file object read to its end."""
_CHUNK = 1 << 20


@dataclass
class Uploaded:
    """What an upload wrote.

    Attributes:
        files: files written (each one call, one generation).
        bytes: their bytes.
        skipped: local path -> why it was not written (a link, an empty directory, a FIFO or a device: ``write``
            makes files only; a cell can make the rest).
    """

    files: int = 0
    bytes: int = 0
    skipped: dict[str, str] = field(default_factory=dict)


class FileWriter:
    """Writes into one session's workspace, as calls of the session (in ``context``: its delta's namespace)."""

    def __init__(self, calls: Transactions, context: str | None) -> None:
        self._calls = calls
        self._context = context

    def write(self, path: str | os.PathLike[str], data: FileData, *, mode: int = DEFAULT_MODE) -> None:
        """Write ``data`` as the file ``path`` (its directories made), replacing a file there; durable on return."""
        relative = _target(path)
        if type(mode) is not int or not 0 <= mode <= 0o777:
            raise ConfigError(f"mode must be permission bits, an int from 0 to 0o777, got {mode!r}")
        content = self._content(relative, data)
        header = request_table.file_write_request(relative, mode, self._calls.settings.timeouts.checkpoint)
        with self._calls.turn():
            self._calls.in_context(header, self._context)
            self._calls.control(header, lambda reply, body: self._commit(reply, body, relative), content)

    def remove(self, path: str | os.PathLike[str], recursive: bool = False) -> None:
        """Remove a file, a link or an empty directory (with ``recursive``, a directory and all it holds)."""
        relative = _target(path)
        if not isinstance(recursive, bool):
            raise ConfigError(f"recursive must be a bool, got {recursive!r}")
        header = request_table.file_remove_request(relative, recursive, self._calls.settings.timeouts.checkpoint)
        with self._calls.turn():
            record = self._calls.ledger.record
            if relative not in record.files and UNSAVED_PREFIX + relative not in record.unsaved:
                raise FileNotFoundInWorkspace(
                    f"'{shown(relative)}' is not in the session's workspace (links on the way are not followed): "
                    "files.list() shows what it holds",
                    path=relative,
                )
            self._calls.in_context(header, self._context)
            self._calls.control(header, lambda reply, body: self._commit(reply, body, relative))

    def upload(self, local_path: str | os.PathLike[str], path: str | os.PathLike[str]) -> Uploaded:
        """A local file as ``path``, or a local directory's files under ``path``, one ``write`` each, in one turn."""
        source = Path(local_path)
        relative = stored_path(path) if source.is_dir() else _target(path)  # a directory's files may go to the root
        planned, uploaded = self._plan(source, relative)
        with self._calls.turn():  # no cell runs between the writes
            for local, target in planned:
                with open(local, "rb") as handle:
                    self.write(target, handle, mode=stat.S_IMODE(os.fstat(handle.fileno()).st_mode))
                uploaded.files += 1
                uploaded.bytes += os.stat(local).st_size
        return uploaded

    # ----------------------------------------------------------------- internals

    def _plan(self, source: Path, relative: str) -> tuple[list[tuple[Path, str]], Uploaded]:
        """The files to write (local, workspace path) and what is skipped; bounded before anything is sent."""
        uploaded = Uploaded()
        if not source.is_dir():
            return [(source, relative)], uploaded
        planned: list[tuple[Path, str]] = []
        total = 0
        limits = self._calls.settings.limits
        for local, target, why in _walk(source, relative):
            if why is not None:
                uploaded.skipped[str(local)] = why
                continue
            planned.append((local, target))
            total += local.stat().st_size
            if len(planned) > limits.workspace_files or total > limits.workspace_bytes:
                raise ConfigError(
                    f"{source} holds more than the workspace takes ({limits.workspace_files} entries, "
                    f"{limits.workspace_bytes} bytes: Settings.limits.workspace_files and workspace_bytes); "
                    "nothing was uploaded"
                )
        return planned, uploaded

    def _content(self, relative: str, data: FileData) -> bytes | bytearray | memoryview:
        limit = self._calls.settings.limits.workspace_bytes
        if isinstance(data, str):
            content: bytes | bytearray | memoryview = data.encode("utf-8")
        elif isinstance(data, (bytes, bytearray, memoryview)):
            content = data
        elif hasattr(data, "read"):
            content = _read_bounded(data, limit + 1)
        else:
            raise ConfigError(f"files.write takes bytes, a str or a binary file object, not {type(data).__name__}")
        if len(content) > limit:
            raise WorkspaceFileTooBig(
                f"'{shown(relative)}' would hold more than the workspace's {limit} bytes "
                "(Settings.limits.workspace_bytes, ORCH_WORKSPACE_BYTES); nothing was written",
                path=relative,
                size=len(content),
                limit=limit,
            )
        return content

    def _commit(self, reply: dict[str, Any], body: bytearray, relative: str) -> None:
        if reply.get("status") == protocol.STATUS_ERROR:
            raise WorkspaceError(
                f"the sandbox could not change '{shown(relative)}' of its workspace: {reply_reason(reply, '')}",
                path=relative,
            )
        self._calls.commit_state(reply, body, {}, self._context)
        unsaved = self._calls.ledger.record.unsaved.get(UNSAVED_PREFIX + relative)
        if unsaved is not None:  # written in the sandbox, but not kept: not what the caller was promised
            raise WorkspaceError(
                f"'{shown(relative)}' was written in the sandbox but its checkpoint cannot keep it ({unsaved}); "
                "session.unsaved names it until it is removed or fits",
                path=relative,
            )


def stored_path(path: str | os.PathLike[str]) -> str:
    """The stored path a files call is given (``""``: the workspace itself), taken lexically (``file_tree.normalized``).

    Raises:
        PathOutsideWorkspace: it leads out of the workspace.
        ConfigError: it is not a str.
    """
    given = os.fspath(path)
    if not isinstance(given, str):
        raise ConfigError(f"a workspace path is a str, got {type(given).__name__}")
    relative = normalized(given)
    if relative is None:
        raise PathOutsideWorkspace(
            f"'{shown(given)}' is outside the session's workspace: give a path relative to {WORKSPACE}, "
            f"or an absolute one under {WORKSPACE}",
            path=given,
        )
    return relative


def _target(path: str | os.PathLike[str]) -> str:
    """The stored path a write or a removal names (never the root).

    Raises:
        PathOutsideWorkspace: it leads out of the workspace.
        ConfigError: it is not a str, or names the workspace itself.
    """
    relative = stored_path(path)
    if not relative:
        raise ConfigError(f"'{shown(os.fspath(path))}' is the workspace itself: name a file or a directory in it")
    return relative


def _walk(source: Path, relative: str) -> Iterator[tuple[Path, str, str | None]]:
    """Each entry under ``source`` (links not followed), sorted: (local path, workspace path, why skipped or None)."""
    for directory, names, files in os.walk(source):
        names.sort()
        here = Path(directory)
        inside = here.relative_to(source).as_posix()
        prefix = "/".join(part for part in (relative, "" if inside == "." else inside) if part)
        if not names and not files and here != source:
            yield here, prefix, "an empty directory: files.write makes files (a cell can make it: os.makedirs)"
        for name in sorted(files) + [n for n in names if (here / n).is_symlink()]:
            local = here / name
            target = f"{prefix}/{name}" if prefix else name
            mode = local.lstat().st_mode
            if stat.S_ISLNK(mode):
                yield local, target, "a link: files.write makes files (a cell can make it: os.symlink)"
            elif not stat.S_ISREG(mode):
                yield local, target, "neither a file nor a directory: it cannot be uploaded"
            else:
                yield local, target, None


def _read_bounded(source: BinaryIO, most: int) -> bytes:
    """At most ``most`` bytes of a binary file object (one past the bound tells it is too big)."""
    parts: list[bytes] = []
    left = most
    while left > 0:
        chunk = source.read(min(_CHUNK, left))
        if not isinstance(chunk, (bytes, bytearray)):
            raise ConfigError(f"files.write reads binary file objects; this one gave {type(chunk).__name__}")
        if not chunk:
            break
        parts.append(bytes(chunk))
        left -= len(chunk)
    return b"".join(parts)
