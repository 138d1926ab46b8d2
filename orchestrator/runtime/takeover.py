"""Taking a session from another controller: ownership first, then its live sandbox, moved over in band.

``Orchestrator.attach`` makes this controller the owner (``CheckpointLedger.take_ownership``: a
new owner token and the next epoch, which makes every other handle stale; refused while the
holder's lease proves it alive, ``state/lease.py``, unless forced), then ``serve`` gives
the session a sandbox: its live one, taken over (new socket, SIGUSR1, handshake:
``Sandbox.take_over``; the agent says goodbye to the previous controller), else a new one
restored from the checkpoint. The previous owner notices at its next step: its store
transactions fail the ownership check, its agent said goodbye (``TakenOver``), and
``SessionSandbox.become_stale`` lets go of everything (``SessionAttachedElsewhere``).
"""

from __future__ import annotations

import logging

from ..errors import OrchestratorError, SessionAttachedElsewhere
from . import discard
from .restore import SessionSandbox
from .sandbox import Sandbox

logger = logging.getLogger(__name__)


def serve(session: SessionSandbox) -> None:
    """Give a newly owned session a sandbox: take its live one over, else start one and restore.

    A hibernated session stays so until its first call (attaching is not using).

    Raises:
        SessionAttachedElsewhere: another controller attached it meanwhile (it won).
        OrchestratorError: no sandbox could be started.
    """
    record = session.ledger.record
    remove_strays(session)
    if record.container_id is None and record.hibernated_at is not None:
        return
    sandbox = None
    if record.sandbox_id and record.container_id:
        state = session.backend.inspect(record.container_id)
        if state is not None and state.running:
            try:
                sandbox = Sandbox.take_over(
                    session.backend,
                    session.settings,
                    sandbox_id=record.sandbox_id,
                    container_id=record.container_id,
                    claim=session.ledger.owned,
                )
            except SessionAttachedElsewhere:
                raise
            except OrchestratorError as exc:
                logger.warning(
                    "session %s: taking over %s failed (%s); starting anew", session.session_id, state.name, exc
                )
    if sandbox is not None:
        session.adopt(sandbox)
    else:
        session.start()


def remove_strays(session: SessionSandbox) -> None:
    """Remove containers of this session other than its recorded one (left by a controller that died)."""
    with session.ledger.owned() as current:
        discard.discard_strays(
            session.backend, session.settings.runtime_dir, session.session_labels(), keep=current.container_id
        )
