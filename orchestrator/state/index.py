"""A cache of what ``ls``, prune, the janitor and the capacity cap need of each session, so they need not read every
record: ``<state_dir>/cache/sessions.json``.

A session's record (``meta.json``) is read and validated in full, history and all, to answer
one line of ``ls``; at 10,000 hibernated sessions that is most of a second. This file keeps,
per session, a small ``Summary`` of its record with the identity of the ``meta.json`` it was
made from: inode, size, modification and change time, read with ``fstat`` on the descriptor
the record was read through. Records are never changed in place (written whole and renamed
over, ``files.replace_file``), so while ``stat`` of the path gives back that identity the
file holds the very bytes the summary was made from. An entry whose identity differs, a
session missing from the file, or the whole file unreadable means: read the record. Two more
facts are cached the same way, each keyed by the directory it depends on: how many blobs the
manifest names that ``blobs/`` lacks (``missing``), and that prune found nothing to remove
in the session's directories (``clean``).

Timestamps have a granularity (a tick of the kernel's coarse clock): a file replaced twice
within one tick, with its inode number reused, could look unchanged. So nothing younger than
``RACY`` seconds when it was looked at is cached (as git does with its index): any later
change then gets a later timestamp. This assumes the clock does not step back by more than
``RACY``.

Nothing is deleted on this file's word: before prune removes a session it reads the record in full
under the session's locks (a dry run reports on the listing alone), it deletes a stray blob only
after reading the record that does not name it, and a container only after reading every record;
a session's owner (the commit path) never reads it. The worst an entry edited by hand with its
stamp kept can do is show wrong values in ``ls`` (and count a session wrongly for the running cap)
until the record changes. The file is rewritten whole (temp file and rename) by whoever found it
out of date; two processes doing so at once lose only each other's additions. Deleting it is
always safe: the next ``ls`` writes it again. A process killed mid-write leaves a temp file in
``cache/``, removed by the next writer after ``STALE_TEMP`` seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field, fields
from typing import Any

from ..errors import CheckpointError, SessionNotFound
from ..files import TEMP_PREFIX, replace_file
from .store import SessionRecord, SessionStore

CACHE_DIR = "cache"
INDEX_FILE = "sessions.json"
FORMAT = 1
"""Bumped when a ``Summary`` changes shape: a file of another format is ignored whole."""
RACY = 2.0
"""Seconds a file or directory must be unchanged before what was read of it is cached."""
STALE_TEMP = 60.0
"""Seconds after which a temp file in ``cache/`` is a leftover of a killed writer."""

Stamp = str
"""What identifies one version of a file or directory: ``"st_ino:st_size:st_mtime_ns:st_ctime_ns"``. An entry's
stamps are compared with fresh ones, never trusted alone: anything else in their place matches nothing."""


def stamp(info: os.stat_result) -> Stamp:
    return f"{info.st_ino}:{info.st_size}:{info.st_mtime_ns}:{info.st_ctime_ns}"


def settled(info: os.stat_result, seen_at: float) -> bool:
    """Whether ``info`` (of a file or directory, looked at from ``seen_at`` on) is old enough to cache facts about."""
    return seen_at - max(info.st_mtime, info.st_ctime) > RACY


@dataclass(frozen=True)
class Summary:
    """What a listing shows of a record (``survey.SessionInfo``'s fields that come from it)."""

    image: str
    created_at: float
    last_used_at: float
    generation: int
    variables: int
    checkpoint_bytes: int
    epoch: int
    sandbox_id: str | None
    container_id: str | None
    hibernated_at: float | None
    labels: dict[str, str]
    forked_from: dict[str, Any]
    generations_kept: int
    history_bytes: int
    blobs: list[str] = field(default_factory=list)
    """Every blob the current manifest or a kept generation names (for the bytes removing it frees)."""

    @classmethod
    def of(cls, record: SessionRecord) -> Summary:
        return cls(
            image=record.image,
            created_at=record.created_at,
            last_used_at=record.last_used_at,
            generation=record.generation,
            variables=len(record.variables),
            checkpoint_bytes=record.checkpoint_bytes,
            epoch=record.epoch,
            sandbox_id=record.sandbox_id,
            container_id=record.container_id,
            hibernated_at=record.hibernated_at,
            labels=dict(record.labels),
            forked_from=dict(record.forked_from),
            generations_kept=len(record.history) + 1,
            history_bytes=record.history_bytes,
            blobs=sorted(record.named_blobs()),
        )

    @classmethod
    def from_json(cls, data: Any) -> Summary | None:
        """The summary in ``data``, or None when anything in it is off (the record is read instead)."""
        if type(data) is not list or len(data) != len(_FIELDS):
            return None
        (image, created, used, generation, variables, size, epoch, sandbox, container, hibernated, labels, forked,
         kept, history, blobs) = data  # fmt: skip
        ok = (
            type(image) is str
            and type(created) in _NUMBER
            and type(used) in _NUMBER
            and _count(generation)
            and _count(variables)
            and _count(size)
            and _count(epoch)
            and type(sandbox) in _OPTIONAL_STR
            and type(container) in _OPTIONAL_STR
            and type(hibernated) in _OPTIONAL_NUMBER
            and type(labels) is dict
            and (not labels or all(type(k) is str and type(v) is str for k, v in labels.items()))
            and type(forked) is dict
            and (not forked or (type(forked.get("session_id")) is str and _count(forked.get("generation"))))
            and _count(kept)
            and _count(history)
            and type(blobs) is list
            and all(type(b) is str for b in blobs)
        )
        return cls(*data) if ok else None

    def to_json(self) -> list[Any]:
        return [getattr(self, name) for name in _FIELDS]


_FIELDS = [f.name for f in fields(Summary)]
_NUMBER = (int, float)
_OPTIONAL_NUMBER = (int, float, type(None))
_OPTIONAL_STR = (str, type(None))


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


class StoreIndex:
    """The cache of one store, loaded once per survey or prune and written back once if it changed.

    Entries are kept as the JSON they are stored as (``{"meta": stamp, "summary": [...], "missing": [stamp, n],
    "clean": [stamp, stamp]}``) and checked where they are used: a summary is parsed only when its stamp matches.
    """

    def __init__(self, store: SessionStore, *, load: bool = True) -> None:
        """``load``: read the file (without, nothing is cached: for a look at one session, cheaper than the file)."""
        self.store = store
        self.path = store.base / CACHE_DIR / INDEX_FILE
        self._entries: dict[str, Any] = {}
        self._summaries: dict[str, tuple[Stamp, Summary]] = {}
        """Summaries parsed or made in this pass, with the stamp of their record (``latest``)."""
        self._blobs: dict[str, Stamp] = {}
        """The stamp of each session's ``blobs/`` as this pass's survey saw it (``missing``)."""
        self._changed = False
        if load:
            self._load()

    def _load(self) -> None:
        """Read the file; anything unreadable is ignored (whole file or one entry: those records are read)."""
        try:
            with open(self.path, "rb") as file:
                data = json.loads(file.read())
        except (OSError, ValueError):
            return
        if type(data) is dict and data.get("format") == FORMAT and type(data.get("sessions")) is dict:
            self._entries = data["sessions"]

    def _entry(self, session_id: str, meta: os.stat_result) -> dict[str, Any] | None:
        """The entry of ``session_id`` if it was made from the ``meta.json`` that stats as ``meta``."""
        entry = self._entries.get(session_id)
        if type(entry) is dict and entry.get("meta") == stamp(meta):
            return entry
        return None

    def summary(self, session_id: str, meta: os.stat_result) -> Summary | None:
        """The cached summary of the record whose ``meta.json`` stats as ``meta``, or None (read the record)."""
        entry = self._entry(session_id, meta)
        if entry is None:
            return None
        known = self._summaries.get(session_id)
        if known is not None and known[0] == entry["meta"]:
            return known[1]
        summary = Summary.from_json(entry.get("summary"))
        if summary is None:
            del self._entries[session_id]
            self._changed = True
        else:
            self._summaries[session_id] = (entry["meta"], summary)
        return summary

    def lookup(
        self, session_id: str, directory: str, seen_at: float, *, reread: bool = False
    ) -> tuple[Summary, os.stat_result, SessionRecord | None]:
        """The summary of the record in ``directory`` (the session's), the ``stat`` of its ``meta.json``, and the
        record when it had to be read (not cached, or ``reread``); ``seen_at``: a time from before this call.

        Raises:
            SessionNotFound: the session has no record.
            CheckpointError: its record is unreadable or invalid.
        """
        try:
            meta = os.stat(f"{directory}/meta.json")
        except FileNotFoundError:
            raise SessionNotFound(f"no session {session_id!r} in {self.store.root}") from None
        except OSError as exc:
            raise CheckpointError(f"the record of session {session_id} is unreadable: {exc}") from exc
        summary = None if reread else self.summary(session_id, meta)
        if summary is not None:
            return summary, meta, None
        record, meta = self.store.read(session_id)
        return self.put(session_id, meta, record, seen_at), meta, record

    def recorded_containers(self) -> dict[str, str]:
        """Container id -> session id of every readable record that names a container (a snapshot, from the cache
        where it holds the record as it is: to narrow a search; ``SessionStore.recorded_containers`` to decide)."""
        owners = {}
        root = str(self.store.root)
        for session_id in self.store.names():
            with contextlib.suppress(SessionNotFound, CheckpointError):
                container_id = self.lookup(session_id, f"{root}/{session_id}", time.time())[0].container_id
                if container_id:
                    owners[container_id] = session_id
        return owners

    def latest(self, session_id: str) -> Summary | None:
        """The summary ``summary`` or ``put`` last gave out for the session in this pass, or None."""
        known = self._summaries.get(session_id)
        return None if known is None else known[1]

    def put(self, session_id: str, meta: os.stat_result, record: SessionRecord, seen_at: float) -> Summary:
        """Note the summary of ``record``, read through a descriptor that ``fstat`` gave ``meta`` (from ``seen_at``
        on); it is returned, and cached if the file is settled."""
        summary = Summary.of(record)
        self._summaries[session_id] = (stamp(meta), summary)
        entry = self._entry(session_id, meta)
        if entry is not None:
            if entry.get("summary") != summary.to_json():  # what was read wins over an entry edited by hand
                entry["summary"] = summary.to_json()
                self._changed = True
            return summary
        if settled(meta, seen_at):
            self._entries[session_id] = {"meta": stamp(meta), "summary": summary.to_json()}
            self._changed = True
        elif self._entries.pop(session_id, None) is not None:
            self._changed = True
        return summary

    def missing(self, session_id: str, meta: os.stat_result, blobs: os.stat_result) -> int | None:
        """How many blobs the manifest names that ``blobs/`` (statted as ``blobs``) lacks, if known."""
        self._blobs[session_id] = stamp(blobs)
        entry = self._entry(session_id, meta)
        if entry is None:
            return None
        found = entry.get("missing")
        if type(found) is list and len(found) == 2 and found[0] == self._blobs[session_id] and _count(found[1]):
            return int(found[1])
        return None

    def note_missing(
        self, session_id: str, meta: os.stat_result, blobs: os.stat_result, count: int, seen_at: float
    ) -> None:
        """Remember ``count`` for ``blobs/`` as statted before it was listed (from ``seen_at`` on)."""
        entry = self._entry(session_id, meta)
        if entry is not None and settled(blobs, seen_at):
            entry["missing"] = [stamp(blobs), count]
            self._changed = True

    def clean(self, session_id: str, directory: os.stat_result) -> bool:
        """Whether prune found nothing to remove in the session's directory as it is now and in its ``blobs/`` as this
        pass's survey saw it (a change since is looked at by the next pass). A new record changes the directory too:
        ``meta.json`` is renamed into it."""
        entry = self._entries.get(session_id)
        blobs = self._blobs.get(session_id)
        return blobs is not None and type(entry) is dict and entry.get("clean") == [stamp(directory), blobs]

    def note_clean(
        self,
        session_id: str,
        meta: os.stat_result,
        directory: os.stat_result,
        blobs: os.stat_result,
        seen_at: float,
    ) -> None:
        """Remember that the directories, statted so before prune listed them (from ``seen_at`` on), held no stray
        for the record that stats as ``meta``."""
        entry = self._entry(session_id, meta)
        if entry is not None and settled(directory, seen_at) and settled(blobs, seen_at):
            entry["clean"] = [stamp(directory), stamp(blobs)]
            self._changed = True

    def keep_only(self, session_ids: set[str]) -> None:
        """Forget every session not in ``session_ids`` (call with every session a scan of the store found)."""
        for gone in set(self._entries) - session_ids:
            del self._entries[gone]
            self._changed = True

    def save(self) -> None:
        """Write the file back if anything changed; a failure is ignored: it is a cache (a read-only state
        directory, a full disk)."""
        if not self._changed:
            return
        body = json.dumps({"format": FORMAT, "sessions": self._entries}, separators=(",", ":")).encode()
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(mode=0o700, exist_ok=True)
            _remove_stale_temps(str(self.path.parent))
            replace_file(self.path, body, mode=0o600)
            self._changed = False


def _remove_stale_temps(directory: str) -> None:
    """Temp files a killed writer left in ``cache/`` (any writer's is younger than ``STALE_TEMP``)."""
    now = time.time()
    for entry in os.scandir(directory):
        if entry.name.startswith(TEMP_PREFIX):
            with contextlib.suppress(OSError):
                if now - entry.stat(follow_symlinks=False).st_mtime > STALE_TEMP:
                    os.unlink(entry.path)
