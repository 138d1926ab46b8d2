"""Host calls are bounded per cell and per session, and nothing of a cell starts after it ended (no engine)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from orchestrator.agent import protocol
from orchestrator.errors import ConfigError
from orchestrator.runtime.hostcalls import CallDesk, HandlerPool, HostCalls
from orchestrator.slots import Slots


class Gate:
    """A handler that counts its invocations and blocks until released."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.invoked = 0
        self.returned = 0
        self.release = threading.Event()
        self.all_returned = threading.Event()
        self.expected_returns = 0

    def __call__(self, payload: Any) -> Any:
        with self.lock:
            self.invoked += 1
        self.release.wait(30)
        with self.lock:
            self.returned += 1
            if self.returned == self.expected_returns:
                self.all_returned.set()
        return payload


def errors(desk: CallDesk) -> list[str]:
    return [header["error"] for header, _ in desk.answers() if header["status"] == protocol.STATUS_ERROR]


def test_a_flood_is_refused_past_the_cells_bound_and_nothing_waiting_starts_after_the_cell_ended() -> None:
    gate = Gate()
    pool = HandlerPool(150)
    desk = CallDesk(HostCalls({"llm_query": gate}, max_concurrent=4), pool, max_held=100)
    try:
        for call in range(5000):
            desk.submit(call, "llm_query", bytearray(json.dumps(call).encode()))
        refused = errors(desk)
        assert len(refused) == 4900
        assert all("Settings.limits.max_host_calls_per_cell" in message for message in refused)
        assert pool.held == 100
        desk.close()  # the cell ended: 96 waiting calls are cancelled, 4 handlers run on
        assert pool.held == 4
        gate.expected_returns = 4
        gate.release.set()
        assert gate.all_returned.wait(10)
    finally:
        gate.release.set()
        pool.close()
    assert gate.invoked == 4, "a call waiting when its cell ended was started"
    assert pool.held == 0


def test_a_call_number_still_open_is_refused_and_holds_nothing_more() -> None:
    """The sandbox numbers its calls; one that repeats an open number (hostile) must not take a second slot that
    the first one's answer would free twice, or never."""
    gate = Gate()
    pool = HandlerPool(8)
    desk = CallDesk(HostCalls({"llm_query": gate}, max_concurrent=1), pool, max_held=8)
    try:
        for _ in range(2):  # running, then waiting
            desk.submit(1, "llm_query", bytearray(b"1"))
            desk.submit(2, "llm_query", bytearray(b"2"))
        refused = errors(desk)
        assert len(refused) == 2 and all("still open" in message for message in refused), refused
        assert pool.held == 2
        gate.expected_returns = 2
        gate.release.set()
        assert gate.all_returned.wait(10)
        deadline = time.monotonic() + 10
        while pool.held and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.held == 0
    finally:
        gate.release.set()
        desk.close()
        pool.close()


def test_handlers_left_running_by_ended_cells_count_against_the_sessions_bound() -> None:
    gate = Gate()
    pool = HandlerPool(10)
    calls = HostCalls({"llm_query": gate}, max_concurrent=4)
    try:
        for _ in range(2):  # each cell leaves 4 handlers running
            desk = CallDesk(calls, pool, max_held=8)
            for call in range(4):
                desk.submit(call, "llm_query", bytearray(b"1"))
            assert errors(desk) == []
            desk.close()
        assert pool.held == 8
        desk = CallDesk(calls, pool, max_held=8)
        for call in range(4):
            desk.submit(call, "llm_query", bytearray(b"1"))
        refused = errors(desk)
        assert len(refused) == 2 and all("Settings.limits.max_host_calls_per_session" in m for m in refused)
        desk.close()
        gate.expected_returns = 10
        gate.release.set()
        assert gate.all_returned.wait(10)
        assert pool.held == 0
        desk = CallDesk(calls, pool, max_held=8)  # room again once they returned
        desk.submit(0, "llm_query", bytearray(b"1"))
        desk.close()
    finally:
        gate.release.set()
        pool.close()


def test_a_closed_pool_starts_nothing_and_refuses_every_call() -> None:
    gate = Gate()
    pool = HandlerPool(8)
    desk = CallDesk(HostCalls({"llm_query": gate}), pool, max_held=8)
    pool.close()
    desk.submit(0, "llm_query", bytearray(b"1"))
    (refused,) = errors(desk)
    assert "its session is closing" in refused
    desk.close()
    assert gate.invoked == 0 and pool.held == 0


def test_calls_waiting_when_the_pool_closes_are_refused_one_after_another_not_one_stack_frame_each() -> None:
    gate = Gate()
    pool = HandlerPool(5000, Slots(5000))  # beyond the controller's default bound
    desk = CallDesk(HostCalls({"llm_query": gate}, max_concurrent=1), pool, max_held=5000)
    try:
        for call in range(3000):  # one runs, 2,999 wait: more than the interpreter's recursion limit
            desk.submit(call, "llm_query", bytearray(b"1"))
        pool.close()
        gate.expected_returns = 1
        gate.release.set()
        assert gate.all_returned.wait(10)
        deadline = time.monotonic() + 10
        while pool.held and time.monotonic() < deadline:  # the returned handler's thread refuses the waiting ones
            time.sleep(0.01)
        refused = errors(desk)
        assert len(refused) == 2999 and all("the session is closing" in message for message in refused)
        assert gate.invoked == 1 and pool.held == 0
    finally:
        gate.release.set()
        desk.close()


def test_the_bound_must_be_positive() -> None:
    with pytest.raises(ConfigError):
        HandlerPool(0)


def test_the_controllers_bound_holds_across_sessions_and_each_handler_thread_ends_with_it() -> None:
    gate = Gate()
    controller = Slots(6)
    pools = [HandlerPool(4, controller) for _ in range(3)]
    desks = [CallDesk(HostCalls({"llm_query": gate}), pool, max_held=4) for pool in pools]
    threads_before = threading.active_count()
    try:
        for desk in desks:
            for call in range(4):
                desk.submit(call, "llm_query", bytearray(b"1"))
        refused = [message for desk in desks for message in errors(desk)]
        assert len(refused) == 6 and all("the controller already holds 6 host calls" in m for m in refused)
        assert sum(pool.held for pool in pools) == 6
        assert threading.active_count() - threads_before <= 6
        gate.expected_returns = 6
        gate.release.set()
        assert gate.all_returned.wait(10)
        deadline = time.monotonic() + 10
        while threading.active_count() > threads_before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert threading.active_count() == threads_before  # no idle thread outlives its call
        assert sum(pool.held for pool in pools) == 0 and all(controller.reserve() for _ in range(6))
    finally:
        gate.release.set()
        for desk, pool in zip(desks, pools, strict=True):
            desk.close()
            pool.close()
