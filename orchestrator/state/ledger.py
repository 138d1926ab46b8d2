"""The checkpoint ledger of one session as its owner sees it: manifest, quota, unsaved names, ownership.

Every change goes through the store's per-session transaction and starts by checking that this
handle still owns the session (same owner token and epoch): a handle that another controller
took the session from can no longer commit, delete, or touch the sandbox fields, and learns
it through ``SessionAttachedElsewhere``. A commit validates the agent's delta completely
before it writes anything, and stores blobs, manifest and counters in one switch of the
manifest, so what a caller is told was stored is exactly what any later owner sees.

A str or bytes value the controller makes itself (``set_value``, ``add_context``) gets a blob
the controller writes (a host-made blob, ``stage``): it is checked against the quota before its
request is sent, written to a temp file on a thread while the request is in flight, and named
by the commit that stores the agent's reply, in the same switch of the manifest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import secrets
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TypeVar

from .. import background
from ..agent import checkpoint_names, framing
from ..agent.reply_types import CheckpointDelta, FilesDelta
from ..errors import (
    CheckpointError,
    CheckpointLimitExceeded,
    CheckpointQuotaExceeded,
    GenerationNotFound,
    OrchestratorError,
    ProtocolError,
    SessionAttachedElsewhere,
    SessionHeld,
)
from ..metrics import NO_METRICS, Recorder
from ..units import describe_bytes
from . import files, history, lease
from .store import SessionRecord, SessionStore, Written, new_host_blob_id, wrong_size
from .unsaved import merged, names_only

logger = logging.getLogger(__name__)
T = TypeVar("T")


def new_owner_token() -> str:
    return secrets.token_hex(8)


class StagedBlob:
    """A host-made blob on its way into the store: written to a temp file on a thread while its request is in flight.

    The commit that stores the reply naming it gives it its name (``place``, under the store
    lock, before the manifest is saved); ``discard`` removes what is left of it, so a call that
    failed leaves no file behind (and one whose controller died leaves a file prune removes).
    """

    def __init__(self, store: SessionStore, session_id: str, parts: Sequence[framing.Body]) -> None:
        self.blob_id = new_host_blob_id()
        self.size = sum(memoryview(part).nbytes for part in parts)
        self._store = store
        self._session_id = session_id
        self._parts = parts
        self._written: Future[Path | None] | None = background.beside().submit(self._write)

    def _write(self) -> Path | None:
        try:
            return self._store.stage_blob(self._session_id, self._parts)
        except CheckpointError:
            return None  # ``place`` writes it again, under the lock, and raises why it cannot

    def written(self) -> Path | None:
        """The temp file once it is whole (None: staging failed; ``place`` will write it), for a value file."""
        return None if self._written is None else self._written.result()

    def _temp(self) -> Path | None:
        written, self._written = self._written, None
        return None if written is None else written.result()

    def place(self) -> None:
        """Name the blob (inside the store transaction); written here if staging failed or a prune removed it."""
        self._store.place_blob(self._session_id, self._temp(), self.blob_id, self._parts)

    def discard(self) -> None:
        """Remove the temp file if it was not placed (after the call, whatever its outcome)."""
        temp = self._temp()
        if temp is not None:
            with contextlib.suppress(OSError):
                temp.unlink()


def _key_bytes(variables: dict[str, str]) -> int:
    return sum(checkpoint_names.key_bytes(key) for key in variables)


def _check_names(changed: dict[str, str]) -> None:
    """Refuse a variable name the store would refuse: never commit what cannot be read back."""
    for key in changed:
        problem = checkpoint_names.checkpoint_key_problem(key)
        if problem is not None:
            shown = repr(key[:64]) + ("..." if len(key) > 64 else "")
            raise ProtocolError(f"checkpoint names a variable {shown} that cannot be stored: {problem}")


def _received_blobs(record: SessionRecord, delta: CheckpointDelta, body: bytearray) -> dict[str, memoryview]:
    """The blobs a checkpoint sent, by digest, cut from its ``body`` (their sizes checked against those stored)."""
    try:
        parts = framing.split_body(body, [entry["size"] for entry in delta["blobs"]])
    except framing.ProtocolViolation as exc:
        raise ProtocolError(str(exc)) from None
    blobs = {entry["digest"]: part for entry, part in zip(delta["blobs"], parts, strict=True)}
    _check_stored_sizes(record, blobs)
    return blobs


def _checked(rule: Callable[..., T], *args: Any) -> T:
    """``rule(*args)`` of ``state/files.py``, its ValueError (a rule the delta broke) a ProtocolError."""
    try:
        return rule(*args)
    except ValueError as exc:
        raise ProtocolError(f"checkpoint files: {exc}") from None


def _files_after(
    record: SessionRecord, workspace: FilesDelta, blobs: dict[str, memoryview]
) -> tuple[dict[str, files.Entry], dict[str, int]]:
    """The workspace after ``workspace`` and the sizes of its new files' blobs, each checked against the blob sent
    in the body or the one the record holds (now or in a kept generation).

    Raises:
        ProtocolError: an entry breaks a rule of the map, or a file's blob was neither sent nor stored, or is
            given a size it does not have.
    """
    changed, claimed = _checked(files.entries, workspace["changed"])
    for blob_digest, size in claimed.items():
        sent = blobs.get(blob_digest)
        held = len(sent) if sent is not None else _stored_size(record, blob_digest)
        if held is None:
            raise ProtocolError(f"checkpoint names a file blob {blob_digest} that was neither sent nor stored")
        if held != size:
            raise ProtocolError(f"checkpoint says file blob {blob_digest} has {size} bytes; it has {held}")
    return _checked(files.apply, record.files, changed, workspace["deleted"]), claimed


def _stored_size(record: SessionRecord, blob_digest: str) -> int | None:
    """The size of a blob the record names, now or in a kept generation (None: it names no such blob)."""
    size = record.blob_sizes.get(blob_digest)
    if size is None:
        kept = (snapshot.blob_sizes for snapshot in reversed(record.history))
        size = next((sizes[blob_digest] for sizes in kept if blob_digest in sizes), None)
    return size


def _check_contexts(
    changed: dict[str, str], variables: dict[str, str], known: Collection[str], *, destroying: bool
) -> None:
    """Refuse variables of a context the session does not have (``destroying``: one it was told to destroy)."""

    def unknown(names: Iterable[str]) -> bool:
        separator = checkpoint_names.CONTEXT_SEPARATOR
        return any(separator in k and k.partition(separator)[0] not in known for k in names)

    if unknown(changed):
        raise ProtocolError("checkpoint names a variable of a context the session does not have")
    if destroying and unknown(variables):
        raise ProtocolError("the agent kept variables of a context it was told to destroy")


def _check_stored_sizes(record: SessionRecord, blobs: dict[str, memoryview]) -> None:
    """Refuse a delta that sends a blob the record names (now or in a kept generation) with another size: the store
    keeps the file it has, so the record would count the sandbox's number, not the bytes on disk.

    Raises:
        ProtocolError: naming the first such blob.
    """
    for blob_digest, data in blobs.items():  # only the blobs sent: a commit never walks the whole history
        size = _stored_size(record, blob_digest)
        if size is not None and size != len(data):
            raise wrong_size(blob_digest, len(data), size)


def generation_not_found(record: SessionRecord, generation: int) -> GenerationNotFound:
    """The error for a generation ``record`` does not keep, naming those it keeps."""
    kept = ", ".join(str(g) for g in [*(s.generation for s in record.history), record.generation])
    return GenerationNotFound(
        f"session {record.session_id} keeps no generation {generation}; it keeps generation {kept} "
        "(Settings.limits.history_generations, ORCH_HISTORY_GENERATIONS, keeps more)"
    )


def _amount(size: int) -> str:
    return f"{size} bytes" if size < 1024 else f"{size} bytes ({describe_bytes(size)})"


class CheckpointLedger:
    """The stored record of one session, changed only by its owner."""

    def __init__(self, store: SessionStore, record: SessionRecord, quota: int, *, keep: int) -> None:
        """``quota``: the checkpoint quota in bytes; ``keep``: earlier generations kept (``history.retain``)."""
        self._store = store
        self.record = record
        self.quota = quota
        self.keep = keep
        self.metrics: Recorder = NO_METRICS
        """Told the bytes of each commit (its session's runtime sets it)."""
        self.workspace_files = files.DEFAULT_ENTRIES
        """Entries the session's workspace may hold (``Settings.limits.workspace_files``; its runtime sets it)."""
        self._held: SessionRecord | None = None
        self._written: Written | None = None
        """The record as this handle last saved it: the next transaction reuses it while the file is unchanged."""

    @property
    def store(self) -> SessionStore:
        """The store the session lives in (its directory also holds the calls' output files)."""
        return self._store

    @classmethod
    def create(cls, store: SessionStore, record: SessionRecord, quota: int, *, keep: int) -> CheckpointLedger:
        """Store a new session's ``record``, held by this process from now (its lease written with it)."""
        store.create(record, lease.new_lease(record.owner, record.epoch, now=time.time()))
        return cls(store, record, quota, keep=keep)

    @classmethod
    def fork(
        cls,
        store: SessionStore,
        source_id: str,
        children: Sequence[SessionRecord],
        quota: int,
        *,
        at: int | None = None,
        keep: int,
        placement: dict[str, Any] | None = None,
    ) -> list[CheckpointLedger]:
        """Store ``children`` (new records: id, image, labels, times, owner set) as forks of ``source_id`` at its
        last committed generation, or at the kept generation ``at``: each gets that generation's state, scaffold
        and placement (or ``placement``) and shares its blobs (``SessionStore.fork``). The source is read under its
        lock, never changed; nobody needs to own it.

        Each child is whole or absent. When one cannot be made, those made before it are removed again and the error
        raised; a kill leaves those written before it, ordinary sessions that name their source in ``forked_from``.

        Raises:
            GenerationNotFound: ``at`` is not a generation the source keeps (the message names those it keeps).
            SessionNotFound: no source.
            ConfigError: a child's id is taken.
            CheckpointError: the source's checkpoint is damaged.
        """
        made = []
        with store.transaction(source_id) as source:
            snapshot = source.snapshot() if at is None else source.generation_at(at)
            if snapshot is None:
                raise generation_not_found(source, at or 0)
            try:
                for child in children:
                    child.generation = snapshot.generation
                    child.apply(snapshot)
                    child.committed_at, child.changed = snapshot.at, list(snapshot.changed)
                    child.files_changed = list(snapshot.files_changed)
                    child.forked_from = {"session_id": source_id, "generation": snapshot.generation}
                    child.placement = dict(source.placement if placement is None else placement)
                    child.scaffold = dict(source.scaffold)
                    store.fork(source_id, child, lease.new_lease(child.owner, child.epoch, now=time.time()))
                    made.append(cls(store, child, quota, keep=keep))
            except BaseException:
                for ledger in made:
                    with contextlib.suppress(OrchestratorError):  # taken meanwhile (by force), or gone: left alone
                        ledger.delete()
                raise
        return made

    @classmethod
    def take_ownership(
        cls, store: SessionStore, session_id: str, quota: int, *, keep: int, force: bool = False
    ) -> CheckpointLedger:
        """Become the session's owner: a new token and the next epoch, which makes every other handle stale.

        A session whose lease proves a live holder (``lease.is_live``) is taken only with ``force``.

        Raises:
            SessionHeld: a live controller holds the session and ``force`` is False; nothing was changed.
        """
        with store.transaction(session_id) as record:
            leases = store.lease(session_id)
            with leases.locked():
                held, now = leases.read(), time.time()
                live = lease.is_live(
                    held,
                    owner=record.owner,
                    now=now,
                    ttl=lease.LEASE_TTL,
                    here=lease.this_machine(),
                    probe=lease.process_start,
                )
                if live and held is not None:
                    if not force:
                        raise SessionHeld(
                            f"session {session_id} is held by a live controller ({held.describe(now)}); nothing "
                            "was changed. Wait until it detaches or closes the session, or take it over with "
                            "--force (attach(..., force=True)): its running call is stopped and its handle goes stale",
                            host=held.host,
                            pid=held.pid,
                            since=held.since,
                        )
                    logger.warning("session %s: taken over by force from %s", session_id, held.describe(now))
                record.owner = new_owner_token()
                record.epoch += 1
                leases.write(lease.new_lease(record.owner, record.epoch, now=now))
            store.save(record)
        return cls(store, record, quota, keep=keep)

    def renew_lease(self) -> bool:
        """Renew this handle's lease on the session; False when it holds none any more (taken over, or released).

        Raises:
            SessionNotFound: the session was removed.
        """
        return self._store.lease(self.session_id).renew(self.record.owner, now=time.time())

    def release_lease(self) -> None:
        """End this handle's lease, if it still holds one (a lease another handle took is left alone)."""
        self._store.lease(self.session_id).release(self.record.owner)

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
        with self._store.transaction(self.session_id, written=self._written) as current:
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

    def update(self, change: Callable[[SessionRecord], None]) -> None:
        """Let ``change`` act on the record (and on the sandbox it names) while we own the session, then store it."""
        with self.owned() as current:
            change(current)
            self._save(current)

    def check_room(self, keys: Collection[str], size: int, what: str) -> None:
        """Refuse a host-made value of ``size`` bytes under ``keys`` (checkpoint keys) that would not fit the quota
        or the manifest's bounds (so the agent, which adopts it without a check, is never the one over them).

        Raises:
            CheckpointQuotaExceeded: with it, the checkpoint would hold more than the quota, or more names
                (or bytes of names) than the manifest's bounds.
        """
        record = self.record
        kept = {d for k, d in record.variables.items() if k not in keys} | files.digests(record.files)
        held = size + sum(record.blob_sizes[d] for d in kept)
        if held > self.quota:
            raise CheckpointQuotaExceeded(
                f"{what} takes {_amount(size)} of checkpoint: with it session {self.session_id} would hold "
                f"{_amount(held)}, over its checkpoint quota of {_amount(self.quota)}; nothing was sent or "
                "stored. Raise Settings.limits.checkpoint_quota (ORCH_CHECKPOINT_QUOTA; by default 4 x the memory "
                "limit), free room first (del variables in a cell, reset()), or pass a smaller value",
                size=size,
                held=held,
                quota=self.quota,
            )
        variables = dict.fromkeys([*record.variables, *keys], "")
        if (
            len(variables) > checkpoint_names.MAX_CHECKPOINT_NAMES
            or _key_bytes(variables) > checkpoint_names.MAX_CHECKPOINT_NAME_BYTES
        ):
            raise CheckpointQuotaExceeded(
                f"{what}: with its names session {self.session_id} would hold {len(variables)} names "
                f"({_key_bytes(variables)} bytes of names), over the checkpoint's bound of "
                f"{checkpoint_names.MAX_CHECKPOINT_NAMES} names and "
                f"{checkpoint_names.MAX_CHECKPOINT_NAME_BYTES} bytes of names; "
                "nothing was sent or stored. Delete variables first (del in a cell, reset())",
                size=size,
                held=held,
                quota=self.quota,
            )

    def stage(self, parts: Sequence[framing.Body]) -> StagedBlob:
        """Start writing a host-made blob (``blob_format.host_blob_parts``) under a new id; ``commit`` names it."""
        return StagedBlob(self._store, self.session_id, parts)

    def commit(
        self,
        delta: CheckpointDelta,
        body: bytearray,
        *,
        counters: dict[str, int] | None = None,
        contexts: dict[str, dict[str, Any]] | None = None,
        staged: Collection[StagedBlob] = (),
        context: str | None = None,
    ) -> dict[str, str]:
        """Validate a reply's checkpoint delta and store it; return the names that could not be saved.

        ``contexts`` (when given) replaces the record's contexts in the same manifest write. ``context`` is the
        context the delta is from (None: the default one): its names in the record's unsaved report are replaced.
        ``staged`` are host-made blobs the delta may name without sending them; those it names are
        stored with it (the caller discards the others).

        Raises:
            ProtocolError: the delta is inconsistent (names an unknown blob, wrong sizes or
                generation, a name the store would refuse); nothing was stored.
            CheckpointLimitExceeded: the checkpoint would go past the quota or the manifest's
                bounds (``_check_limits``); nothing was stored.
            SessionAttachedElsewhere: we no longer own the session; nothing was stored.
        """
        changed, deleted, workspace = delta["vars"], delta["deleted"], delta.get("files")
        moved = workspace is not None and bool(workspace["changed"] or workspace["deleted"])
        expected = self.record.generation + (1 if changed or deleted or moved else 0)
        if delta["generation"] != expected:
            raise ProtocolError(f"checkpoint generation {delta['generation']} out of step (expected {expected})")
        known = self.record.contexts if contexts is None else contexts
        paths = None if workspace is None else _checked(files.unsaved, workspace["unsaved"])
        unsaved = merged(self.record.unsaved, delta["unsaved"], context=context, known=known, workspace=paths)
        if (
            not (changed or deleted or moved or delta["blobs"] or counters or contexts is not None)
            and unsaved == self.record.unsaved
        ):
            return delta["unsaved"]  # nothing to store; the activity file (not the record) says it was used
        _check_names(changed)
        blobs = _received_blobs(self.record, delta, body)
        host = {blob.blob_id: blob for blob in staged}
        if not set(changed.values()) <= set(blobs) | set(host) | set(self.record.blob_sizes):
            raise ProtocolError("checkpoint names a blob that was neither sent nor stored")
        gone = set(deleted)
        variables = {k: v for k, v in self.record.variables.items() if k not in gone}
        variables.update(changed)
        _check_contexts(changed, variables, known, destroying=contexts is not None)
        sizes = {
            **self.record.blob_sizes,
            **{d: len(b) for d, b in blobs.items()},
            **{d: blob.size for d, blob in host.items()},
        }
        changes: dict[str, Any] = {"unsaved": unsaved, "generation": delta["generation"], **(counters or {})}
        workspace_files = self.record.files
        if workspace is not None and moved:
            entries = files.entry_limit(self.workspace_files)  # the changed paths alone, before any is checked
            self._refuse_over([("workspace entries", len(workspace["changed"]), entries)])
            workspace_files, file_sizes = _files_after(self.record, workspace, blobs)
            sizes.update(file_sizes)
            listed = itertools.chain((entry[0] for entry in workspace["changed"]), workspace["deleted"])
            changes["files"] = workspace_files
            changes["files_changed"] = files.changed_paths(self.record.files, workspace_files, listed)
        elif delta["generation"] != self.record.generation:
            changes["files_changed"] = []
        blob_sizes = {d: sizes[d] for d in set(variables.values()) | files.digests(workspace_files)}
        self._check_limits(variables, blob_sizes, workspace_files)
        if contexts is not None:
            changes["contexts"] = contexts
        self._store_checkpoint(variables, blob_sizes, blobs, host, changes)
        return delta["unsaved"]

    def _store_checkpoint(
        self,
        variables: dict[str, str],
        blob_sizes: dict[str, int],
        blobs: dict[str, memoryview],
        host: dict[str, StagedBlob],
        changes: dict[str, Any],
    ) -> None:
        """Write the blobs the variables name (sent, or host-made and staged) and then the manifest, as the owner."""
        written: dict[str, bytes | bytearray | memoryview] = {d: blobs[d] for d in blobs if d in blob_sizes}
        with self.owned() as current:
            self._store.write_blobs(self.session_id, written)
            for blob_id, blob in host.items():
                if blob_id in blob_sizes:
                    blob.place()
            self._replace_manifest(current, variables, blob_sizes, **changes)
        self.metrics.checkpoint(
            sum(map(len, written.values())) + sum(b.size for i, b in host.items() if i in blob_sizes),
            self.record.checkpoint_bytes,
        )

    def _check_limits(
        self, variables: dict[str, str], blob_sizes: dict[str, int], workspace: dict[str, files.Entry]
    ) -> None:
        """Refuse a checkpoint past the session's limits, each counted on what the host holds (received bytes, keys,
        paths).

        Raises:
            CheckpointLimitExceeded: over the quota in bytes, ``MAX_CHECKPOINT_NAMES`` names,
                ``MAX_CHECKPOINT_NAME_BYTES`` bytes of names, or the workspace's bounds (``files.limits``).
        """
        before = self.record
        limits = [("bytes", sum(blob_sizes.values()), self.quota)]
        if any(key not in before.variables for key in variables):  # only added names grow the manifest
            limits.append(("names", len(variables), checkpoint_names.MAX_CHECKPOINT_NAMES))
            limits.append(("name bytes", _key_bytes(variables), checkpoint_names.MAX_CHECKPOINT_NAME_BYTES))
        if not workspace.keys() <= before.files.keys():  # only added paths grow the workspace's map
            limits.extend(files.limits(workspace, self.workspace_files))
        self._refuse_over(limits)

    def _refuse_over(self, limits: list[tuple[str, int, int]]) -> None:
        """Raise CheckpointLimitExceeded for the first ``(unit, held, limit)`` whose ``held`` is over its limit."""
        for unit, held, limit in limits:
            if held > limit:
                had = self._holding(unit)  # counted only here: a commit within its limits does not pay for it
                raise CheckpointLimitExceeded(
                    f"the agent's checkpoint would hold {held} {unit}, over the session's "
                    f"{'checkpoint quota' if unit == 'bytes' else 'checkpoint manifest limit'} of {limit} {unit} "
                    f"(it held {had}); nothing of it was stored. An honest agent names what does not fit in unsaved, "
                    "so the sandbox is not trusted any more",
                    unit=unit,
                    size=max(0, held - had),
                    held=held,
                    quota=limit,
                )

    def _holding(self, unit: str) -> int:
        """What the record holds now of a ``_check_limits`` unit."""
        before = self.record
        if unit == "bytes":
            return before.checkpoint_bytes
        if unit == "names":
            return len(before.variables)
        if unit == "name bytes":
            return _key_bytes(before.variables)
        return next(held for name, held, _ in files.limits(before.files, self.workspace_files) if name == unit)

    def drop(self, names: dict[str, str]) -> None:
        """Take values (and workspace files, named ``/workspace/<path>``) that could not be restored out of the
        checkpoint (the agent does not hold them either)."""
        if not names:
            return
        with self.owned() as current:
            variables = {k: v for k, v in current.variables.items() if k not in names}
            kept = {p: e for p, e in current.files.items() if files.UNSAVED_PREFIX + p not in names}
            live = set(variables.values()) | files.digests(kept)
            blob_sizes = {d: s for d, s in current.blob_sizes.items() if d in live}
            self._replace_manifest(current, variables, blob_sizes, files=kept)

    def rewind(self, generation: int) -> SessionRecord:
        """Make a new generation whose state is the kept generation ``generation``'s, in one switch of the manifest;
        history stays linear (the generation left is kept like any other). Returns the record as stored.

        Raises:
            GenerationNotFound: the session keeps no such generation (the message names those it keeps).
            SessionAttachedElsewhere: we no longer own the session; nothing was changed.
        """
        with self.owned() as current:
            target = current.generation_at(generation)
            if target is None:
                raise generation_not_found(current, generation)
            before, files_before = dict(current.variables), current.files
            self._advance(current, current.generation + 1)
            current.apply(target)
            current.changed = history.changed_names(before, current.variables)
            current.files_changed = files.changed_paths(
                files_before, current.files, files_before.keys() | current.files
            )
            current.rewound_from = generation
            self._store_manifest(current, current.named_blobs())
        return self.record

    def _advance(self, current: SessionRecord, generation: int) -> None:
        """Keep the current generation in the history (its unsaved report as names only) and begin ``generation``
        (its state set by the caller)."""
        kept = dataclasses.replace(current.snapshot(), unsaved=names_only(current.unsaved))
        current.history = [*current.history, kept]
        current.generation, current.committed_at, current.rewound_from = generation, time.time(), None

    def _replace_manifest(
        self, current: SessionRecord, variables: dict[str, str], blob_sizes: dict[str, int], **fields: Any
    ) -> None:
        """Switch to a new manifest and ``fields`` in one rename (a new generation keeps the one before in the
        history), then delete the blobs no kept manifest names any more (under the store lock)."""
        named = current.named_blobs()
        generation = fields.pop("generation", current.generation)
        if generation != current.generation:
            changed = history.changed_names(current.variables, variables)
            self._advance(current, generation)
            current.changed = changed
        current.variables, current.blob_sizes = variables, blob_sizes
        for name, value in fields.items():
            setattr(current, name, value)
        self._store_manifest(current, named)

    def _store_manifest(self, current: SessionRecord, named_before: set[str]) -> None:
        """Trim the history to the retention rule, save, then delete the blobs that left every kept manifest."""
        current.history = history.retain(current.history, current.blob_sizes, keep=self.keep, quota=self.quota)
        self._save(current)
        self._store.delete_blobs(self.session_id, named_before - current.named_blobs())

    def delete(self) -> None:
        """Remove the record and every blob."""
        with self.owned():
            self._store.delete(self.session_id)

    def mapped_blob(self, blob_digest: str) -> AbstractContextManager[memoryview]:
        """One stored blob for the ``with`` block (``SessionStore.mapped_blob``)."""
        return self._store.mapped_blob(self.session_id, blob_digest)

    def blob_path(self, blob_digest: str) -> Path:
        """Where a stored blob is (``SessionStore.blob_path``): a deferred value's blob is handed out as its file."""
        return self._store.blob_path(self.session_id, blob_digest)

    def _save(self, current: SessionRecord) -> None:
        current.last_used_at = time.time()
        self._written = self._store.save(current)
        self.record = dataclasses.replace(current)
