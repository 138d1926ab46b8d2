"""``session.files``, its read side: a session's workspace as the store's current generation holds it.

``read``, ``list``, ``exists`` and ``download`` read the record's ``files`` map and the blob files
(docs/design/workspace.md, "The files API"), never the sandbox: after every call the two are the same
but for what ``session.unsaved`` names, a hibernated session is read without being started, and no byte
reaches the caller that the host did not hash when it stored it. A path is relative to ``/workspace``
(an absolute one under it is taken too), ``..`` is taken lexically, and a link on the way is followed
through the stored workspace only, never out of it. ``write``, ``remove`` and ``upload`` are requests
to the sandbox's worker (``api/file_writes.py``).
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, overload

from ..checks import is_count
from ..errors import (
    CheckpointError,
    ConfigError,
    FileNotFoundInWorkspace,
    NotAFileInWorkspace,
    PathOutsideWorkspace,
    WorkspaceFileTooBig,
)
from ..state.store import SessionStore
from .download import BlobOpener, Downloaded, download_file, download_tree, read_counted
from .file_tree import WORKSPACE, Entry, FileTree, Unreachable, normalized, os_name, shown, tree_order
from .file_writes import DEFAULT_MODE, FileData, FileWriter, Uploaded, stored_path

DEFAULT_MAX_READ_BYTES = 64 << 20
"""What ``read`` returns in memory at most unless told otherwise; ``read(path, to=...)`` streams any size."""

FileKind = Literal["file", "dir", "symlink"]
_KINDS: dict[str, FileKind] = {"f": "file", "d": "dir", "l": "symlink"}
_BLOB = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_LISTS = "files.list() shows what the workspace holds"


@dataclass(frozen=True)
class FileInfo:
    """One entry of a session's workspace.

    Attributes:
        path: relative to ``/workspace``, ``/``-separated; a name that is not UTF-8 holds its bytes as
            ``os.fsdecode`` does (pass it back as it is).
        kind: ``"file"``, ``"dir"`` or ``"symlink"``.
        size: a file's bytes, a link's target's bytes, 0 for a directory.
        mode: permission bits (``0o644``); setuid, setgid and sticky are never kept.
        mtime: last modification, seconds since the epoch.
        link_target: a link's target as the sandbox wrote it (never followed out of the workspace), else None.
    """

    path: str
    kind: FileKind
    size: int
    mode: int
    mtime: float
    link_target: str | None

    @classmethod
    def of(cls, entry: Entry) -> FileInfo:
        kind = _KINDS[entry.kind]
        target = entry.ref if kind == "symlink" else None
        return cls(entry.path, kind, entry.size, entry.mode, entry.mtime_ns / 1e9, target)


class WorkspaceRecord(Protocol):
    """What ``Files`` reads of a session's record (``SessionRecord`` is one)."""

    @property
    def session_id(self) -> str: ...

    @property
    def files(self) -> Mapping[str, Sequence[Any]]: ...

    @property
    def blob_sizes(self) -> Mapping[str, int]: ...


class Files:
    """The files of one session's workspace, as its last checkpoint stored them."""

    def __init__(
        self, record: Callable[[], WorkspaceRecord], store: SessionStore, writer: FileWriter | None = None
    ) -> None:
        """``record``: the session's current record (each call reads one, whole); ``store``: where its blobs are;
        ``writer``: the session's calls that change its workspace (``api/file_writes.py``)."""
        self._record = record
        self._store = store
        self._writer = writer

    def write(self, path: str | os.PathLike[str], data: FileData, *, mode: int = DEFAULT_MODE) -> None:
        """Write ``data`` as the file ``path`` of the workspace (its missing directories made), replacing a file or
        link there; the session's checkpoint holds it when this returns (like ``set_value``).

        Args:
            path: relative to ``/workspace`` (or absolute under it).
            data: bytes, a str (written as UTF-8) or a binary file object (read to its end).
            mode: the file's permission bits.

        Raises:
            PathOutsideWorkspace: ``path`` leads out of the workspace.
            WorkspaceFileTooBig: ``data`` is bigger than the workspace (``Settings.limits.workspace_bytes``).
            WorkspaceError: the sandbox could not write it (a directory there, the workspace full); nothing changed.
            ConfigError: ``path`` names the workspace itself, or ``mode`` is not permission bits.
        """
        self._writes().write(path, data, mode=mode)

    def remove(self, path: str | os.PathLike[str], recursive: bool = False) -> None:
        """Remove a file, a link (not what it points to) or an empty directory; with ``recursive`` a directory and
        everything in it. The checkpoint holds the removal when this returns.

        Raises:
            PathOutsideWorkspace: ``path`` leads out of the workspace.
            WorkspaceError: the sandbox could not remove it (nothing there, a directory that is not empty).
        """
        self._writes().remove(path, recursive)

    def upload(self, local_path: str | os.PathLike[str], path: str | os.PathLike[str]) -> Uploaded:
        """Copy a local file to ``path``, or a local directory's files under ``path`` (``"."``: the workspace),
        one ``write`` each (a generation each) in one turn of the session: no cell runs between them.

        A directory's links, empty directories and special files are not written but named in
        ``Uploaded.skipped``. A directory of more files or bytes than the workspace holds
        (``Settings.limits.workspace_files``, ``workspace_bytes``) is refused before anything is sent.

        Raises:
            ConfigError: the directory is past the workspace's bounds.
            PathOutsideWorkspace, WorkspaceFileTooBig, WorkspaceError: as ``write``.
        """
        return self._writes().upload(local_path, path)

    @overload
    def read(self, path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_READ_BYTES) -> bytes: ...

    @overload
    def read(self, path: str | os.PathLike[str], *, to: str | os.PathLike[str]) -> int: ...

    def read(
        self,
        path: str | os.PathLike[str],
        *,
        to: str | os.PathLike[str] | None = None,
        max_bytes: int = DEFAULT_MAX_READ_BYTES,
    ) -> bytes | int:
        """A file's bytes (a link is followed inside the workspace), or with ``to`` the file written there.

        Args:
            path: The file, relative to ``/workspace`` (or absolute under it).
            to: A local file to stream it to, whatever its size, never held in memory: made, or replaced whole
                (a link there is replaced, not followed); its directory must exist.
            max_bytes: The most ``read`` returns in memory (without ``to``).

        Returns:
            The bytes; with ``to``, how many were written.

        Raises:
            FileNotFoundInWorkspace: nothing is at ``path``.
            NotAFileInWorkspace: ``path`` is a directory.
            PathOutsideWorkspace: ``path`` (or a link on the way) leads out of the workspace.
            WorkspaceFileTooBig: the file holds more than ``max_bytes`` (without ``to``).
            CheckpointError: its stored blob is missing, or not as long as the record says.
            OSError: ``to`` cannot be written (``IsADirectoryError``: a directory is there).
        """
        record, tree = self._view()
        entry = self._file(tree, path)
        if to is not None:
            return download_file(entry, Path(to), self._opener(record)).bytes
        if not is_count(max_bytes):
            raise ConfigError(f"max_bytes must be a count of bytes (an int >= 0), got {max_bytes!r}")
        if entry.size > max_bytes:
            raise WorkspaceFileTooBig(
                f"'{shown(entry.path)}' holds {entry.size} bytes, more than read() returns in memory "
                f"(max_bytes={max_bytes}): read(path, to=local_path) streams it to a local file",
                path=entry.path,
                size=entry.size,
                limit=max_bytes,
            )
        fd = self._opener(record)(entry)
        try:
            return read_counted(fd, entry)
        finally:
            os.close(fd)

    def list(self, path: str | os.PathLike[str] = ".", recursive: bool = False) -> builtins.list[FileInfo]:
        """The entries of a directory (links listed as links), or of every directory under it; a file's own entry.

        Args:
            path: The directory (or file), relative to ``/workspace`` or absolute under it; a link is followed
                inside the workspace.
            recursive: Every entry under ``path`` at any depth, not only those in it (links are not followed).

        Returns:
            The entries, each directory right before what it holds (sorted by their paths' components), each
            with its own path in the workspace (through a link to a directory: the paths the link leads to).

        Raises:
            FileNotFoundInWorkspace: nothing is at ``path``.
            PathOutsideWorkspace: ``path`` (or a link on the way) leads out of the workspace.
        """
        _, tree = self._view()
        found = self._find(tree, path)
        entry = tree.entry(found) if found else None
        if entry is not None and entry.kind != "d":
            return [FileInfo.of(entry)]
        entries = sorted(tree.below(found, recursive=recursive), key=lambda e: tree_order(e.path))
        return [FileInfo.of(each) for each in entries if each.kind in _KINDS]

    def exists(self, path: str | os.PathLike[str]) -> bool:
        """Whether the workspace has an entry at ``path`` (a link counts, wherever it points).

        Raises:
            PathOutsideWorkspace: ``path`` (or a link on the way to it) leads out of the workspace.
        """
        _, tree = self._view()
        try:
            self._find(tree, path, follow_last=False)
        except FileNotFoundInWorkspace:
            return False
        return True

    def download(self, path: str | os.PathLike[str], local_path: str | os.PathLike[str]) -> Downloaded:
        """Write a file, or a directory and everything under it, to the local disk, never outside ``local_path``.

        A file goes to ``local_path`` (into it, under its name, when ``local_path`` is a directory), replacing a
        file or link there. A directory's entries go into ``local_path``, made when missing (its parent must
        exist) and merged into otherwise; a link inside is made only when it leads to an entry of the download,
        and is named in ``Downloaded.skipped`` otherwise. ``path`` itself may be a link inside the workspace.

        Returns:
            What was written and what was skipped, with why.

        Raises:
            FileNotFoundInWorkspace: nothing is at ``path``.
            PathOutsideWorkspace: ``path`` (or a link on the way) leads out of the workspace.
            CheckpointError: a stored blob is missing, or not as long as the record says (that file is removed).
            OSError: the destination cannot be written: a link or a file where a directory goes
                (``NotADirectoryError``), a directory where a file goes (``IsADirectoryError``), a permission.
        """
        record, tree = self._view()
        found = self._find(tree, path)
        entry = tree.entry(found) if found else None
        if entry is None or entry.kind == "d":
            return download_tree(tree, found, Path(local_path), self._opener(record))
        entry = self._file(tree, found)
        target = Path(local_path)
        if target.is_dir():  # under the name it was asked by (a link's, when path is a link), as cp does
            asked = (normalized(os.fspath(path)) or "").rpartition("/")[2]
            target /= os.fsdecode(os_name(asked) or os_name(entry.name) or b"")
        return download_file(entry, target, self._opener(record))

    # ----------------------------------------------------------------- internals

    def _writes(self) -> FileWriter:
        if self._writer is None:
            raise ConfigError("these files are read-only: write through the session (session.files)")
        return self._writer

    def _view(self) -> tuple[WorkspaceRecord, FileTree]:
        record = self._record()
        return record, FileTree(record.files, record.blob_sizes)

    def _find(self, tree: FileTree, path: str | os.PathLike[str], *, follow_last: bool = True) -> str:
        """The stored path ``path`` leads to (``""``: the root)."""
        relative = stored_path(path)
        given = os.fspath(path)
        try:
            return tree.resolve(relative, follow_last=follow_last)
        except Unreachable as exc:
            if exc.outside:
                raise PathOutsideWorkspace(
                    f"'{shown(given)}' leads out of the session's workspace ({exc.reason}); links are never "
                    "followed out of it",
                    path=given,
                ) from None
            raise FileNotFoundInWorkspace(
                f"'{shown(given)}' is not in the session's workspace ({exc.reason}); {_LISTS} (as of the "
                "last call: what a cell wrote is there once its call returned, unless session.unsaved names it)",
                path=given,
            ) from None

    def _file(self, tree: FileTree, path: str | os.PathLike[str]) -> Entry:
        found = self._find(tree, path)
        entry = tree.entry(found) if found else None
        if entry is None or entry.kind != "f":
            raise NotAFileInWorkspace(
                f"'{shown(found) or WORKSPACE}' is a directory of the session's workspace, not a file: "
                "files.list() lists it, files.download() writes it to a local directory",
                path=found,
            )
        return entry

    def _opener(self, record: WorkspaceRecord) -> BlobOpener:
        session_id = record.session_id

        def open_blob(entry: Entry) -> int:
            try:
                return os.open(self._store.blob_path(session_id, entry.ref), _BLOB)
            except OSError as exc:
                raise CheckpointError(
                    f"the stored bytes of '{shown(entry.path)}' cannot be read ({exc.strerror}): if a call of the "
                    "session ran meanwhile it may have replaced that file, so try again; else the session's "
                    "store is damaged"
                ) from exc

        return open_blob
