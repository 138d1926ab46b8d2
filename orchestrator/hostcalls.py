"""Host calls: functions of the controller that code in the sandbox calls while its cell runs.

The sandbox has no network. What it needs from the host (an LM sub-call above all) travels
as a ``host_call`` frame on the agent's channel (docs/protocol.md, "Host calls"): the worker
sends it, the supervisor relays it, and the controller runs the named handler in a thread
while it waits for the cell's reply, then sends a ``host_reply`` back. Many calls can be in
flight at once (threads in the cell, batched forms). Each is bounded in size
(``max_bytes`` of JSON each way) and in time (``timeout``, and never past the end of its
cell): a call still running when its cell ends is answered with an error in the sandbox
and its late result is dropped, never given to a later cell.

Payloads and results are JSON values: the host never unpickles anything from a sandbox.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from .agent import protocol
from .errors import ConfigError
from .wakeup import Wakeup

logger = logging.getLogger(__name__)

HostCallHandler = Callable[[Any], Any]
"""A handler takes the call's JSON payload and returns a JSON-serializable result (or raises)."""

DEFAULT_MAX_BYTES = 16 << 20
_serving = threading.local()  # .owner: what the handler running on this thread serves


def serving(owner: object) -> bool:
    """True when the current thread runs a handler or callback for ``owner`` (a call back into it would deadlock)."""
    return getattr(_serving, "owner", None) is owner


@contextlib.contextmanager
def serving_as(owner: object) -> Iterator[None]:
    """Run caller code (a host-call handler, an output callback) on behalf of ``owner``'s running call."""
    _serving.owner = owner
    try:
        yield
    finally:
        _serving.owner = None


class HostCallError(Exception):
    """Raise in a handler to send the sandbox this message (any other exception is reported by type and text)."""


@dataclass(frozen=True)
class HostCalls:
    """The host calls one ``Session.execute`` accepts.

    Attributes:
        handlers: name -> handler. A call naming no handler gets an error in the sandbox.
        timeout: seconds one call may take (None: until its cell ends).
        max_concurrent: handlers of this cell running at once (one past its timeout holds its
            slot until it returns); more calls wait their turn, up to ``max(64, 4 * max_concurrent)``
            calls and ``2 * max_bytes`` of payloads, and calls beyond that are refused at once.
        max_bytes: largest JSON payload or result, in bytes, either way.
    """

    handlers: Mapping[str, HostCallHandler] = field(default_factory=dict)
    timeout: float | None = None
    max_concurrent: int = 16
    max_bytes: int = DEFAULT_MAX_BYTES

    def __post_init__(self) -> None:
        if self.timeout is not None and not self.timeout > 0:
            raise ConfigError(f"HostCalls.timeout must be a positive number of seconds or None, got {self.timeout!r}")
        if not (isinstance(self.max_concurrent, int) and self.max_concurrent >= 1):
            raise ConfigError(f"HostCalls.max_concurrent must be an int >= 1, got {self.max_concurrent!r}")
        if not (isinstance(self.max_bytes, int) and self.max_bytes >= 1):
            raise ConfigError(f"HostCalls.max_bytes must be an int >= 1, got {self.max_bytes!r}")
        for name, handler in self.handlers.items():
            if not isinstance(name, str) or not name or not callable(handler):
                raise ConfigError(f"HostCalls.handlers maps non-empty names to callables, got {name!r}: {handler!r}")


Answer = tuple[dict[str, Any], bytes]
"""A ``host_reply`` frame for the connection to send: header and JSON body."""


def answer_ok(call: int, result: bytes) -> Answer:
    return {"type": protocol.HOST_REPLY, "call": call, "status": protocol.STATUS_OK}, result


def answer_error(call: int, message: str) -> Answer:
    """The sandbox's call fails with ``message`` (it raises ``HostCallError``, or ``EOFError`` for input())."""
    return {"type": protocol.HOST_REPLY, "call": call, "status": protocol.STATUS_ERROR, "error": message}, b""


def encode(value: Any, max_bytes: int) -> bytes:
    """A payload or result as JSON bytes within ``max_bytes`` (HostCallError otherwise)."""
    try:
        raw = json.dumps(value, ensure_ascii=False).encode("utf-8", errors="surrogatepass")
    except (TypeError, ValueError) as exc:
        raise HostCallError(f"the result is not JSON-serializable: {exc}") from None
    if len(raw) > max_bytes:
        raise HostCallError(f"the result is {len(raw)} bytes of JSON, over the {max_bytes}-byte limit")
    return raw


class CallDesk:
    """The host calls of one running cell: handlers run on an executor, answers queue up for the connection.

    The connection reads frames and never blocks on a handler: it ``submit``s each call, polls
    ``wake_fd`` beside the channel, and sends what ``answers`` returns. ``close`` (the cell
    ended) drops every answer still to come; a handler that finishes later is only logged.
    """

    def __init__(self, calls: HostCalls, executor: Executor, owner: object = None) -> None:
        """``owner``: what the calls serve (the session); ``serving(owner)`` is True in its handlers."""
        self._calls = calls
        self._executor = executor
        self._owner = owner
        self._lock = threading.Lock()
        self._wakeup = Wakeup()
        self._waiting: deque[tuple[int, str, bytearray, float]] = deque()
        self._waiting_bytes = 0
        self._running: dict[int, tuple[str, float]] = {}  # call -> (handler name, expiry)
        self._expired: set[int] = set()  # running calls already answered with "took longer": they keep their slot
        self._answers: list[Answer] = []
        self._closed = False

    @property
    def wake_fd(self) -> int:
        """Readable when an answer is ready."""
        return self._wakeup.fd

    def submit(self, call: int, name: str, body: bytearray) -> None:
        """Take one call from the sandbox; it runs now or when a slot of ``max_concurrent`` frees up."""
        expiry = math.inf if self._calls.timeout is None else time.monotonic() + self._calls.timeout
        if name not in self._calls.handlers:
            known = ", ".join(sorted(self._calls.handlers)) or "none"
            self._answer(call, f"no host call named {name!r} (this cell accepts: {known})")
        elif len(body) > self._calls.max_bytes:
            self._answer(call, f"the payload is {len(body)} bytes, over the {self._calls.max_bytes}-byte limit")
        elif not self._queue(call, name, body, expiry):
            self._answer(
                call,
                f"host call {name!r} refused: {len(self._waiting)} calls already wait for one of the "
                f"{self._calls.max_concurrent} handler slots of this cell",
            )
        else:
            self._start_waiting()

    def _queue(self, call: int, name: str, body: bytearray, expiry: float) -> bool:
        """Put a call in the waiting line unless that is full (the sandbox must not fill the host's memory)."""
        calls = self._calls
        with self._lock:
            if self._waiting and (
                len(self._waiting) >= max(64, 4 * calls.max_concurrent)
                or self._waiting_bytes + len(body) > 2 * calls.max_bytes
            ):
                return False
            self._waiting.append((call, name, body, expiry))
            self._waiting_bytes += len(body)
            return True

    def answers(self) -> list[Answer]:
        """The ``host_reply`` frames ready to send: finished calls, and calls past their time limit."""
        self._wakeup.drain()
        now = time.monotonic()
        with self._lock:
            for call, (name, expiry) in list(self._running.items()):
                if expiry <= now:
                    self._running[call] = (name, math.inf)  # the slot stays taken until the handler returns
                    self._expired.add(call)
                    self._answers.append(
                        answer_error(call, f"host call {name!r} took longer than {self._calls.timeout:g} s")
                    )
            for item in [item for item in self._waiting if item[3] <= now]:
                self._waiting.remove(item)
                self._waiting_bytes -= len(item[2])
                self._answers.append(
                    answer_error(item[0], f"host call {item[1]!r} waited longer than {self._calls.timeout:g} s")
                )
            ready, self._answers = self._answers, []
        self._start_waiting()
        return ready

    def next_expiry(self) -> float:
        """When the next call runs out of time (``math.inf``: none can)."""
        with self._lock:
            expiries = [expiry for _, expiry in self._running.values()] + [item[3] for item in self._waiting]
        return min(expiries, default=math.inf)

    def close(self) -> None:
        """The cell ended: drop every answer still due, and the wake-up pipe."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            dropped = len(self._running) + len(self._waiting)
            self._running.clear()
            self._waiting.clear()
            self._waiting_bytes = 0
            self._wakeup.close()
        if dropped:
            logger.info("the cell ended with %d host calls unanswered; their results will be dropped", dropped)

    def _start_waiting(self) -> None:
        with self._lock:
            starting = []
            while self._waiting and len(self._running) < self._calls.max_concurrent and not self._closed:
                call, name, body, expiry = self._waiting.popleft()
                self._waiting_bytes -= len(body)
                self._running[call] = (name, expiry)
                starting.append((call, name, body))
        for call, name, body in starting:
            self._executor.submit(self._run, call, name, body)

    def _run(self, call: int, name: str, body: bytearray) -> None:
        try:
            with serving_as(self._owner):
                result = self._calls.handlers[name](json.loads(body.decode("utf-8", errors="surrogatepass")))
            answer = answer_ok(call, encode(result, self._calls.max_bytes))
        except HostCallError as exc:
            answer = answer_error(call, str(exc))
        except Exception as exc:  # a handler's failure is the sandbox's error, never the controller's
            logger.info("host call %r failed: %s", name, exc, exc_info=True)
            answer = answer_error(call, f"host call {name!r} failed: {type(exc).__name__}: {exc}")
        with self._lock:
            self._running.pop(call, None)
            if self._closed or call in self._expired:
                self._expired.discard(call)
                logger.debug("host call %r finished after its cell ended (or its time limit); dropped", name)
            else:
                self._answers.append(answer)
                self._wakeup.notify()
        self._start_waiting()

    def _answer(self, call: int, error: str) -> None:
        with self._lock:
            if self._closed:
                return
            self._answers.append(answer_error(call, error))
            self._wakeup.notify()
