"""orchestrator: persistent, checkpointed Python sessions in sandbox containers, for LLM agents."""

from __future__ import annotations

__version__ = "0.1.0"

from .config import Settings
from .contexts import Context
from .errors import (
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
    ImageMissing,
    InputRequestNotFound,
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
    SessionNotFound,
    SessionsNotClosed,
    TransportError,
)
from .events import InputRequest, OutputEvent
from .manager import Orchestrator
from .prune import PruneAction, PruneReport
from .results import ExecError, ExecResult
from .session import Session
from .survey import SessionInfo, SessionStatus
from .tools import PythonTool

__all__ = [
    "AgentStartTimeout",
    "AgentTimeoutError",
    "CapacityExceeded",
    "ChannelLost",
    "CheckpointError",
    "CheckpointLimitExceeded",
    "CheckpointQuotaExceeded",
    "ConfigError",
    "Context",
    "ContextNotFound",
    "EngineError",
    "EngineUnavailable",
    "ExecError",
    "ExecResult",
    "ExecutionTimeout",
    "ImageMissing",
    "InputRequest",
    "InputRequestNotFound",
    "Orchestrator",
    "OrchestratorError",
    "OutputEvent",
    "ProtocolError",
    "PruneAction",
    "PruneReport",
    "PythonTool",
    "RelayUnavailable",
    "SandboxCrashed",
    "SandboxError",
    "SandboxOutOfMemory",
    "Session",
    "SessionAttachedElsewhere",
    "SessionBusy",
    "SessionClosed",
    "SessionError",
    "SessionInfo",
    "SessionNotFound",
    "SessionStatus",
    "SessionsNotClosed",
    "Settings",
    "TransportError",
    "__version__",
]
