"""The controller's side of deferred values: it hands a sandbox the blob of a value a restore deferred.

A restore sends values of at least ``DEFER_BYTES`` as ``defer`` requests: the worker loads one
when a cell first uses it, by a host call of the reserved name ``protocol.BLOB_CALL`` that the
connection answers here, from the store, never through the cell's handlers (docs/protocol.md,
"Deferred values"). The call comes from the sandbox, so it is hostile: it is served only for a
checkpoint key whose current record entry names that very blob (so a controller that took the
sandbox over serves what its predecessor deferred, and no sandbox reads a blob its session does
not name), through the store's mapped, digest-checked read, and each key at most
``_SERVES_PER_KEY`` times per restore (an honest worker loads it once; an interrupt in the middle
costs one more), so a cell cannot make the host read and send more than a few times its checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager

from ..agent import protocol
from ..errors import OrchestratorError

logger = logging.getLogger(__name__)

DEFER_BYTES = 1 << 20
"""A value whose blob has at least this many bytes is deferred by a restore, not loaded. Below it, loading at
once costs less than a round trip later (a MiB unpickles in about a millisecond); above it, a value's load time
grows with its size and is worth saving for a first call that does not use it."""
_SERVES_PER_KEY = 4


class BlobRefused(Exception):
    """The sandbox asked for a blob it may not have, or the blob cannot be read: the message says why."""


class DeferredBlobs:
    """Serves the blobs of one sandbox's deferred values, as its session's current record names them."""

    def __init__(
        self,
        sandbox_id: str,
        named: Callable[[str], str | None],
        open_blob: Callable[[str], AbstractContextManager[memoryview]],
    ) -> None:
        """``named``: the blob the session's current record names for a checkpoint key (None: none)."""
        self._sandbox_id = sandbox_id
        self._named = named
        self._open_blob = open_blob
        self._served: dict[str, int] = {}
        self.served_bytes = 0
        """Bytes of blobs handed out since the last restore (what lazy loading cost the host)."""

    def restored(self) -> None:
        """A restore began: every key may be loaded again."""
        self._served.clear()
        self.served_bytes = 0

    def serve(self, payload: object) -> bytes:
        """The blob a ``BLOB_CALL`` asks for (its JSON payload decoded), checked against its digest.

        Raises:
            BlobRefused: it names no blob the session's record names under that key, it was served
                too often, or its stored blob is gone or damaged (logged: the value is lost).
        """
        try:
            call = protocol.read_blob_call(payload)
        except protocol.BadRequest as exc:
            raise BlobRefused(str(exc)) from None
        key, digest = call["key"], call["digest"]
        if self._named(key) != digest:
            raise BlobRefused(f"no deferred value {key[:200]!r} with that blob in this session")
        count = self._served.get(key, 0)
        if count >= _SERVES_PER_KEY:
            raise BlobRefused(f"the blob of {key!r} was handed out {count} times since the restore, the most it may")
        self._served[key] = count + 1
        try:
            with self._open_blob(digest) as blob:
                intact = protocol.is_host_blob(digest) or protocol.blob_digest(blob) == digest
                data = bytes(blob) if intact else b""
        except (OSError, OrchestratorError) as exc:
            logger.error("sandbox %s: the blob of deferred value %r cannot be read: %s", self._sandbox_id, key, exc)
            raise BlobRefused(f"its stored blob cannot be read: {exc}") from None
        if not intact:
            logger.error("sandbox %s: the blob of deferred value %r does not match its digest", self._sandbox_id, key)
            raise BlobRefused("its stored blob does not match its digest: the checkpoint file is damaged")
        self.served_bytes += len(data)
        return data
