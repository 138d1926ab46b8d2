"""Which workspace serves a request: one per MCP client session, so that clients never see each other's sessions.

Over stdio the server has one client: one workspace. Over streamable HTTP a client that keeps an
MCP session (the handshake protocols, up to 2025-11-25) sends its ``Mcp-Session-Id`` on every
request, which the SDK has checked (an unknown id never reaches a tool): it gets a workspace of
its own, closed when it ends its session (``DELETE``), when it has been idle past ``idle_after``
(the SDK drops such a session too), or when the server stops. A request without one (the
2026-07-28 protocol has no client sessions) is served by the workspace those clients share. A
named session (``--session``) can have one holder only: with it every client shares one workspace.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from .workspace import Workspace

logger = logging.getLogger(__name__)

SESSION_HEADER = "mcp-session-id"


class Clients:
    """The workspaces of the server's clients, made on a client's first request.

    Args:
        make: a new workspace (each with its own default session).
        per_session: give each MCP session id its own workspace (False: every request shares one).
        idle_after: seconds without a request after which a client's workspace is closed (None: never).
        clock: ``time.monotonic``, or a test's.
    """

    def __init__(
        self,
        make: Callable[[], Workspace],
        *,
        per_session: bool,
        idle_after: float | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._make = make
        self._per_session = per_session
        self._idle_after = idle_after
        self._clock = clock
        self._lock = threading.Lock()
        self.shared = make()
        """The workspace of requests without an MCP session id (stdio's only one)."""
        self._own: dict[str, tuple[Workspace, float]] = {}

    def of(self, headers: Mapping[str, str] | None) -> Workspace:
        """The workspace of the client that sent a request with ``headers`` (None: stdio)."""
        key = headers.get(SESSION_HEADER) if headers is not None and self._per_session else None
        with self._lock:
            stale = self._take_idle()
            if key is None:
                found = self.shared
            else:
                found = self._own[key][0] if key in self._own else self._make()
                self._own[key] = (found, self._clock())
        _close_all(stale)
        return found

    def end(self, key: str) -> None:
        """The client ended its MCP session: its sessions go."""
        with self._lock:
            held = self._own.pop(key, None)
        if held is not None:
            logger.info("MCP session %.64s ended", key)
            held[0].close()

    def close(self) -> None:
        """The server stops: every client's sessions go (a named one is detached)."""
        with self._lock:
            held = [workspace for workspace, _ in self._own.values()]
            self._own.clear()
        _close_all([*held, self.shared])

    def _take_idle(self) -> list[Workspace]:
        if self._idle_after is None:
            return []
        now = self._clock()
        idle = [key for key, (_, used) in self._own.items() if now - used > self._idle_after]
        return [self._own.pop(key)[0] for key in idle]


def _close_all(workspaces: list[Workspace]) -> None:
    for workspace in workspaces:
        workspace.close()
