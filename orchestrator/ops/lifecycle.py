"""Operations on a session's sandbox that need no handle on it: discard containers, hibernate an idle session.

A session's owner uses them under its ownership check; ops (prune, the janitor, the running-session
cap, ``orchestrator hibernate``) use them on sessions nobody here holds. Hibernating is not a change
of owner: it removes the container and keeps the checkpoint under the session's store lock, while
its activity lock proves no call runs, and the owner's next call starts and restores a new sandbox
as it does after any container loss.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path

from ..backends.base import SANDBOX_ID, SESSION_ID, STORE_ID, Backend
from ..errors import CheckpointError
from ..state import activity
from ..state.store import SessionRecord, SessionStore
from ..wire.endpoint import discard_sandbox_dir

logger = logging.getLogger(__name__)


def discard_sandbox(backend: Backend, runtime_dir: Path, sandbox_id: str | None, container_id: str) -> None:
    """Remove a sandbox's container and its channel directory (both may be gone already)."""
    backend.remove(container_id)
    if sandbox_id is not None:
        discard_sandbox_dir(runtime_dir, sandbox_id)


def discard_strays(
    backend: Backend, runtime_dir: Path, labels: Mapping[str, str], keep: str | None = None
) -> list[str]:
    """Remove every container carrying ``labels`` except ``keep``; return the names of those removed."""
    removed = []
    for stray in backend.find(labels):
        if stray.id != keep:
            discard_sandbox(backend, runtime_dir, stray.labels.get(SANDBOX_ID), stray.id)
            removed.append(stray.name)
    return removed


def session_labels(store: SessionStore, session_id: str) -> dict[str, str]:
    """The labels every container of this session carries (and only its containers)."""
    return {STORE_ID: store.store_id, SESSION_ID: session_id}


def discard_session_sandboxes(
    backend: Backend, runtime_dir: Path, labels: Mapping[str, str], record: SessionRecord
) -> list[str]:
    """Remove every container of the session (``labels``) and the recorded sandbox with its directory; return the
    names of those found by label (a container from a warm pool has no session label: the record names it)."""
    removed = discard_strays(backend, runtime_dir, labels)
    if record.container_id is not None:
        discard_sandbox(backend, runtime_dir, record.sandbox_id, record.container_id)
    elif record.sandbox_id is not None:
        discard_sandbox_dir(runtime_dir, record.sandbox_id)
    return removed


def mark_hibernated(record: SessionRecord) -> None:
    """The record of a session whose sandbox was just removed on purpose."""
    record.sandbox_id = record.container_id = None
    record.hibernated_at = time.time()


def hibernate_held(store: SessionStore, backend: Backend, runtime_dir: Path, session_id: str) -> bool:
    """Hibernate a session the caller holds still (``activity.quiet``); False if it was hibernated already.

    Raises:
        SessionNotFound: no such session.
        SessionBusy: its store lock stayed taken.
    """
    with store.transaction(session_id) as record:
        removed = discard_session_sandboxes(backend, runtime_dir, session_labels(store, session_id), record)
        if record.container_id is None and record.hibernated_at is not None and not removed:
            return False
        mark_hibernated(record)
        store.save(record)
    logger.info("hibernated session %s", session_id)
    return True


def remove_held(store: SessionStore, backend: Backend, runtime_dir: Path, session_id: str) -> None:
    """Delete a session the caller holds still: its containers, sandbox directory, record and blobs."""
    with store.locked(session_id):
        try:
            record = store.load(session_id)
        except CheckpointError:  # an unreadable record: its containers are found by label all the same
            discard_strays(backend, runtime_dir, session_labels(store, session_id))
        else:
            discard_session_sandboxes(backend, runtime_dir, session_labels(store, session_id), record)
        store.delete(session_id)
    logger.info("removed session %s", session_id)


def hibernate_idle(store: SessionStore, backend: Backend, runtime_dir: Path, session_id: str) -> bool | None:
    """Hibernate a session if no call runs on it: remove its containers, keep its checkpoint.

    Returns:
        True if it was hibernated, False if it was already, None if it was busy (left alone).

    Raises:
        SessionNotFound: no such session.
        SessionBusy: its store lock stayed taken.
    """
    with activity.quiet(store.activity_path(session_id)) as still:
        return hibernate_held(store, backend, runtime_dir, session_id) if still else None
