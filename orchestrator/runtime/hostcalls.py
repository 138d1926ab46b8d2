"""Host calls: functions of the controller that code in the sandbox calls while its cell runs.

The sandbox has no network. What it needs from the host (an LM sub-call above all) travels
as a ``host_call`` frame on the agent's channel (docs/protocol.md, "Host calls"): the worker
sends it, the supervisor relays it, and the controller runs the named handler in a thread
while it waits for the cell's reply, then sends a ``host_reply`` back. Many calls can be in
flight at once (threads in the cell, batched forms). Each is bounded in size
(``max_bytes`` of JSON each way) and in time (``timeout``, and never past the end of its
cell): a call still running when its cell ends is answered with an error in the sandbox
and its late result is dropped, never given to a later cell.

Bounded per cell, per session (``Settings.limits.max_host_calls_per_cell`` and ``max_host_calls_per_session``)
and per controller process (``CONTROLLER_HOST_CALLS``, all sessions together): past any bound a call is
answered with an error at once, never queued. Calls still waiting when their cell ends are cancelled (their
handlers never start), and all of a session's when it closes; a handler already running cannot be stopped, so
it holds its place in the session's bound until it returns, and its result is dropped.

Payloads and results are JSON values: the host never unpickles anything from a sandbox.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..agent import framing, protocol
from ..errors import ConfigError
from ..metrics import NO_METRICS, Recorder
from ..slots import Slots
from ..wire.call import Answer, answer_error, answer_ok
from ..wire.wakeup import Wakeup

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
            slot until it returns); more calls wait their turn, up to ``Settings.limits.max_host_calls_per_cell``
            calls waiting or running and ``2 * max_bytes`` of waiting payloads, and the session's own bound
            (``Settings.limits.max_host_calls_per_session``); calls beyond those are refused at once.
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


def encode(value: Any, max_bytes: int) -> bytes:
    """A payload or result as JSON bytes within ``max_bytes`` (HostCallError otherwise)."""
    try:
        raw = json.dumps(value, ensure_ascii=False).encode("utf-8", errors="surrogatepass")
    except (TypeError, ValueError) as exc:
        raise HostCallError(f"the result is not JSON-serializable: {exc}") from None
    if len(raw) > max_bytes:
        raise HostCallError(f"the result is {len(raw)} bytes of JSON, over the {max_bytes}-byte limit")
    return raw


CONTROLLER_HOST_CALLS = 512
"""Host calls all sessions of one controller process may hold at once, on as many shared threads at most: each
session's own bound (128 by default) keeps one session to a quarter of them."""


_controller = Slots(CONTROLLER_HOST_CALLS)
"""The controller process's bound, shared by every session's ``HandlerPool`` (threads are a process's resource).
Each handler runs on a thread of its own that ends with it, so the threads alive are never more than the calls held
(an executor of a session's own kept its peak of idle threads until the session closed)."""


class HandlerPool:
    """The host-call handlers of one session, across its cells: a bound on calls held.

    A call is *held* from the moment a cell's desk queues it until it is answered without running, or its
    handler returns. At most ``limit`` are held at once (a handler still running after its cell ended counts
    until it returns), and at most ``CONTROLLER_HOST_CALLS`` of all sessions together; each handler runs on a
    thread of its own, started at once, so a held call never queues unseen and no idle thread outlives its call.
    A thread cannot be stopped: a handler still running when its cell ends or the session closes goes on until
    it returns (an LM call until its own timeout), and its result is dropped. After ``close`` nothing starts any
    more.
    """

    def __init__(self, limit: int, controller: Slots = _controller) -> None:
        if not (isinstance(limit, int) and limit >= 1):
            raise ConfigError(f"the host-call bound of a session must be an int >= 1, got {limit!r}")
        self.limit = limit
        self._own = Slots(limit)
        self._controller = controller
        self._lock = threading.Lock()
        self._closed = False
        self.controller_full = False
        """Whether the last refused ``reserve`` was refused for the controller's bound, not the session's."""

    @property
    def held(self) -> int:
        """Calls held now (queued in a cell's desk, or with a handler running)."""
        return self._own.held

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def controller_limit(self) -> int:
        """Calls all sessions of the controller may hold at once."""
        return self._controller.limit

    def reserve(self) -> bool:
        """Hold one more call; False when ``limit`` are held, the controller's bound is reached, or the pool is
        closed (``controller_full`` says whether it was the controller's bound)."""
        with self._lock:
            self.controller_full = False
            if self._closed or not self._own.reserve():
                return False
            if not self._controller.reserve():
                self._own.release()
                self.controller_full = True
                return False
            return True

    def release(self, count: int = 1) -> None:
        self._own.release(count)
        self._controller.release(count)

    def run(self, job: Callable[[], None]) -> bool:
        """Run ``job`` on a thread of its own (the caller holds its reservation); False when the pool is closed."""
        with self._lock:
            if self._closed:
                return False
        threading.Thread(target=job, name="orchestrator-host-call", daemon=True).start()
        return True

    def close(self) -> None:
        """Start nothing more; a handler still running finishes on its thread (its result is dropped)."""
        with self._lock:
            self._closed = True


class CallDesk:
    """The host calls of one running cell: handlers run on the session's pool, answers queue up for the connection.

    The connection reads frames and never blocks on a handler: it ``submit``s each call, polls
    ``wake_fd`` beside the channel, and sends what ``answers`` returns. At most ``max_held`` calls
    of the cell wait or run at once (and the session's ``HandlerPool`` bounds all its cells together);
    a call past either bound is answered with an error at once, never queued. ``close`` (the cell
    ended) drops every call still waiting (its handler never starts) and every answer still to come;
    a handler that finishes later is only logged.
    """

    def __init__(
        self,
        calls: HostCalls,
        pool: HandlerPool,
        *,
        max_held: int,
        owner: object = None,
        metrics: Recorder = NO_METRICS,
    ) -> None:
        """``owner``: what the calls serve (the session); ``serving(owner)`` is True in its handlers. ``metrics`` is
        told each call's outcome."""
        self._metrics = metrics
        self._calls = calls
        self._pool = pool
        self._max_held = max_held
        self._owner = owner
        self._lock = threading.Lock()
        self._wakeup = Wakeup()
        self._waiting: deque[tuple[int, str, bytearray, float]] = deque()
        # call -> (handler name, expiry); expiry None: already answered "took longer", the call keeps its slot
        self._running: dict[int, tuple[str, float | None]] = {}
        self._answers: list[Answer] = []
        self._closed = False

    @property
    def wake_fd(self) -> int:
        """Readable when an answer is ready."""
        return self._wakeup.fd

    def submit(self, call: int, name: str, body: bytearray) -> None:
        """Take one call from the sandbox; it runs now, when a slot of ``max_concurrent`` frees up, or is refused."""
        expiry = math.inf if self._calls.timeout is None else time.monotonic() + self._calls.timeout
        if name not in self._calls.handlers:
            known = ", ".join(sorted(self._calls.handlers)) or "none"
            self._answer(call, f"no host call named {name!r} (this cell accepts: {known})")
        elif len(body) > self._calls.max_bytes:
            self._answer(call, f"the payload is {len(body)} bytes, over the {self._calls.max_bytes}-byte limit")
        else:
            refused = self._queue(call, name, body, expiry)
            if refused:
                self._answer(call, f"host call {name!r} refused: {refused}")
            else:
                self._start_waiting()
                return
        self._metrics.host_call("refused")

    def _queue(self, call: int, name: str, body: bytearray, expiry: float) -> str | None:
        """Put a call in the waiting line, or say why not (the sandbox must not fill the host's memory or threads)."""
        with self._lock:
            if self._closed:
                return "its cell has ended"
            if call in self._running or any(item[0] == call for item in self._waiting):
                return f"call {call} is still open (the sandbox numbers each of its calls anew)"
            held = len(self._waiting) + len(self._running)
            if held >= self._max_held:
                return (
                    f"{held} calls of this cell already wait or run, the most a cell may have "
                    "(Settings.limits.max_host_calls_per_cell)"
                )
            waiting_bytes = sum(len(item[2]) for item in self._waiting)
            if waiting_bytes + len(body) > 2 * self._calls.max_bytes:  # one payload alone is within max_bytes
                return f"the calls waiting for a handler slot already hold {waiting_bytes} bytes of payload"
            if not self._pool.reserve():
                if self._pool.closed:
                    return "its session is closing"
                if self._pool.controller_full:
                    return (
                        f"the controller already holds {self._pool.controller_limit} host calls of all its "
                        "sessions, the most it may; try again when some have returned"
                    )
                return (
                    f"{self._pool.limit} calls of this session already wait or run (some may be of cells that "
                    "ended and whose handlers have not returned), the most a session may "
                    "(Settings.limits.max_host_calls_per_session)"
                )
            self._waiting.append((call, name, body, expiry))
            return None

    def answers(self) -> list[Answer]:
        """The ``host_reply`` frames ready to send: finished calls, and calls past their time limit."""
        self._wakeup.drain()
        now = time.monotonic()
        with self._lock:
            for call, (name, expiry) in list(self._running.items()):
                if expiry is not None and expiry <= now:
                    self._running[call] = (name, None)  # the slot stays taken until the handler returns
                    self._answers.append(
                        answer_error(call, f"host call {name!r} took longer than {self._calls.timeout:g} s")
                    )
            expired = [item for item in self._waiting if item[3] <= now]
            for item in expired:
                self._metrics.host_call("expired")
                self._waiting.remove(item)
                self._answers.append(
                    answer_error(item[0], f"host call {item[1]!r} waited longer than {self._calls.timeout:g} s")
                )
            ready, self._answers = self._answers, []
        if expired:
            self._pool.release(len(expired))
        self._start_waiting()
        return ready

    def next_expiry(self) -> float:
        """When the next call runs out of time (``math.inf``: none can)."""
        with self._lock:
            expiries = [expiry for _, expiry in self._running.values() if expiry is not None]
            expiries += [item[3] for item in self._waiting]
        return min(expiries, default=math.inf)

    def close(self) -> None:
        """The cell ended: calls still waiting never start, answers still due are dropped, the wake-up pipe goes."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            cancelled, running = len(self._waiting), len(self._running)
            self._waiting.clear()
            self._wakeup.close()
        if cancelled:
            self._pool.release(cancelled)
        if cancelled or running:
            logger.info(
                "the cell ended with %d host calls not started (cancelled) and %d running (their results will be "
                "dropped)",
                cancelled,
                running,
            )

    def _start_waiting(self) -> None:
        """Start waiting calls while the cell has handler slots free; a call the closed pool refuses is answered and
        frees its slot for the next (in this loop: one waiting call after another, never one stack frame each)."""
        refused = True
        while refused:
            with self._lock:
                starting = []
                while self._waiting and len(self._running) < self._calls.max_concurrent and not self._closed:
                    call, name, body, expiry = self._waiting.popleft()
                    self._running[call] = (name, expiry)
                    starting.append((call, name, body))
            refused = False
            for call, name, body in starting:
                if not self._pool.run(functools.partial(self._run, call, name, body)):
                    self._settle(call, name, answer_error(call, f"host call {name!r}: the session is closing"))
                    refused = True

    def _run(self, call: int, name: str, body: bytearray) -> None:
        with self._lock:
            started = not self._closed  # a cell that ended before a thread took the call: its handler never starts
        if not started:
            self._settle(call, name, None)  # nothing waits in a closed desk: no next call to start
            return
        try:
            with serving_as(self._owner):
                result = self._calls.handlers[name](framing.decode_json(body, "host call payload", surrogates=True))
            answer = answer_ok(call, encode(result, self._calls.max_bytes))
        except HostCallError as exc:
            answer = answer_error(call, str(exc))
        except Exception as exc:  # a handler's failure is the sandbox's error, never the controller's
            logger.info("host call %r failed: %s", name, exc, exc_info=True)
            answer = answer_error(call, f"host call {name!r} failed: {type(exc).__name__}: {exc}")
        self._metrics.host_call("ok" if answer[0]["status"] == protocol.STATUS_OK else "error")
        self._finish(call, name, answer)

    def _finish(self, call: int, name: str, answer: Answer | None) -> None:
        """A handler returned (or never started): settle its call, and start the next waiting ones."""
        self._settle(call, name, answer)
        self._start_waiting()

    def _settle(self, call: int, name: str, answer: Answer | None) -> None:
        """The call holds nothing any more: its slot and its session reservation go; the answer, if still due."""
        with self._lock:
            _, expiry = self._running.pop(call)
            if answer is None or self._closed or expiry is None:
                logger.debug("host call %r ended after its cell ended (or its time limit); its answer is dropped", name)
            else:
                self._answers.append(answer)
                self._wakeup.notify()
        self._pool.release()

    def _answer(self, call: int, error: str) -> None:
        with self._lock:
            if self._closed:
                return
            self._answers.append(answer_error(call, error))
            self._wakeup.notify()
