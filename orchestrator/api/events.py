"""What a running call tells its caller as it happens: output chunks and ``input()`` requests.

The caller's ``on_output`` callback runs on the thread that called ``execute``, in the order the
frames came (stdout and stderr each in order), so it must be quick; what it raises is reported
in ``ExecResult.callback_errors`` and the call goes on. An ``InputRequest`` is answered by the
callback's return value (a str) or later by ``Session.submit_input`` from any thread; with no
answer after ``idle_timeout`` seconds the cell's ``input()`` raises ``EOFError``. That wait
does not count toward the cell's timeout.
"""

from __future__ import annotations

import codecs
import json
import logging
import math
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..agent import framing, protocol
from ..errors import ConfigError, InputRequestNotFound
from ..runtime.hostcalls import serving_as
from ..runtime.output import StreamRecorder
from ..wire.call import Answer, answer_error, answer_ok
from ..wire.wakeup import Wakeup

logger = logging.getLogger(__name__)

_MAX_CALLBACK_ERRORS = 20
_MAX_INPUT_BYTES = 1 << 20
_MAX_PROMPT = 1 << 16  # characters of an input() prompt the caller is shown
_MAX_WAITING_INPUTS = 16  # input() calls of one cell waiting at once (one per thread that reads input)


@dataclass(frozen=True)
class OutputEvent:
    """A piece of what the cell printed: ``data`` its bytes exactly as the cell wrote them, ``text`` those decoded as
    UTF-8 (a character split across pieces is kept whole, so ``text`` may be empty; a byte that is not UTF-8 is
    U+FFFD). The ``data`` of a stream's events, joined, are its bytes as written (up to the per-call file limit);
    the last event of a stream that ended inside a character has its U+FFFD as ``text`` and no ``data``."""

    stream: str  # "stdout" or "stderr"
    text: str
    data: bytes = b""


@dataclass(frozen=True)
class InputRequest:
    """The cell called ``input(prompt)``: answer with the callback's return value or ``Session.submit_input``."""

    request_id: str
    prompt: str
    idle_timeout: float


Event = OutputEvent | InputRequest
OnOutput = Callable[[Event], "str | None"]
"""The ``on_output`` callback: gets every event; a str it returns answers an ``InputRequest``."""


class LiveCall:
    """The live side of one exec on the controller: output to the caller and the files, input, interrupts.

    The connection feeds it frames and polls ``wake_fd``; other threads ``submit`` answers and
    ``interrupt``. The input flag of the exec request is set only when there is a callback.
    """

    def __init__(
        self,
        new_recorder: Callable[[str], StreamRecorder],
        on_output: OnOutput | None,
        input_timeout: float,
        owner: object,
        wakeup: Wakeup,
    ) -> None:
        """``owner``: the session; its callback runs as ``serving_as(owner)``, so it cannot call back into it.
        ``wakeup``: the session's (one per session, not per call: a call that prints nothing stays cheap)."""
        self.recorders: dict[str, StreamRecorder] = {}  # the streams that sent output, by name
        self._new_recorder = new_recorder
        self._owner = owner
        self._on_output = on_output
        self._input_timeout = input_timeout
        self._decoders: dict[str, codecs.IncrementalDecoder] = {}
        self._lock = threading.Lock()
        self._waiting: dict[str, tuple[int, float]] = {}  # request id -> (host call number, expiry)
        self._answers: list[Answer] = []
        self._interrupt = False
        self.interrupt_requested = False  # the caller stopped the cell (its timeout did not)
        self._closed = False
        self._wakeup = wakeup  # one meant for an earlier call only makes the first poll return early
        self.callback_errors: list[str] = []

    @property
    def wake_fd(self) -> int:
        return self._wakeup.fd

    @property
    def waiting_for_input(self) -> bool:
        """An ``input()`` waits for its answer: the cell's clock stands still."""
        return bool(self._waiting)

    def output(self, stream: str, data: bytearray) -> None:
        """An ``output`` frame: into the stream's recorder, then to the callback."""
        if stream not in protocol.OUTPUT_STREAMS:
            return
        recorder = self.recorders.get(stream)
        if recorder is None:
            recorder = self.recorders[stream] = self._new_recorder(stream)
        recorder.write(data)
        if self._on_output is not None and data:
            decoder = self._decoders.get(stream)
            if decoder is None:
                decoder = self._decoders[stream] = codecs.getincrementaldecoder("utf-8")("replace")
            raw = bytes(data)
            self._tell(OutputEvent(stream, decoder.decode(raw), raw))

    def finish_output(self) -> None:
        """The call ended: a dangling partial character goes out as a replacement character (its bytes went already)."""
        for stream, decoder in self._decoders.items():
            text = decoder.decode(b"", final=True)
            if text and self._on_output is not None:
                self._tell(OutputEvent(stream, text))

    def input_request(self, call: int, body: bytearray) -> None:
        """The cell's ``input()`` (a host call): ask the caller; answer now if the callback did.

        Without a callback the exec did not allow input, so the call was forged by the cell: refused at once.
        """
        error = None
        if self._on_output is None:
            error = "input() is not answered in this call (it was run without on_output)"
        elif len(self._waiting) >= _MAX_WAITING_INPUTS:  # each would hold host memory and a caller's attention
            error = f"{_MAX_WAITING_INPUTS} input() calls of this cell wait for answers already"
        if error is not None:
            with self._lock:
                self._answers.append(answer_error(call, error))
                self._wakeup.notify()
            return
        try:
            prompt = framing.decode_json(body, "an input() prompt", surrogates=True).get("prompt", "")
        except (framing.ProtocolViolation, AttributeError):
            prompt = ""
        if not isinstance(prompt, str):
            prompt = ""
        request = InputRequest(f"in-{secrets.token_hex(6)}", prompt[:_MAX_PROMPT], self._input_timeout)
        with self._lock:
            self._waiting[request.request_id] = (call, time.monotonic() + self._input_timeout)
        answer = self._tell(request)
        if answer is not None:
            try:
                self.submit(request.request_id, answer)
            except (ConfigError, InputRequestNotFound) as exc:
                self._note_callback_error(exc)

    def submit(self, request_id: str, text: str) -> None:
        """Answer an input request (any thread).

        Raises:
            ConfigError: ``text`` is not a str or is too long.
            InputRequestNotFound: no such request waits (unknown, answered, timed out, or its cell ended).
        """
        if not isinstance(text, str):
            raise ConfigError(f"the answer to an input request must be a str, not {type(text).__name__}")
        raw = json.dumps(text, ensure_ascii=False).encode("utf-8", "surrogatepass")
        if len(raw) > _MAX_INPUT_BYTES:
            raise ConfigError(f"the answer is {len(raw)} bytes; at most {_MAX_INPUT_BYTES} are sent to input()")
        with self._lock:
            waiting = self._waiting.pop(request_id, None)
            if waiting is None:
                raise InputRequestNotFound(
                    f"no input request {request_id!r} is waiting (unknown, already answered, timed out, or its "
                    "cell ended); answer the request_id of the latest InputRequest event"
                )
            self._answers.append(answer_ok(waiting[0], raw))
            self._wakeup.notify()

    def interrupt(self) -> bool:
        """Ask for the cell to be stopped (any thread): the connection sends the agent an ``interrupt``.

        Returns False when the call has ended already.
        """
        with self._lock:
            if self._closed:
                return False
            self._interrupt = self.interrupt_requested = True
            self._wakeup.notify()
            return True

    def take_interrupt(self) -> bool:
        asked, self._interrupt = self._interrupt, False
        return asked

    def answers(self) -> list[Answer]:
        """``host_reply`` frames to send: submitted answers, and EOF for requests past their idle timeout."""
        self._wakeup.drain()
        now = time.monotonic()
        with self._lock:
            for request_id, (call, expiry) in list(self._waiting.items()):
                if expiry <= now:
                    del self._waiting[request_id]
                    error = f"no answer within the input idle timeout of {self._input_timeout:g} s"
                    self._answers.append(answer_error(call, error))
            ready, self._answers = self._answers, []
        return ready

    def next_expiry(self) -> float:
        if not self._waiting:  # only this call's connection thread adds to it; another thread may only take away
            return math.inf
        with self._lock:
            return min((expiry for _, expiry in self._waiting.values()), default=math.inf)

    def close(self) -> None:
        """The call ended: no request waits any more, the recorders' files are closed."""
        with self._lock:
            self._waiting.clear()
            self._closed = True  # under the lock: no other thread wakes the session's next call for this one
        for recorder in self.recorders.values():
            recorder.close()

    def _tell(self, event: Event) -> str | None:
        if self._on_output is None:
            return None
        try:
            with serving_as(self._owner):
                return self._on_output(event)
        except Exception as exc:  # the caller's bug must not cost the call its result
            logger.warning("the on_output callback raised: %s", exc, exc_info=True)
            self._note_callback_error(exc)
            return None

    def _note_callback_error(self, exc: Exception) -> None:
        if len(self.callback_errors) < _MAX_CALLBACK_ERRORS:
            self.callback_errors.append(f"{type(exc).__name__}: {exc}"[:500])
