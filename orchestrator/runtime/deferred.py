"""The controller's side of deferred values: it hands a sandbox the blob of a value a restore deferred.

A restore sends values of at least ``DEFER_BYTES`` as ``defer`` requests: the worker loads one
when a cell first uses it, by a host call of the reserved name ``protocol.BLOB_CALL`` that the
connection answers here, from the store, never through the cell's handlers (docs/protocol.md,
"Deferred values"). The call comes from the sandbox, so it is hostile, and everything it makes the
host spend is bounded by what the restore deferred:

- only a key the sandbox's last restore deferred (``restored``; a controller that took a sandbox over
  counts what a restore of its record defers) whose current record entry still names that very blob;
- each key at most ``_SERVES_PER_KEY`` times per restore: once, and once more after a load the cell's
  interrupt cut short; past that the answer is ``protocol.BLOB_UNAVAILABLE`` (the value stays
  deferred: the next restore serves it again), never a refusal that would lose it;
- each blob's digest checked once per restore, on the session's own ``background.Lane`` (one session's
  checks never queue another's), against a fresh open of the stored blob (never the descriptor handed
  out, which need not be the stored file), and its verdict reused for every key and re-ask naming it;
- what is handed out is the answer's own: the channel closes a descriptor, or unmaps a blob sent as a
  body, as soon as the answer is sent (``Served.close``);
- a host that cannot open or map the blob now (out of descriptors or memory: any ``OSError``) answers
  ``BLOB_UNAVAILABLE``: the value stays deferred and in the checkpoint.

Only a blob that does not match its digest, or a call for something not deferred, is refused
(``protocol.BLOB_REFUSED``: the worker drops the value, or it was never its own). The worker binds a
value only once the controller says its blob matched (``protocol.BLOB_CHECK_CALL``), as a restore's
``verified`` load does. In one hop the blob goes as a read-only descriptor (SCM_RIGHTS on the call link)
where one may be handed out; else as the answer's body.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from contextlib import AbstractContextManager

from .. import background
from ..agent import blob_format, protocol
from ..wire.call import BlobRefused, BlobUnavailable, Served

logger = logging.getLogger(__name__)

DEFER_BYTES = 1 << 20
"""A value whose blob has at least this many bytes is deferred by a restore, not loaded. Below it, loading at
once costs less than a round trip later (a MiB unpickles in about a millisecond); above it, a value's load time
grows with its size and is worth saving for a first call that does not use it."""
_SERVES_PER_KEY = 2  # an honest worker asks once, and once more if an interrupt cut its load short


def deferrable(
    manifest: Mapping[str, str], open_blob: Callable[[str], AbstractContextManager[memoryview]], least: int | None
) -> dict[str, int]:
    """The keys of ``manifest`` whose blob has at least ``least`` bytes, with that size (none for None): what a
    restore defers."""
    if least is None:
        return {}
    sizes: dict[str, int] = {}
    for key, digest in manifest.items():
        with open_blob(digest) as blob:
            if len(blob) >= least:
                sizes[key] = len(blob)
    return sizes


class DeferredBlobs:
    """Serves the blobs of one sandbox's deferred values, as its last restore deferred them."""

    def __init__(
        self,
        sandbox_id: str,
        named: Callable[[str], str | None],
        open_blob: Callable[[str], AbstractContextManager[memoryview]],
        open_file: Callable[[str], int | None] | None = None,
    ) -> None:
        """``named``: the blob the session's current record names for a checkpoint key (None: none); ``open_file``:
        a read-only descriptor of a blob the worker may have (None: the blob goes as a body)."""
        self._sandbox_id = sandbox_id
        self._named = named
        self._open_blob = open_blob
        self._open_file = open_file
        self._deferred: frozenset[str] = frozenset()  # the keys the last restore deferred
        self._served: dict[str, int] = {}
        self._checks: dict[str, Future[bool]] = {}  # digest -> its check, once per restore
        self.lane = background.Lane()
        """Where the digest checks run, one at a time on the shared pool: its session's (``SessionSandbox.lane``,
        set when it serves), so a session's checks queue behind its own, whichever sandbox or restore made them."""
        self.served_bytes = 0
        """Bytes of blobs handed out since the last restore (what lazy loading cost the host)."""

    def restored(self, deferred: Mapping[str, object]) -> None:
        """A restore began that defers the keys of ``deferred`` (none: it loads everything), or a sandbox taken over
        holds those deferred: only they are served, each key and each check afresh."""
        self._deferred = frozenset(deferred)
        self._served.clear()
        for check in self._checks.values():
            check.cancel()  # the last restore's checks not started yet: nobody will ask their verdict
        self._checks.clear()
        self.served_bytes = 0

    def serve(self, payload: object, *, as_file: bool = False) -> Served:
        """The blob a ``BLOB_CALL`` asks for (its JSON payload decoded): with ``as_file``, where one may be handed out,
        a descriptor of it, else its mapping; its digest check starts on ``lane`` unless it did since the restore.

        Raises:
            BlobRefused: the restore deferred no such key, or the record names another blob under it.
            BlobUnavailable: it was handed out ``_SERVES_PER_KEY`` times since the restore, or the host cannot open
                or map it now.
        """
        key, digest = self._granted(payload)
        count = self._served.get(key, 0)
        if count >= _SERVES_PER_KEY:
            raise BlobUnavailable(
                f"the blob of {key[:200]!r} was handed out {count} times since the restore, the most it may; it loads "
                "again after the next restore"
            )
        self._check(digest)  # first: the host hashes its own read while the copy for the worker is made
        served = self._open(key, digest, as_file)
        self._served[key] = count + 1
        self.served_bytes += served.size
        return served

    def verdict(self, payload: object) -> bool:
        """The answer to a ``BLOB_CHECK_CALL``: True when the blob handed out for that key matched its digest.

        Raises:
            BlobRefused: no blob was handed out for it, or the blob does not match (logged: the value is lost).
            BlobUnavailable: the host could not read the blob to check it (it may later: the value stays).
        """
        key, digest = self._granted(payload)
        check = self._checks.get(digest)
        if check is None or not self._served.get(key):
            raise BlobRefused(f"no blob of {key[:200]!r} was handed out to check")
        try:
            matched = check.result()
        except (OSError, MemoryError) as exc:  # CheckpointError too: the host could not open or map it now
            self._checks.pop(digest, None)  # the next blob call checks again
            logger.warning("sandbox %s: the blob of %r could not be checked now: %s", self._sandbox_id, key, exc)
            raise BlobUnavailable(f"the host could not read its stored blob now: {exc}") from None
        if not matched:
            logger.error("sandbox %s: the blob of deferred value %r does not match its digest", self._sandbox_id, key)
            raise BlobRefused("its stored blob does not match its digest: the checkpoint file is damaged")
        return True

    def _open(self, key: str, digest: str, as_file: bool) -> Served:
        """The blob to hand out, open for its answer alone."""
        try:
            fd = self._open_file(digest) if as_file and self._open_file is not None else None
            if fd is not None:
                try:
                    size = os.fstat(fd).st_size
                except BaseException:
                    os.close(fd)
                    raise
                return Served(size, fd, memoryview(b""), lambda: os.close(fd))
            mapping = contextlib.ExitStack()
            with mapping:
                body = mapping.enter_context(self._open_blob(digest))
                return Served(len(body), None, body, _closer(mapping.pop_all()))
        except (OSError, MemoryError) as exc:  # CheckpointError too: the host cannot open or map it now
            logger.warning(
                "sandbox %s: the blob of deferred value %r cannot be read now: %s", self._sandbox_id, key, exc
            )
            raise BlobUnavailable(f"the host cannot read its stored blob now: {exc}") from None

    def _check(self, digest: str) -> None:
        """Check ``digest``'s stored blob on ``lane`` unless it was since the restore (a host-made blob has no content
        digest: the worker checks its frame). One that could not read the blob (out of descriptors) runs again."""
        earlier = self._checks.get(digest)
        if earlier is not None and not (earlier.done() and (earlier.cancelled() or earlier.exception() is not None)):
            return
        if blob_format.is_host_blob(digest):
            check: Future[bool] = Future()
            check.set_result(True)
        else:
            check = self.lane.submit(lambda: self._matches(digest))
        self._checks[digest] = check

    def _matches(self, digest: str) -> bool:
        """Whether the stored blob has content digest ``digest``, read by an open of the check's own."""
        with self._open_blob(digest) as blob:
            return blob_format.blob_digest(blob) == digest

    def _granted(self, payload: object) -> tuple[str, str]:
        """The key and digest a call names, if the last restore deferred that key and the record names that blob."""
        try:
            call = blob_format.read_blob_call(payload)
        except protocol.BadRequest as exc:
            raise BlobRefused(str(exc)) from None
        key, digest = call["key"], call["digest"]
        if key not in self._deferred or self._named(key) != digest:
            raise BlobRefused(f"no deferred value {key[:200]!r} with that blob in this sandbox")
        return key, digest


def _closer(mapping: contextlib.ExitStack) -> Callable[[], None]:
    """Unmap a blob sent as a body; one whose bytes something still reads (a view kept by a failed send) is unmapped
    when the last reader lets go of it."""

    def close() -> None:
        with contextlib.suppress(BufferError):
            mapping.close()

    return close
