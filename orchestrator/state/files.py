"""The record's ``files`` map: one generation's workspace, as the host keeps it, and every rule it obeys.

``{path: (kind, mode, mtime_ns, ref)}`` (docs/design/workspace.md, "The record"): ``path`` relative
to ``/workspace``; ``kind`` ``f`` (a file: ``ref`` its blob's 32-hex digest, the blob in the
record's ``blob_sizes`` like a value's), ``d`` (a directory: ``ref`` ``""``) or ``l`` (a symlink:
``ref`` its target, never followed); ``mode`` the permission bits; ``mtime_ns`` in ``[0, 2**63)``.

A name that is not UTF-8 comes from the sandbox as its filesystem gave it (``surrogateescape``)
and is kept so: a path is valid only in the one form that encodes back to its bytes, so two keys
can never name one file. The map is a tree (every entry's parent a directory of it, or the root)
and bounded as the variables are: at most the session's ``workspace_files`` entries (never past
``MAX_FILE_ENTRIES``) and ``MAX_MAP_PATH_BYTES`` of paths as stored. The ledger checks a delta
against these rules before it commits (``entries``, ``apply``, ``limits``); the store checks a
record it reads (``loaded``), so what is committed can be read back and nothing else is.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, TypeGuard

from ..agent.reply_types import FileChange
from ..agent.workspace_paths import file_name_bytes, path_problem
from ..wire.replies import DIGEST, MAX_FILE_ENTRIES, MAX_PATH_CHARS

Entry = tuple[str, int, int, str]
"""One path's state: kind, mode, mtime_ns, ref."""
FILE, DIRECTORY, LINK = "f", "d", "l"
MAX_PATH_BYTES = MAX_PATH_CHARS
"""A path or a link target, in bytes as the filesystem holds it (PATH_MAX)."""
MAX_MODE = 0o777
"""Permission bits only: setuid, setgid and sticky never come back (the mount is nosuid)."""
MTIME_END = 1 << 63
DEFAULT_ENTRIES = 10_000
"""``Settings.limits.workspace_files`` unless set: files, directories and links together."""
MAX_MAP_PATH_BYTES = 4 << 20
"""Bytes of one generation's paths as the record stores them (UTF-8, a lone surrogate as three)."""
MAX_CHANGED_LISTED = 1000
"""Paths ``files_changed`` lists; past it the list ends with ``"/+N more"`` (no path starts with ``/``)."""
UNSAVED_PREFIX = "/workspace/"
"""The record's ``unsaved`` names a path that could not be kept as this and the path: one namespace with the
variables', which no variable name starts (``unsaved.owner``)."""


def entry_problem(kind: object, mode: object, mtime_ns: object, ref: object) -> str | None:
    """Why ``(kind, mode, mtime_ns, ref)`` cannot be a path's entry, or None when it can."""
    if not _is_int(mode) or not 0 <= mode <= MAX_MODE:
        return f"a mode is not from 0 to 0o{MAX_MODE:o}"
    if not _is_int(mtime_ns) or not 0 <= mtime_ns < MTIME_END:
        return "an mtime is not from 0 to 2**63 - 1 nanoseconds"
    if not isinstance(ref, str):
        return "a ref is not a str"
    if kind == FILE:
        return None if DIGEST.match(ref) else "a file's ref is not a 32-hex digest"
    if kind == DIRECTORY:
        return None if ref == "" else "a directory's ref is not empty"
    if kind == LINK:
        raw = file_name_bytes(ref) if len(ref) <= MAX_PATH_BYTES else None
        if raw is None or not 0 < len(raw) <= MAX_PATH_BYTES or b"\0" in raw:
            return f"a link target is not 1 to {MAX_PATH_BYTES} bytes of a file name without NUL"
        return None
    return "a kind is not 'f', 'd' or 'l'"


def entries(changed: Sequence[FileChange]) -> tuple[dict[str, Entry], dict[str, int]]:
    """A delta's changed entries as the map holds them, and each file blob's size as the delta claims it.

    Raises:
        ValueError: an entry breaks a rule, a path is listed twice, or one digest is given two sizes.
    """
    found: dict[str, Entry] = {}
    sizes: dict[str, int] = {}
    for path, kind, mode, mtime_ns, ref, size in changed:
        problem = path_problem(path) or entry_problem(kind, mode, mtime_ns, ref)
        if problem is not None:
            raise ValueError(f"{problem}: {_shown(path)}")
        if path in found:
            raise ValueError(f"a path is listed twice: {_shown(path)}")
        if kind != FILE and size != 0:
            raise ValueError(f"a directory or link has a size: {_shown(path)}")
        if kind == FILE and sizes.setdefault(ref, size) != size:
            raise ValueError(f"blob {ref} is given two sizes")
        found[path] = (kind, mode, mtime_ns, ref)
    return found, sizes


def apply(files: Mapping[str, Entry], changed: Mapping[str, Entry], deleted: Iterable[str]) -> dict[str, Entry]:
    """The map after a delta: ``deleted`` paths removed (a directory with everything under it; a path the map does
    not hold is already gone), then ``changed`` set. ``files`` is a valid tree; ``changed`` holds valid entries.

    Raises:
        ValueError: a deleted path is invalid or listed twice, or the result is not a tree (an entry whose parent
            is not a directory of it: a directory replaced by a file without deleting what it held, say).
    """
    result = dict(files)
    gone: set[str] = set()
    for path in deleted:
        problem = path_problem(path)
        if problem is not None or path in gone:
            raise ValueError(f"{problem or 'a deleted path is listed twice'}: {_shown(path)}")
        gone.add(path)
    directories = {path for path in gone if files.get(path, ("",))[0] == DIRECTORY}
    for path in gone:
        result.pop(path, None)
    if directories:
        for path in [path for path in result if _under(path, directories)]:
            del result[path]
    result.update(changed)
    unmade = any(  # a directory that is something else now, though not deleted: did it hold anything?
        entry[0] != DIRECTORY and path not in gone and files.get(path, ("",))[0] == DIRECTORY
        for path, entry in changed.items()
    )
    problem = tree_problem(result, result if unmade else changed)
    if problem is not None:
        raise ValueError(problem)
    return result


def tree_problem(files: Mapping[str, Entry], paths: Iterable[str]) -> str | None:
    """Why ``files`` is not a tree at ``paths`` (the parent of each must be a directory of it, or the root)."""
    for path in paths:
        parent = path.rpartition("/")[0]
        if parent and files.get(parent, ("",))[0] != DIRECTORY:
            return f"the parent of {_shown(path)} is not a directory of the workspace"
    return None


def limits(files: Mapping[str, Entry], max_entries: int) -> list[tuple[str, int, int]]:
    """``(unit, held, limit)`` of each bound of the map: its entries (``max_entries``, the session's
    ``workspace_files``, at most ``MAX_FILE_ENTRIES``) and its paths' stored bytes."""
    return [
        ("workspace entries", len(files), entry_limit(max_entries)),
        ("workspace path bytes", path_bytes(files), MAX_MAP_PATH_BYTES),
    ]


def entry_limit(max_entries: int) -> int:
    """The entries a session's workspace may hold: its ``workspace_files``, never past ``MAX_FILE_ENTRIES``."""
    return min(max_entries, MAX_FILE_ENTRIES)


def path_bytes(files: Collection[str]) -> int:
    """Bytes of the paths as the record stores them; counted by characters when that bound already settles it."""
    chars = sum(map(len, files))
    if 4 * chars <= MAX_MAP_PATH_BYTES:  # a character is at most 4 bytes
        return chars
    return sum(len(path.encode("utf-8", "surrogatepass")) for path in files)


def digests(files: Mapping[str, Entry]) -> set[str]:
    """The blobs of the map's files (each must be in the record's ``blob_sizes``)."""
    return {ref for kind, _, _, ref in files.values() if kind == FILE}


def changed_paths(before: Mapping[str, Entry], after: Mapping[str, Entry], paths: Iterable[str]) -> list[str]:
    """Which of ``paths`` differ between the maps, sorted; a path removed with its directory is left out (the
    directory says it), and past ``MAX_CHANGED_LISTED`` the list ends with a count of the rest."""
    changed = sorted({path for path in paths if before.get(path) != after.get(path)})
    changed = [path for path in changed if path in after or not _removed_parent(path, before, after)]
    if len(changed) <= MAX_CHANGED_LISTED:
        return changed
    listed = changed[: MAX_CHANGED_LISTED - 1]
    return [*listed, f"/+{len(changed) - len(listed)} more"]


def unsaved(report: Mapping[str, str]) -> dict[str, str]:
    """A delta's ``files.unsaved`` as the record's ``unsaved`` keys them (``UNSAVED_PREFIX`` and the path).

    Raises:
        ValueError: a key is not a valid path.
    """
    for path in report:
        problem = path_problem(path)
        if problem is not None:
            raise ValueError(f"unsaved names an invalid path ({problem}): {_shown(path)}")
    return {UNSAVED_PREFIX + path: reason for path, reason in report.items()}


def loaded(value: Any, known: Mapping[str, Entry]) -> dict[str, Entry]:
    """A stored map, checked whole (paths, entries, tree, bounds: up to ``MAX_FILE_ENTRIES``), entries as tuples;
    an entry ``known`` holds (another generation's map, checked) is that very tuple, not checked again.

    Raises:
        ValueError: anything is off.
    """
    if not isinstance(value, dict) or len(value) > MAX_FILE_ENTRIES:
        raise ValueError(f"not a map of at most {MAX_FILE_ENTRIES} paths")
    result: dict[str, Entry] = {}
    for path, entry in value.items():
        if not isinstance(entry, list) or len(entry) != 4:
            raise ValueError(f"an entry is not [kind, mode, mtime_ns, ref]: {_shown(path)}")
        same = known.get(path)
        if same is not None and same == tuple(entry):  # kept generations repeat most of the current one's
            result[path] = same
            continue
        problem = path_problem(path) or entry_problem(*entry)
        if problem is not None:
            raise ValueError(problem)
        result[path] = (entry[0], entry[1], entry[2], entry[3])
    problem = tree_problem(result, result)
    if problem is not None or path_bytes(result) > MAX_MAP_PATH_BYTES:
        raise ValueError(problem or f"its paths take more than {MAX_MAP_PATH_BYTES} bytes")
    return result


def changed_list_ok(value: Any) -> bool:
    """Whether ``value`` is a ``files_changed`` list as ``changed_paths`` makes them."""
    if not isinstance(value, list) or len(value) > MAX_CHANGED_LISTED:
        return False
    paths = value[:-1] if value and isinstance(value[-1], str) and _is_more(value[-1]) else value
    return all(path_problem(path) is None for path in paths)


def _is_more(text: str) -> bool:
    count, _, rest = text.removeprefix("/+").partition(" ")
    return text.startswith("/+") and rest == "more" and count.isascii() and count.isdigit()


def _removed_parent(path: str, before: Mapping[str, Entry], after: Mapping[str, Entry]) -> bool:
    """Whether ``path``'s directory is gone too (removed, or something else now)."""
    parent = path.rpartition("/")[0]
    return bool(parent) and parent in before and after.get(parent, ("",))[0] != DIRECTORY


def _under(path: str, directories: set[str]) -> bool:
    """Whether an ancestor of ``path`` is in ``directories``."""
    parent = path.rpartition("/")[0]
    while parent:
        if parent in directories:
            return True
        parent = parent.rpartition("/")[0]
    return False


def _is_int(value: object) -> TypeGuard[int]:
    return type(value) is int


def _shown(path: object) -> str:
    return repr(path[:80]) + ("..." if len(path) > 80 else "") if isinstance(path, str) else type(path).__name__
