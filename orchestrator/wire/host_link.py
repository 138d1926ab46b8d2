"""Serving a running cell's host calls and output, and waiting for the sandbox while they are served.

The calls come on the worker's call link (K, ``call_link.py``); each goes to the request's ``CallDesk`` or is
answered here at once (a deferred value's blob, or a refusal), and the answers are queued on K. The request loop
(``connection.py``) waits on the sandbox and on the desk's answers together (``wait_for_sandbox``).
"""

from __future__ import annotations

import math
import select
import time
from collections.abc import Callable, Iterator

from ..agent import framing, protocol, reply_types
from ..errors import AgentTimeoutError, ProtocolError
from .call import Answer, BlobRefused, BlobServer, BlobUnavailable, Call, LiveEvents, answer_error, answer_ok
from .transport import Channel

OUTPUT_FRAMES_PER_CELL = 1 << 18
"""``output`` frames one request's cell may send. Each costs the controller a read and a parse however small it is, so
past this many the rest are dropped (as bytes past the output file's cap are) and the cell is stopped once, as its
timeout stops it: reading a flood of tiny frames costs a controller core this many frames and the interrupt's grace,
not the cell's whole timeout. An honest worker sends one per stream every 20 ms (``agent/capture.py``), unless the
cell flushes every write (``print(..., flush=True)``)."""
_FLOODED = (
    f"\n[... output stopped: the cell sent more than {OUTPUT_FRAMES_PER_CELL} output frames (flushed writes); "
    "it was interrupted ...]\n"
).encode()


class OutputBudget:
    """The output frames of one request's cell: to ``live`` within ``OUTPUT_FRAMES_PER_CELL``; past it dropped, and
    ``stop`` (the request's interrupt) called once."""

    def __init__(self, live: LiveEvents | None, stop: Callable[[], None]) -> None:
        self._live = live
        self._stop = stop
        self.frames = 0

    def output(self, stream: str, body: bytearray) -> None:
        self.frames += 1
        if self.frames <= OUTPUT_FRAMES_PER_CELL:
            if self._live is not None:
                self._live.output(stream, body)
            return
        if self.frames == OUTPUT_FRAMES_PER_CELL + 1:
            if self._live is not None:
                self._live.output("stderr", bytearray(_FLOODED))
            self._stop()


_BLOBS_ON_THE_WAY = 4
"""Blob answers queued on one channel at once, each holding a descriptor or a mapping until it is sent: an honest
worker asks for one at a time (a context loads under its lock); a cell that asks from many threads and reads
nothing gets "unavailable" past this, so what it makes the host hold stays bounded whatever the peer reads."""


def serve_host_call(
    channel: Channel,
    frame: framing.Header,
    body: bytearray,
    call: Call,
    *,
    blob_files: bool = False,
) -> bool:
    """A host call of the running cell: to ``call``'s desk (True: its answer comes later), or answered at once on
    ``channel`` (a deferred value's blob, or a refusal). ``blob_files``: the worker's own link (one hop), where a
    blob may go as a descriptor of its file."""
    number, name = call_number(frame), frame.get("name")
    if not isinstance(name, str):
        raise ProtocolError("a host_call frame without a handler name")
    if name in (protocol.BLOB_CALL, protocol.BLOB_CHECK_CALL):
        _answer_blob_call(channel, number, name, body, call.blobs, blob_files)
    elif call.desk is None:
        error = f"host call {name[:64]!r}: this cell was run without host calls"
        channel.enqueue(*answer_error(number, error))
    else:
        call.desk.submit(number, name, body)
        return True
    return False


def send_while_quiet(channel: Channel, deadline: float) -> None:
    """Send the queued answers while the sandbox sends nothing: a deferred value's blob (100 MB) moves in one tight
    loop instead of one round of the caller's wait per socket buffer. Stops as soon as the sandbox has something to
    say (it may be waiting for us to read before it reads), or at ``deadline``."""
    if not channel.has_queued:
        return
    poller = select.poll()
    poller.register(channel.fileno(), select.POLLIN | select.POLLOUT)
    while channel.has_queued and not channel.buffered:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        events = poller.poll(math.ceil(remaining * 1000))
        if any(event & ~select.POLLOUT for _, event in events):
            return  # readable (or hung up): the caller's loop reads first
        channel.flush()


def wait_for_sandbox(poller: select.poll, deadline: float, call: Call, *, wake_at: float, what: str) -> set[int]:
    """Poll the sandbox's channels (registered on ``poller`` by the caller) and the wake-ups of ``call``'s desk and
    live events until something is ready, an answer is due, or ``wake_at``; the descriptors that are ready.

    Raises:
        AgentTimeoutError: ``deadline`` (at or after ``wake_at``) passed: ``what`` says who sent no reply.
    """
    wake = wake_at
    for source in (call.desk, call.live):
        if source is not None:
            poller.register(source.wake_fd, select.POLLIN)
            wake = min(wake, source.next_expiry())
    remaining = wake - time.monotonic()
    if remaining <= 0 and wake == deadline:
        raise AgentTimeoutError(f"{what} sent no complete reply: the deadline passed")
    return {fd for fd, _ in poller.poll(None if remaining == math.inf else max(0, math.ceil(remaining * 1000)))}


def due_answers(ready: set[int], call: Call) -> Iterator[Answer]:
    """The answers of ``call``'s desk and live events that are ready (their wake-up is in ``ready``) or past their
    expiry."""
    now = time.monotonic()
    for source in (call.desk, call.live):
        if source is not None and (source.wake_fd in ready or source.next_expiry() <= now):
            yield from source.answers()


def call_number(frame: framing.Header) -> int:
    call = frame.get("call")
    if type(call) is not int:
        raise ProtocolError("a host_call frame without a call number")
    return call


def _answer_blob_call(
    channel: Channel, call: int, name: str, body: bytearray, blobs: BlobServer | None, as_file: bool
) -> None:
    """Queue the answer to a deferred value's blob call (the blob, or with ``as_file`` where it may be a descriptor of
    it and ``file``, its size, in the header; the channel closes it once sent) or check call (``true``), or why not:
    refused (the request is hostile, or the blob damaged) or unavailable now (the value stays deferred)."""
    if blobs is None:
        channel.enqueue(*answer_error(call, protocol.BLOB_REFUSED + "this sandbox has no deferred values"))
        return
    try:
        payload = framing.decode_json(body, "blob call payload")
        if name == protocol.BLOB_CHECK_CALL:
            channel.enqueue(*answer_ok(call, b"true" if blobs.verdict(payload) else b"false"))
            return
        if channel.carrying >= _BLOBS_ON_THE_WAY:
            raise BlobUnavailable(f"{channel.carrying} blobs are on their way to this sandbox already")
        served = blobs.serve(payload, as_file=as_file)
    except (framing.ProtocolViolation, BlobRefused) as exc:
        channel.enqueue(*answer_error(call, protocol.BLOB_REFUSED + str(exc)))
        return
    except BlobUnavailable as exc:
        channel.enqueue(*answer_error(call, protocol.BLOB_UNAVAILABLE + str(exc)))
        return
    if served.fd is not None:
        channel.enqueue(reply_types.host_reply_file(call, served.size), b"", (served.fd,), sent=served.close)
    else:
        channel.enqueue(reply_types.host_reply(call), served.body, sent=served.close)
