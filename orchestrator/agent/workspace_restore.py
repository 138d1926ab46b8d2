"""Writing the store's workspace entries into an emptied ``/workspace``, exactly, batch by batch.

The restore path of docs/design/workspace.md ("Restore"): the workspace is emptied, then each
``files_put`` batch is written (directories 0700 first, each file whole under a temporary name with
its mode and mtime and then renamed, links with their mtime), and at the end directories get their
modes and mtimes, deepest first, so writing into them never changes them afterwards. No cell runs
meanwhile; no link is ever followed.
"""

from __future__ import annotations

import os
import stat
from typing import Any, Dict, List, Optional, Tuple

from . import workspace_disk as disk
from .protocol import BadRequest
from .workspace_paths import path_problem

MAX_MTIME_NS = 1 << 63

Row = list  # [path, kind, mode, mtime_ns, ref, size]: an entry as the record and the delta hold it
Key = Optional[Tuple[int, int, int, int, int]]  # disk.stat_key of what was written


class RestoreWriter:
    """Empties the workspace when made, writes batches with ``put``, and gives what it wrote at ``finish``."""

    def __init__(self, root: str) -> None:
        self.root = root
        disk.empty(root)
        self.written: Dict[str, Tuple[Row, Key]] = {}
        self._dirs: List[Tuple[str, int, int]] = []

    def put(self, entries: List[list], read_content: disk.ReadContent) -> None:
        """Write one batch of entries (``[path, kind, mode, mtime_ns, ref, size]``) in path order.

        ``read_content(ref, size)`` gives a file's bytes. An entry's directory is in the batch or
        in an earlier one.

        Raises:
            BadRequest: an entry is malformed, comes twice, or has no directory of the restore to go in.
        """
        fds = disk.DirFds(self.root)
        try:
            for row in sorted((checked(row) for row in entries), key=lambda row: row[0]):
                try:
                    self._put(row, read_content, fds)
                except OSError as exc:  # the disk's refusal (full, say), named after the entry
                    raise OSError(exc.errno, "workspace entry %r: %s" % (row[0], exc.strerror or exc)) from None
        finally:
            fds.close()

    def _put(self, row: Row, read_content: disk.ReadContent, fds: disk.DirFds) -> None:
        path, kind, mode, mtime_ns, ref, size = row
        parent, name = disk.split(path)
        if path in self.written:
            raise BadRequest("the workspace entry %r comes twice" % path)
        if parent and (parent not in self.written or self.written[parent][0][1] != "d"):
            raise BadRequest("the workspace entry %r has no directory to go in" % path)
        parent_fd = fds.get(parent)
        if parent_fd is None:
            raise BadRequest("the directory of %r could not be opened" % path)
        key: Key = None
        if kind == "d":
            try:
                os.mkdir(name, 0o700, dir_fd=parent_fd)
            except FileExistsError:  # a context's directory, made by the restore's context_create: it is this one
                st = disk.lstat(parent_fd, name)
                if st is None or not stat.S_ISDIR(st.st_mode):
                    raise
            self._dirs.append((path, mode, mtime_ns))
        else:
            if kind == "l":
                disk.write_link(parent_fd, name, ref, mtime_ns)
            else:
                data = read_content(ref, size)
                if memoryview(data).nbytes != size:
                    raise BadRequest("the content of %r is not %d bytes" % (path, size))
                disk.write_file(parent_fd, name, data, mode, mtime_ns)
            key = disk.stat_key(os.stat(name, dir_fd=parent_fd, follow_symlinks=False))
        self.written[path] = (row, key)

    def finish(self) -> Dict[str, Tuple[Row, Key]]:
        """Give directories their modes and mtimes, deepest first; every entry written with its ``lstat`` key."""
        fds = disk.DirFds(self.root)
        try:
            for path, mode, mtime_ns in sorted(self._dirs, key=lambda d: -d[0].count("/")):
                parent, name = disk.split(path)
                parent_fd = fds.get(parent)
                if parent_fd is None:
                    raise OSError("the directory of %r could not be opened" % path)
                self.written[path] = (
                    self.written[path][0],
                    disk.stat_key(disk.set_dir(parent_fd, name, mode, mtime_ns)),
                )
        finally:
            fds.close()
        return self.written


def contents_of(entries: List[Any], body: disk.Content) -> disk.ReadContent:
    """``read_content`` for a ``files_put`` batch: its body holds the entries of kind ``f``, in their order, each
    ``size`` bytes (``request_table.read_files_put`` checked that they add up to the body).

    The content given is a view of ``body``, looked up by (``ref``, ``size``): identical files share one.
    """
    view = memoryview(body).cast("B")
    found: Dict[Tuple[str, int], memoryview] = {}
    offset = 0
    for entry in entries:
        if entry[1] == "f":
            size = entry[5]
            if isinstance(entry[4], str):
                found.setdefault((entry[4], size), view[offset : offset + size])
            offset += size

    def read_content(ref: str, size: int) -> disk.Content:
        content = found.get((ref, size))
        if content is None:
            raise BadRequest("no content of %d bytes for the blob %r in the batch" % (size, ref))
        return content

    return read_content


def checked(row: object) -> Row:
    """A restored entry, validated (the host checked it too; a bug must not write something else).

    Raises:
        BadRequest: it is not ``[path, kind, mode, mtime_ns, ref, size]`` within the record's rules.
    """
    if not isinstance(row, (list, tuple)) or len(row) != 6:
        raise BadRequest("a workspace entry is [path, kind, mode, mtime_ns, ref, size]")
    path, kind, mode, mtime_ns, ref, size = row
    ints = (mode, mtime_ns, size)
    if not isinstance(path, str) or not isinstance(ref, str) or not all(type(n) is int for n in ints):
        raise BadRequest("a workspace entry is [path, kind, mode, mtime_ns, ref, size]")
    problem = path_problem(path)
    if problem is not None:
        raise BadRequest("workspace entry %r: %s" % (path, problem))
    if kind not in ("f", "d", "l") or not 0 <= mode <= 0o777 or not 0 <= mtime_ns < MAX_MTIME_NS or size < 0:
        raise BadRequest("workspace entry %r: bad kind, mode, mtime or size" % path)
    if kind == "l" and not _link_target_ok(ref):
        raise BadRequest("workspace entry %r: bad link target" % path)
    return [path, kind, mode, mtime_ns, ref, size]


def _link_target_ok(target: str) -> bool:
    try:
        raw = disk.os_name(target)
    except UnicodeEncodeError:
        return False
    return 0 < len(raw) <= disk.MAX_LINK_BYTES and b"\0" not in raw
