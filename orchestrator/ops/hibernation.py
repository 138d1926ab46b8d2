"""Hibernation: a session without a sandbox, on purpose; its checkpoint stays, its next call resumes it.

Hibernating removes the session's containers and marks its record (``hibernated_at``) under the
session's store lock, and is not a change of owner. Its owner does it through ``Session.hibernate``
and the idle policy (``hibernate_if_idle``); ops (prune, the janitor, the running-session cap,
``orchestrator hibernate``) do it to sessions nobody here holds while their activity lock proves
no call runs (``hibernate_idle``). Resuming is no operation of its own: the owner's next call
finds no sandbox and starts and restores one (``SessionSandbox.ready``), as after any container
loss, and ``Orchestrator.resume`` is an attach that starts it at once.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from ..backends.base import Backend
from ..errors import OrchestratorError, SessionAttachedElsewhere
from ..runtime import discard
from ..runtime.hostcalls import serving
from ..runtime.restore import SessionSandbox, SessionState
from ..state import activity
from ..state.activity import last_active
from ..state.store import SessionRecord, SessionStore

logger = logging.getLogger(__name__)


def mark_hibernated(record: SessionRecord) -> None:
    """The record of a session whose sandbox was just removed on purpose."""
    record.sandbox_id = record.container_id = None
    record.hibernated_at = time.time()


def hibernate(session: SessionSandbox) -> None:
    """Hibernate a session this handle owns: remove its sandbox, keep the checkpoint (``Session.hibernate``).

    Raises:
        SessionAttachedElsewhere: another controller owns the session (nothing was touched).
        SessionClosed: the session was closed.
    """
    with session.turn(call=False):  # not a use: the session's idle time goes on
        session.check_usable()
        session.drop()  # an error below leaves the record naming it: the next start removes it

        def discard(current: SessionRecord) -> None:
            session.discard_all(current)
            mark_hibernated(current)

        try:
            session.ledger.update(discard)
        except SessionAttachedElsewhere:
            session.become_stale()
            raise
        logger.info("hibernated session %s", session.session_id)


def hibernate_if_idle(session: SessionSandbox, idle_for: float) -> bool:
    """Hibernate a held session if no call ran for ``idle_for`` seconds and none runs now (never waits); True if
    it did. The idle policy (``Settings.capacity.hibernate_after``) of the sessions an ``Orchestrator`` holds."""
    if session.state is not SessionState.READY or session.sandbox is None or serving(session):
        return False
    if not session.lock.acquire(blocking=False):
        return False
    try:
        if time.time() - last_active(session.activity.path, 0.0) < idle_for or session.sandbox is None:
            return False
        hibernate(session)
        return True
    except OrchestratorError as exc:
        logger.warning("session %s: hibernating after %g s idle failed: %s", session.session_id, idle_for, exc)
        return False
    finally:
        session.lock.release()


def forget_sandbox(session: SessionSandbox) -> None:
    """Let go of a held session's sandbox that someone else just removed (``Orchestrator.hibernate``), unless a
    call is using it (that call then finds it gone and restores, as after any lost container)."""
    if session.lock.acquire(blocking=False):
        try:
            session.drop()
        finally:
            session.lock.release()


def hibernate_held(store: SessionStore, backend: Backend, runtime_dir: Path, session_id: str) -> bool:
    """Hibernate a session the caller holds still (``activity.quiet``); False if it was hibernated already.

    Raises:
        SessionNotFound: no such session.
        SessionBusy: its store lock stayed taken.
    """
    with store.transaction(session_id) as record:
        removed = discard.discard_session_sandboxes(
            backend, runtime_dir, discard.session_labels(store, session_id), record
        )
        if record.container_id is None and record.hibernated_at is not None and not removed:
            return False
        mark_hibernated(record)
        store.save(record)
    logger.info("hibernated session %s", session_id)
    return True


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
