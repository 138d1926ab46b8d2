"""The asynchronous API as coroutines: AsyncOrchestrator and AsyncSession (implemented in ``api/aio.py``)."""

from __future__ import annotations

from .api.aio import AsyncOrchestrator, AsyncSession

__all__ = ["AsyncOrchestrator", "AsyncSession"]
