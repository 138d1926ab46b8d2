"""The worker's host-call link (K), the controller's end: the running cell's calls and output, and their answers.

The worker holds K's other end and cell code can write anything there at any time (docs/trust.md), so
``CallLink`` passes calls on only while an exec's cell runs and answers the others itself, bounds every answer by the
sandbox's own limit, answers the calls still open when the cell ends (and drops their late answers), and closes the
link when something on it is not a call or output (docs/design/one-hop.md, "Output and host calls").

A link that broke (a frame that is not a valid call or output, or over K's bounds; EOF; a worker that does not take
its answers) is closed: the worker's calls then fail with a message, the cell and the
session go on, and the worker's next data channel brings a new link. Nothing read on K raises. Reading is bounded
per round, so a flood cannot keep the controller from its deadline, and no call is read while answers wait for the
worker to take them (the worker's reader thread takes them at once), so a worker that sends calls without reading
the answers cannot fill the controller's memory.
"""

from __future__ import annotations

import itertools
import logging
import select
import time
from collections.abc import Iterable

from ..agent import framing, protocol
from ..errors import TransportError
from .call import Answer, Call, answer_error
from .host_link import OutputBudget, send_while_quiet, serve_host_call
from .transport import Channel

logger = logging.getLogger(__name__)

ANSWER_MAX_BYTES = protocol.HOST_CALL_MAX_BYTES
"""The sandbox's own bound on an answer's body (its ``ORCH_HOST_CALL_MAX_BYTES``, which the controller leaves at the
default); a deferred value's blob is bounded by the request body limit instead."""
_FRAMES_PER_ROUND = 64  # frames read from K before the request's loop looks at its deadline and D again
_FRAMES_AFTER_CELL = 1024  # frames read from K after a reply or between calls; more is a flood: the link is closed
_FLUSH_SECONDS = 2.0  # a worker's reader thread takes its answers at once; one that does not has broken its link


class CallLink:
    """K of one worker's data channel: a ``Channel`` with K's bounds, while it is open, and the calls it holds open."""

    def __init__(self, channel: Channel, *, blob_files: bool) -> None:
        """``blob_files``: K passes descriptors, so a deferred value's blob may go as one of its file."""
        self._channel: Channel | None = channel
        self._blob_files = blob_files
        self._open: set[int] = set()  # calls of the running cell given to its desk or input(), not answered yet

    @property
    def closed(self) -> bool:
        return self._channel is None

    def poll_events(self) -> int:
        """What to wait for on K (0: nothing, it is closed): its frames, or only room for the answers that wait."""
        channel = self._channel
        if channel is None:
            return 0
        return select.POLLOUT if channel.has_queued else select.POLLIN

    def fileno(self) -> int:
        """K's descriptor (only while ``poll_events`` is not 0)."""
        assert self._channel is not None
        return self._channel.fileno()

    def readable(self, ready: set[int]) -> bool:
        """Whether K has something to read or send now (``ready``: the descriptors the last wait found ready)."""
        channel = self._channel
        return channel is not None and (channel.fileno() in ready or channel.buffered)

    def read(self, call: Call, *, refusal: str | None, output: OutputBudget | None, deadline: float) -> None:
        """The frames on K now, at most a round's: output to ``output``; calls to ``call``'s desk (``input()`` to its
        live events), or answered ``refusal`` when it is not None (no exec's cell runs)."""
        channel = self._channel
        for count in itertools.count():
            if channel is None or not self.flush_now() or channel.has_queued:
                return  # closed, or answers wait for the worker: its next call can wait too
            if count >= _FRAMES_PER_ROUND and _readable(channel):
                return  # a flood: the wait finds K ready at once, after the deadline and D had their turn
            try:
                frame = channel.poll_recv()
            except TransportError as exc:  # EOF, or not a frame within K's bounds
                self.close(f"{exc}")
                return
            if frame is None:
                return
            message, body = frame
            if message.get("type") == protocol.OUTPUT:
                if not self._output(message, body, output):
                    return
                continue
            number = self._call(message)
            if number is None:
                return
            if refusal is not None:
                channel.enqueue(*answer_error(number, refusal))
            elif message["name"] == protocol.INPUT_CALL and call.live is not None:
                self._open.add(number)
                call.live.input_request(number, body)
            elif serve_host_call(channel, message, body, call, blob_files=self._blob_files):
                self._open.add(number)
            elif message["name"] == protocol.BLOB_CALL:  # a deferred value's blob: sent now, while the worker is quiet
                try:
                    send_while_quiet(channel, deadline)
                except TransportError as exc:
                    self.close(f"{exc}")

    def answer(self, answers: Iterable[Answer]) -> None:
        """Send the answers of open calls, each within the sandbox's bound; an answer to a call that is not open (its
        cell ended, and it was answered then) is dropped, never sent to the worker where a later cell reads."""
        channel = self._channel
        for header, body in answers:
            call = header.get("call")
            if channel is None or call not in self._open:
                logger.debug("dropped the answer to host call %r: its cell ended", call)
                continue
            self._open.discard(call)
            if len(body) > ANSWER_MAX_BYTES:
                error = (
                    f"the result is {len(body)} bytes, over the sandbox's {ANSWER_MAX_BYTES}-byte limit for host calls"
                )
                header, body = answer_error(call, error)
            channel.enqueue(header, body)
        self.flush_now()

    def end_cell(self) -> None:
        """The cell ended (``cell_done`` or its reply): every call still open is answered ``error`` now."""
        calls, self._open = self._open, set()
        if self._channel is not None:
            for call in sorted(calls):
                self._channel.enqueue(*answer_error(call, protocol.CALL_ENDED))
            self.flush_now()

    def after_reply(self, output: OutputBudget | None) -> None:
        """The reply came: the cell's last output is in K before it (a socket pair's write completes in the peer's
        buffer), so deliver it; refuse the calls that came with it and those still open; and send every answer whole
        (a frame cut in half would break the link for the next cell)."""
        self._settle(output, protocol.CALL_ENDED)

    def idle(self) -> None:
        """Between calls: what a thread an earlier cell left wrote on K. Its calls are answered ``error`` (no cell
        runs), its output is dropped; anything else closes K."""
        self._settle(None, protocol.CALL_NO_CELL)

    def flush_now(self) -> bool:
        """Send what the worker takes now; False when K is closed (it broke here)."""
        channel = self._channel
        if channel is None:
            return False
        try:
            channel.flush()
        except TransportError as exc:
            self.close(f"{exc}")
            return False
        return True

    def close(self, why: str | None = None) -> None:
        """Close K (idempotent): the worker's calls fail from now on; ``why`` it broke, if it did."""
        channel, self._channel = self._channel, None
        self._open.clear()
        if channel is None:
            return
        if why is not None:  # a worker that died (reported as SandboxCrashed) or a cell that closed K: nothing to do
            logger.debug("closed the worker's host-call link until its next data channel: %s", why)
        channel.close()

    def _settle(self, output: OutputBudget | None, refusal: str) -> None:
        """Read what is on K (output to ``output``, calls answered ``refusal``), end the open calls, send answers."""
        channel = self._channel
        for _ in range(_FRAMES_AFTER_CELL):
            if channel is None or self._channel is None:
                return
            try:
                frame = channel.poll_recv()
            except TransportError as exc:
                self.close(f"{exc}")
                return
            if frame is None:
                break
            message, body = frame
            if message.get("type") == protocol.OUTPUT:
                self._output(message, body, output)
            elif (call := self._call(message)) is not None:
                channel.enqueue(*answer_error(call, refusal))
        else:
            self.close(f"more than {_FRAMES_AFTER_CELL} frames came on it after its cell ended")
            return
        self.end_cell()
        if channel.has_queued:
            try:
                channel.flush(deadline=time.monotonic() + _FLUSH_SECONDS)
            except TransportError as exc:
                self.close(f"{exc}")

    def _output(self, message: framing.Header, body: bytearray, output: OutputBudget | None) -> bool:
        """An ``output`` frame of the running cell to ``output`` (dropped without it); a bad one closes K (False)."""
        stream = message.get("stream")
        if stream not in protocol.OUTPUT_STREAMS:
            self.close(f"an output frame for the stream {str(stream)[:64]!r}")
            return False
        if output is not None:
            output.output(str(stream), body)
        return True

    def _call(self, message: framing.Header) -> int | None:
        """The number of a ``host_call`` frame; None (K closed) if the frame is not one."""
        call, name, kind = message.get("call"), message.get("name"), message.get("type")
        if kind == protocol.HOST_CALL and type(call) is int and isinstance(name, str):
            return call
        self.close(f"a {str(kind)[:64]!r} frame that is not a host call or output")
        return None


def _readable(channel: Channel) -> bool:
    """Whether K's socket has bytes now (bytes already read into ``channel`` are not seen by a wait)."""
    poller = select.poll()
    poller.register(channel.fileno(), select.POLLIN)
    return bool(poller.poll(0))
