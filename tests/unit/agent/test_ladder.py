"""The interrupt/kill ladder's states, on a fake clock: deadlines, grace, input pauses, cancel, checkpoint, takeover."""

from __future__ import annotations

import pytest

from orchestrator.agent.ladder import ABANDON, KILL, NOTICE_DELAY, Ladder


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
    assert not ladder.in_cell and not ladder.relays_calls
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


def test_the_cell_done_starts_the_checkpoints_clock_and_its_notice(clock: Clock) -> None:
    ladder, signals = ladder_for(clock)
    clock.advance(10.0)
    ladder.expired()  # the cell was interrupted and stopped: its checkpoint has a fresh ladder
    clock.advance(0.5)
    ladder.cell_done()
    assert ladder.phase == "checkpoint" and not ladder.in_cell and not ladder.relays_calls
    assert not ladder.interrupted and ladder.cell_interrupted
    assert ladder.cell_duration == 10.5
    assert ladder.wait_seconds() == pytest.approx(NOTICE_DELAY)
    assert not ladder.notice_due()
    clock.advance(NOTICE_DELAY)
    assert ladder.notice_due()
    assert not ladder.notice_due(), "one notice"
    assert ladder.wait_seconds() == pytest.approx(30.0 - NOTICE_DELAY)
    clock.advance(30.0)
    assert ladder.expired() is None
    assert signals == ["cell", "checkpoint"]
    clock.advance(2.0)
    assert ladder.expired() == KILL
    assert ladder.duration() == 10.5, "the cell's own time, not the checkpoint's"


def test_a_takeover_interrupts_at_once_and_abandons_after_the_grace(clock: Clock) -> None:
    ladder, signals = ladder_for(clock)
    assert ladder.relays_calls
    clock.advance(3.0)
    ladder.take_over()
    assert signals == ["cell"] and ladder.taken_over and not ladder.relays_calls
    assert not ladder.cell_interrupted, "a takeover's interrupt does not make the cell's error a timeout"
    assert ladder.deadline == 1005.0
    clock.advance(2.0)
    assert ladder.expired() == ABANDON
    assert signals == ["cell"]


def test_a_takeover_after_the_interrupt_sends_no_second_one(clock: Clock) -> None:
    ladder, signals = ladder_for(clock)
    clock.advance(10.0)
    ladder.expired()
    clock.advance(1.0)
    ladder.take_over()
    assert signals == ["cell"]
    assert ladder.deadline == 1011.0 + 2.0
    clock.advance(2.0)
    assert ladder.expired() == ABANDON
