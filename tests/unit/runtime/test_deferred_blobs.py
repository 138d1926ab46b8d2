"""The controller's side of deferred values (runtime/deferred.py), and how Sandbox.restore defers."""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.agent import blob_format, protocol, request_table
from orchestrator.config import Settings
from orchestrator.errors import CheckpointError
from orchestrator.runtime.deferred import DeferredBlobs
from orchestrator.runtime.sandbox import Sandbox
from orchestrator.wire.call import BlobRefused, BlobUnavailable

BLOB = b"\x80\x04blob of a big value."
DIGEST = blob_format.blob_digest(BLOB)
OTHER = blob_format.blob_digest(b"another session's blob")


class Store:
    """Blobs by digest, and the record's manifest (key -> digest)."""

    def __init__(self) -> None:
        self.files = {DIGEST: bytearray(BLOB), OTHER: bytearray(b"another session's blob")}
        self.manifest = {"big": DIGEST, "ctx/big": DIGEST}

    @contextlib.contextmanager
    def open_blob(self, digest: str) -> Iterator[memoryview]:
        if digest not in self.files:
            raise CheckpointError(f"blob {digest} is missing")
        yield memoryview(bytes(self.files[digest]))


@pytest.fixture
def store() -> Store:
    return Store()


@pytest.fixture
def blobs(store: Store) -> DeferredBlobs:
    blobs = DeferredBlobs("sb-test", store.manifest.get, store.open_blob)
    blobs.restored({"big": len(BLOB), "ctx/big": len(BLOB)})
    return blobs


def served(blobs: DeferredBlobs, payload: Any) -> bytes:
    """The blob handed out, its answer sent (closed)."""
    answer = blobs.serve(payload)
    try:
        return bytes(answer.body)
    finally:
        answer.close()


def test_a_blob_the_restore_deferred_is_served_and_confirmed(blobs: DeferredBlobs) -> None:
    for key in ("big", "ctx/big"):
        assert served(blobs, {"key": key, "digest": DIGEST}) == BLOB
        assert blobs.verdict({"key": key, "digest": DIGEST}) is True
    assert blobs.served_bytes == 2 * len(BLOB)


@pytest.mark.parametrize(
    "payload",
    [
        {"key": "big", "digest": OTHER},  # another blob under its own key
        {"key": "secret", "digest": OTHER},  # a key the record does not name
        {"key": "small", "digest": DIGEST},  # named by the record, not deferred
        {"key": "big"},
        ["big", DIGEST],
        None,
    ],
)
def test_anything_else_is_refused(blobs: DeferredBlobs, store: Store, payload: Any) -> None:
    store.manifest["small"] = DIGEST
    with pytest.raises(BlobRefused):
        blobs.serve(payload)
    with pytest.raises(BlobRefused):
        blobs.verdict(payload)
    assert blobs.served_bytes == 0


def test_a_verdict_needs_a_blob_handed_out(blobs: DeferredBlobs) -> None:
    with pytest.raises(BlobRefused, match="no blob of 'big' was handed out"):
        blobs.verdict({"key": "big", "digest": DIGEST})
    served(blobs, {"key": "big", "digest": DIGEST})
    assert blobs.verdict({"key": "big", "digest": DIGEST}) is True
    assert blobs.verdict({"key": "big", "digest": DIGEST}) is True  # the verdict is kept: asked again, not rehashed


def test_each_key_is_handed_out_twice_per_restore_then_unavailable(blobs: DeferredBlobs) -> None:
    call = {"key": "big", "digest": DIGEST}
    for _ in range(2):
        served(blobs, call)
    with pytest.raises(BlobUnavailable, match="handed out 2 times"):
        blobs.serve(call)  # not refused: the value stays deferred
    blobs.restored({"big": len(BLOB)})
    assert served(blobs, call) == BLOB
    blobs.restored({})  # a restore that loads everything: nothing is served
    with pytest.raises(BlobRefused):
        blobs.serve(call)


def test_a_blob_is_checked_once_per_restore_for_every_key_and_ask(blobs: DeferredBlobs, store: Store) -> None:
    opened: list[str] = []
    real = store.open_blob

    def counting(digest: str) -> Any:
        opened.append(digest)
        return real(digest)

    blobs._open_blob = counting
    for key in ("big", "ctx/big", "big", "ctx/big"):
        served(blobs, {"key": key, "digest": DIGEST})
        assert blobs.verdict({"key": key, "digest": DIGEST}) is True
    assert len(opened) == 4 + 1  # four answers, one check


def test_a_damaged_blob_is_refused_at_its_verdict(blobs: DeferredBlobs, store: Store, caplog: Any) -> None:
    store.files[DIGEST][3] ^= 0xFF
    served(blobs, {"key": "big", "digest": DIGEST})
    with pytest.raises(BlobRefused, match="does not match its digest"):
        blobs.verdict({"key": "big", "digest": DIGEST})
    assert "does not match its digest" in caplog.text


@pytest.mark.parametrize("error", [errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOENT])
def test_a_host_that_cannot_open_the_blob_answers_unavailable(
    blobs: DeferredBlobs, store: Store, error: int, caplog: Any
) -> None:
    failing = {"answer": True, "check": False}  # the answer's open fails (on this thread), the check's (its lane's)

    @contextlib.contextmanager
    def short(digest: str) -> Iterator[memoryview]:
        if failing["answer" if threading.current_thread() is threading.main_thread() else "check"]:
            raise CheckpointError("cannot map it") from OSError(error, os.strerror(error))
        with store.open_blob(digest) as blob:
            yield blob

    blobs._open_blob = short
    with pytest.raises(BlobUnavailable, match="cannot read its stored blob now"):
        blobs.serve({"key": "big", "digest": DIGEST})
    assert blobs.served_bytes == 0 and "cannot be read now" in caplog.text
    failing.update(answer=False, check=True)
    blobs._checks.clear()  # the check the failed ask started (it passed): this one's fails
    served(blobs, {"key": "big", "digest": DIGEST})  # the failed ask did not count
    with pytest.raises(BlobUnavailable, match="could not read its stored blob now"):
        blobs.verdict({"key": "big", "digest": DIGEST})
    failing["check"] = False
    served(blobs, {"key": "big", "digest": DIGEST})  # checked again
    assert blobs.verdict({"key": "big", "digest": DIGEST}) is True


def test_a_restore_cancels_the_last_ones_checks_not_started(blobs: DeferredBlobs, store: Store) -> None:
    gate = threading.Event()
    blobs.lane.submit(lambda: gate.wait(30))  # the session's lane is busy: the check waits behind
    served(blobs, {"key": "big", "digest": DIGEST})
    waiting = blobs._checks[DIGEST]
    blobs.restored({"big": len(BLOB)})
    gate.set()
    assert waiting.cancelled()
    served(blobs, {"key": "big", "digest": DIGEST})
    assert blobs.verdict({"key": "big", "digest": DIGEST}) is True


def test_the_record_as_it_is_now_decides(blobs: DeferredBlobs, store: Store) -> None:
    del store.manifest["big"]  # the cell deleted it meanwhile, or it was found damaged
    with pytest.raises(BlobRefused):
        blobs.serve({"key": "big", "digest": DIGEST})


class _ScriptedSandbox(Sandbox):
    """A sandbox whose agent defers what it is told and fails the loads of ``failing`` (no engine, no channel)."""

    def __init__(self, failing: set[str]) -> None:
        self._settings = Settings()
        self.sandbox_id = "sb-test"
        self.failing = failing
        self.sent: list[tuple[str, str]] = []

    def request(self, header: Any, body: Any = b"", **_: Any) -> tuple[dict[str, Any], bytes]:
        kind = header["type"]
        if kind in (request_table.LOAD, request_table.DEFER):
            self.sent.append((kind, header["name"]))
            status = protocol.STATUS_ERROR if header["name"] in self.failing else protocol.STATUS_OK
            return {"type": request_table.LOAD_REPLY, "status": status, "reason": "needs its class"}, b""
        return {"type": request_table.RESTORE_REPLY, "status": protocol.STATUS_OK, "generation": 1}, b""


def _sized(sizes: dict[str, int]) -> tuple[dict[str, str], Any]:
    blobs = {f"h{index:032x}": b"x" * size for index, size in enumerate(sizes.values())}
    manifest = dict(zip(sizes, blobs, strict=True))

    @contextlib.contextmanager
    def open_blob(digest: str) -> Iterator[memoryview]:
        yield memoryview(blobs[digest])

    return manifest, open_blob


def test_a_restore_defers_the_big_values_and_loads_the_rest() -> None:
    manifest, open_blob = _sized({"big": 100, "small": 99, "c/big": 100})
    sandbox = _ScriptedSandbox(set())
    sandbox.serve_deferred(manifest.get, open_blob)
    assert sandbox.restore(manifest, 1, open_blob, defer_at=100) == {}
    assert sorted(sandbox.sent) == [("defer", "big"), ("defer", "big"), ("load", "small")]


def test_without_a_server_nothing_is_deferred() -> None:
    manifest, open_blob = _sized({"big": 100})
    sandbox = _ScriptedSandbox(set())
    assert sandbox.restore(manifest, 1, open_blob, defer_at=1) == {}
    assert sandbox.sent == [("load", "big")]


def test_a_value_failing_beside_deferred_ones_starts_the_restore_over_loading_all() -> None:
    manifest, open_blob = _sized({"Big": 100, "instance": 10})
    sandbox = _ScriptedSandbox({"instance"})
    sandbox.serve_deferred(manifest.get, open_blob)
    failed = sandbox.restore(manifest, 1, open_blob, defer_at=100)
    assert set(failed) == {"instance"}  # it still fails when all are loaded: named, as before
    assert ("load", "Big") in sandbox.sent and sandbox.sent[0] == ("defer", "Big")
