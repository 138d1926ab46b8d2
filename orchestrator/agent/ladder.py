"""The interrupt/kill ladder of one request: its deadline, the interrupt when it passes, the kill after the grace.

A phase that overruns its time limit is interrupted (SIGINT for a cell or a load, SIGUSR2 for a
checkpoint: ``WorkerProcess.interrupt``); one that still runs ``grace`` seconds later has its worker
killed and replaced. The ladder only keeps time and says what is due; the supervisor waits, reads
and kills. Its clock is injectable, so its states are tested without processes (tests/unit/agent/
test_ladder.py).

Besides the deadline: a cell's clock stops while the cell waits for an answer to ``input()``; the
controller may cancel a cell (its deadline becomes now); when a cell is done, the checkpoint that
follows runs under its own limit and is announced to the controller once if it still runs
``NOTICE_DELAY`` later (the controller then moves its own deadline); a takeover interrupts at once
and abandons the request ``grace`` seconds later at the latest.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

NOTICE_DELAY = 0.05  # a checkpoint still running after this long is announced to the controller
ABANDON = "abandon"  # a takeover's grace passed: kill the worker and give the request up
KILL = "kill"  # the interrupt's grace passed: kill the worker and reply with a timeout


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
        self.checkpoint_limit = checkpoint_limit
        self.grace = grace
        self._interrupt = interrupt
        self._clock = clock
        self.started = clock()
        self.deadline = self.started + limit
        self.interrupted = False  # interrupt sent in the current phase
        self.cell_interrupted = False  # the cell was interrupted at its deadline (its error is a timeout)
        self.cell_duration: Optional[float] = None  # how long the cell ran, once it is done
        self.notice_at: Optional[float] = None  # when to tell the controller the checkpoint's clock runs
        self.paused_at: Optional[float] = None  # since when the cell waits for an answer to input(): its clock stops
        self.taken_over = False

    @property
    def in_cell(self) -> bool:
        return self.phase == "cell"

    @property
    def relays_calls(self) -> bool:
        """Host calls are relayed to the controller only while the cell runs and no takeover came."""
        return self.phase == "cell" and not self.taken_over

    def take_over(self) -> None:
        """A new controller took the channel: interrupt now (unless done), and abandon within ``grace``."""
        self.taken_over = True
        if not self.interrupted:
            self._interrupt(self.phase)
            self.interrupted = True
        self.deadline = min(self.deadline, self._clock()) + self.grace

    def follow_input(self, waiting: bool) -> None:
        """Stop the clock while the cell waits for an answer to input() (not once interrupted); restart it after."""
        if waiting and self.paused_at is None and not self.interrupted:
            self.paused_at = self._clock()
        elif self.paused_at is not None and not waiting:
            self.deadline += self._clock() - self.paused_at
            self.paused_at = None

    def wait_seconds(self) -> Optional[float]:
        """How long to wait for the worker before the ladder has something to do (None: no limit)."""
        wake = self.deadline if self.notice_at is None else min(self.deadline, self.notice_at)
        if self.paused_at is None or self.notice_at is not None:
            return max(0.0, wake - self._clock())
        return None

    def cancel(self) -> None:
        """The controller interrupted the cell: its deadline is now (a later phase, or an interrupted one, goes on)."""
        if self.phase == "cell" and not self.interrupted:
            self.deadline, self.paused_at = self._clock(), None

    def cell_done(self) -> None:
        """The cell finished: the checkpoint's clock starts, and its notice is due ``NOTICE_DELAY`` later."""
        self.cell_duration = self._clock() - self.started
        self.phase, self.interrupted = "checkpoint", False
        self.deadline = self._clock() + self.checkpoint_limit
        self.notice_at = self._clock() + NOTICE_DELAY

    def notice_due(self) -> bool:
        """True once, when the checkpoint still runs ``NOTICE_DELAY`` after the cell was done."""
        if self.notice_at is not None and self._clock() >= self.notice_at:
            self.notice_at = None
            return True
        return False

    def expired(self) -> Optional[str]:
        """What the deadline asks for now: None (keep waiting; at the deadline the worker was just interrupted
        and has ``grace`` more seconds), ABANDON (after a takeover) or KILL."""
        if self._clock() < self.deadline or self.paused_at is not None:
            return None
        if self.taken_over:
            return ABANDON
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
