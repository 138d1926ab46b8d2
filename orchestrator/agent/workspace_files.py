"""The files API's writes in the sandbox (``file_write``, ``file_remove``): one path of the workspace, never through
a link.

The controller's ``session.files.write`` and ``remove`` are requests to the worker (docs/design/workspace.md, "The
files API"); the checkpoint that follows them saves what they did. A path is relative to the workspace or absolute
under it, taken lexically (``a/../b`` is ``b``); one that leads out of it, names the workspace itself or breaks the
record's rules is refused. Every directory on the way is opened relative to its parent's descriptor with
``O_NOFOLLOW``: a link there (a cell may plant one to ``/etc``) refuses the request, and nothing is written. The
last name is never followed either: a file written there replaces a link (its target untouched), as ``docker cp``
does; a link removed is the link.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat
import time
from typing import List, Tuple

from . import workspace_disk as disk
from .workspace_paths import path_problem


class FileRequestError(Exception):
    """The request cannot be done; the message is the reply's ``reason``."""


def record_path(root: str, path: str) -> str:
    """``path`` as a record path of the workspace at ``root``.

    Raises:
        FileRequestError: it holds a NUL, leads out of the workspace, names the workspace itself, or breaks the
            record's rules (``workspace_paths.path_problem``).
    """
    if "\0" in path:
        raise FileRequestError("the path holds a NUL byte")
    normal = posixpath.normpath(path)
    if normal.startswith("/"):
        if normal != root and not normal.startswith(root + "/"):
            raise FileRequestError("%r is outside the workspace %s" % (path, root))
        normal = normal[len(root) :].lstrip("/") or "."
    if normal == ".." or normal.startswith("../"):
        raise FileRequestError("%r leads out of the workspace" % path)
    if normal == ".":
        raise FileRequestError("%r is the workspace itself, not an entry in it" % path)
    problem = path_problem(normal)
    if problem is not None:
        raise FileRequestError("%r: %s" % (path, problem))
    return normal


def write(root: str, path: str, data: disk.Content, mode: int) -> str:
    """Write ``data`` as the file ``path`` with ``mode`` (its directories made), whole: a new file renamed into place.

    Returns:
        The record path written.

    Raises:
        FileRequestError: the path is refused (``record_path``), goes through a link or a file, is a directory, or
            the disk refused the write.
    """
    rel = record_path(root, path)
    parent_fd, name = _open_parent(root, rel, make=True)
    try:
        st = disk.lstat(parent_fd, name)
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise FileRequestError("%s is a directory" % rel)
        disk.write_file(parent_fd, name, data, mode, time.time_ns())
    except OSError as exc:
        raise FileRequestError("%s cannot be written: %s" % (rel, os.strerror(exc.errno or 0))) from None
    finally:
        os.close(parent_fd)
    return rel


def remove(root: str, path: str, recursive: bool) -> str:
    """Remove the file, link or directory ``path`` (a directory with everything in it only when ``recursive``).

    Returns:
        The record path removed.

    Raises:
        FileRequestError: the path is refused (``record_path``), goes through a link or a file, is not there, is a
            directory that is not empty and ``recursive`` is false, or the disk refused the removal.
    """
    rel = record_path(root, path)
    parent_fd, name = _open_parent(root, rel, make=False)
    try:
        st = disk.lstat(parent_fd, name)
        if st is None:
            raise FileRequestError("no such file or directory in the workspace: %s" % rel)
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=parent_fd)
        elif recursive:
            disk.remove_tree(parent_fd, name)
        else:
            os.rmdir(name, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno == errno.ENOTEMPTY:
            raise FileRequestError("%s is a directory that is not empty (remove it recursively)" % rel) from None
        raise FileRequestError("%s cannot be removed: %s" % (rel, os.strerror(exc.errno or 0))) from None
    finally:
        os.close(parent_fd)
    return rel


def _open_parent(root: str, rel: str, make: bool) -> Tuple[int, bytes]:
    """The open directory ``rel`` is in (made when missing if ``make``) and its last name; never through a link.

    Raises:
        FileRequestError: a directory on the way is a link, not a directory, missing (``make`` false), or cannot be
            made or opened.
    """
    names: List[str] = rel.split("/")
    try:
        fd = os.open(root, disk.DIR_FLAGS)
    except OSError as exc:
        raise FileRequestError("the workspace %s cannot be opened: %s" % (root, os.strerror(exc.errno or 0))) from None
    walked = ""
    try:
        for name in names[:-1]:
            walked = disk.record_path(walked, name)
            raw = disk.os_name(name)
            if make:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(raw, 0o777, dir_fd=fd)
            try:
                child = os.open(raw, disk.DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise FileRequestError(_why_not_a_directory(walked, exc, fd, raw)) from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd, disk.os_name(names[-1])


def _why_not_a_directory(path: str, exc: OSError, dir_fd: int, name: bytes) -> str:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        try:
            link = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except OSError:
            link = False
        if link:
            return "%s is a symbolic link: the workspace's files are never written or removed through a link" % path
        return "%s is not a directory" % path
    if exc.errno == errno.ENOENT:
        return "no such file or directory in the workspace: %s" % path
    return "%s cannot be opened: %s" % (path, os.strerror(exc.errno or 0))
