"""The shared pool's lanes (background.py): one session's flood of work holds one thread and delays only
itself. What is observed is which tasks run and wait, never time."""

from __future__ import annotations

import threading

from orchestrator import background


def test_a_lane_runs_one_task_at_a_time_and_another_lane_is_not_queued_behind_it() -> None:
    gate = threading.Event()
    running: list[int] = []
    most = [0]
    lock = threading.Lock()

    def flooding(index: int) -> int:
        with lock:
            running.append(index)
            most[0] = max(most[0], len(running))
        gate.wait(30)
        with lock:
            running.remove(index)
        return index

    hostile, other = background.Lane(), background.Lane()
    flood = [hostile.submit(lambda index=index: flooding(index)) for index in range(3 * background.THREADS)]
    assert hostile.busy and hostile.waiting == 3 * background.THREADS - 1  # one on the pool, the rest in its lane
    assert other.submit(lambda: "not behind the flood").result(timeout=30) == "not behind the flood"
    assert not other.busy and other.waiting == 0
    gate.set()
    assert [future.result(timeout=30) for future in flood] == list(range(3 * background.THREADS))  # in order
    assert most[0] == 1
    assert not hostile.busy


def test_a_task_that_raises_gives_its_future_the_error_and_the_lane_goes_on() -> None:
    lane = background.Lane()

    def fails() -> None:
        raise OSError(24, "Too many open files")

    failed = lane.submit(fails)
    after = lane.submit(lambda: 1)
    assert isinstance(failed.exception(timeout=30), OSError)
    assert after.result(timeout=30) == 1
