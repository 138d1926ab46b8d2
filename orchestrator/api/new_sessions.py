"""What making sessions needs besides their handles: the arguments checked, their records, forks started together."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from ..backends.base import LABEL_PREFIX, Placement
from ..checks import is_count
from ..errors import ConfigError, OrchestratorError
from ..runtime.restore import SessionSandbox
from ..state.ledger import new_owner_token
from ..state.store import SessionRecord, validate_session_id
from .session import Session

_FORK_STARTS = 8
"""Forks whose sandboxes ``Orchestrator.fork`` starts and restores at once."""


def check_labels(labels: Mapping[str, str] | None) -> None:
    """Raises ConfigError for a label outside our namespace (``orchestrator.<you>.<name>``)."""
    for key in labels or {}:
        if not key.startswith(LABEL_PREFIX) or key.count(".") < 2:
            raise ConfigError(f"label {key!r} must be namespaced like 'orchestrator.<you>.<name>'")


def new_id() -> str:
    return f"s{secrets.token_hex(6)}"


def fork_ids(count: int, session_ids: Sequence[str] | None) -> list[str]:
    """The ids of ``count`` forks: ``session_ids`` checked, or new random ones.

    Raises:
        ConfigError: ``count`` is not a positive integer, or the ids are not ``count`` different valid ones.
    """
    if not is_count(count) or count < 1:
        raise ConfigError(f"count must be a positive integer, got {count!r}")
    ids = [new_id() for _ in range(count)] if session_ids is None else list(session_ids)
    if len(ids) != count or len(set(ids)) != count:
        raise ConfigError(f"session_ids must name {count} different ids, got {ids!r}")
    return [validate_session_id(child) for child in ids]


def new_record(
    session_id: str, image: str, labels: Mapping[str, str], placement: Placement | None = None
) -> SessionRecord:
    """The record of a session made now, owned by a new owner token at its first epoch."""
    now = time.time()
    return SessionRecord(
        session_id=session_id,
        image=image,
        created_at=now,
        last_used_at=now,
        labels=dict(labels),
        placement={} if placement is None else placement.to_json(),
        owner=new_owner_token(),
        epoch=1,
    )


def start_all(forks: Sequence[tuple[Session, SessionSandbox]]) -> None:
    """Start (and restore) every fork's sandbox, ``_FORK_STARTS`` at once; when one fails, close them all and raise."""
    try:
        with ThreadPoolExecutor(min(len(forks), _FORK_STARTS), thread_name_prefix="fork-start") as starts:
            for started in [starts.submit(sandbox.start) for _, sandbox in forks]:
                started.result()
    except BaseException:
        for fork, _ in forks:
            with contextlib.suppress(OrchestratorError):
                fork.close()
        raise
