"""What ops see of each stored session: its status, ages and sizes, read without owning or waking it.

A survey reads the store and asks the engine once (containers by label); it never takes a
session over, never starts a container, and never waits for a session that is in a call.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..backends.base import STORE_ID, Backend, ContainerState
from ..errors import CheckpointError, SessionNotFound
from ..state.activity import is_busy, last_active
from ..state.store import SessionRecord, SessionStore


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
    """Memory the container uses now; None when it is not running or the engine does not say."""
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

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (status as its string)."""
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["status"] = self.status.value
        return data


def survey(
    store: SessionStore,
    backend: Backend,
    *,
    now: float,
    session_ids: Iterable[str] | None = None,
    held: bool = False,
    shared: bool = False,
) -> list[SessionInfo]:
    """Describe stored sessions (all, or ``session_ids``) with one engine listing for all of them.

    ``held``: the caller holds these sessions still (``activity.quiet``), so none is busy. ``shared``: measure
    ``shared_bytes`` (a stat of each blob: for one session, not for a listing).

    Raises:
        SessionNotFound: one of ``session_ids`` is not stored.
        EngineUnavailable: no engine answers.
    """
    ids = list(store.ids()) if session_ids is None else list(session_ids)
    containers = {c.id: c for c in backend.find({STORE_ID: store.store_id})}
    records: dict[str, SessionRecord | CheckpointError] = {}
    for session_id in ids:
        try:
            records[session_id] = store.load(session_id)
        except CheckpointError as exc:
            records[session_id] = exc
        except SessionNotFound:
            if session_ids is not None:
                raise
            continue  # removed since it was listed (its owner or another prune): not ours to report
    running = [
        r.container_id
        for r in records.values()
        if isinstance(r, SessionRecord) and r.container_id in containers and containers[r.container_id].running
    ]
    memory = backend.memory_usage(running) if running else {}
    infos = []
    for session_id, record in records.items():
        path = store.activity_path(session_id)
        if isinstance(record, CheckpointError):
            infos.append(_unreadable(session_id, record, last_active(path, 0.0), now))
            continue
        container = containers.get(record.container_id or "")
        busy = not held and is_busy(path)
        active = last_active(path, record.last_used_at)
        missing = store.missing_blobs(record)
        status, problem = _status(record, container, busy, missing)
        infos.append(
            SessionInfo(
                id=session_id,
                status=status,
                image=record.image,
                created_at=record.created_at,
                last_active_at=active,
                age_seconds=max(0.0, now - record.created_at),
                idle_seconds=0.0 if busy else max(0.0, now - active),
                generation=record.generation,
                variables=len(record.variables),
                checkpoint_bytes=record.checkpoint_bytes,
                epoch=record.epoch,
                sandbox_id=record.sandbox_id,
                container_id=record.container_id,
                container_status=container.status if container else None,
                node=container.node if container else None,
                memory_bytes=memory.get(record.container_id or ""),
                hibernated_at=record.hibernated_at,
                problem=problem,
                checkpoint_damaged=bool(missing),
                labels=dict(record.labels),
                forked_from=dict(record.forked_from) or None,
                generations_kept=len(record.history) + 1,
                history_bytes=record.history_bytes,
                shared_bytes=store.shared_bytes(record) if shared else None,
            )
        )
    return infos


def _status(
    record: SessionRecord, container: ContainerState | None, busy: bool, missing: set[str]
) -> tuple[SessionStatus, str | None]:
    if missing:
        return SessionStatus.BROKEN, f"its checkpoint is damaged: {len(missing)} blob(s) missing"
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
