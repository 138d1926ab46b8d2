"""orchestrator: persistent, checkpointed Python sessions in sandbox containers, for LLM agents.

Its public names are imported when first used (PEP 562), so that ``import orchestrator.cli`` (every
``orchestrator`` command) or ``import orchestrator.errors`` does not pay for the Docker SDK, the async API and
the rest: ``orchestrator --version`` costs about what the interpreter's start does (bench/cli_start.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .extras import VERSION as __version__

if TYPE_CHECKING:
    from .api.aio import AsyncContext, AsyncOrchestrator, AsyncPythonTool, AsyncSession
    from .api.events import InputRequest, OutputEvent
    from .api.manager import Orchestrator
    from .api.results import ExecError, ExecResult, Generation
    from .api.session import Context, Session
    from .api.tools import PythonTool
    from .backends.base import Placement
    from .config import Capacity, Confinement, ResourceLimits, Settings, SwarmSettings, Timeouts
    from .errors import (
        AgentStartFailed,
        AgentStartTimeout,
        AgentTimeoutError,
        CapacityExceeded,
        ChannelLost,
        CheckpointError,
        CheckpointLimitExceeded,
        CheckpointQuotaExceeded,
        ConfigError,
        ContextNotFound,
        EngineError,
        EngineUnavailable,
        ExecutionTimeout,
        FileNotFoundInWorkspace,
        GenerationNotFound,
        ImageBuildFailed,
        ImageMissing,
        InputRequestNotFound,
        NotAFileInWorkspace,
        NotASandboxImage,
        OrchestratorError,
        PathOutsideWorkspace,
        ProtocolError,
        RelayUnavailable,
        SandboxCrashed,
        SandboxError,
        SandboxOutOfMemory,
        SessionAttachedElsewhere,
        SessionBusy,
        SessionClosed,
        SessionError,
        SessionHeld,
        SessionNotFound,
        SessionsNotClosed,
        TransportError,
        WorkspaceError,
        WorkspaceFileTooBig,
    )
    from .ops.prune import PruneAction, PruneReport
    from .ops.survey import SessionInfo, SessionStatus
    from .runtime.hostcalls import HostCallError, HostCalls

_EXPORTS = {
    ".api.aio": ("AsyncContext", "AsyncOrchestrator", "AsyncPythonTool", "AsyncSession"),
    ".api.events": ("InputRequest", "OutputEvent"),
    ".api.manager": ("Orchestrator",),
    ".api.results": ("ExecError", "ExecResult", "Generation"),
    ".api.session": ("Context", "Session"),
    ".api.tools": ("PythonTool",),
    ".backends.base": ("Placement",),
    ".config": ("Capacity", "Confinement", "ResourceLimits", "Settings", "SwarmSettings", "Timeouts"),
    ".ops.prune": ("PruneAction", "PruneReport"),
    ".ops.survey": ("SessionInfo", "SessionStatus"),
    ".runtime.hostcalls": ("HostCallError", "HostCalls"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (then an attribute like any other)."""
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    elif name in __all__:  # the errors: one light module holds them all
        value = getattr(importlib.import_module(".errors", __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "AgentStartFailed",
    "AgentStartTimeout",
    "AgentTimeoutError",
    "AsyncContext",
    "AsyncOrchestrator",
    "AsyncPythonTool",
    "AsyncSession",
    "Capacity",
    "CapacityExceeded",
    "ChannelLost",
    "CheckpointError",
    "CheckpointLimitExceeded",
    "CheckpointQuotaExceeded",
    "ConfigError",
    "Confinement",
    "Context",
    "ContextNotFound",
    "EngineError",
    "EngineUnavailable",
    "ExecError",
    "ExecResult",
    "ExecutionTimeout",
    "FileNotFoundInWorkspace",
    "Generation",
    "GenerationNotFound",
    "HostCallError",
    "HostCalls",
    "ImageBuildFailed",
    "ImageMissing",
    "InputRequest",
    "InputRequestNotFound",
    "NotAFileInWorkspace",
    "NotASandboxImage",
    "Orchestrator",
    "OrchestratorError",
    "OutputEvent",
    "PathOutsideWorkspace",
    "Placement",
    "ProtocolError",
    "PruneAction",
    "PruneReport",
    "PythonTool",
    "RelayUnavailable",
    "ResourceLimits",
    "SandboxCrashed",
    "SandboxError",
    "SandboxOutOfMemory",
    "Session",
    "SessionAttachedElsewhere",
    "SessionBusy",
    "SessionClosed",
    "SessionError",
    "SessionHeld",
    "SessionInfo",
    "SessionNotFound",
    "SessionStatus",
    "SessionsNotClosed",
    "Settings",
    "SwarmSettings",
    "Timeouts",
    "TransportError",
    "WorkspaceError",
    "WorkspaceFileTooBig",
    "__version__",
]
