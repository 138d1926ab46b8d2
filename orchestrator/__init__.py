"""orchestrator: persistent, checkpointed Python sessions in sandbox containers, for LLM agents."""

from __future__ import annotations

__version__ = "0.1.0"

from .api.aio import AsyncContext, AsyncOrchestrator, AsyncPythonTool, AsyncSession
from .api.contexts import Context
from .api.events import InputRequest, OutputEvent
from .api.manager import Orchestrator
from .api.results import ExecError, ExecResult, Generation
from .api.session import Session
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
    GenerationNotFound,
    ImageBuildFailed,
    ImageMissing,
    InputRequestNotFound,
    NotASandboxImage,
    OrchestratorError,
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
)
from .ops.prune import PruneAction, PruneReport
from .ops.survey import SessionInfo, SessionStatus
from .runtime.hostcalls import HostCallError, HostCalls

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
    "Generation",
    "GenerationNotFound",
    "HostCallError",
    "HostCalls",
    "ImageBuildFailed",
    "ImageMissing",
    "InputRequest",
    "InputRequestNotFound",
    "NotASandboxImage",
    "Orchestrator",
    "OrchestratorError",
    "OutputEvent",
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
    "__version__",
]
