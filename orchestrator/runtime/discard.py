"""Removing a session's sandboxes without a handle on it: discard its containers, or remove the session whole.

A session's owner uses them under its ownership check; ops (prune, the janitor, hibernation) use
them on sessions nobody here holds, while the session's activity lock proves no call runs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from ..backends.base import SANDBOX_ID, SESSION_ID, STORE_ID, Backend, ContainerState
from ..errors import CheckpointError
from ..state.controllers import CONTROLLER_RUNTIME_DIR
from ..state.store import SessionRecord, SessionStore
from ..wire.endpoint import discard_sandbox_dir

logger = logging.getLogger(__name__)


def discard_sandbox(backend: Backend, runtime_dir: Path, sandbox_id: str | None, container_id: str) -> None:
    """Remove a sandbox's container and its channel directory (both may be gone already)."""
    backend.remove(container_id)
    if sandbox_id is not None:
        discard_sandbox_dir(runtime_dir, sandbox_id)


def discard_left_behind(backend: Backend, container: ContainerState) -> None:
    """Remove a container a gone controller left behind (``state.controllers.left_behind``) and its channel
    directory (in the runtime dir its label names)."""
    runtime_dir = container.labels.get(CONTROLLER_RUNTIME_DIR)
    if runtime_dir and os.path.isabs(runtime_dir):
        discard_sandbox(backend, Path(runtime_dir), container.labels.get(SANDBOX_ID), container.id)
    else:
        backend.remove(container.id)


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
