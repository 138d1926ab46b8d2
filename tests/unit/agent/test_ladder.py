"""The interrupt/kill ladder's states, on a fake clock: deadlines, grace, input pauses, cancel, checkpoint, takeover."""

from __future__ import annotations

import pytest

from orchestrator.agent import protocol, request_table
from orchestrator.agent.ladder import CONTROL_STEP_SECONDS, DEFAULT_STEP_SECONDS, KILL, Ladder


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


def ladder_for(clock: Clock, phase: str = "cell", limit: float = 10.0, checkpoint: float = 30.0) -> tuple:
    """A ladder with a 2 s grace, and the list of the phases it interrupted."""
    signals: list[str] = []
    return Ladder(phase, limit, checkpoint, 2.0, signals.append, clock), signals


def test_before_the_deadline_nothing_is_due(clock: Clock) -> None:
    ladder, signals = ladder_for(clock)
    assert ladder.wait_seconds() == 10.0
    clock.advance(9.9)
    assert ladder.expired() is None
    assert signals == []
    assert ladder.wait_seconds() == pytest.approx(0.1)


def test_the_deadline_interrupts_then_the_grace_kills(clock: Clock) -> None:
    ladder, signals = ladder_for(clock)
    clock.advance(10.0)
    assert ladder.expired() is None, "at the deadline the worker is interrupted and waited for"
    assert signals == ["cell"]
    assert ladder.interrupted and ladder.cell_interrupted
    assert ladder.wait_seconds() == 2.0
    clock.advance(1.9)
    assert ladder.expired() is None
    assert signals == ["cell"], "one interrupt per phase"
    clock.advance(0.1)
    assert ladder.expired() == KILL
    assert ladder.duration() == 12.0


@pytest.mark.parametrize("phase", ["load", "checkpoint", "request"])
def test_other_phases_are_interrupted_as_themselves_and_are_not_a_cell(clock: Clock, phase: str) -> None:
    ladder, signals = ladder_for(clock, phase=phase, limit=5.0)
    assert not ladder.in_cell
    clock.advance(5.0)
    assert ladder.expired() is None
    assert signals == [phase]
    assert ladder.interrupted and not ladder.cell_interrupted
    clock.advance(2.0)
    assert ladder.expired() == KILL


def test_an_input_wait_stops_the_cells_clock(clock: Clock) -> None:
    ladder, signals = ladder_for(clock)
    clock.advance(4.0)
    ladder.follow_input(True)
    assert ladder.wait_seconds() is None, "no limit while the cell waits for its input"
    clock.advance(100.0)
    assert ladder.expired() is None
    ladder.follow_input(True)  # still waiting: the pause keeps its start
    clock.advance(50.0)
    ladder.follow_input(False)
    assert ladder.deadline == 1000.0 + 10.0 + 150.0
    assert ladder.wait_seconds() == 6.0
    clock.advance(6.0)
    assert ladder.expired() is None
    assert signals == ["cell"]


def test_an_interrupted_cell_is_not_paused_by_input(clock: Clock) -> None:
    ladder, _ = ladder_for(clock)
    clock.advance(10.0)
    ladder.expired()
    ladder.follow_input(True)
    assert ladder.paused_at is None
    clock.advance(2.0)
    assert ladder.expired() == KILL


def test_the_controller_cancels_a_cell_now(clock: Clock) -> None:
    ladder, signals = ladder_for(clock)
    clock.advance(1.0)
    ladder.follow_input(True)
    ladder.cancel()
    assert ladder.paused_at is None and ladder.deadline == clock.now
    assert ladder.expired() is None
    assert signals == ["cell"] and ladder.cell_interrupted


def test_a_cancel_after_the_interrupt_or_after_the_cell_changes_nothing(clock: Clock) -> None:
    ladder, _ = ladder_for(clock)
    clock.advance(10.0)
    ladder.expired()
    deadline = ladder.deadline
    clock.advance(1.0)
    ladder.cancel()
    assert ladder.deadline == deadline
    done, _ = ladder_for(clock)
    done.cell_done()
    done.cancel()
    assert done.deadline == clock.now + 30.0


def test_the_cell_done_starts_the_checkpoints_clock(clock: Clock) -> None:
    ladder, signals = ladder_for(clock)
    clock.advance(10.0)
    ladder.expired()  # the cell was interrupted and stopped: its checkpoint has a fresh ladder
    clock.advance(0.5)
    ladder.cell_done()
    assert ladder.phase == "checkpoint" and not ladder.in_cell
    assert not ladder.interrupted and ladder.cell_interrupted
    assert ladder.cell_duration == 10.5
    assert ladder.wait_seconds() == pytest.approx(30.0)
    clock.advance(30.0)
    assert ladder.expired() is None
    assert signals == ["cell", "checkpoint"]
    clock.advance(2.0)
    assert ladder.expired() == KILL
    assert ladder.duration() == 10.5, "the cell's own time, not the checkpoint's"


@pytest.mark.parametrize(
    ("request_", "phase", "limit"),
    [
        ({"type": request_table.EXEC, "timeout": 3, "checkpoint_timeout": 30}, "cell", 3.0),
        ({"type": request_table.LOAD, "timeout": 4.5}, "load", 4.5),
        ({"type": request_table.SET_VALUE, "checkpoint_timeout": 30}, "checkpoint", 30.0),
        ({"type": request_table.RESET}, "checkpoint", DEFAULT_STEP_SECONDS),
        ({"type": request_table.RESTORE_BEGIN}, "request", CONTROL_STEP_SECONDS),
        ({"type": request_table.INSTALL, "timeout": 7}, "request", 7.0),
        ({"type": request_table.EXEC, "timeout": float("inf")}, "cell", DEFAULT_STEP_SECONDS),
        ({"type": request_table.EXEC, "timeout": True}, "cell", DEFAULT_STEP_SECONDS),
        ({"type": request_table.EXEC, "timeout": -1}, "cell", DEFAULT_STEP_SECONDS),
    ],
)
def test_a_requests_ladder_takes_its_phase_and_limits_from_the_request(
    clock: Clock, request_: dict, phase: str, limit: float
) -> None:
    ladder = Ladder.for_request(request_, 2.0, lambda phase: None, clock)
    assert (ladder.phase, ladder.deadline - clock.now, ladder.grace) == (phase, limit, 2.0)


def test_an_interrupted_cells_or_loads_error_is_the_interrupts_doing(clock: Clock) -> None:
    cell = Ladder.for_request({"type": request_table.EXEC, "timeout": 1}, 2.0, lambda phase: None, clock)
    assert not cell.stopped_by_interrupt(protocol.STATUS_ERROR)
    cell.cancel()
    cell.expired()
    assert cell.stopped_by_interrupt(protocol.STATUS_ERROR)
    assert not cell.stopped_by_interrupt(protocol.STATUS_OK), "a cell that finished just then stays a success"
    load = Ladder.for_request({"type": request_table.LOAD, "timeout": 1}, 2.0, lambda phase: None, clock)
    clock.advance(1.0)
    load.expired()
    assert load.stopped_by_interrupt(protocol.STATUS_ERROR)
    checkpoint = Ladder.for_request(
        {"type": request_table.RESET, "checkpoint_timeout": 1}, 2.0, lambda phase: None, clock
    )
    clock.advance(1.0)
    checkpoint.expired()
    assert not checkpoint.stopped_by_interrupt(protocol.STATUS_ERROR), "an interrupted checkpoint replies normally"


def test_the_reply_of_a_killed_worker(clock: Clock) -> None:
    cell = Ladder.for_request({"type": request_table.EXEC, "timeout": 1}, 2.0, lambda phase: None, clock)
    clock.advance(3.0)
    assert cell.killed_reply() == {
        "status": protocol.STATUS_TIMEOUT,
        "ran": True,
        "worker_restarted": True,
        "phase": "cell",
        "reason": "the cell ignored the interrupt for 2.0 s; the worker was killed",
        "duration": 3.0,
    }
    load = Ladder.for_request({"type": request_table.LOAD, "timeout": 1}, 2.0, lambda phase: None, clock)
    assert load.killed_reply()["phase"] == "load" and "duration" not in load.killed_reply()
    begin = Ladder.for_request({"type": request_table.RESTORE_BEGIN}, 2.0, lambda phase: None, clock)
    assert begin.killed_reply() == {"status": protocol.STATUS_OK, "worker_restarted": True}  # a fresh worker is empty
