"""The files of ``/workspace`` as part of the checkpoint: what changed since the last one, and a restore.

Runs in the sandbox worker (standard library only). After every call the worker asks for the
``files`` part of the checkpoint delta (docs/design/workspace.md, "The delta"): the entries created
or changed, the paths deleted, and what cannot be saved with the reason, plus the new content
blobs, each file's bytes named by ``blob_format.blob_digest`` as values' blobs are. A call that
changed no file costs no scan: inotify events say which paths to look at, and without events
nothing is looked at ("Tracking changes without a scan"). When the events cannot be trusted (the
queue overflowed, a directory has no watch, the descriptor was closed or replaced by the cell, no
inotify at all, after a restore) the next delta walks the tree instead, reading only files whose
``lstat`` changed. What is sent becomes the baseline: the store holds it.

The worker's hooks: ``start`` once; ``checkpoint`` after the values' delta at every checkpoint
(``delta`` is the same without the worker's types); ``begin_restore`` with ``restore_begin``,
``put`` per ``files_put`` batch and ``finish_restore`` when the restore ends.
"""

from __future__ import annotations

import contextlib
import os
import stat
from typing import Callable, Container, ContextManager, Dict, List, NamedTuple, Optional, Set, Tuple

from . import blob_format, checkpoint, workspace_restore
from . import workspace_disk as disk
from . import workspace_inotify as inotify
from .protocol import BadRequest
from .workspace_paths import path_problem

_KEPT = "; its last saved version is kept"

Row = workspace_restore.Row
Armed = Callable[[], ContextManager[None]]  # the worker's interrupt armed while it is entered (SIGUSR2: out of time)


class _Saved(NamedTuple):
    """An entry as the store holds it, and the ``lstat`` it was saved from (``key``: None until known)."""

    kind: str
    mode: int
    mtime_ns: int
    ref: str
    size: int
    key: Optional[tuple]

    def row(self, path: str) -> Row:
        return [path, self.kind, self.mode, self.mtime_ns, self.ref, self.size]

    def same_record(self, other: "_Saved") -> bool:
        return self[:5] == other[:5]


class _Run:
    """One delta in the making: rows, deletions, and the blobs the host does not hold yet."""

    def __init__(self, held: Container[str], had: Set[str], limit: Optional[int]) -> None:
        self.held = held  # the values' blobs the host holds
        self.had = had  # the blobs the workspace's baseline held when the delta began: the host holds them
        self.limit = limit  # bytes the saved files' distinct blobs may hold after this delta (None: no quota)
        self.sent: Set[str] = set()
        self.blobs: List[checkpoint.Blob] = []
        self.changed: List[Row] = []
        self.deleted: List[str] = []

    def send(self, blob: checkpoint.Blob) -> None:
        """Put ``blob`` in the delta unless the host holds it or it is in already."""
        digest = blob.digest
        if digest not in self.held and digest not in self.had and digest not in self.sent:
            self.sent.add(digest)
            self.blobs.append(blob)


def _parent(path: str) -> str:
    return path.rpartition("/")[0]


def _mtime(st: os.stat_result) -> int:
    """The record's mtime: one before 1970 is saved as 0 (the record holds [0, 2**63))."""
    return max(st.st_mtime_ns, 0)


def _under(path: str, roots: Set[str]) -> bool:
    """True when an ancestor of ``path`` (not ``path`` itself) is in ``roots``."""
    while path:
        path = _parent(path)
        if path in roots:
            return True
    return False


class Workspace:
    """The tracked directory tree under ``root``: its baseline (what the store holds), watches and bounds.

    Args:
        root: the workspace directory (``/workspace``); never followed through a link below it.
        max_entries: files, directories and links saved at most (the rest is named in ``unsaved``).
        max_bytes: bytes of files saved at most, all files together.
        max_file_bytes: bytes of one file saved at most.
    """

    def __init__(self, root: str, max_entries: int, max_bytes: int, max_file_bytes: int) -> None:
        self.root = os.path.realpath(root)
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_file_bytes = max_file_bytes
        self._saved: Dict[str, _Saved] = {}
        self._refs: Dict[str, int] = {}  # digest -> saved files holding it
        self._bytes = 0  # sizes of the saved files, added up
        self._blob_bytes = 0  # sizes of their distinct blobs
        self._unsaved: Dict[str, str] = {}  # path -> why it is not saved now (complete)
        # The unsaved of the last delta that listed files; None until one did since the worker started
        # or restored: the record may name what this workspace does not hold (a FIFO not restored).
        self._reported: Optional[Dict[str, str]] = None
        self._events: Optional[inotify.Inotify] = None
        self._wd_path: Dict[int, str] = {}
        self._path_wd: Dict[str, int] = {}
        self._blind = False  # a directory could not be watched: only a scan sees everything
        self._rescan: Optional[str] = "the workspace was not scanned yet"  # why the next delta walks the tree
        self._writer: Optional[workspace_restore.RestoreWriter] = None  # during a restore
        self._undo: Optional[List[Tuple[str, Optional[_Saved]]]] = None  # (path, entry before) while a delta runs
        self.last_scan: Optional[str] = None  # why the last full scan happened (diagnostics, tests)

    # -- the worker's hooks

    def start(self) -> None:
        """Make the inotify descriptor; the first delta walks the tree and reports what it holds."""
        self._events = inotify.Inotify.open()
        self._rescan = "the workspace was not scanned yet"

    def close(self) -> None:
        self._stop_watching()

    @property
    def blob_bytes(self) -> int:
        """Bytes of the distinct blobs the saved files hold: what the workspace counts in the checkpoint quota."""
        return self._blob_bytes

    def delta(
        self, held: Container[str], limit: Optional[int] = None, armed: Armed = contextlib.nullcontext
    ) -> Tuple[Optional[dict], List[checkpoint.Blob]]:
        """What changed since the last delta (or restore): the delta's ``files`` object and the new blobs.

        ``files`` is None when nothing changed (``unsaved`` included); else ``unsaved`` in it is
        complete. The blobs are the contents of changed files that neither ``held`` (the blobs the
        host holds for values) nor the workspace's baseline holds, each once; identical files share
        one. ``limit``: bytes the saved files' distinct blobs may hold after this delta (what the
        values left of the checkpoint quota; None: no quota); a file whose new blob does not fit is
        named unsaved (what this delta deletes or replaces frees room for it). What is returned is
        the new baseline.

        ``armed`` is entered around the work (not when no event came): the worker's interrupt may
        raise KeyboardInterrupt inside it. An exception (that KeyboardInterrupt, an unexpected
        ``OSError``) leaves the baseline as it was, and the next delta walks the tree.
        """
        if self._writer is not None:  # a restore is under way: its end gives the baseline
            return None, []
        unsaved_before, self._undo = self._unsaved, []  # _scan and _update change a copy of _unsaved
        fds = disk.DirFds(self.root)
        try:
            dirty = self._pending()
            if dirty is not None and not dirty:
                return None, []
            run = _Run(held, set(self._refs), limit)
            self._unsaved = dict(self._unsaved)
            with armed():  # left before the baseline is final: an interrupt past it cannot be raised
                if dirty is None:
                    self._scan(run, fds)
                else:
                    self._update(dirty | set(self._unsaved), run, fds)
        except BaseException:  # events read and not acted on are lost: only a scan can tell now
            self._roll_back(unsaved_before)
            raise
        finally:
            self._undo = None
            fds.close()
        if not (run.changed or run.deleted) and self._unsaved == self._reported:
            return None, []
        self._reported = dict(self._unsaved)
        unsaved = checkpoint.listed(dict(sorted(self._unsaved.items())))
        return {"changed": run.changed, "deleted": sorted(run.deleted), "unsaved": unsaved}, run.blobs

    def checkpoint(
        self, description: dict, parts: list, tracker: checkpoint.Tracker, armed: Armed = contextlib.nullcontext
    ) -> None:
        """The worker's hook after the values' delta: add the workspace's delta to ``description`` and ``parts``.

        The blobs the values hold (``tracker.held``) are not sent again; with a quota, files get
        the room the values left (the values' delta counted ``blob_bytes``, what the files held,
        as ``tracker.held.files_bytes``). A delta whose files changed anything advances the
        generation, as a changed variable does. ``armed`` as for ``delta``: out of time, it gives
        up, and the files go in a later checkpoint.
        """
        limit = None
        if tracker.quota:
            limit = max(0, tracker.quota - tracker.held.bytes)
        try:
            files, blobs = self.delta(tracker.held.refs, limit, armed)
        except KeyboardInterrupt:  # out of time (the worker's SIGUSR2): the next checkpoint scans and sends them
            return
        if files is None:
            return
        if (files["changed"] or files["deleted"]) and not (description["vars"] or description["deleted"]):
            tracker.generation += 1
            description["generation"] = tracker.generation
        description["files"] = files
        listed = set(entry["digest"] for entry in description["blobs"])
        for blob in blobs:
            if blob.digest not in listed:
                listed.add(blob.digest)
                description["blobs"].append({"digest": blob.digest, "size": blob.size})
                parts.extend(blob.parts)

    # -- events

    def _pending(self) -> Optional[Set[str]]:
        """The paths events named since the last delta; None when events cannot be trusted (walk the tree)."""
        if self._blind and self._rescan is None:
            self._rescan = "a directory could not be watched"
        dirty: Set[str] = set()
        if self._events is None:
            self._rescan = self._rescan or "no inotify"
        elif not self._events.intact():
            self._restart_watching()
            self._rescan = "the inotify descriptor was closed or replaced"
        else:
            try:
                events = self._events.read()
            except OSError:
                self._restart_watching()
                self._rescan = "the inotify descriptor could not be read"
            else:
                self._mark(events, dirty)
        return None if self._rescan is not None else dirty

    def _mark(self, events: List[inotify.Event], dirty: Set[str]) -> None:
        for wd, mask, name in events:
            if mask & (inotify.IN_Q_OVERFLOW | inotify.IN_UNMOUNT):
                self._rescan = "inotify's queue overflowed"
                continue
            path = self._wd_path.get(wd)
            if path is None:
                continue
            if mask & inotify.IN_IGNORED:  # the watch is gone (its directory was deleted, or we removed it)
                del self._wd_path[wd]
                if self._path_wd.get(path) == wd:
                    del self._path_wd[path]
                continue
            if name:
                dirty.add(disk.record_path(path, disk.record_name(name)))
            if path:  # the directory itself: its mtime moved, or it went
                dirty.add(path)

    def _watch(self, path: str, fd: int) -> None:
        if self._events is None:
            return
        try:
            wd = self._events.add(fd, os.path.join(os.fsencode(self.root), disk.os_name(path)))
        except inotify.WatchFailed:
            self._blind = True
            return
        old = self._wd_path.get(wd)
        if old is not None and old != path:  # a directory watched before under another name: it moved
            self._path_wd.pop(old, None)
        replaced = self._path_wd.get(path)
        if replaced is not None and replaced != wd:  # another directory had this name: it went elsewhere
            self._wd_path.pop(replaced, None)
            self._events.remove(replaced)
        self._wd_path[wd] = path
        self._path_wd[path] = wd

    def _unwatch(self, roots: Set[str]) -> None:
        """Drop the watches of these directories and of everything under them (they went or are not directories)."""
        for path in [p for p in self._path_wd if p in roots or _under(p, roots)]:
            wd = self._path_wd.pop(path)
            if self._wd_path.get(wd) == path:
                del self._wd_path[wd]
            if self._events is not None:
                self._events.remove(wd)

    def _stop_watching(self) -> None:
        if self._events is not None:
            self._events.close()
        self._events = None
        self._wd_path.clear()
        self._path_wd.clear()

    def _restart_watching(self) -> None:
        self._stop_watching()
        self._events = inotify.Inotify.open()

    # -- looking at the tree

    def _scan(self, run: _Run, fds: disk.DirFds) -> None:
        """Walk everything (events could not be trusted): rewatch every directory, compare every entry."""
        self.last_scan, self._rescan, self._blind = self._rescan, None, False
        old_watches = dict(self._wd_path)
        self._wd_path.clear()
        self._path_wd.clear()
        seen: Dict[str, os.stat_result] = {}
        unlisted: Dict[str, str] = {}
        try:
            root_fd = fds.get("")
        except OSError:
            root_fd = None
        if root_fd is None:  # no workspace here (yet): nothing to save, and the next delta looks again
            missing = "the workspace directory %s is missing" % self.root
        else:
            missing = None
            disk.walk("", root_fd, self._watch, seen, unlisted)
        if self._events is not None:
            for wd in set(old_watches) - set(self._wd_path):
                self._events.remove(wd)
        listed_roots = set(unlisted)
        gone = {p for p in self._saved if p not in seen and not _under(p, listed_roots)}
        self._unsaved = {}
        self._reconcile(seen, gone, unlisted, run, fds)
        self._rescan = missing

    def _update(self, dirty: Set[str], run: _Run, fds: disk.DirFds) -> None:
        """Look at the paths events named, and walk the directories that are new (or not watched)."""
        seen: Dict[str, os.stat_result] = {}
        missing: Set[str] = set()
        walked: Set[str] = set()
        unlisted: Dict[str, str] = {}
        for path in sorted(dirty):
            if path in seen or _under(path, missing):
                continue
            parent, name = disk.split(path)
            try:
                parent_fd = fds.get(parent)
                st = None if parent_fd is None else disk.lstat(parent_fd, name)
                if st is None:
                    missing.add(path)
                    continue
                seen[path] = st
                if stat.S_ISDIR(st.st_mode) and self._unknown_inside(path, st):
                    dir_fd = fds.get(path)
                    if dir_fd is not None:
                        walked.add(path)
                        disk.walk(path, dir_fd, self._watch, seen, unlisted)
            except OSError as exc:  # cannot be looked at now (no search permission): its saved state stays
                unlisted[path if path in seen else parent] = os.strerror(exc.errno or 0)
        not_dirs = {p for p in missing if p in self._saved} | {
            p for p, st in seen.items() if p in self._saved and not stat.S_ISDIR(st.st_mode)
        }
        went = {p for p in not_dirs if self._saved[p].kind == "d"}
        gone = {p for p in missing if p in self._saved}
        if went:
            gone.update(p for p in self._saved if _under(p, went))
            self._unwatch(went)
        rewalked = {p for p in walked if p in self._saved and self._saved[p].kind == "d"}  # new ones hold nothing saved
        if rewalked:  # a walk saw all a directory holds: what it did not see went
            unknown = set(unlisted)
            gone.update(p for p in self._saved if p not in seen and _under(p, rewalked) and not _under(p, unknown))
        looked_at = missing | went
        for path in [p for p in self._unsaved if p in seen or p in missing or _under(p, looked_at)]:
            del self._unsaved[path]
        self._reconcile(seen, gone, unlisted, run, fds)

    def _unknown_inside(self, path: str, st: os.stat_result) -> bool:
        """True when the events say nothing of what the directory at ``path`` holds: it must be walked.

        That is one new to the record, another directory now under that name, one without a
        watch, or one whose mode changed (it may have been unreadable until now).
        """
        prev = self._saved.get(path)
        if prev is None or prev.kind != "d" or path not in self._path_wd or prev.key is None:
            return True
        return prev.key[:2] != (st.st_mode, st.st_ino)

    def _reconcile(
        self, seen: Dict[str, os.stat_result], gone: Set[str], unlisted: Dict[str, str], run: _Run, fds: disk.DirFds
    ) -> None:
        """Drop what went, then save what was seen, parents first; the rest goes in ``unsaved``."""
        for path in gone:
            self._drop(path)
        run.deleted.extend(p for p in gone if _parent(p) not in gone)
        for path in sorted(seen):
            self._consider(path, seen[path], run, fds)
        for path, reason in unlisted.items():
            if path in self._saved:
                self._unsaved[path] = "its entries cannot be listed (%s); their last saved versions are kept" % reason

    def _consider(self, path: str, st: os.stat_result, run: _Run, fds: disk.DirFds) -> None:
        prev = self._saved.get(path)
        if prev is not None and prev.key == disk.stat_key(st):  # unchanged: the common case of a scan
            return
        parent = _parent(path)
        if parent and (parent not in self._saved or self._saved[parent].kind != "d"):
            return  # under a directory that is not saved: its own entry in ``unsaved`` covers this one
        reason = path_problem(path)
        entry: Optional[_Saved] = None
        if reason is None:
            for _attempt in range(2):
                try:
                    entry = self._entry(path, st, run, fds)
                    break
                except disk.Unsaved as exc:
                    reason = str(exc)
                    break
                except OSError as exc:
                    reason = "it cannot be read: %s" % os.strerror(exc.errno or 0)
                    break
                except disk.Raced:
                    again = self._lstat(path, fds)
                    if again is None:  # it went meanwhile: the next events say so too
                        return
                    st = again
            else:
                reason = "it kept changing while it was read"
        if entry is None:
            if stat.S_ISDIR(st.st_mode):
                reason = "%s (with everything in it)" % reason
            self._unsaved[path] = reason + _KEPT if path in self._saved else reason
            return
        prev = self._saved.get(path)
        if prev is not entry:  # a directory that is a directory no more lost its entries in _update or _scan
            if prev is None or not prev.same_record(entry):
                run.changed.append(entry.row(path))
            self._drop(path)
            self._hold(path, entry)

    def _entry(self, path: str, st: os.stat_result, run: _Run, fds: disk.DirFds) -> _Saved:
        """The entry to save for ``path`` as ``lstat`` found it (the saved one itself when unchanged).

        Raises:
            disk.Unsaved: it cannot be saved.
            disk.Raced: it changed under us.
        """
        kind = disk.kind_of(st.st_mode)
        if kind is None:
            raise disk.Unsaved(disk.special_reason(st.st_mode))
        prev = self._saved.get(path)
        key = disk.stat_key(st)
        if prev is not None and prev.key == key:
            return prev
        if prev is None and len(self._saved) >= self.max_entries:
            raise disk.Unsaved("the workspace saves at most %d entries" % self.max_entries)
        mode = stat.S_IMODE(st.st_mode) & 0o777
        if kind == "d":
            return _Saved("d", mode, _mtime(st), "", 0, key)
        parent, name = disk.split(path)
        parent_fd = fds.get(parent)
        if parent_fd is None:
            raise disk.Raced()
        if kind == "l":
            target = disk.read_link(parent_fd, name)
            again = disk.lstat(parent_fd, name)
            if again is None or disk.stat_key(again) != key:
                raise disk.Raced()
            return _Saved("l", mode, _mtime(st), target, 0, key)
        self._check_file(st, prev)
        data, st = disk.read_file(parent_fd, name, self.max_file_bytes)
        self._check_file(st, prev)
        blob = checkpoint.Blob([data] if data else [], len(data), blob_format.blob_digest(data))
        self._check_room(run, blob, prev)
        run.send(blob)
        return _Saved("f", stat.S_IMODE(st.st_mode) & 0o777, _mtime(st), blob.digest, blob.size, disk.stat_key(st))

    def _check_room(self, run: _Run, blob: checkpoint.Blob, prev: Optional[_Saved]) -> None:
        """Refuse a new blob the quota has no room for (the files' distinct blobs, ``prev``'s freed if only it held it).

        Raises:
            disk.Unsaved: with it the files' blobs would hold more than ``run.limit``.
        """
        if run.limit is None or blob.digest in self._refs:  # a saved file holds these bytes: nothing new
            return
        freed = prev.size if prev is not None and prev.kind == "f" and self._refs.get(prev.ref) == 1 else 0
        if self._blob_bytes - freed + blob.size > run.limit:
            raise disk.Unsaved("the checkpoint quota has no room for its %d bytes" % blob.size)

    def _lstat(self, path: str, fds: disk.DirFds) -> Optional[os.stat_result]:
        parent, name = disk.split(path)
        try:
            parent_fd = fds.get(parent)
            return None if parent_fd is None else disk.lstat(parent_fd, name)
        except OSError:
            return None

    def _check_file(self, st: os.stat_result, prev: Optional[_Saved]) -> None:
        if st.st_nlink != 1:
            raise disk.Unsaved("a file with %d hard links cannot be saved" % st.st_nlink)
        if st.st_size > self.max_file_bytes:
            raise disk.Unsaved("the file is larger than %d bytes" % self.max_file_bytes)
        if self._bytes - (prev.size if prev is not None else 0) + st.st_size > self.max_bytes:
            raise disk.Unsaved("the workspace saves at most %d bytes of files" % self.max_bytes)

    # -- the baseline

    def _hold(self, path: str, entry: _Saved) -> None:
        if self._undo is not None:
            self._undo.append((path, self._saved.get(path)))
        self._saved[path] = entry
        if entry.kind == "f":
            self._count(entry, 1)

    def _drop(self, path: str) -> None:
        if self._undo is not None and path in self._saved:
            self._undo.append((path, self._saved[path]))
        entry = self._saved.pop(path, None)
        if entry is not None and entry.kind == "f":
            self._count(entry, -1)

    def _count(self, entry: _Saved, step: int) -> None:
        """A saved file's blob held once more (1) or once less (-1): ``_refs``, ``_bytes``, ``_blob_bytes``."""
        count = self._refs.get(entry.ref, 0) + step
        if count:
            self._refs[entry.ref] = count
        else:
            del self._refs[entry.ref]
        if count == (1 if step > 0 else 0):
            self._blob_bytes += step * entry.size
        self._bytes += step * entry.size

    def _roll_back(self, unsaved: Dict[str, str]) -> None:
        """Put the baseline back as it was before a delta that did not finish; the next delta walks the tree."""
        undo, self._undo = self._undo or [], None
        for path, entry in reversed(undo):
            if entry is None:
                self._saved.pop(path, None)
            else:
                self._saved[path] = entry
        self._refs, self._bytes, self._blob_bytes = {}, 0, 0  # counted again: an interrupt may have cut a count
        for entry in self._saved.values():
            if entry.kind == "f":
                self._count(entry, 1)
        self._unsaved = unsaved
        self._rescan = "the last delta did not finish"

    # -- restore

    @property
    def restoring(self) -> bool:
        """A restore began and did not finish: ``put`` batches are taken."""
        return self._writer is not None

    def begin_restore(self) -> None:
        """Empty the workspace and forget the baseline: ``put`` batches follow, then ``finish_restore``."""
        self._stop_watching()
        self._saved, self._refs, self._bytes, self._blob_bytes = {}, {}, 0, 0
        self._unsaved, self._reported = {}, None
        self._rescan = "the restore did not finish"
        self._writer = workspace_restore.RestoreWriter(self.root)

    def put(self, entries: List[list], read_content: disk.ReadContent) -> None:
        """Write one ``files_put`` batch of the store's entries (``RestoreWriter.put``).

        Raises:
            BadRequest: an entry is malformed, comes twice, or has no directory of the restore to
                go in; or no restore began.
        """
        if self._writer is None:
            raise BadRequest("files_put outside a restore")
        self._writer.put(entries, read_content)

    def finish_restore(self) -> None:
        """Give directories their modes and mtimes: what the store holds is on disk and is the baseline.

        The next delta walks the tree once (watching it again) and, unless something changed
        since, reports nothing.
        """
        if self._writer is None:
            raise BadRequest("no restore began")
        written, self._writer = self._writer.finish(), None
        for path, (row, key) in written.items():
            self._hold(path, _Saved(*row[1:], key=key))
        self._events = inotify.Inotify.open()
        self._rescan = "the workspace was restored"

    def restore(self, entries: List[list], read_content: disk.ReadContent) -> None:
        """The whole restore in one batch: ``begin_restore``, ``put``, ``finish_restore``."""
        self.begin_restore()
        self.put(entries, read_content)
        self.finish_restore()
