"""The checkpoint ledger of one session as its owner sees it: manifest, quota, unsaved names, ownership.

Every change goes through the store's per-session transaction and starts by checking that this
handle still owns the session (same owner token and epoch): a handle that another controller
took the session from can no longer commit, delete, or touch the sandbox fields, and learns
it through ``SessionAttachedElsewhere``. A commit validates the agent's delta completely
before it writes anything, and stores blobs, manifest and counters in one switch of the
manifest, so what a caller is told was stored is exactly what any later owner sees.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

from .agent import protocol
from .errors import ProtocolError, SessionAttachedElsewhere
from .lifecycle import mark_hibernated
from .messages import CheckpointDelta
from .store import SessionRecord, SessionStore


def new_owner_token() -> str:
    return secrets.token_hex(8)


class CheckpointLedger:
    """The stored record of one session, changed only by its owner."""

    def __init__(self, store: SessionStore, record: SessionRecord, quota: int) -> None:
        self._store = store
        self.record = record
        self.quota = quota
        self._held: SessionRecord | None = None

    @property
    def store(self) -> SessionStore:
        """The store the session lives in (its directory also holds the calls' output files)."""
        return self._store

    @classmethod
    def take_ownership(cls, store: SessionStore, session_id: str, quota: int) -> CheckpointLedger:
        """Become the session's owner: a new token and the next epoch, which makes every other handle stale."""
        with store.transaction(session_id) as record:
            record.owner = new_owner_token()
            record.epoch += 1
            store.save(record)
        return cls(store, record, quota)

    @property
    def session_id(self) -> str:
        return self.record.session_id

    @contextlib.contextmanager
    def owned(self) -> Iterator[SessionRecord]:
        """The store transaction, entered only while we still own the session (re-entrant).

        Raises:
            SessionAttachedElsewhere: another handle took ownership since.
            SessionNotFound: the session was deleted.
        """
        if self._held is not None:
            yield self._held
            return
        with self._store.transaction(self.session_id) as current:
            if (current.owner, current.epoch) != (self.record.owner, self.record.epoch):
                raise SessionAttachedElsewhere(
                    f"session {self.session_id} was attached by another controller (epoch {current.epoch}, "
                    f"this handle has {self.record.epoch}); attach it again to use it"
                )
            self._held = current
            try:
                yield current
            finally:
                self._held = None

    def check_owner(self) -> None:
        with self.owned():
            pass

    def set_sandbox(self, sandbox_id: str, container_id: str) -> None:
        with self.owned() as current:
            current.sandbox_id, current.container_id = sandbox_id, container_id
            current.hibernated_at = None
            self._save(current)

    def hibernate(self, discard: Callable[[SessionRecord], None]) -> None:
        """Let ``discard`` remove the sandbox the record names, then record the session as hibernated."""
        with self.owned() as current:
            discard(current)
            mark_hibernated(current)
            self._save(current)

    def commit(
        self,
        delta: CheckpointDelta,
        body: bytearray,
        *,
        counters: dict[str, int] | None = None,
        contexts: dict[str, dict[str, Any]] | None = None,
    ) -> dict[str, str]:
        """Validate a reply's checkpoint delta and store it; return the names that could not be saved.

        ``contexts`` (when given) replaces the record's contexts in the same manifest write.

        Raises:
            ProtocolError: the delta is inconsistent (names an unknown blob, wrong sizes or
                generation, over the quota); nothing was stored.
            SessionAttachedElsewhere: we no longer own the session; nothing was stored.
        """
        changed, deleted = delta["vars"], delta["deleted"]
        expected = self.record.generation + (1 if changed or deleted else 0)
        if delta["generation"] != expected:
            raise ProtocolError(f"checkpoint generation {delta['generation']} out of step (expected {expected})")
        if not (changed or deleted or delta["blobs"] or counters or contexts is not None):
            return delta["unsaved"]  # nothing to store; the activity file (not the record) says it was used
        try:
            parts = protocol.split_body(body, [entry["size"] for entry in delta["blobs"]])
        except protocol.ProtocolViolation as exc:
            raise ProtocolError(str(exc)) from None
        blobs = {entry["digest"]: part for entry, part in zip(delta["blobs"], parts, strict=True)}
        if not set(changed.values()) <= set(blobs) | set(self.record.blob_sizes):
            raise ProtocolError("checkpoint names a blob that was neither sent nor stored")
        variables = {k: v for k, v in self.record.variables.items() if k not in deleted}
        variables.update(changed)
        known = self.record.contexts if contexts is None else contexts
        if any(
            protocol.CONTEXT_SEPARATOR in k and k.partition(protocol.CONTEXT_SEPARATOR)[0] not in known for k in changed
        ):
            raise ProtocolError("checkpoint names a variable of a context the session does not have")
        if contexts is not None and any(
            protocol.CONTEXT_SEPARATOR in k and k.partition(protocol.CONTEXT_SEPARATOR)[0] not in known
            for k in variables
        ):
            raise ProtocolError("the agent kept variables of a context it was told to destroy")
        sizes = {**self.record.blob_sizes, **{d: len(b) for d, b in blobs.items()}}
        blob_sizes = {d: sizes[d] for d in set(variables.values())}
        if sum(blob_sizes.values()) > self.quota:
            raise ProtocolError(
                f"the agent's checkpoint would hold {sum(blob_sizes.values())} bytes, over the quota of {self.quota}"
            )
        with self.owned() as current:
            self._store.write_blobs(self.session_id, {d: blobs[d] for d in blobs if d in blob_sizes})
            if contexts is not None:
                current.contexts = contexts
            self._replace_manifest(current, variables, blob_sizes, generation=delta["generation"], **(counters or {}))
        return delta["unsaved"]

    def drop(self, names: dict[str, str]) -> None:
        """Take values that could not be restored out of the checkpoint (the agent does not hold them either)."""
        if not names:
            return
        with self.owned() as current:
            variables = {k: v for k, v in current.variables.items() if k not in names}
            live = set(variables.values())
            self._replace_manifest(current, variables, {d: s for d, s in current.blob_sizes.items() if d in live})

    def _replace_manifest(
        self, current: SessionRecord, variables: dict[str, str], blob_sizes: dict[str, int], **fields: int
    ) -> None:
        """Switch to a new manifest in one rename, then delete the blobs that left it (under the store lock)."""
        gone = set(current.blob_sizes) - set(blob_sizes)
        current.variables, current.blob_sizes = variables, blob_sizes
        for name, value in fields.items():
            setattr(current, name, value)
        self._save(current)
        self._store.delete_blobs(self.session_id, gone)

    def delete(self) -> None:
        """Remove the record and every blob."""
        with self.owned():
            self._store.delete(self.session_id)

    def read_blob(self, blob_digest: str) -> bytes:
        return self._store.read_blob(self.session_id, blob_digest)

    def _save(self, current: SessionRecord) -> None:
        current.last_used_at = time.time()
        self._store.save(current)
        self.record = dataclasses.replace(current)
