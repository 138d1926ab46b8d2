"""Per-sandbox identity: the uid (and gid) a new sandbox's worker runs as, one no live sandbox holds.

Every sandbox's worker gets its own uid, so per-uid kernel limits (inotify instances, RLIMIT_NPROC,
user keyrings) are per sandbox: one sandbox cannot use up another's. The uid is drawn at random from
``Settings.confinement.worker_uids`` and checked against the ``WORKER_UID`` labels of the engine's sandboxes (one
filtered listing): two live sandboxes never share one while their controllers start them one after
the other. Two controllers that start sandboxes on one engine in the same instant could draw the same
uid between their check and their start, once in about ``size of the range`` draws for each such pair;
with the default hundred million uids that is rare, and the cost is only two sandboxes sharing per-uid limits
(the uid does not guard their channels or state: each has its own secret and container).
"""

from __future__ import annotations

import logging
import secrets

from ..backends.base import WORKER_UID, Backend
from ..config import Settings
from ..errors import ConfigError

logger = logging.getLogger(__name__)

_DRAWS = 16
"""Draws before giving up: a range that is nearly full is a configuration to fix, not a loop to spin."""


def choose_worker_uid(backend: Backend, settings: Settings) -> int:
    """A uid from ``settings.confinement.worker_uids`` that no sandbox of this engine carries (``WORKER_UID`` label).

    Raises:
        ConfigError: ``_DRAWS`` draws all hit a uid in use (the range is too small for the sandboxes running).
        EngineError: the engine could not list its sandboxes.
    """
    low, high = settings.confinement.worker_uids
    for _ in range(_DRAWS):
        uid = low + secrets.randbelow(high - low + 1)
        if not backend.find({WORKER_UID: str(uid)}):
            return uid
        logger.debug("worker uid %d is held by a sandbox; drawing another", uid)
    raise ConfigError(
        f"no free worker uid in Settings.confinement.worker_uids {low}-{high} after {_DRAWS} draws: the sandboxes of "
        "this engine hold them; widen the range (ORCH_WORKER_UIDS)"
    )
