"""A call as an iterator of its events (``Session.stream``): the call runs on a thread of its own, its events come
through a queue, and leaving the loop early interrupts it."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .events import Event, OnOutput
from .results import ExecResult


def stream(
    execute: Callable[[OnOutput], ExecResult], interrupt: Callable[[], bool], name: str
) -> Iterator[Event | ExecResult]:
    """Each event ``execute`` hands its ``on_output`` as it happens, then its result (or what it raised, after the
    events); ``interrupt`` stops its cell when the caller leaves the loop early."""
    events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()

    def run() -> None:
        try:
            events.put(("result", execute(lambda event: events.put(("event", event)))))
        except BaseException as exc:
            events.put(("error", exc))

    runner = threading.Thread(target=run, name=name, daemon=True)
    runner.start()
    finished = False
    try:
        while True:
            kind, item = events.get()
            if kind == "event":
                yield item
                continue
            finished = True
            if kind == "error":
                raise item
            yield item
            return
    finally:
        while not finished and runner.is_alive() and not interrupt():
            runner.join(0.005)  # the call has not begun yet: interrupt it once it has
        runner.join()
