"""A session's stored workspace read as a tree: its entries, a directory's children, paths followed through links.

The record keeps one generation's workspace as a flat map ``{path: (kind, mode, mtime_ns, ref)}``
(docs/design/workspace.md, "The record"), paths relative to ``/workspace``. This module reads it and
nothing else: no byte of a sandbox's filesystem, no file on the host. A link is followed the way the
kernel would follow it (``..`` after a link applies to where the link led), but through the map's
entries only, and never above the directory the walk is confined to (the workspace's root, or a
download's): a link to ``/etc/shadow``, to ``../../x`` or to a name the map does not hold leads
nowhere (``Unreachable``), whatever the disk holds.

Names come from the sandbox: a name that is not UTF-8 is kept as ``os.fsdecode`` keeps it
(``surrogateescape``), written back as its own bytes (``os_name``) and shown escaped (``shown``).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..safe_text import visible

WORKSPACE = "/workspace"
"""Where the workspace is in the sandbox: an absolute path under it names the same entry as its relative path."""
MAX_LINK_HOPS = 40
"""Links followed for one path at most, as the kernel's limit (``ELOOP``)."""
MAX_NAME_BYTES = 255
_SHOWN_CHARS = 200


def shown(path: str) -> str:
    """``path`` made safe to print on one line: a byte that is not UTF-8 as ``\\xff``, a control character or
    a bidi override as its escape (``safe_text.visible``), at most 200 characters."""
    try:
        text = path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate that no byte escaped: visible() shows it as \udXXX
        text = path
    text = visible(text, multiline=False)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def original_bytes(text: str) -> bytes | None:
    """``text`` (a name, a link's target) as the bytes it was decoded from (``surrogateescape``), or None when it
    holds a surrogate that escapes no byte."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return None


def os_name(name: str) -> bytes | None:
    """One component of a stored path as the bytes to give the host's filesystem, or None when it cannot be one
    (empty, ``.``, ``..``, a ``/`` or NUL, past 255 bytes, a surrogate that escapes no byte)."""
    if name in ("", ".", "..") or "/" in name or "\x00" in name:
        return None
    raw = original_bytes(name)
    return raw if raw is not None and len(raw) <= MAX_NAME_BYTES else None


class Unreachable(Exception):
    """A path the tree does not lead to; ``outside``: because it (or a link on the way) leads out of where it
    may go, rather than to a name the tree does not hold."""

    def __init__(self, reason: str, *, outside: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.outside = outside


@dataclass(frozen=True)
class Entry:
    """One entry of the stored workspace, as the record holds it."""

    path: str
    kind: str
    """``"f"`` (a regular file), ``"d"`` (a directory) or ``"l"`` (a symlink)."""
    mode: int
    mtime_ns: int
    ref: str
    """A file's blob id, a link's target, ``""`` for a directory."""
    size: int
    """A file's bytes as the store counted them (``blob_sizes``); a link's target's bytes; 0 for a directory."""

    @property
    def name(self) -> str:
        return self.path.rpartition("/")[2]


def parent_of(path: str) -> str:
    """The stored path of ``path``'s directory (``""``: the workspace's root)."""
    return path.rpartition("/")[0]


def tree_order(path: str) -> list[str]:
    """Sort key putting a directory right before its entries (``a``, ``a/b``, ``a.txt``)."""
    return path.split("/")


class FileTree:
    """One generation's workspace (the record's ``files`` map and ``blob_sizes``), read only."""

    def __init__(self, files: Mapping[str, Sequence[Any]], blob_sizes: Mapping[str, int]) -> None:
        self._files = files
        self._sizes = blob_sizes

    def entry(self, path: str) -> Entry | None:
        """The entry at ``path`` itself (a link is not followed), or None; the root (``""``) has none."""
        fields = self._files.get(path)
        if fields is None:
            return None
        kind, mode, mtime_ns, ref = fields
        if kind == "f":
            size = self._sizes.get(ref, 0)
        elif kind == "l":
            size = len(original_bytes(ref) or b"")
        else:
            size = 0
        return Entry(path, kind, mode, mtime_ns, ref, size)

    def below(self, directory: str, *, recursive: bool) -> Iterator[Entry]:
        """The entries in ``directory`` (``""``: the root), or under it at any depth; in no particular order."""
        prefix = directory + "/" if directory else ""
        for path in self._files:
            if path.startswith(prefix) and (recursive or "/" not in path[len(prefix) :]):
                found = self.entry(path)
                if found is not None:
                    yield found

    def resolve(self, path: str, *, start: str = "", floor: str = "", follow_last: bool = True) -> str:
        """The stored path ``path`` leads to, taken from directory ``start``, links followed through the map.

        Args:
            path: ``/``-separated; ``.`` and empty components are skipped, ``..`` goes up where the walk is.
            start: the directory the walk begins in (a link's own directory for its target).
            floor: the directory the walk may never go above (``""``: the workspace's root).
            follow_last: follow a link in the last component too (False: the link itself).

        Raises:
            Unreachable: an absolute link target, ``..`` above ``floor``, a name the map lacks, a component
                that is a file, more than ``MAX_LINK_HOPS`` links.
        """
        if path.startswith("/"):
            raise Unreachable(f"'{shown(path)}' is an absolute path", outside=True)
        where = start.split("/") if start else []
        depth = len(floor.split("/")) if floor else 0
        pending = _components(path)
        hops = 0
        while pending:
            name = pending.pop()
            if name == "..":
                if len(where) <= depth:
                    raise Unreachable(f"'..' leads above '{shown(floor or WORKSPACE)}'", outside=True)
                where.pop()
                continue
            where.append(name)
            here = "/".join(where)
            fields = self._files.get(here)
            if fields is None:
                raise Unreachable(f"nothing is at '{shown(here)}'", outside=False)
            kind, ref = fields[0], fields[3]
            if kind == "l" and (pending or follow_last):
                hops += 1
                if hops > MAX_LINK_HOPS:
                    raise Unreachable(f"more than {MAX_LINK_HOPS} links on the way to '{shown(path)}'", outside=False)
                if ref.startswith("/"):
                    raise Unreachable(f"'{shown(here)}' is a link to '{shown(ref)}', an absolute path", outside=True)
                if not ref:
                    raise Unreachable(f"'{shown(here)}' is a link to nothing", outside=False)
                where.pop()
                pending.extend(_components(ref))
            elif kind != "d" and pending:
                raise Unreachable(f"'{shown(here)}' is not a directory", outside=False)
        return "/".join(where)


def _components(path: str) -> list[str]:
    """``path``'s components to walk, as a stack (the next on top), without the empty and ``.`` ones."""
    return [name for name in reversed(path.split("/")) if name not in ("", ".")]


def normalized(path: str) -> str | None:
    """A path given to the files API as a stored path (``""``: the root), or None when it leads out of the
    workspace: relative to it, or absolute under ``/workspace``; ``..`` taken lexically, as ``os.path.normpath``
    takes it. A NUL leads out too: no name in the workspace holds one."""
    if "\x00" in path:
        return None
    if path.startswith("/"):
        absolute = posixpath.normpath(path)
        if absolute == WORKSPACE:
            return ""
        if not absolute.startswith(WORKSPACE + "/"):
            return None
        return absolute[len(WORKSPACE) + 1 :]
    relative = posixpath.normpath(path) if path else "."
    if relative == ".":
        return ""
    if relative == ".." or relative.startswith("../"):
        return None
    return relative
