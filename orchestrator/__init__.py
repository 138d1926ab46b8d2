"""orchestrator: persistent, checkpointed Python sessions in sandbox containers, for LLM agents."""

from __future__ import annotations

__version__ = "0.1.0"

from .config import Settings
from .errors import (
    AgentStartTimeout,
    AgentTimeoutError,
    ChannelLost,
    CheckpointError,
    ConfigError,
    EngineError,
    EngineUnavailable,
    ExecutionTimeout,
    ImageMissing,
    OrchestratorError,
    ProtocolError,
    SandboxCrashed,
    SandboxError,
    SandboxOutOfMemory,
    SessionAttachedElsewhere,
    SessionBusy,
    SessionClosed,
    SessionError,
    SessionNotFound,
    TransportError,
)
from .manager import Orchestrator
from .results import ExecError, ExecResult
from .session import Session

__all__ = [
    "AgentStartTimeout",
    "AgentTimeoutError",
    "ChannelLost",
    "CheckpointError",
    "ConfigError",
    "EngineError",
    "EngineUnavailable",
    "ExecError",
    "ExecResult",
    "ExecutionTimeout",
    "ImageMissing",
    "Orchestrator",
    "OrchestratorError",
    "ProtocolError",
    "SandboxCrashed",
    "SandboxError",
    "SandboxOutOfMemory",
    "Session",
    "SessionAttachedElsewhere",
    "SessionBusy",
    "SessionClosed",
    "SessionError",
    "SessionNotFound",
    "Settings",
    "TransportError",
    "__version__",
]
