"""A deferred value's blob as a descriptor of its file (docs/protocol.md, "Deferred values").

The controller's channel queues an answer with a descriptor (closed by the answer's ``sent`` once sent or dropped),
and the
worker's reader of K maps it only for a blob call whose answer says ``file``; any other descriptor is closed unused.
Real socket pairs and files; what is observed is the answer and the descriptors left open, never time.
"""

from __future__ import annotations

import array
import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent import blob_format, framing, protocol, reply_types
from orchestrator.agent.hostcall import HostCallClient, HostCallError
from orchestrator.runtime.deferred import DeferredBlobs
from orchestrator.wire.call import BlobRefused
from orchestrator.wire.transport import Channel

BLOB = b"\x80\x04" + b"blob of a big value" * 100 + b"."


def open_fds() -> set[int]:
    """This process's open descriptors (not the one that listed them, closed by then)."""
    return {int(fd) for fd in os.listdir("/proc/self/fd") if _is_open(int(fd))}


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@pytest.fixture
def blob_file(tmp_path: Path) -> Path:
    path = tmp_path / "blob"
    path.write_bytes(BLOB)
    path.chmod(0o600)
    return path


@pytest.fixture
def link() -> Iterator[tuple[HostCallClient, socket.socket]]:
    """The worker's client on one end of K; the test plays the controller on the other."""
    worker, controller = socket.socketpair()
    client = HostCallClient(worker, protocol.HOST_CALL_MAX_BYTES, contextlib.nullcontext)
    with controller:
        yield client, controller
        client.close()
    worker.close()


def answer(controller: socket.socket, header: dict[str, Any], body: bytes = b"", fds: tuple[int, ...] = ()) -> None:
    """Read the worker's call and send ``header`` (with its call number) and ``body``, ``fds`` on its first byte."""
    call, _ = framing.recv_frame(controller)
    frame = b"".join(framing.frame_parts({**header, "call": call["call"]}, body))
    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    controller.sendmsg([frame], rights)


def call_in_thread(client: HostCallClient, name: str, controller: socket.socket, **reply: Any) -> Any:
    """``client.call_raw(name)`` while the controller answers as ``reply`` says; its result, or the error."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(client.call_raw(name, {"key": "big", "digest": "0" * 32}, timeout=10))
        except HostCallError as exc:
            result.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    answer(controller, **reply)
    thread.join(10)
    return result[0]


def test_a_blob_answer_with_a_file_is_mapped_and_leaves_no_descriptor(link: Any, blob_file: Path) -> None:
    client, controller = link
    fd = os.open(blob_file, os.O_RDONLY)
    before = open_fds()
    mapped = call_in_thread(
        client, protocol.BLOB_CALL, controller, header=dict(reply_types.host_reply_file(0, len(BLOB))), fds=(fd,)
    )
    os.close(fd)
    assert type(mapped).__name__ == "mmap" and bytes(mapped) == BLOB
    mapped.close()
    assert open_fds() <= before - {fd}


@pytest.mark.parametrize(
    "name, size, copies, error",
    [
        ("handler", len(BLOB), 1, "a file came for a call that takes none"),  # not a blob call
        (protocol.BLOB_CALL, len(BLOB), 2, "2 descriptors came with it"),
        (protocol.BLOB_CALL, len(BLOB), 0, "0 descriptors came with it"),
        (protocol.BLOB_CALL, len(BLOB) + 1, 1, f"holds {len(BLOB)} bytes, not the {len(BLOB) + 1} announced"),
        (protocol.BLOB_CALL, "big", 1, "file size 'big' is not valid"),
    ],
)
def test_a_file_answer_that_is_not_whole_fails_the_call_and_closes_what_came(
    link: Any, blob_file: Path, name: str, size: Any, copies: int, error: str
) -> None:
    client, controller = link
    fds = tuple(os.open(blob_file, os.O_RDONLY) for _ in range(copies))
    before = open_fds()
    header = {"type": protocol.HOST_REPLY, "status": protocol.STATUS_OK, "file": size}
    result = call_in_thread(client, name, controller, header=header, fds=fds)
    assert isinstance(result, HostCallError) and error in str(result), result
    for fd in fds:
        os.close(fd)
    assert open_fds() <= before - set(fds)


def test_a_descriptor_on_an_answer_that_asks_for_none_is_closed(link: Any, blob_file: Path) -> None:
    client, controller = link
    fd = os.open(blob_file, os.O_RDONLY)
    before = open_fds()
    result = call_in_thread(
        client, protocol.BLOB_CALL, controller, header=dict(reply_types.host_reply(0)), body=BLOB, fds=(fd,)
    )
    os.close(fd)
    assert bytes(result) == BLOB  # the body
    assert open_fds() <= before - {fd}


def test_a_descriptor_past_a_frames_prefix_is_never_taken_in(link: Any, blob_file: Path) -> None:
    client, controller = link
    fd = os.open(blob_file, os.O_RDONLY)
    before = open_fds()
    done: list[Any] = []
    thread = threading.Thread(target=lambda: done.append(client.call("handler", None, timeout=10)))
    thread.start()
    call, _ = framing.recv_frame(controller)
    frame = b"".join(framing.frame_parts({**reply_types.host_reply(call["call"])}, b"[1]"))
    controller.sendall(frame[: framing.PREFIX.size])
    controller.sendmsg([frame[framing.PREFIX.size :]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
    thread.join(10)
    os.close(fd)
    assert done == [[1]]
    assert open_fds() <= before - {fd}


def test_the_controllers_channel_closes_a_descriptor_as_soon_as_it_is_sent_or_dropped() -> None:
    ours, theirs = socket.socketpair()
    channel = Channel(ours, framing.MAX_HEADER_BYTES, framing.MAX_BODY_BYTES)
    read, write = os.pipe()
    before = open_fds()
    channel.enqueue(dict(reply_types.host_reply_file(1, 3)), b"", (read,), sent=lambda: os.close(read))
    assert open_fds() == before  # no copy
    channel.flush(deadline=None)
    assert open_fds() == before - {read}  # closed once sent
    data, fds, _, _ = socket.recv_fds(theirs, 1 << 16, 4)
    assert len(fds) == 1 and data.startswith(framing.MAGIC)
    os.write(write, b"via")
    assert os.read(fds[0], 3) == b"via"  # the same pipe
    os.close(fds[0])
    again = os.dup(write)
    channel.enqueue(dict(reply_types.host_reply_file(2, 3)), b"", (again,), sent=lambda: os.close(again))
    mine = ours.fileno()
    channel.close()  # dropped unsent: closed too
    assert open_fds() == before - {mine, read}
    os.close(write)
    theirs.close()


def _stored(path: Path) -> Any:
    """The store's mapped read of ``path`` (what the check opens afresh)."""

    @contextlib.contextmanager
    def open_blob(digest: str) -> Iterator[memoryview]:
        yield memoryview(path.read_bytes())

    return open_blob


def test_the_host_checks_the_stored_blob_not_the_descriptor_it_hands_out(blob_file: Path, tmp_path: Path) -> None:
    digest = blob_format.blob_digest(BLOB)
    copy = tmp_path / "copy"  # what is handed out need not be the stored file (a sealed copy, say)
    copy.write_bytes(b"not the blob")
    blobs = DeferredBlobs("sb-test", {"big": digest}.get, _stored(blob_file), lambda _: os.open(copy, os.O_RDONLY))
    blobs.restored({"big": len(BLOB)})
    before = open_fds()
    served = blobs.serve({"key": "big", "digest": digest}, as_file=True)
    assert served.fd is not None and served.size == len(b"not the blob")
    assert os.path.samefile(f"/proc/self/fd/{served.fd}", copy)
    assert blobs.verdict({"key": "big", "digest": digest}) is True
    served.close()
    assert open_fds() == before  # the answer's descriptor; the check held none of its own after it


def test_a_damaged_stored_blob_is_refused_at_its_verdict(blob_file: Path) -> None:
    digest = blob_format.blob_digest(BLOB)
    blob_file.write_bytes(BLOB[:-1] + b"!")
    blobs = DeferredBlobs("sb-test", {"big": digest}.get, _stored(blob_file), lambda _: os.open(blob_file, os.O_RDONLY))
    blobs.restored({"big": len(BLOB)})
    blobs.serve({"key": "big", "digest": digest}, as_file=True).close()
    with pytest.raises(BlobRefused, match="does not match its digest"):
        blobs.verdict({"key": "big", "digest": digest})


def test_without_a_file_the_blob_goes_as_its_body(blob_file: Path) -> None:
    digest = blob_format.blob_digest(BLOB)
    for open_file in (None, lambda _: None):  # none may be handed out (the relayed carrier), or this one may not
        blobs = DeferredBlobs("sb-test", {"big": digest}.get, _stored(blob_file), open_file)
        blobs.restored({"big": len(BLOB)})
        served = blobs.serve({"key": "big", "digest": digest}, as_file=True)
        assert served.fd is None and bytes(served.body) == BLOB
        assert blobs.verdict({"key": "big", "digest": digest}) is True
        served.close()


class _Connection:
    def __init__(self, capabilities: list[str]) -> None:
        self.passes_descriptors = True
        self.hello = {"capabilities": capabilities}


def test_an_agent_that_does_not_offer_blob_files_gets_the_body(tmp_path: Path) -> None:
    from orchestrator.config import Settings
    from orchestrator.runtime.sandbox import Sandbox

    sandbox = Sandbox.__new__(Sandbox)
    sandbox._settings = Settings()
    sandbox.sandbox_id = "sb-test"
    for capabilities, files in (([], False), ([protocol.BLOB_FILES], True)):
        sandbox.connection = _Connection(capabilities)  # type: ignore[assignment]
        sandbox.serve_deferred({}.get, _stored(tmp_path / "blob"), lambda digest: tmp_path / digest)
        assert sandbox.deferred is not None and (sandbox.deferred._open_file is not None) is files
