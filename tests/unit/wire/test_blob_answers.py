"""Answers to deferred values' blob calls on a channel (wire/host_link.py): what each holds is let go of once it is
sent, and a peer that asks from many threads without reading gets "unavailable" past a few, never more held."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator

from orchestrator.agent import blob_format, framing, protocol
from orchestrator.runtime.deferred import DeferredBlobs
from orchestrator.wire.call import Call
from orchestrator.wire.host_link import serve_host_call
from orchestrator.wire.transport import Channel

BLOBS = {blob_format.blob_digest(b"%d" % index * 1000): b"%d" % index * 1000 for index in range(8)}
MANIFEST = {f"k{index}": digest for index, digest in enumerate(BLOBS)}


@contextlib.contextmanager
def open_blob(digest: str) -> Iterator[memoryview]:
    yield memoryview(BLOBS[digest])


blobs = DeferredBlobs("sb-test", MANIFEST.get, open_blob)


def blob_call(channel: Channel, call: int, key: str) -> None:
    body = bytearray(json.dumps({"key": key, "digest": MANIFEST[key]}).encode())
    serve_host_call(
        channel, {"type": protocol.HOST_CALL, "call": call, "name": protocol.BLOB_CALL}, body, Call(0.0, blobs=blobs)
    )


def test_blob_answers_on_their_way_are_bounded_and_let_go_of_once_sent() -> None:
    blobs.restored(MANIFEST)
    ours, theirs = socket.socketpair()
    channel = Channel(ours, framing.MAX_HEADER_BYTES, framing.MAX_BODY_BYTES)
    for call, key in enumerate(MANIFEST):
        blob_call(channel, call, key)  # nobody reads meanwhile
    assert channel.carrying == 4
    channel.flush(deadline=None)
    assert channel.carrying == 0
    answers = [framing.recv_frame(theirs) for _ in MANIFEST]
    served = [header for header, _ in answers if header["status"] == protocol.STATUS_OK]
    unavailable = [header["error"] for header, _ in answers if header["status"] != protocol.STATUS_OK]
    assert len(served) == 4 and len(unavailable) == 4
    assert all(error.startswith(protocol.BLOB_UNAVAILABLE) and "on their way" in error for error in unavailable)
    blob_call(channel, 99, "k7")  # asked again once the others went: served
    channel.flush(deadline=None)
    header, body = framing.recv_frame(theirs)
    assert header["status"] == protocol.STATUS_OK and bytes(body) == BLOBS[MANIFEST["k7"]]
    channel.close()
    theirs.close()
