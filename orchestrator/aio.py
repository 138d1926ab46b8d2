"""The asynchronous API: the twins of Orchestrator, Session, Context, PythonTool and Files whose calls are coroutines.

Implemented in ``api/aio.py``; also exported from ``orchestrator`` itself.
"""

from __future__ import annotations

from .api.aio import AsyncContext, AsyncFiles, AsyncOrchestrator, AsyncPythonTool, AsyncSession

__all__ = ["AsyncContext", "AsyncFiles", "AsyncOrchestrator", "AsyncPythonTool", "AsyncSession"]
