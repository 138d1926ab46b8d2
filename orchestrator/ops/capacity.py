"""The cap on running sessions (``Settings.capacity.max_running``): make room before a sandbox starts, or refuse.

Counting and starting happen under one store-wide lock, so two controllers on one state dir
cannot both take the last place. Room is made by hibernating the least recently used session
that no call holds (its checkpoint stays; its next call resumes it).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from ..backends.base import SESSION_ID, STORE_ID, Backend
from ..config import Settings
from ..errors import CapacityExceeded, SessionNotFound
from ..state.activity import last_active
from ..state.index import StoreIndex
from ..state.store import SessionStore
from . import hibernation

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def room_for(store: SessionStore, backend: Backend, settings: Settings, session_id: str) -> Iterator[None]:
    """Hold a place for ``session_id``'s new sandbox while it starts (nothing to do without a cap).

    Raises:
        CapacityExceeded: ``max_running`` sessions run and the policy is "refuse", or every one is in a call.
        SessionBusy: another controller held the capacity lock for ``Settings.timeouts.lock``.
    """
    if settings.capacity.max_running is None:
        yield
        return
    with store.store_lock("capacity"):
        others = running_sessions(store, backend) - {session_id}
        excess = len(others) - settings.capacity.max_running + 1
        if excess > 0 and settings.capacity.policy == "hibernate":
            excess -= _hibernate_least_recent(store, backend, settings, others, excess)
        if excess > 0:
            raise CapacityExceeded(
                f"{len(others)} sessions run already "
                f"(Settings.capacity.max_running={settings.capacity.max_running}) and "
                + (
                    "the capacity policy is to refuse"
                    if settings.capacity.policy == "refuse"
                    else "none of them could be hibernated (all in a call)"
                )
                + f"; session {session_id} was not started: hibernate or remove one (`orchestrator ls`) "
                "or raise the cap"
            )
        yield


def running_sessions(store: SessionStore, backend: Backend) -> set[str]:
    """Ids of the store's sessions whose container runs.

    A container started for the session carries its id as a label. One that came from a warm pool
    does not (labels cannot change), so it counts when a record names it; a pool's spare counts not.
    """
    running = [c for c in backend.find({STORE_ID: store.store_id}) if c.running]
    sessions = {c.labels[SESSION_ID] for c in running if SESSION_ID in c.labels}
    pooled = {c.id for c in running if SESSION_ID not in c.labels}
    if pooled:
        index = StoreIndex(store)  # not every record read: only those changed since a listing cached them
        sessions |= {sid for cid, sid in index.recorded_containers().items() if cid in pooled}
        index.save()
    return sessions


def _hibernate_least_recent(
    store: SessionStore, backend: Backend, settings: Settings, session_ids: set[str], wanted: int
) -> int:
    """Hibernate up to ``wanted`` idle sessions, least recently used first; return how many."""
    done = 0
    by_use = sorted(session_ids, key=lambda sid: last_active(store.activity_path(sid), 0.0))
    for session_id in by_use:
        if done == wanted:
            break
        with contextlib.suppress(SessionNotFound):
            if hibernation.hibernate_idle(store, backend, settings.runtime_dir, session_id):
                logger.info(
                    "hibernated session %s to stay within max_running=%d", session_id, settings.capacity.max_running
                )
                done += 1
    return done
