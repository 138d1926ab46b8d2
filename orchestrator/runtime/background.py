"""A process-wide pool of threads for work done beside a request: writing a host-made blob while it is sent,
checking a blob's digest while it is restored. A thread started per call would cost more than it saves."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

_pool: tuple[int, ThreadPoolExecutor] | None = None
_lock = threading.Lock()


def beside() -> ThreadPoolExecutor:
    """The pool (a forked child makes its own: it has none of its parent's threads)."""
    global _pool
    with _lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(max_workers=4, thread_name_prefix="orchestrator-beside"))
        return _pool[1]
