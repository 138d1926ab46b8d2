"""The controller's side of deferred values: it hands a sandbox the blob of a value a restore deferred.

A restore sends values of at least ``DEFER_BYTES`` as ``defer`` requests: the worker loads one
when a cell first uses it, by a host call of the reserved name ``protocol.BLOB_CALL`` that the
connection answers here, from the store, never through the cell's handlers (docs/protocol.md,
"Deferred values"). The call comes from the sandbox, so it is hostile: it is served only for a
checkpoint key whose current record entry names that very blob (so a controller that took the
sandbox over serves what its predecessor deferred, and no sandbox reads a blob its session does
not name), through the store's mapped read, and each key at most
``_SERVES_PER_KEY`` times per restore (an honest worker loads it once; an interrupt in the middle
costs one more), so a cell cannot make the host read and send more than a few times its checkpoint.
The blob is checked against its digest on a host thread while it travels and is unpickled (the sandbox
has one CPU; 100 MB cost ~120 ms to hash), and the worker binds the value only once the controller
says it matched (``protocol.BLOB_CHECK_CALL``), as a restore's ``verified`` load does. In one hop, where the
worker can never write the file, the blob goes as a read-only descriptor of its stored file (SCM_RIGHTS on the
call link): the worker maps it, and the host checks its own mapping of that same file.
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager, ExitStack
from typing import NamedTuple

from ..agent import protocol
from ..errors import OrchestratorError
from . import background

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
        open_file: Callable[[str], int | None] | None = None,
    ) -> None:
        """``named``: the blob the session's current record names for a checkpoint key (None: none); ``open_file``:
        a read-only descriptor of a blob's file the worker may have (None: the blob goes as a body)."""
        self._sandbox_id = sandbox_id
        self._named = named
        self._open_blob = open_blob
        self._open_file = open_file
        self._served: dict[str, int] = {}
        self._checks: dict[tuple[str, str], Future[bool]] = {}  # the digest checks of blobs handed out
        self._mapped = ExitStack()  # the blobs handed out during the running request, mapped until it ends
        self.served_bytes = 0
        """Bytes of blobs handed out since the last restore (what lazy loading cost the host)."""

    def restored(self) -> None:
        """A restore began: every key may be loaded again."""
        self._served.clear()
        self._checks.clear()
        self.served_bytes = 0

    def serve(self, payload: object, *, as_file: bool = False) -> memoryview | BlobFile:
        """The blob a ``BLOB_CALL`` asks for (its JSON payload decoded): with ``as_file``, where one may be handed out,
        a descriptor of its file (open until ``release``), else the blob mapped until ``release``; its digest check
        starts beside.

        Raises:
            BlobRefused: it names no blob the session's record names under that key, it was served
                too often, or its stored blob cannot be read (logged: the value is lost).
        """
        key, digest = self._granted(payload)
        count = self._served.get(key, 0)
        if count >= _SERVES_PER_KEY:
            raise BlobRefused(f"the blob of {key!r} was handed out {count} times since the restore, the most it may")
        self._served[key] = count + 1
        check: Future[bool] = Future()
        try:
            fd = self._open_file(digest) if as_file and self._open_file is not None else None
            served: memoryview | BlobFile
            if fd is None:
                served = blob = self._mapped.enter_context(self._open_blob(digest))
                size = len(blob)
                if not protocol.is_host_blob(digest):
                    check = background.beside().submit(lambda: protocol.blob_digest(blob) == digest)
            else:
                self._mapped.callback(os.close, fd)
                served = BlobFile(fd, os.fstat(fd).st_size)
                size = served.size
                if not protocol.is_host_blob(digest):  # the host checks the very file the worker maps
                    check = background.beside().submit(_file_matches, os.dup(fd), digest)
        except (OSError, OrchestratorError) as exc:
            logger.error("sandbox %s: the blob of deferred value %r cannot be read: %s", self._sandbox_id, key, exc)
            raise BlobRefused(f"its stored blob cannot be read: {exc}") from None
        if protocol.is_host_blob(digest):  # no content digest: the worker checks its frame
            check.set_result(True)
        self._checks[(key, digest)] = check
        self.served_bytes += size
        return served

    def release(self) -> None:
        """The request ended (its answers were sent): unmap the blobs it handed out.

        A mapping something still reads (a request that failed with the blob half sent, a check the
        cell never asked for) cannot close now; it closes when the last reader lets go of it.
        """
        mapped, self._mapped = self._mapped, ExitStack()
        try:
            mapped.close()
        except BufferError:
            logger.debug(
                "sandbox %s: a deferred value's blob is still in use; unmapped when released", self._sandbox_id
            )

    def verdict(self, payload: object) -> bool:
        """The answer to a ``BLOB_CHECK_CALL``: True when the blob last handed out for that key matched its digest.

        Raises:
            BlobRefused: no blob was handed out for it, or the blob does not match (logged: the value is lost).
        """
        key, digest = self._granted(payload)
        check = self._checks.pop((key, digest), None)
        if check is None:
            raise BlobRefused(f"no blob of {key[:200]!r} was handed out to check")
        try:
            matched = check.result()
        except (ValueError, BufferError, OSError):  # its mapping was closed before the check ran, or the file is empty
            raise BlobRefused(f"the blob of {key[:200]!r} handed out earlier cannot be checked any more") from None
        if not matched:
            logger.error("sandbox %s: the blob of deferred value %r does not match its digest", self._sandbox_id, key)
            raise BlobRefused("its stored blob does not match its digest: the checkpoint file is damaged")
        return True

    def _granted(self, payload: object) -> tuple[str, str]:
        """The key and digest a call names, if the session's current record names that blob under that key."""
        try:
            call = protocol.read_blob_call(payload)
        except protocol.BadRequest as exc:
            raise BlobRefused(str(exc)) from None
        key, digest = call["key"], call["digest"]
        if self._named(key) != digest:
            raise BlobRefused(f"no deferred value {key[:200]!r} with that blob in this session")
        return key, digest


class BlobFile(NamedTuple):
    """A blob handed out as a read-only descriptor of its stored file (one hop), and the file's size."""

    fd: int
    size: int


def _file_matches(fd: int, digest: str) -> bool:
    """Whether the file behind ``fd`` (the check's own descriptor, closed here) has content digest ``digest``; its
    mapping is the check's own too, so it is gone when the check is, whatever the request did meanwhile.

    Raises:
        ValueError: the file is empty (no blob is).
    """
    try:
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
            return protocol.blob_digest(view) == digest
    finally:
        os.close(fd)
