"""The asynchronous API: the twins of Orchestrator, Session, Context and PythonTool whose calls are coroutines.

Implemented in ``api/aio.py``; also exported from ``orchestrator`` itself.
"""

from __future__ import annotations

from .api.aio import AsyncContext, AsyncOrchestrator, AsyncPythonTool, AsyncSession

__all__ = ["AsyncContext", "AsyncOrchestrator", "AsyncPythonTool", "AsyncSession"]
