"""The sandbox serving one session: started or adopted, the checkpoint and the scaffold restored into it, let go.

A session has at most one sandbox at a time, and a sandbox never holds anything the checkpoint
does not: every new one (started, taken from the warm pool, or taken over from another
controller with another generation) is restored from the stored record before it serves a
call, value by value (``Sandbox.restore``), and the scaffold is installed after. Values that
cannot be restored are dropped from the checkpoint and reported once. The session's lock
lives here too, since starting and restoring must never run beside a call: ``turn`` holds it
(and, for a call, the activity file that tells prune the session is busy).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from .. import background
from ..agent import request_table
from ..backends.base import SESSION_ID, STORE_ID, Backend, ContainerState, Placement
from ..config import Settings
from ..errors import ChannelLost, ConfigError, OrchestratorError, SessionAttachedElsewhere, SessionClosed
from ..metrics import NO_METRICS, Recorder
from ..safe_text import logging_session
from ..state.activity import Activity
from ..state.ledger import CheckpointLedger
from ..state.store import SessionRecord
from ..wire.replies import TakenOver, parse_install_reply, worker_failure
from ..wire.wakeup import Wakeup
from . import discard
from .deferred import DEFER_BYTES, DeferredBlobs, deferrable
from .hostcalls import HandlerPool, serving
from .sandbox import Sandbox

logger = logging.getLogger(__name__)


class SessionState(enum.Enum):
    READY = "ready"
    DETACHED = "detached"
    CLOSED = "closed"


class SessionSandbox:
    """The sandbox of one session and everything that replaces or restores it; a ``recovery.Recoverable``."""

    def __init__(
        self,
        ledger: CheckpointLedger,
        *,
        backend: Backend,
        settings: Settings,
        labels: dict[str, str],
        make_room: Callable[[str], AbstractContextManager[object]] = lambda session_id: contextlib.nullcontext(),
        take_pooled: Callable[[str], Sandbox | None] = lambda image: None,
        metrics: Recorder = NO_METRICS,
    ) -> None:
        self.ledger = ledger
        self.metrics = metrics
        ledger.metrics = metrics
        ledger.workspace_files = settings.limits.workspace_files
        self.backend = backend
        self.settings = settings
        self.activity = Activity(ledger.store.activity_path(ledger.session_id), wait=settings.timeouts.lock)
        """Whether a call runs on the session, and when the last one ended, for every process (prune's proof)."""
        self._scope = ledger.store.store_id
        self._labels = labels
        self._make_room = make_room
        self._take_pooled = take_pooled
        self.lock = threading.RLock()
        self.sandbox: Sandbox | None = None
        self.state = SessionState.READY
        stored = ledger.record.scaffold
        self.scaffold: tuple[str, list[str]] | None = (stored["code"], list(stored["names"])) if stored else None
        """The scaffold every new worker gets (kept in the record: a later owner or a fork installs it too)."""
        self.restore_failures: dict[str, str] = {}
        """Values the last restore could not bring back, with the reason (they were dropped)."""
        self._unreported_failures: dict[str, str] = {}
        self._host_calls: HandlerPool | None = None
        self._call_wakeup: Wakeup | None = None
        self.lane = background.Lane()
        """This session's work on the controller's shared pool (its deferred values' digest checks): one task at a
        time, so a flood from its sandbox delays only itself (runtime/background.py)."""

    @property
    def session_id(self) -> str:
        return self.ledger.session_id

    @property
    def generation(self) -> int:
        return self.ledger.record.generation

    @contextlib.contextmanager
    def turn(self, *, call: bool = True) -> Iterator[None]:
        """One call at a time: the session's lock, and (for a ``call``) its activity file held (busy for prune)
        and touched. What is logged meanwhile on this thread names the session (``--log-json``).

        Raises:
            ConfigError: called from a handler serving this session's running cell (it would wait for ever).
            SessionBusy: another process held the session (pruning or hibernating it) too long.
        """
        if serving(self):
            raise ConfigError(
                f"a host-call handler or on_output callback of session {self.session_id} called back into that "
                "session, whose cell waits for it; use another session (or do the work in the handler)"
            )
        with self.lock, logging_session(self.session_id), self.activity if call else contextlib.nullcontext():
            yield

    def check_usable(self) -> None:
        if self.state is SessionState.CLOSED:
            raise SessionClosed(f"session {self.session_id} is closed")
        if self.state is SessionState.DETACHED:
            raise SessionAttachedElsewhere(
                f"session {self.session_id} is detached; attach it again with Orchestrator.attach"
            )

    def ready(self) -> Sandbox:
        """Before a call: a live, idle sandbox that this handle owns (started and restored if needed)."""
        self.check_usable()
        if self.sandbox is not None:
            try:
                self.sandbox.connection.check_idle()
            except TakenOver:
                self.become_stale()
                raise SessionAttachedElsewhere(
                    f"session {self.session_id} was attached by another controller"
                ) from None
            except ChannelLost as exc:
                logger.info("session %s: the sandbox went away between calls (%s); restarting it", self.session_id, exc)
                self.start("sandbox_gone")
        if self.sandbox is None:
            self.start()
        assert self.sandbox is not None
        return self.sandbox

    # ----------------------------------------------------------------- a new sandbox

    def start(self, cause: str | None = None) -> None:
        """Start a new sandbox for this session and restore its checkpoint into it (busy meanwhile, for prune).

        ``cause``: why, for the metrics (default "resume" for a hibernated session, else "start").
        """
        cause = cause or ("resume" if self.ledger.record.hibernated_at is not None else "start")
        with self.turn():
            if self.sandbox is not None:
                self.discard()
            else:
                with self.ledger.owned() as current:
                    self.discard_recorded(current)
            record = self.ledger.record
            with self._make_room(self.session_id):
                sandbox = self._take_pooled(record.image) or Sandbox.start(
                    self.backend,
                    self.settings,
                    image=record.image,
                    scope=self._scope,
                    labels=self._labels,
                    placement=Placement.from_json(record.placement),
                )
            try:
                self.ledger.set_sandbox(sandbox.sandbox_id, sandbox.container_id)
            except BaseException:
                sandbox.remove()  # never registered: nobody else knows it
                raise
            self.sandbox = sandbox
            self.restore(cause)

    def replace(self, cause: str) -> None:
        """Remove the sandbox and start another, restored (``start``)."""
        self.start(cause)

    def adopt(self, sandbox: Sandbox) -> None:
        """Serve this session from a live sandbox (taken over); restore unless it already holds our generation."""
        with self.turn():
            self.sandbox = sandbox
            try:
                self.ledger.set_sandbox(sandbox.sandbox_id, sandbox.container_id)
            except BaseException:
                self.sandbox = None
                sandbox.release()
                raise
            if sandbox.generation != self.generation:
                self.restore("takeover")
            else:  # its values deferred by another controller's restore (of this record: the same rule) are ours
                deferred = self._serve_deferred(sandbox)
                deferred.restored(deferrable(self.ledger.record.variables, self.ledger.mapped_blob, DEFER_BYTES))

    # ----------------------------------------------------------------- restore

    def restore(self, cause: str) -> None:
        """Load the stored checkpoint (and the scaffold) into the sandbox; a takeover meanwhile makes this handle
        stale. ``cause``: why (the metrics' label: docs/metrics.md)."""
        started = time.monotonic()
        try:
            self._load_checkpoint()
            self.metrics.restore(cause, time.monotonic() - started)
        except TakenOver:
            self.become_stale()
            raise SessionAttachedElsewhere(
                f"session {self.session_id} was attached by another controller while restoring"
            ) from None

    def load_current(self) -> None:
        """Bring the live sandbox (if any) to the stored record's state, which changed under it (a rewind); a sandbox
        that fails meanwhile is dropped, and the next call starts and restores a new one."""
        if self.sandbox is None:
            return
        try:
            self.restore("rewind")
        except SessionAttachedElsewhere:
            raise
        except OrchestratorError as exc:
            logger.warning(
                "session %s: restoring into the sandbox failed (%s); the next call starts another", self.session_id, exc
            )
            self.discard()

    def _load_checkpoint(self) -> None:
        assert self.sandbox is not None
        record = self.ledger.record
        self._serve_deferred(self.sandbox)
        failures = self.sandbox.restore(
            record.variables,
            record.generation,
            self.ledger.mapped_blob,
            record.contexts,
            defer_at=DEFER_BYTES,
            files=record.files,
            file_sizes=record.blob_sizes,
        )
        self.ledger.drop(failures)
        self.restore_failures = failures
        self._unreported_failures.update(failures)
        if failures:  # the next call's result reports them (restore_failures)
            logger.info("session %s: could not restore %s", self.session_id, ", ".join(sorted(failures)))
        if self.scaffold is not None:
            self.install_scaffold()

    def _serve_deferred(self, sandbox: Sandbox) -> DeferredBlobs:
        """Have ``sandbox`` serve the blobs of the values its restore defers, its digest checks in this session's
        lane."""
        sandbox.serve_deferred(self._recorded_blob, self.ledger.mapped_blob, self.ledger.blob_path)
        assert sandbox.deferred is not None
        sandbox.deferred.lane = self.lane
        return sandbox.deferred

    def _recorded_blob(self, key: str) -> str | None:
        """The blob the session's current record names for a checkpoint key (what a deferred value may load)."""
        return self.ledger.record.variables.get(key)

    def take_unreported(self) -> dict[str, str]:
        """Restore failures no result or error has reported yet; reported now."""
        failures, self._unreported_failures = self._unreported_failures, {}
        return failures

    def set_scaffold(self, scaffold: tuple[str, list[str]]) -> None:
        """Install ``scaffold`` (code, names) now and in every later worker; a sandbox it starts gets it with its
        restore. A scaffold that fails leaves the previous one in place.

        Raises:
            ConfigError: the code raised in the sandbox.
        """
        previous, self.scaffold = self.scaffold, scaffold
        try:
            live = self.sandbox is not None
            self.ready()
            if live:
                self.install_scaffold()
        except ConfigError:
            self.scaffold = previous
            raise
        code, names = scaffold
        self.ledger.update(lambda record: setattr(record, "scaffold", {"code": code, "names": list(names)}))

    def install_scaffold(self) -> None:
        """Run the scaffold in the (fresh or restored) worker; a scaffold that raises there is the caller's error."""
        assert self.sandbox is not None and self.scaffold is not None
        code, names = self.scaffold
        seconds = self.settings.timeouts.start
        header = request_table.install_request(code, names, seconds)
        reply, _ = self.sandbox.request(header, seconds=seconds + self.settings.timeouts.interrupt_grace)
        failure = worker_failure(reply)
        reason = failure["reason"] if failure is not None else parse_install_reply(reply)
        if reason is not None:
            self.discard()  # its worker may be empty now; the next call starts and restores a new one
            raise ConfigError(f"the scaffold of session {self.session_id} failed in the sandbox: {reason}")

    # ----------------------------------------------------------------- letting go

    def death(self) -> ContainerState | None:
        """How the sandbox's container ended, once it has (None: no sandbox, or its container is gone)."""
        return None if self.sandbox is None else self.sandbox.settled_state()

    def discard(self) -> None:
        """Remove our sandbox, only while we own the session (a stale handle stops here and keeps it to release)."""
        if self.sandbox is not None:
            with self.ledger.owned():
                self.sandbox.remove()
            self.sandbox = None

    def drop(self) -> None:
        """Close our channel to the sandbox (the container is left to whoever removes or takes it over)."""
        if self.sandbox is not None:
            self.sandbox.release()
            self.sandbox = None

    def release(self) -> None:
        """No more calls on this handle: the channel, the host-call threads, the activity file and the lease go."""
        self.drop()
        self.stop_host_calls()
        self.activity.close()
        self.ledger.release_lease()

    def become_stale(self) -> None:
        """Another controller owns the session now: let go of everything, keep nothing."""
        self.release()
        self.state = SessionState.DETACHED

    def session_labels(self) -> dict[str, str]:
        """The labels every container of this session carries."""
        return {key: self._labels[key] for key in (STORE_ID, SESSION_ID)}

    def discard_all(self, record: SessionRecord) -> None:
        """Remove every container of this session and the recorded sandbox directory (call under ownership)."""
        discard.discard_session_sandboxes(self.backend, self.settings.runtime_dir, self.session_labels(), record)

    def discard_recorded(self, record: SessionRecord) -> None:
        """Remove the sandbox ``record`` names (call under ownership: the store lock is held meanwhile)."""
        if record.container_id:
            discard.discard_sandbox(self.backend, self.settings.runtime_dir, record.sandbox_id, record.container_id)

    # ----------------------------------------------------------------- what calls share

    def handler_pool(self) -> HandlerPool:
        """The session's host-call handlers (made on first use): bounded across its cells; each cell bounds its own."""
        if self._host_calls is None:
            self._host_calls = HandlerPool(self.settings.limits.max_host_calls_per_session)
        return self._host_calls

    def wakeup(self) -> Wakeup:
        """Wakes a running call's connection from other threads (an interrupt, an input answer)."""
        if self._call_wakeup is None:
            self._call_wakeup = Wakeup()
        return self._call_wakeup

    def stop_host_calls(self) -> None:
        """No more calls on this handle: the host-call threads and the call wake-up go."""
        if self._host_calls is not None:
            self._host_calls.close()  # nothing waiting starts; a handler still running finishes on its own
            self._host_calls = None
        if self._call_wakeup is not None:
            self._call_wakeup.close()
            self._call_wakeup = None
