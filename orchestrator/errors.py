"""The exception tree of the controller: every infrastructure failure is one of these.

Errors in the *user's* code are not exceptions: they come back as ``ExecResult.error``.

::

    OrchestratorError
    ├── ConfigError (ValueError)             a setting or argument is invalid
    │   ├── GenerationNotFound (LookupError) the session keeps no such generation (rewind, fork(at=...))
    │   └── NotASandboxImage                 a base image was given where a sandbox image goes; build on it
    ├── InputRequestNotFound (LookupError)   no input() request with that id waits
    ├── EngineError                          the Docker engine refused or failed
    │   ├── EngineUnavailable (ConnectionError)  no engine answers; how to start one
    │   ├── ImageMissing (LookupError)           the sandbox image is not built; how to build it
    │   └── ImageBuildFailed                     a sandbox image's build failed; the end of its log
    ├── SessionError
    │   ├── SessionNotFound (LookupError)    no session with that id
    │   ├── ContextNotFound (LookupError)    no context with that id in the session (or it was destroyed)
    │   ├── SessionClosed                    the session was closed
    │   ├── SessionAttachedElsewhere         another controller owns the session now (epoch moved on)
    │   │   └── SessionHeld                  attach refused: a live controller holds it (named); force=True takes it
    │   ├── SessionBusy (TimeoutError)       another process held the session's store lock too long
    │   ├── CapacityExceeded                 Settings.capacity.max_running sessions run and none could make room
    │   ├── CheckpointQuotaExceeded          a value would take the checkpoint past its quota or bounds; nothing stored
    │   ├── SessionsNotClosed                Orchestrator.close could not close some sessions (all were tried)
    │   └── CheckpointError (OSError)        the checkpoint could not be stored or restored
    ├── WorkspaceError                       a files call (session.files) could not use a path of the workspace
    │   ├── FileNotFoundInWorkspace (LookupError)  nothing at that path in the session's stored workspace
    │   ├── NotAFileInWorkspace              the path is a directory (or a link that leads out); use list or download
    │   ├── PathOutsideWorkspace (ValueError)  the path leads out of /workspace (``..``, another absolute path)
    │   └── WorkspaceFileTooBig              the file is past what read() returns in memory; use read(to=...)
    ├── SandboxError                         the call failed because of the sandbox; see .restored
    │   ├── ExecutionTimeout (TimeoutError)  the cell ran past its timeout
    │   ├── SandboxCrashed                   the interpreter or container died
    │   │   └── SandboxOutOfMemory (MemoryError)  ... killed for exceeding its memory limit
    │   ├── AgentStartTimeout (TimeoutError) a new container's agent never connected
    │   └── AgentStartFailed                 a new container exited before its agent connected
    └── TransportError                       the channel to the agent failed
        ├── ProtocolError                    the agent sent something invalid or oversized; see .restored
        │   └── CheckpointLimitExceeded      ... a checkpoint past the session's limits (also a CheckpointQuotaExceeded)
        ├── ChannelLost (ConnectionError)    the agent's end of the channel closed
        ├── AgentTimeoutError (TimeoutError) the agent did not answer in time
        └── RelayUnavailable (ConnectionError)  a node's relay (Swarm) cannot be reached, refused us or failed
"""

from __future__ import annotations


class OrchestratorError(Exception):
    """Root of every error the controller raises."""


class _QuotesLog(OrchestratorError):
    """An error that quotes the last lines of a log (a build's, a container's), each a line of its own.

    ``headline`` is the one-line message; ``str()`` adds the quoted lines below it, indented, so a traceback
    shows them. They were made safe for a terminal and bounded where the log was read (``safe_text.last_lines``).

    Attributes:
        log_tail: the log's last lines, oldest first.
    """

    def __init__(self, headline: str, *, log_tail: tuple[str, ...] = ()) -> None:
        super().__init__(headline)
        self.headline = headline
        self.log_tail = tuple(log_tail)

    def __str__(self) -> str:
        return self.headline + "".join(f"\n  | {line}" for line in self.log_tail)


class ConfigError(OrchestratorError, ValueError):
    """A setting or argument is invalid; the message names it and what is allowed."""


class NotASandboxImage(ConfigError):
    """The image given where a sandbox image goes (``create_session(image=...)``, the CLI's ``--image``) has no agent:
    it is a base image. Nothing was started; the message says how to build a sandbox image on it (``--base``).

    Attributes:
        image: the image given.
    """

    def __init__(self, message: str, *, image: str) -> None:
        super().__init__(message)
        self.image = image


class EngineError(OrchestratorError):
    """The Docker engine refused or failed an operation."""


class EngineUnavailable(EngineError, ConnectionError):
    """No Docker engine answers; the message says how to start one."""


class ImageMissing(EngineError, LookupError):
    """The sandbox image does not exist; the message says how to build it."""


class ImageBuildFailed(_QuotesLog, EngineError):
    """A sandbox image's build failed (a base without ``python3``, a full disk): the headline is the engine's error,
    ``log_tail`` the build log's last lines.

    Attributes:
        tag: the image that was being built.
        base_image: the base it was built on.
    """

    def __init__(self, headline: str, *, tag: str, base_image: str, log_tail: tuple[str, ...] = ()) -> None:
        super().__init__(headline, log_tail=log_tail)
        self.tag = tag
        self.base_image = base_image


class InputRequestNotFound(OrchestratorError, LookupError):
    """No ``input()`` request with that id waits: unknown, already answered, timed out, or its cell ended."""


class SessionError(OrchestratorError):
    """A problem with a session as a whole."""


class SessionNotFound(SessionError, LookupError):
    """No session with that id exists in the store."""


class ContextNotFound(SessionError, LookupError):
    """The session has no context with that id: it never existed or was destroyed; the message says what to do."""


class GenerationNotFound(ConfigError, LookupError):
    """The session keeps no such generation (``Session.history()`` lists those it keeps): it was never committed, or
    the history's depth or the checkpoint quota let it go (``Settings.limits.history_generations``)."""


class SessionClosed(SessionError):
    """The session was closed; create or attach a new one."""


class SessionAttachedElsewhere(SessionError):
    """Another controller attached to this session and now owns its channel."""


class SessionHeld(SessionAttachedElsewhere):
    """``attach`` (``resume``, ``remove``; the CLI's ``exec``, ``shell``, ``resume``, ``rm``) was refused: a live
    controller holds the session (its lease is renewed). Nothing was changed; the holder's calls go on.

    Wait for it to detach or close the session, or take it over with ``force=True`` (``--force``): its running call
    is then stopped and not kept, and its handle goes stale.

    Attributes:
        host: the holder's host name.
        pid: the holder's process id on that host.
        since: when it took the session (seconds since the epoch).
    """

    def __init__(self, message: str, *, host: str, pid: int, since: float) -> None:
        super().__init__(message)
        self.host = host
        self.pid = pid
        self.since = since


class SessionBusy(SessionError, TimeoutError):
    """Another process held the session's store lock longer than ``Settings.timeouts.lock``."""


class CapacityExceeded(SessionError):
    """``Settings.capacity.max_running`` sessions run already and the policy (or their calls) left no room for one
    more."""


class CheckpointQuotaExceeded(SessionError):
    """A value handed to the session (``add_context``, ``set_value``) would take its stored checkpoint past
    ``Settings.limits.checkpoint_quota``, or past the manifest's bounds (``checkpoint_names.MAX_CHECKPOINT_NAMES``
    names, ``checkpoint_names.MAX_CHECKPOINT_NAME_BYTES`` bytes of names); it was refused before it was sent, and
    nothing was stored.

    Attributes:
        size: bytes the value's checkpoint blob takes.
        held: bytes the checkpoint would hold with it (counted in bytes whichever bound it passed).
        quota: the session's checkpoint quota in bytes.
    """

    def __init__(self, message: str, *, size: int, held: int, quota: int) -> None:
        super().__init__(message)
        self.size = size
        self.held = held
        self.quota = quota


class SessionsNotClosed(SessionError):
    """``Orchestrator.close`` could not close some sessions; it tried every one, then closed the pool and the engine
    client, and raised this last.

    Attributes:
        failures: session id -> the error its ``close`` raised, for each session that failed.
    """

    def __init__(self, failures: dict[str, Exception]) -> None:
        self.failures = dict(failures)
        each = "; ".join(f"{sid}: {type(exc).__name__}: {exc}" for sid, exc in self.failures.items())
        super().__init__(
            f"{len(self.failures)} session(s) could not be closed (every other one was): {each}. Their containers "
            "may still run: `orchestrator prune` quarantines an unreadable record and reports its container"
        )


class CheckpointError(SessionError, OSError):
    """A checkpoint could not be stored or restored."""


class WorkspaceError(OrchestratorError):
    """A files call (``session.files``: ``read``, ``list``, ``exists``, ``download``) could not use a path of the
    session's workspace; the message shows the path (control characters and bytes that are not UTF-8 escaped) and
    says what to do.

    Attributes:
        path: the path as it was given (or as the workspace holds it).
    """

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


class FileNotFoundInWorkspace(WorkspaceError, LookupError):
    """Nothing is at that path in the session's stored workspace (or a link on the way leads to nothing)."""


class NotAFileInWorkspace(WorkspaceError):
    """``read`` was given a directory, or a link whose target is outside the workspace (never followed there)."""


class PathOutsideWorkspace(WorkspaceError, ValueError):
    """The path leads out of ``/workspace``: ``..`` above it, another absolute path, a NUL; or a link on the way
    points out of it. Give a path relative to the workspace, or an absolute one under ``/workspace``."""


class WorkspaceFileTooBig(WorkspaceError):
    """The file holds more than ``read`` returns in memory (its ``max_bytes``); ``read(path, to=local_path)``
    streams a file of any size to a local file.

    Attributes:
        size: the file's size in bytes.
        limit: the ``max_bytes`` it is past.
    """

    def __init__(self, message: str, *, path: str, size: int, limit: int) -> None:
        super().__init__(message, path=path)
        self.size = size
        self.limit = limit


class _Recovered(OrchestratorError):
    """What a failed call did to the session: whether it was restored, to which generation, what was lost.

    Attributes:
        restored: True when the session was brought back to its last checkpoint and the
            next call will work; False when the sandbox kept running with its state.
        generation: the checkpoint generation the session is at now.
        restore_failures: values the restore could not bring back (name -> reason); they
            were dropped from the checkpoint.
    """

    def __init__(
        self,
        message: str,
        *,
        restored: bool = False,
        generation: int | None = None,
        restore_failures: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.restored = restored
        self.generation = generation
        self.restore_failures = dict(restore_failures or {})


class SandboxError(_Recovered):
    """The call failed because of what happened in the sandbox; see ``restored``."""


class ExecutionTimeout(SandboxError, TimeoutError):
    """The cell ran past its timeout; ``restored`` says whether the worker had to be killed."""

    def __init__(
        self,
        message: str,
        *,
        restored: bool = False,
        generation: int | None = None,
        restore_failures: dict[str, str] | None = None,
        stdout: str = "",
        stderr: str = "",
    ) -> None:
        super().__init__(message, restored=restored, generation=generation, restore_failures=restore_failures)
        self.stdout = stdout
        self.stderr = stderr


class SandboxCrashed(SandboxError):
    """The interpreter or its container died during the call."""


class SandboxOutOfMemory(SandboxCrashed, MemoryError):
    """The sandbox exceeded its memory limit and was killed."""


class AgentStartTimeout(SandboxError, TimeoutError):
    """A new container started but its agent did not connect in time."""


class AgentStartFailed(_QuotesLog, SandboxError):
    """A new container exited before its agent connected (a base image given as the sandbox image, an agent command
    that fails): reported as soon as the engine says so, not at the start timeout. Nothing is left behind.

    Attributes:
        exit_code: the container's exit code (None: the engine did not say, or the container was gone).
        log_tail: the container's last log lines.
    """

    def __init__(self, headline: str, *, exit_code: int | None, log_tail: tuple[str, ...] = ()) -> None:
        super().__init__(headline, log_tail=log_tail)
        self.exit_code = exit_code


class TransportError(OrchestratorError):
    """The channel to the agent failed."""


class ProtocolError(_Recovered, TransportError):
    """The agent sent a malformed, oversized or unexpected message; ``restored`` says what followed."""


class CheckpointLimitExceeded(CheckpointQuotaExceeded, ProtocolError):
    """The agent sent a checkpoint that would take the session past one of its limits, which an honest agent keeps
    within by itself (it names what does not fit in ``unsaved``): the checkpoint quota in bytes, or the manifest's
    bounds (``checkpoint_names.MAX_CHECKPOINT_NAMES`` names, ``checkpoint_names.MAX_CHECKPOINT_NAME_BYTES`` bytes
    of names).

    Nothing of that checkpoint was stored; the sandbox was replaced and the session restored to its last
    checkpoint (``restored``), so what the call did is lost and everything stored before is kept.

    Attributes:
        unit: what the limit counts: ``"bytes"``, ``"names"`` or ``"name bytes"``.
        size: how much of it the refused checkpoint added.
        held: how much the checkpoint would have held with it.
        quota: the limit.
    """

    def __init__(
        self,
        message: str,
        *,
        unit: str = "bytes",
        size: int = 0,
        held: int = 0,
        quota: int = 0,
        restored: bool = False,
        generation: int | None = None,
        restore_failures: dict[str, str] | None = None,
    ) -> None:
        ProtocolError.__init__(
            self, message, restored=restored, generation=generation, restore_failures=restore_failures
        )
        self.unit = unit
        self.size = size
        self.held = held
        self.quota = quota


class ChannelLost(TransportError, ConnectionError):
    """The agent's end of the channel closed (the agent or its container is gone)."""


class AgentTimeoutError(TransportError, TimeoutError):
    """The agent did not answer within the deadline."""


class RelayUnavailable(TransportError, ConnectionError):
    """The relay on a sandbox's Swarm node did not answer, refused this controller's TLS credentials (or we refused
    its), or failed the request; the message says what to check."""
