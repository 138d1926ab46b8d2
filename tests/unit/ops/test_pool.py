"""SandboxPool.take: what a sandbox that failed to start costs the taker (no engine: ``start`` is replaced)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from orchestrator.config import Settings
from orchestrator.errors import EngineError, ImageMissing
from orchestrator.ops.pool import SandboxPool, SandboxTemplate


class _Idle:
    def check_idle(self) -> None:
        pass


class _Sandbox:
    sandbox_id = "sb-ok"
    connection = _Idle()

    def remove(self) -> None:
        pass


def _pool(monkeypatch: pytest.MonkeyPatch, outcomes: list[BaseException | None]) -> SandboxPool:
    """A pool of one whose starts give ``outcomes`` in turn (None: a sandbox), then sandboxes."""
    lock = threading.Lock()

    def start(self: SandboxPool, settings: Any = None) -> Any:
        with lock:
            outcome = outcomes.pop(0) if outcomes else None
        if outcome is not None:
            raise outcome
        return _Sandbox()

    monkeypatch.setattr(SandboxPool, "start", start)
    return SandboxPool(None, Settings(), SandboxTemplate("img", "t", {}), size=1, share_network=False)  # type: ignore[arg-type]


def test_a_sandbox_the_engine_refused_to_start_costs_one_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    with _pool(monkeypatch, [EngineError("cannot start a stopped process: unknown")]) as pool:
        assert isinstance(pool.take(), _Sandbox)


def test_an_engine_that_refuses_every_start_is_the_takers_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with _pool(monkeypatch, [EngineError(f"refused {n}") for n in range(10)]) as pool, pytest.raises(EngineError):
        pool.take()


def test_a_missing_image_is_the_takers_error_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    with _pool(monkeypatch, [ImageMissing("no image img")]) as pool, pytest.raises(ImageMissing):
        pool.take()
