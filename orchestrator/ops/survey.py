"""What ops see of each stored session: its status, ages and sizes, read without owning or waking it.

A survey reads the store and asks the engine once (containers by label); it never takes a
session over, never starts a container, and never waits for a session that is in a call.
"""

from __future__ import annotations

import enum
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..backends.base import STORE_ID, Backend, ContainerState, ResourceUsage
from ..errors import CheckpointError, SessionNotFound
from ..state.activity import ACTIVITY_FILE, last_active, observe
from ..state.index import StoreIndex, Summary
from ..state.store import SessionStore

CPU_WINDOW = 0.2
"""Seconds between the two readings of each running container's CPU time that give its live CPU share: a survey
reads the store in between, and waits only for what is left of it (and only when a container runs)."""


class SessionStatus(enum.Enum):
    """A session's lifecycle status as any process sees it (not a handle's state)."""

    RUNNING = "running"
    """Its recorded container runs and no call is in progress."""
    BUSY = "busy"
    """A controller is in a call on it (or starting or restoring its sandbox) right now."""
    HIBERNATED = "hibernated"
    """No container, on purpose (``hibernate``); the next call resumes it from its checkpoint."""
    BROKEN = "broken"
    """Its container exited or vanished without a hibernate, or its checkpoint is damaged (see ``problem``)."""


@dataclass(frozen=True)
class SessionInfo:
    """One row of ``orchestrator ls``, one object of ``orchestrator inspect``."""

    id: str
    status: SessionStatus
    image: str
    created_at: float
    last_active_at: float
    """When its last call ended (to the second, from the session's activity file)."""
    age_seconds: float
    idle_seconds: float
    """Seconds since ``last_active_at``; 0 while busy."""
    generation: int
    variables: int
    checkpoint_bytes: int
    epoch: int
    sandbox_id: str | None
    container_id: str | None
    container_status: str | None
    """The engine's word for the recorded container ("running", "exited", ...); None when there is none."""
    memory_bytes: int | None
    """Memory the container uses now; None when it is not running or the engine does not say (docs/metrics.md)."""
    hibernated_at: float | None
    problem: str | None
    """Why the session is broken (or None)."""
    checkpoint_damaged: bool = False
    """Its record is unreadable or blobs its manifest names are missing: it cannot be restored whole."""
    record_unreadable: bool = False
    """Its record itself cannot be read (prune quarantines it rather than remove anything)."""
    labels: dict[str, str] = field(default_factory=dict)
    node: str | None = None
    """The machine its container runs (or last ran) on, when the backend spreads sandboxes (Swarm); else None."""
    forked_from: dict[str, Any] | None = None
    """``{"session_id", "generation"}`` of the session it was forked from; None when it was not forked."""
    generations_kept: int = 1
    """Generations it keeps for ``rewind`` and ``fork(at=...)``, the current one included."""
    history_bytes: int = 0
    """Bytes of the blobs the current generation and the kept ones name, each blob counted once."""
    shared_bytes: int | None = None
    """Bytes of its blobs that other sessions hold too (hard links of a fork: stored once on the host); measured
    for one session (``describe``), None in a listing (it reads every blob's inode)."""
    cpu_percent: float | None = None
    """CPU its container used over the last ``CPU_WINDOW`` seconds, in percent of one core (as ``docker stats``: 200
    is two cores busy); None when it is not running or the engine does not say."""
    cpu_seconds: float | None = None
    """CPU time its container used since it started (all cores together); None as for ``cpu_percent``."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (status as its string)."""
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["status"] = self.status.value
        return data


@dataclass(frozen=True)
class Deciding:
    """How a caller that acts on what it surveys (prune) reads the sessions: with the engine's listing it has just
    made, measuring no usage (two engine readings it does not need)."""

    containers: Mapping[str, ContainerState]
    """The store's containers by id."""
    index: StoreIndex | None = None
    """The store's summary cache (``state.index``), which the caller goes on using; else as ``survey`` says."""
    held: bool = False
    """The caller holds these sessions still (``activity.quiet``), so none is busy."""
    reread: bool = False
    """Read every record in full, whatever the index holds (to decide on them)."""


def survey(
    store: SessionStore,
    backend: Backend,
    *,
    now: float,
    session_ids: Iterable[str] | None = None,
    shared: bool = False,
    deciding: Deciding | None = None,
) -> list[SessionInfo]:
    """Describe stored sessions (all, or ``session_ids``) with one engine listing for all of them.

    ``shared``: measure ``shared_bytes`` (a stat of each blob: for one session, not for a listing). Without
    ``deciding``, running containers' memory and CPU are measured (two engine readings ``CPU_WINDOW`` apart), and a
    survey of the whole store reads the summary cache and writes it back, one of ``session_ids`` reads their
    records (cheaper than the cache file of a big store).

    Raises:
        SessionNotFound: one of ``session_ids`` is not stored.
        EngineUnavailable: no engine answers.
    """
    measure = deciding is None
    deciding = deciding or Deciding({c.id: c for c in backend.find({STORE_ID: store.store_id})})
    containers = deciding.containers
    live = [c.id for c in containers.values() if c.running] if measure else []
    first, sampled = (backend.resource_usage(live) if live else {}), time.monotonic()
    facts = _summaries(store, session_ids, deciding)
    recorded = [f[0].container_id for f in facts.values() if not isinstance(f, CheckpointError)]
    running = [cid for cid in recorded if cid is not None and cid in containers and containers[cid].running]
    usage_now = _live_usage(backend, running, first, sampled) if measure and running else {}
    infos = []
    root = str(store.root)
    for session_id, fact in facts.items():
        path = f"{root}/{session_id}/{ACTIVITY_FILE}"  # the id is valid: listed by ``names`` or read by ``summarize``
        if isinstance(fact, CheckpointError):
            infos.append(_unreadable(session_id, fact, last_active(path, 0.0), now))
            continue
        record, missing = fact
        if deciding.held:
            busy, active = False, last_active(path, record.last_used_at)
        else:
            busy, active = observe(path, record.last_used_at)
        info = _info(session_id, record, containers.get(record.container_id or ""), (busy, active), missing, now)
        measured = usage_now.get(record.container_id or "", _NONE)
        infos.append(
            replace(
                info,
                memory_bytes=measured[0],
                cpu_percent=measured[1],
                cpu_seconds=measured[2],
                shared_bytes=store.shared_bytes_of(session_id, record.blobs) if shared else None,
            )
        )
    return infos


def _summaries(
    store: SessionStore, session_ids: Iterable[str] | None, deciding: Deciding
) -> dict[str, tuple[Summary, int] | CheckpointError]:
    """Each session's summary and missing blobs (or why its record cannot be read), from the cache where it holds."""
    whole = session_ids is None
    ids = store.names() if session_ids is None else list(session_ids)
    cache = StoreIndex(store, load=whole) if deciding.index is None else deciding.index
    facts: dict[str, tuple[Summary, int] | CheckpointError] = {}
    for session_id in ids:
        try:
            facts[session_id] = summarize(store, cache, session_id, trusted=whole, reread=deciding.reread)
        except CheckpointError as exc:
            facts[session_id] = exc
        except SessionNotFound:
            if not whole:
                raise
            continue  # removed since it was listed (its owner or another prune), or a directory without a record
    if whole:
        cache.keep_only(set(facts))
        if deciding.index is None:
            cache.save()
    return facts


def _info(
    session_id: str,
    record: Summary,
    container: ContainerState | None,
    activity: tuple[bool, float],
    missing: int,
    now: float,
) -> SessionInfo:
    """What the record and its container say of the session (its usage and shared bytes measured apart)."""
    busy, active = activity
    status, problem = _status(record, container, busy, missing)
    return SessionInfo(
        id=session_id,
        status=status,
        image=record.image,
        created_at=record.created_at,
        last_active_at=active,
        age_seconds=max(0.0, now - record.created_at),
        idle_seconds=0.0 if busy else max(0.0, now - active),
        generation=record.generation,
        variables=record.variables,
        checkpoint_bytes=record.checkpoint_bytes,
        epoch=record.epoch,
        sandbox_id=record.sandbox_id,
        container_id=record.container_id,
        container_status=container.status if container else None,
        node=container.node if container else None,
        memory_bytes=None,
        hibernated_at=record.hibernated_at,
        problem=problem,
        checkpoint_damaged=bool(missing),
        labels=dict(record.labels),
        forked_from=dict(record.forked_from) or None,
        generations_kept=record.generations_kept,
        history_bytes=record.history_bytes,
    )


def summarize(
    store: SessionStore, index: StoreIndex, session_id: str, *, trusted: bool = False, reread: bool = False
) -> tuple[Summary, int]:
    """The summary of a session's record and how many blobs its manifest names that are not on disk: from
    ``index`` where it holds them for the files as they are now, else read (and noted in ``index``).

    ``trusted``: ``session_id`` comes from ``SessionStore.names`` (valid: not checked again). ``reread``: read the
    record and ``blobs/`` whatever ``index`` holds.

    Raises:
        SessionNotFound: the session has no record.
        CheckpointError: its record is unreadable or invalid.
        ConfigError: ``session_id`` is no valid id.
    """
    seen_at = time.time()  # before anything is looked at: what changes from here on is not cached
    directory = f"{store.root}/{session_id}" if trusted else store.session_path(session_id)
    summary, meta, record = index.lookup(session_id, directory, seen_at, reread=reread)
    try:
        blobs: os.stat_result | None = os.stat(f"{directory}/blobs")
    except OSError:
        blobs = None
    missing = None if blobs is None or reread else index.missing(session_id, meta, blobs)
    if missing is None:
        if record is None:  # the summary was cached, the count is not: the manifest is needed
            record, meta = store.read(session_id)
            summary = index.put(session_id, meta, record, seen_at)
        missing = len(store.missing_blobs(record))
        if blobs is not None:
            index.note_missing(session_id, meta, blobs, missing, seen_at)
    return summary, missing


_NONE: tuple[None, None, None] = (None, None, None)


def _live_usage(
    backend: Backend, running: list[str], first: Mapping[str, ResourceUsage], sampled: float
) -> dict[str, tuple[int | None, float | None, float | None]]:
    """Each running container's memory, CPU percent and CPU seconds: read again once ``CPU_WINDOW`` has passed since
    ``first`` (``sampled``), the CPU share from the two readings."""
    time.sleep(max(0.0, CPU_WINDOW - (time.monotonic() - sampled)))
    second, elapsed = backend.resource_usage(running), time.monotonic() - sampled
    usage = {}
    for container_id, now in second.items():
        before = first.get(container_id)
        percent = None
        if before is not None and before.cpu_seconds is not None and now.cpu_seconds is not None:
            percent = max(0.0, now.cpu_seconds - before.cpu_seconds) / elapsed * 100
        usage[container_id] = (now.memory_bytes, percent, now.cpu_seconds)
    return usage


def _status(
    record: Summary, container: ContainerState | None, busy: bool, missing: int
) -> tuple[SessionStatus, str | None]:
    if missing:
        return SessionStatus.BROKEN, f"its checkpoint is damaged: {missing} blob(s) missing"
    if busy:
        return SessionStatus.BUSY, None
    if container is not None and container.running:
        return SessionStatus.RUNNING, None
    if record.container_id is None:
        if record.hibernated_at is not None:
            return SessionStatus.HIBERNATED, None
        return SessionStatus.BROKEN, "it has no container: its controller stopped before starting one"
    if container is None:
        return SessionStatus.BROKEN, "its container is gone (removed, or the engine lost it)"
    return SessionStatus.BROKEN, f"its container is {container.status}" + (
        f" (exit code {container.exit_code})" if container.exit_code is not None else ""
    )


def _unreadable(session_id: str, error: CheckpointError, active: float, now: float) -> SessionInfo:
    return SessionInfo(
        id=session_id,
        status=SessionStatus.BROKEN,
        image="",
        created_at=0.0,
        last_active_at=active,
        age_seconds=0.0,
        idle_seconds=max(0.0, now - active),
        generation=0,
        variables=0,
        checkpoint_bytes=0,
        epoch=0,
        sandbox_id=None,
        container_id=None,
        container_status=None,
        memory_bytes=None,
        hibernated_at=None,
        problem=str(error),
        checkpoint_damaged=True,
        record_unreadable=True,
    )
