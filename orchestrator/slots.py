"""A bounded count of things held, safe across threads: a session's host calls, the controller's, an MCP server's
sandbox sessions. One definition, so every cap on what a sandbox or a client can make the host hold reads alike."""

from __future__ import annotations

import threading


class Slots:
    """At most ``limit`` held at once; ``reserve`` says whether one more could be taken."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._held = 0

    @property
    def held(self) -> int:
        with self._lock:
            return self._held

    def reserve(self) -> bool:
        """Hold one more; False (holding nothing more) when ``limit`` are held."""
        with self._lock:
            if self._held >= self.limit:
                return False
            self._held += 1
            return True

    def release(self, count: int = 1) -> None:
        """Let go of ``count`` held ones."""
        with self._lock:
            self._held -= count
