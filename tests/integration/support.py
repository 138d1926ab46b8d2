"""Helpers shared by the integration tests (importable as ``support``: pytest puts this directory on sys.path)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from orchestrator import Orchestrator, Session, SessionAttachedElsewhere, SessionClosed


def close_quietly(session: Session) -> None:
    """Close a session at teardown; a handle another controller took over (or that is closed) is left alone."""
    with contextlib.suppress(SessionAttachedElsewhere, SessionClosed):
        session.close()


def tree_snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` (relative path -> (size, mtime_ns)), to show that nothing changed there.

    The activity file is left out: any attempt at a call (a stale handle's too) marks it used.
    """
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "activity"
    }


def tree_bytes(root: Path) -> int:
    """Bytes of every file under ``root``."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def wait_gone(orch: Orchestrator, container_id: str, timeout: float = 15.0) -> None:
    """Wait until the container has stopped running (or no longer exists)."""
    ends = time.monotonic() + timeout
    while time.monotonic() < ends:
        state = orch.backend.inspect(container_id)
        if state is None or not state.running:
            return
        time.sleep(0.05)
    raise AssertionError(f"container {container_id[:12]} still running after {timeout} s")


def kill_and_wait(orch: Orchestrator, container_id: str | None) -> None:
    """SIGKILL a container (any session's: the engine is shared) and wait until the engine sees it dead."""
    assert container_id is not None
    orch.backend.kill(container_id)
    wait_gone(orch, container_id)
