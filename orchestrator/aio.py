"""The asynchronous API, as coroutines: ``AsyncOrchestrator`` and ``AsyncSession`` (implemented in ``orchestrator.api.aio``)."""

from __future__ import annotations

from .api.aio import AsyncOrchestrator, AsyncSession

__all__ = ["AsyncOrchestrator", "AsyncSession"]
