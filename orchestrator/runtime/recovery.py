"""The failure model: what a failed request does to the session's sandbox and which error its caller gets.

A request either gets its reply, or fails one of the ways of ``RECOVERY`` (the README's
"Failure model" table). Each row says whether the agent lives (its fresh worker is restored
from the last checkpoint) or the whole sandbox is replaced, and which typed error the caller
gets once the session is usable again. ``Recoverer`` applies the table, as jupyter_client's
restarter applies its restart policy apart from the manager: it drives the session's sandbox
through the narrow ``Recoverable`` (``runtime.restore.SessionSandbox``) and never sees records,
engines or callers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ..agent import protocol, request_table
from ..backends.base import ContainerState
from ..errors import (
    AgentTimeoutError,
    ChannelLost,
    CheckpointLimitExceeded,
    ExecutionTimeout,
    OrchestratorError,
    ProtocolError,
    SandboxCrashed,
    SandboxOutOfMemory,
    SessionAttachedElsewhere,
)
from ..metrics import NO_METRICS, Recorder
from ..wire.call import LiveEvents
from ..wire.connection import Body, Header
from ..wire.replies import TakenOver, WorkerFailure, worker_failure
from .hostcalls import CallDesk
from .sandbox import Sandbox, ValueFile

T = TypeVar("T")


class WorkerReplaced(Exception):
    """The agent replaced its worker during the request (it died, hung or misbehaved)."""

    def __init__(self, failure: WorkerFailure) -> None:
        super().__init__(failure["reason"])
        self.failure = failure


@dataclass(frozen=True)
class Recovery:
    """What one kind of failure does to the sandbox, and what the caller is told."""

    replace_sandbox: bool
    """True: remove the container and start another; False: the agent lives, restore into its fresh worker."""
    error: Callable[[BaseException, ContainerState | None], type[OrchestratorError]]
    """The error class, from the failure and (for a dead container) how the container ended."""
    cause: str
    """The failure's short name: the ``cause`` label of the restore it makes (docs/metrics.md)."""


def _crash_kind(exc: BaseException, death: ContainerState | None) -> type[OrchestratorError]:
    oom = exc.failure["oom"] if isinstance(exc, WorkerReplaced) else death is not None and death.oom_killed
    return SandboxOutOfMemory if oom else SandboxCrashed


# The failure model (README "Failure model"): failure -> (sandbox action, error raised after the restore, cause label).
RECOVERY: dict[str, Recovery] = {
    "worker died (crash, kill -9, OOM)": Recovery(False, _crash_kind, "worker_crash"),
    "worker ignored the interrupt and was killed": Recovery(False, lambda e, d: ExecutionTimeout, "worker_timeout"),
    "worker sent a forged or invalid frame": Recovery(False, lambda e, d: ProtocolError, "worker_protocol_error"),
    "container died or was removed during the call": Recovery(True, _crash_kind, "container_died"),
    "agent did not answer by the deadline": Recovery(True, lambda e, d: ExecutionTimeout, "agent_timeout"),
    "agent sent an invalid reply": Recovery(True, lambda e, d: ProtocolError, "agent_protocol_error"),
    "agent sent a checkpoint past the session's limits": Recovery(
        True, lambda e, d: CheckpointLimitExceeded, "checkpoint_limit"
    ),
}


def classify(exc: BaseException) -> str | None:
    """The row of ``RECOVERY`` a failure belongs to; None for an error that is not a sandbox's failure."""
    if isinstance(exc, WorkerReplaced):
        status = exc.failure["status"]
        if status == protocol.STATUS_TIMEOUT:
            return "worker ignored the interrupt and was killed"
        if status == protocol.STATUS_PROTOCOL_ERROR:
            return "worker sent a forged or invalid frame"
        return "worker died (crash, kill -9, OOM)"
    if isinstance(exc, ChannelLost):
        return "container died or was removed during the call"
    if isinstance(exc, AgentTimeoutError):
        return "agent did not answer by the deadline"
    if isinstance(exc, CheckpointLimitExceeded):
        return "agent sent a checkpoint past the session's limits"
    if isinstance(exc, ProtocolError):
        return "agent sent an invalid reply"
    return None


class Recoverable(Protocol):
    """What recovery does to a session's sandbox (``runtime.restore.SessionSandbox`` is one)."""

    @property
    def session_id(self) -> str: ...

    @property
    def generation(self) -> int:
        """The checkpoint generation the session is at (what a restore brings back)."""
        ...

    @property
    def restore_failures(self) -> dict[str, str]:
        """Values the last restore could not bring back."""
        ...

    def ready(self) -> Sandbox:
        """A live, idle sandbox that the caller owns (started and restored if needed)."""
        ...

    def restore(self, cause: str) -> None:
        """Load the checkpoint into the sandbox's fresh worker (``cause``: why, for the metrics)."""
        ...

    def replace(self, cause: str) -> None:
        """Remove the sandbox, start another and restore into it."""
        ...

    def death(self) -> ContainerState | None:
        """How the sandbox's container ended (None: it is gone)."""
        ...

    def discard(self) -> None:
        """Remove the sandbox; the next call starts another."""
        ...

    def take_unreported(self) -> dict[str, str]:
        """Restore failures no caller was told of yet (and forget them)."""
        ...

    def become_stale(self) -> None:
        """Another controller owns the session: let go of everything, keep nothing."""
        ...


class Recoverer:
    """Sends requests to a session's sandbox and applies ``RECOVERY`` when one fails."""

    def __init__(self, target: Recoverable, metrics: Recorder = NO_METRICS) -> None:
        self._target = target
        self._metrics = metrics

    def call(
        self,
        header: request_table.Request,
        body: Body | ValueFile,
        seconds: float,
        accept: Callable[[dict[str, Any], bytearray], T],
        *,
        checkpoint_seconds: float | None = None,
        desk: CallDesk | None = None,
        live: LiveEvents | None = None,
    ) -> T:
        """One request with recovery: whatever goes wrong, the session is usable again before we raise.

        ``accept`` turns the reply into the result (and stores its checkpoint); what it raises is
        classified as the agent's failure too.

        Raises:
            SessionAttachedElsewhere: another controller took the session (before or during the call).
            OrchestratorError: the error of the failure's row (``restored=True``), or what stopped the
                recovery itself (the sandbox is then dropped and the next call starts another).
        """
        started, outcome = time.monotonic(), "ok"
        try:
            return self._call(header, body, seconds, accept, checkpoint_seconds, desk, live)
        except BaseException as exc:
            outcome = type(exc).__name__
            raise
        finally:
            self._metrics.call(header["type"], outcome, time.monotonic() - started)

    def _call(
        self,
        header: request_table.Request,
        body: Body | ValueFile,
        seconds: float,
        accept: Callable[[dict[str, Any], bytearray], T],
        checkpoint_seconds: float | None,
        desk: CallDesk | None,
        live: LiveEvents | None,
    ) -> T:
        target = self._target
        try:
            try:
                return self._attempt(header, body, seconds, accept, checkpoint_seconds, desk, live)
            except (WorkerReplaced, ChannelLost, AgentTimeoutError, ProtocolError) as exc:
                kind = classify(exc)
                assert kind is not None
                death = self._recover(RECOVERY[kind], exc)
                raise self._recovered_error(RECOVERY[kind], kind, exc, death) from None
        except (TakenOver, SessionAttachedElsewhere) as exc:
            target.become_stale()
            raise SessionAttachedElsewhere(
                f"session {target.session_id} was attached by another controller; this call was not kept ({exc})"
            ) from None

    def _attempt(
        self,
        header: request_table.Request,
        body: Body | ValueFile,
        seconds: float,
        accept: Callable[[dict[str, Any], bytearray], T],
        checkpoint_seconds: float | None,
        desk: CallDesk | None,
        live: LiveEvents | None,
    ) -> T:
        """The request, sent once more if the worker had died between calls (it never ran); a failure is raised."""
        reply = self._send(header, body, seconds, checkpoint_seconds, desk, live)
        failure = worker_failure(reply[0])
        if failure is not None and failure["status"] == protocol.STATUS_CRASHED and not failure["ran"]:
            self._target.restore("worker_gone")  # the worker had died between calls; the request never ran
            reply = self._send(header, body, seconds, checkpoint_seconds, desk, live)
            failure = worker_failure(reply[0])
        if failure is not None:
            raise WorkerReplaced(failure)
        return accept(*reply)

    def _send(
        self,
        header: request_table.Request,
        body: Body | ValueFile,
        seconds: float,
        checkpoint_seconds: float | None,
        desk: CallDesk | None,
        live: LiveEvents | None,
    ) -> tuple[Header, bytearray]:
        sandbox = self._target.ready()
        header.pop("id", None)
        return sandbox.request(
            header, body, seconds=seconds, checkpoint_seconds=checkpoint_seconds, desk=desk, live=live
        )

    def _recover(self, recovery: Recovery, exc: BaseException) -> ContainerState | None:
        """Bring the session back to its last checkpoint; if even that fails, drop the sandbox for the next call.

        Returns how the container ended when the channel was lost with it (None otherwise, or when it is gone).
        """
        target = self._target
        death = None
        try:
            if not recovery.replace_sandbox:
                target.restore(recovery.cause)
                return None
            if isinstance(exc, ChannelLost):
                death = target.death()
            target.replace(recovery.cause)
        except (TakenOver, SessionAttachedElsewhere):
            raise
        except OrchestratorError:
            target.discard()
            raise
        return death

    def _recovered_error(
        self, recovery: Recovery, kind: str, exc: BaseException, death: ContainerState | None
    ) -> OrchestratorError:
        target = self._target
        error = recovery.error(exc, death)
        detail = exc.failure["reason"] if isinstance(exc, WorkerReplaced) else str(exc)
        if isinstance(exc, ChannelLost):
            detail = f"{death.describe() if death else 'the sandbox container was removed'} ({exc})"
        if isinstance(exc, WorkerReplaced) and exc.failure["phase"] == "checkpoint":
            kind = "checkpointing took longer than checkpoint_timeout and ignored the interrupt"
        generation = target.generation
        message = (
            f"{kind}: {detail[:2000]}; session {target.session_id} was restored to checkpoint generation {generation}"
            + (f" without {', '.join(sorted(target.restore_failures))}" if target.restore_failures else "")
        )
        failures = target.take_unreported()
        limits = (
            {k: getattr(exc, k) for k in ("unit", "size", "held", "quota")} if error is CheckpointLimitExceeded else {}
        )
        return error(message, restored=True, generation=generation, restore_failures=failures, **limits)  # type: ignore[call-arg]
