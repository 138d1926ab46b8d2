"""The timeout ladder: an interrupt first (state kept), then a killed worker and a restore."""

from __future__ import annotations

import time

import pytest

from orchestrator import ExecutionTimeout, SandboxError, Session, Settings

pytestmark = pytest.mark.docker

SLACK = 5.0
"""Seconds allowed beyond timeout + grace for the kill, the restart and the restore."""


def run_timed(session: Session, code: str, timeout: float) -> tuple[ExecutionTimeout, float]:
    started = time.monotonic()
    with pytest.raises(ExecutionTimeout) as info:
        session.execute(code, timeout=timeout)
    return info.value, time.monotonic() - started


def test_busy_loop_is_interrupted_and_keeps_state(session: Session, settings: Settings) -> None:
    session.execute("earlier = 'kept'")
    container = session.container_id
    exc, took = run_timed(session, "progress = 'reached'\nprint('started')\nwhile True:\n    pass", timeout=1)
    assert isinstance(exc, SandboxError) and isinstance(exc, TimeoutError)
    assert exc.restored is False
    assert exc.generation == session.generation
    assert exc.stdout == "started\n"
    assert "interrupted" in str(exc)
    assert 1.0 <= took < 1 + settings.timeouts.interrupt_grace + SLACK
    # The worker was not restarted: the earlier state and what the cell did before the interrupt remain.
    assert session.container_id == container
    assert session.execute("earlier, progress").return_value == "('kept', 'reached')"
    assert "progress" in session.variables


def test_cell_that_swallows_the_interrupt_is_killed_and_restored(session: Session, settings: Settings) -> None:
    session.execute("earlier = [1, 2, 3]")
    generation = session.generation
    code = (
        "earlier.append(4)\n"
        "lost = 'never checkpointed'\n"
        "while True:\n"
        "    try:\n"
        "        while True:\n"
        "            pass\n"
        "    except KeyboardInterrupt:\n"
        "        continue\n"
    )
    exc, took = run_timed(session, code, timeout=1)
    assert exc.restored is True
    assert exc.generation == generation == session.generation
    assert "ignored the interrupt" in str(exc)
    assert 1.0 + settings.timeouts.interrupt_grace <= took < 1 + settings.timeouts.interrupt_grace + SLACK
    # Back to the last checkpoint: the cell's changes are gone, the earlier state is there.
    assert session.execute("earlier, 'lost' in globals()").return_value == "([1, 2, 3], False)"
    assert session.execute("sum(earlier)").return_value == "6"


def test_sleep_in_finally_after_the_interrupt(session: Session, settings: Settings) -> None:
    session.execute("import time\nbefore = 'there'")
    code = "try:\n    while True:\n        pass\nfinally:\n    time.sleep(60)\n"
    exc, took = run_timed(session, code, timeout=1)
    assert exc.restored is True
    assert took < 1 + settings.timeouts.interrupt_grace + SLACK
    assert session.execute("before").return_value == "'there'"
    assert session.execute("time.sleep(0.01); 'works'").return_value == "'works'"


def test_sleep_is_interrupted_like_a_busy_loop(session: Session) -> None:
    session.execute("import time")
    exc, took = run_timed(session, "time.sleep(30)", timeout=0.5)
    assert exc.restored is False
    assert took < 5
    assert session.execute("'next'").return_value == "'next'"


def test_cell_finishing_within_the_timeout_is_unaffected(session: Session) -> None:
    result = session.execute("import time\ntime.sleep(0.3)\n'slept'", timeout=5)
    assert result.return_value == "'slept'"
    assert result.duration >= 0.3


def test_interrupt_during_an_output_flood_keeps_the_output_bounded(session: Session, settings: Settings) -> None:
    exc, _ = run_timed(session, "while True:\n    print('spam' * 100)", timeout=1)
    assert exc.restored is False
    assert len(exc.stdout.encode()) < settings.limits.max_output_bytes + 200
    assert "truncated" in exc.stdout
    assert session.execute("'calm'").return_value == "'calm'"
