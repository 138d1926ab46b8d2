"""A process-wide pool of threads for work done beside a request: writing a host-made blob while it is sent,
checking a blob's digest while it is restored. A thread started per call would cost more than it saves.

The pool is shared by every session of the controller, and what a sandbox asks for is hostile: so a session's work
goes through its own ``Lane``, which has at most one task on the pool at a time and queues the rest itself. One
session's flood then holds one of the pool's threads and delays its own tasks only; another session's task waits
for at most one task of each other lane (docs/trust.md).
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

THREADS = 4
_pool: tuple[int, ThreadPoolExecutor] | None = None
_lock = threading.Lock()

T = TypeVar("T")


def beside() -> ThreadPoolExecutor:
    """The pool (a forked child makes its own: it has none of its parent's threads)."""
    global _pool
    with _lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="orchestrator-beside"))
        return _pool[1]


class Lane:
    """One session's work on the shared pool: its tasks run one at a time, in order; the others wait here."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: collections.deque[tuple[Future[object], Callable[[], object]]] = collections.deque()
        self._on_pool = False  # a task of this lane is on the pool (queued there or running)

    @property
    def waiting(self) -> int:
        """Tasks queued here behind the one on the pool."""
        with self._lock:
            return len(self._waiting)

    @property
    def busy(self) -> bool:
        """A task of this lane is on the pool now."""
        with self._lock:
            return self._on_pool

    def submit(self, task: Callable[[], T]) -> Future[T]:
        """Run ``task`` on the pool after this lane's earlier tasks; its future."""
        future: Future[T] = Future()
        with self._lock:
            self._waiting.append((future, task))  # type: ignore[arg-type]
            start, self._on_pool = not self._on_pool, True
        if start:
            self._next()
        return future

    def _next(self) -> None:
        """Put this lane's next task on the pool (it puts the one after it there when it ends)."""
        with self._lock:
            if not self._waiting:
                self._on_pool = False
                return
            future, task = self._waiting.popleft()
        beside().submit(self._run, future, task)

    def _run(self, future: Future[object], task: Callable[[], object]) -> None:
        try:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(task())
                except BaseException as exc:  # the future carries it to whoever waits
                    future.set_exception(exc)
        finally:
            self._next()
