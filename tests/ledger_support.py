"""Records and commits for tests of the store and the ledger without an engine (the agent's deltas, by hand)."""

from __future__ import annotations

import time
from collections.abc import Mapping

from orchestrator.state.ledger import CheckpointLedger, new_owner_token
from orchestrator.state.store import SessionRecord


def new_record(session_id: str) -> SessionRecord:
    """A new session's record, owned by a fresh token at epoch 1."""
    now = time.time()
    return SessionRecord(session_id, "img", now, now, owner=new_owner_token(), epoch=1)


def commit(
    ledger: CheckpointLedger, generation: int, variables: Mapping[str, str], content: Mapping[str, bytes]
) -> None:
    """Store ``variables`` (name -> blob id) as ``generation``, as an agent's delta would; each blob's bytes come from
    ``content`` and are sent whether stored or not (content-addressed)."""
    before = ledger.record.variables
    sent = sorted(set(variables.values()))
    ledger.commit(
        {
            "generation": generation,
            "blobs": [{"digest": d, "size": len(content[d])} for d in sent],
            "vars": {k: v for k, v in variables.items() if before.get(k) != v},
            "deleted": [k for k in before if k not in variables],
            "unsaved": {},
        },
        bytearray(b"".join(content[d] for d in sent)),
    )
