"""Values made on the host (``add_context``, ``add_history``, ``set_value``): one ``set_value`` request each.

A str or bytes value's checkpoint blob is made here, not in the sandbox: a pickle written around the raw bytes
(``blob_format.host_blob_parts``, no copy of them), named by a fresh id (no hash). It is checked against the quota
before anything is sent and written to the store while the request is in flight; the agent adopts it and sends
nothing back (docs/protocol.md, "Host-made blobs"). JSON values are pickled by the agent, as cells' are.
"""

from __future__ import annotations

from typing import Any

from ..agent import blob_format, request_table
from ..checks import is_count
from ..errors import ConfigError
from ..runtime.sandbox import ValueFile
from ..state.ledger import StagedBlob
from ..wire.connection import Body
from ..wire.payloads import encode_payload
from .contexts import checkpoint_key
from .transactions import Transactions


def add_versioned(calls: Transactions, prefix: str, payload: Any, index: int | None, context: str | None) -> int:
    """``add_context`` ("context") or ``add_history`` ("history"): ``payload`` as ``<prefix>_<index>`` (and as
    ``<prefix>`` for index 0); returns the index, by default the context's count."""
    encoded = encode_payload(payload)
    counter = f"{prefix}_count"
    with calls.turn():
        count = calls.count(counter, context)
        if index is None:
            index = count
        if not is_count(index):
            raise ConfigError(f"index must be a non-negative int, got {index!r}")
        aliases = [prefix] if index == 0 else []
        store(calls, f"{prefix}_{index}", aliases, encoded, {counter: max(count, index + 1)}, context)
        return index


def store(
    calls: Transactions,
    name: str,
    aliases: list[str],
    encoded: tuple[str, bytes],
    counters: dict[str, int],
    context: str | None,
) -> None:
    """One ``set_value`` request, on the caller's turn: a host-made value (``encode_payload``) under ``name`` and
    ``aliases``, the context's ``counters`` stored with its delta.

    Raises:
        CheckpointQuotaExceeded: a str or bytes value would take the checkpoint past the quota.
    """
    kind, raw = encoded
    header = request_table.set_value_request(name, kind, aliases, calls.settings.timeouts.checkpoint)
    calls.in_context(header, context)
    staged: list[StagedBlob] = []
    body: Body | ValueFile = raw
    if kind in blob_format.HOST_BLOB_KINDS:
        keys = {checkpoint_key(header.get("context"), n) for n in [name, *aliases]}
        calls.ledger.check_room(keys, len(raw) + blob_format.HOST_BLOB_OVERHEAD, f"the {kind} value for {name}")
        staged.append(calls.ledger.stage(blob_format.host_blob_parts(kind, raw)))
        header["blob"], header["blob_size"] = staged[0].blob_id, staged[0].size
        if staged[0].size >= blob_format.VALUE_FILE_MIN_BYTES:  # a local sandbox maps the staged file instead
            body = ValueFile(staged[0].written, staged[0].blob_id, raw)
    try:
        calls.control(header, lambda r, b: calls.commit_state(r, b, counters, context, staged), body)
    finally:
        for blob in staged:
            blob.discard()
