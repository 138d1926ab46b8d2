"""The interrupt/kill ladder of one request: its deadline, the interrupt when it passes, the kill after the grace.

A phase that overruns its time limit is interrupted (SIGINT for a cell or a load, SIGUSR2 for a
checkpoint: ``WorkerProcess.interrupt``); one that still runs ``grace`` seconds later has its worker
killed and replaced. The controller keeps this ladder for each request (docs/design/one-hop.md) and asks the
supervisor on its connection to interrupt and kill; the ladder only keeps time and says what is due. Its clock is
injectable, so its states are tested without processes (tests/unit/agent/test_ladder.py).

Besides the deadline: a cell's clock stops while the cell waits for an answer to ``input()``; the
caller may cancel a cell (its deadline becomes now); when a cell is done, the checkpoint that
follows runs under its own limit. The phase and limits of a request, the rewrite of an interrupted cell's
error and the reply of a killed worker are here too.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Dict, Mapping, Optional

from . import protocol, request_table

DEFAULT_STEP_SECONDS = 60.0  # a time limit the request did not give (the checkpoint of set_value and reset)
CONTROL_STEP_SECONDS = 5.0  # restore_begin / restore_end (the controller allows them 10 s plus the grace)
KILL = "kill"  # the interrupt's grace passed: kill the worker and reply with a timeout


def _seconds(value: Any, default: float) -> float:
    """A time limit from a request: a positive finite number, else ``default``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return float(value)
    return default


class Ladder(object):
    """The time limits of one request, from the moment it reached the worker.

    Args:
        phase: "cell" (an exec), "load", "checkpoint" (set_value, reset, a context's create or
            destroy) or "request" (restore_begin, restore_end).
        limit: seconds for ``phase``.
        checkpoint_limit: seconds for the checkpoint that follows a cell.
        grace: seconds between the interrupt and the kill.
        interrupt: signals the worker to stop ``phase`` (given the phase).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        phase: str,
        limit: float,
        checkpoint_limit: float,
        grace: float,
        interrupt: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.phase = phase
        self.kind = ""  # the request's type, when made by ``for_request``
        self.checkpoint_limit = checkpoint_limit
        self.grace = grace
        self._interrupt = interrupt
        self._clock = clock
        self.started = clock()
        self.deadline = self.started + limit
        self.interrupted = False  # interrupt sent in the current phase
        self.cell_interrupted = False  # the cell was interrupted at its deadline (its error is a timeout)
        self.cell_duration: Optional[float] = None  # how long the cell ran, once it is done
        self.paused_at: Optional[float] = None  # since when the cell waits for an answer to input(): its clock stops

    @classmethod
    def for_request(
        cls,
        request: Mapping[str, Any],
        grace: float,
        interrupt: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> "Ladder":
        """The ladder of ``request``: its phase and limits from its type, ``timeout`` and ``checkpoint_timeout``."""
        kind = request.get("type")
        row = request_table.REQUESTS.get(str(kind))
        phase = request_table.CONTROL_PHASE if row is None else row.phase
        checkpoint_limit = _seconds(request.get("checkpoint_timeout"), DEFAULT_STEP_SECONDS)
        if phase == request_table.CHECKPOINT_PHASE:
            limit = checkpoint_limit
        elif phase == request_table.CONTROL_PHASE:  # no user code, only a namespace to clear (whose __del__ may hang)
            limit = _seconds(request.get("timeout"), CONTROL_STEP_SECONDS)
        else:
            limit = _seconds(request.get("timeout"), DEFAULT_STEP_SECONDS)
        ladder = cls(phase, limit, checkpoint_limit, grace, interrupt, clock)
        ladder.kind = str(kind)
        return ladder

    @property
    def in_cell(self) -> bool:
        return self.phase == "cell"

    def follow_input(self, waiting: bool) -> None:
        """Stop the clock while the cell waits for an answer to input() (not once interrupted); restart it after."""
        if waiting and self.paused_at is None and not self.interrupted:
            self.paused_at = self._clock()
        elif self.paused_at is not None and not waiting:
            self.deadline += self._clock() - self.paused_at
            self.paused_at = None

    def wait_seconds(self) -> Optional[float]:
        """How long to wait for the worker before the ladder has something to do (None: no limit)."""
        if self.paused_at is None:
            return max(0.0, self.deadline - self._clock())
        return None

    def cancel(self) -> None:
        """The controller interrupted the cell: its deadline is now (a later phase, or an interrupted one, goes on)."""
        if self.phase == "cell" and not self.interrupted:
            self.deadline, self.paused_at = self._clock(), None

    def cell_done(self) -> None:
        """The cell finished: the checkpoint's clock starts."""
        self.cell_duration = self._clock() - self.started
        self.phase, self.interrupted = "checkpoint", False
        self.deadline = self._clock() + self.checkpoint_limit

    def expired(self) -> Optional[str]:
        """What the deadline asks for now: None (keep waiting; at the deadline the worker was just interrupted
        and has ``grace`` more seconds) or KILL."""
        if self._clock() < self.deadline or self.paused_at is not None:
            return None
        if not self.interrupted:
            self._interrupt(self.phase)
            self.interrupted = True
            self.cell_interrupted = self.cell_interrupted or self.phase == "cell"
            self.deadline = self._clock() + self.grace
            return None
        return KILL

    def duration(self) -> float:
        """How long the cell ran (until it was done, else until now)."""
        return self.cell_duration if self.cell_duration is not None else self._clock() - self.started

    def stopped_by_interrupt(self, status: Any) -> bool:
        """A reply of ``status`` is the interrupt's doing: an error of a cell interrupted at its deadline (or cancelled)
        or of an interrupted load; it is a ``timeout, worker_restarted: false`` (a cell that finished just at its
        deadline stays a success)."""
        return status == protocol.STATUS_ERROR and (
            self.cell_interrupted or (self.kind == request_table.LOAD and self.interrupted)
        )

    def killed_reply(self) -> Dict[str, Any]:
        """The fields of the reply to a request (made by ``for_request``) whose worker was killed at the end of the
        ladder (KILL) and replaced: a fresh worker is an empty one."""
        row = request_table.REQUESTS.get(self.kind)
        if row is not None and row.fresh_worker_ok:
            return {"status": protocol.STATUS_OK, "worker_restarted": True}
        reply: Dict[str, Any] = {
            "status": protocol.STATUS_TIMEOUT,
            "ran": True,
            "worker_restarted": True,
            "phase": self.phase,
            "reason": "the %s ignored the interrupt for %.1f s; the worker was killed" % (self.phase, self.grace),
        }
        if self.kind == request_table.EXEC:
            reply["duration"] = self.duration()
        return reply
