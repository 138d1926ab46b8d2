"""The public surface is pinned, and every error belongs to one tree."""

from __future__ import annotations

import inspect

import orchestrator
from orchestrator import errors

EXPECTED = {
    "AgentStartFailed", "AgentStartTimeout", "AgentTimeoutError", "CapacityExceeded", "ChannelLost", "CheckpointError",
    "CheckpointLimitExceeded", "CheckpointQuotaExceeded", "ConfigError", "Context", "ContextNotFound", "EngineError",
    "EngineUnavailable",
    "ExecError", "ExecResult", "ExecutionTimeout", "Generation", "GenerationNotFound", "HostCallError", "HostCalls",
    "ImageBuildFailed", "ImageMissing", "InputRequest", "InputRequestNotFound", "Orchestrator", "OrchestratorError",
    "OutputEvent", "NotASandboxImage", "Placement", "ProtocolError", "PruneAction", "PruneReport", "PythonTool",
    "RelayUnavailable", "SandboxCrashed",
    "SandboxError",
    "SandboxOutOfMemory", "Session", "SessionAttachedElsewhere", "SessionBusy", "SessionClosed", "SessionError",
    "SessionHeld", "SessionInfo", "SessionNotFound", "SessionsNotClosed", "SessionStatus", "Settings", "TransportError",
    "__version__",
    # the async twins (also in orchestrator.aio)
    "AsyncContext", "AsyncOrchestrator", "AsyncPythonTool", "AsyncSession",
    # the workspace's errors (session.files)
    "FileNotFoundInWorkspace", "NotAFileInWorkspace", "PathOutsideWorkspace", "WorkspaceError", "WorkspaceFileTooBig",
    # Settings' groups
    "Capacity", "Confinement", "ResourceLimits", "SwarmSettings", "Timeouts",
}  # fmt: skip


def test_all_is_pinned():
    assert set(orchestrator.__all__) == EXPECTED
    for name in orchestrator.__all__:
        assert hasattr(orchestrator, name)


def test_every_error_is_exported_rooted_and_drawn_in_the_tree():
    classes = [
        c
        for name, c in inspect.getmembers(errors, inspect.isclass)
        if c.__module__ == errors.__name__ and not name.startswith("_")
    ]
    for cls in classes:
        assert issubclass(cls, orchestrator.OrchestratorError)
        assert cls.__name__ in orchestrator.__all__
        assert cls.__name__ in (errors.__doc__ or ""), f"{cls.__name__} missing from the tree in errors.py"


def test_errors_also_inherit_the_matching_builtin():
    assert issubclass(orchestrator.ExecutionTimeout, TimeoutError)
    assert issubclass(orchestrator.SandboxOutOfMemory, MemoryError)
    assert issubclass(orchestrator.EngineUnavailable, ConnectionError)
    assert issubclass(orchestrator.SessionNotFound, LookupError)
    assert issubclass(orchestrator.ConfigError, ValueError)
