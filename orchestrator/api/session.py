"""The public handle on one persistent session: calls, and recovery by one table that mirrors the failure model.

A call is a transaction on the session state: the checkpoint delta its reply carries is stored
(by the ledger, under the store lock, only while this handle owns the session) before the call
returns. What goes wrong is classified into one of the failures of ``RECOVERY``; each says
what happens to the sandbox (restore into the agent's fresh worker, or replace the whole
sandbox) and which typed error the caller gets. The README's failure model is this table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

from ..agent import protocol
from ..backends.base import SESSION_ID, STORE_ID, Backend, ContainerState, Placement
from ..config import Settings
from ..errors import (
    AgentTimeoutError,
    ChannelLost,
    CheckpointLimitExceeded,
    ConfigError,
    ContextNotFound,
    ExecutionTimeout,
    InputRequestNotFound,
    OrchestratorError,
    ProtocolError,
    SandboxCrashed,
    SandboxOutOfMemory,
    SessionAttachedElsewhere,
    SessionClosed,
    SessionNotFound,
)
from ..ops import lifecycle
from ..runtime.hostcalls import CallDesk, HandlerPool, HostCalls, serving
from ..runtime.output import StreamRecorder, keep_newest
from ..runtime.sandbox import Sandbox
from ..state.activity import Activity, last_active
from ..state.ledger import CheckpointLedger, StagedBlob
from ..state.store import SessionRecord
from ..wire.connection import TakenOver
from ..wire.replies import (
    WorkerFailure,
    parse_exec_reply,
    parse_install_reply,
    parse_state_reply,
    reply_reason,
    worker_failure,
)
from ..wire.wakeup import Wakeup
from .contexts import (
    DEFAULT_CONTEXT,
    Context,
    checkpoint_key,
    local_names,
    names_of,
    new_context_id,
    resolve_cwd,
    validate_context_id,
    validate_env,
    workspace,
)
from .events import Event, LiveCall, OnOutput
from .results import ExecError, ExecResult
from .tools import PythonTool

logger = logging.getLogger(__name__)

T = TypeVar("T")


class SessionState(enum.Enum):
    READY = "ready"
    DETACHED = "detached"
    CLOSED = "closed"


class _WorkerReplaced(Exception):
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


def _crash_kind(exc: BaseException, death: ContainerState | None) -> type[OrchestratorError]:
    oom = exc.failure["oom"] if isinstance(exc, _WorkerReplaced) else death is not None and death.oom_killed
    return SandboxOutOfMemory if oom else SandboxCrashed


# The failure model (README "Failure model"): failure -> (sandbox action, error raised after the restore).
RECOVERY: dict[str, Recovery] = {
    "worker died (crash, kill -9, OOM)": Recovery(False, _crash_kind),
    "worker ignored the interrupt and was killed": Recovery(False, lambda e, d: ExecutionTimeout),
    "worker sent a forged or invalid frame": Recovery(False, lambda e, d: ProtocolError),
    "container died or was removed during the call": Recovery(True, _crash_kind),
    "agent did not answer by the deadline": Recovery(True, lambda e, d: ExecutionTimeout),
    "agent sent an invalid reply": Recovery(True, lambda e, d: ProtocolError),
    "agent sent a checkpoint past the session's limits": Recovery(True, lambda e, d: CheckpointLimitExceeded),
}


def _classify(exc: BaseException) -> str | None:
    if isinstance(exc, _WorkerReplaced):
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


def _encode_payload(payload: Any) -> tuple[str, bytes]:
    """How a context or history travels: (kind, raw bytes), never pickled on the host."""
    if isinstance(payload, str):
        return "str", payload.encode("utf-8", errors="surrogatepass")
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return "bytes", bytes(payload)
    if isinstance(payload, (dict, list)):
        try:
            return "json", json.dumps(payload).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"a dict or list payload must be JSON-serializable: {exc}") from exc
    raise ConfigError(f"payload must be str, bytes, dict or list, not {type(payload).__name__}")


class Session:
    """The handle on one persistent sandbox session; obtain it from ``Orchestrator``.

    One call runs at a time; concurrent callers wait their turn. Use as a context manager
    to ``close()`` the session (container and stored state) on exit.
    """

    def __init__(
        self,
        ledger: CheckpointLedger,
        *,
        backend: Backend,
        settings: Settings,
        scope: str,
        labels: dict[str, str],
        activity: Activity,
        make_room: Callable[[str], AbstractContextManager[object]] = lambda session_id: contextlib.nullcontext(),
        take_pooled: Callable[[str], Sandbox | None] = lambda image: None,
        on_close: Callable[[Session], None] | None = None,
    ) -> None:
        self._ledger = ledger
        self._activity = activity
        self._make_room = make_room
        self._take_pooled = take_pooled
        self._backend = backend
        self._settings = settings
        self._scope = scope
        self._labels = labels
        self._on_close = on_close
        self._lock = threading.RLock()
        self._sandbox: Sandbox | None = None
        self._unreported_failures: dict[str, str] = {}
        self._scaffold: tuple[str, list[str]] | None = None
        self._host_calls: HandlerPool | None = None
        self._live: LiveCall | None = None  # the running exec's output, input and interrupt (read by other threads)
        self._call_wakeup: Wakeup | None = None  # wakes a running call's connection from other threads
        self.state = SessionState.READY
        self.restore_failures: dict[str, str] = {}
        """Values the last restore could not bring back, with the reason (they were dropped)."""

    # ----------------------------------------------------------------- public surface

    @property
    def id(self) -> str:
        return self._ledger.session_id

    @property
    def sandbox_id(self) -> str | None:
        return self._sandbox.sandbox_id if self._sandbox else None

    @property
    def container_id(self) -> str | None:
        return self._sandbox.container_id if self._sandbox else None

    @property
    def generation(self) -> int:
        """Checkpoint generation of the stored state (advances with every call that changed it)."""
        return self._ledger.record.generation

    @property
    def epoch(self) -> int:
        """Ownership epoch: advances each time a controller attaches the session."""
        return self._ledger.record.epoch

    @property
    def variables(self) -> list[str]:
        """Names of the default context held by the last checkpoint (a context's: ``Context.variables``)."""
        return names_of(self._ledger.record.variables, None)

    @property
    def checkpoint_bytes(self) -> int:
        """Size of the stored checkpoint in bytes (at most ``Settings.checkpoint_quota_bytes``)."""
        return self._ledger.record.checkpoint_bytes

    @property
    def agent_info(self) -> dict[str, Any]:
        """The agent's handshake: protocol, Python and dill versions."""
        if self._sandbox is None:
            return {}
        hello = self._sandbox.connection.hello
        return {"protocol": hello["protocol"], "python": hello["python"], "dill": hello["dill"]}

    def execute(
        self,
        code: str,
        timeout: float | None = None,
        *,
        host_calls: HostCalls | None = None,
        on_output: OnOutput | None = None,
        context: str | None = None,
    ) -> ExecResult:
        """Run ``code`` in the session's namespace and checkpoint the result.

        Args:
            code: Python source; a trailing expression's repr becomes ``return_value``.
            timeout: seconds the cell may run (default ``Settings.exec_timeout``); the
                checkpoint afterwards has its own limit, ``Settings.checkpoint_timeout``.
                Time its ``input()`` waits for an answer does not count.
            host_calls: handlers that code in the sandbox may call while this cell runs
                (``host_call(name, payload)`` in the scaffold; see ``set_scaffold``).
            on_output: called on this thread with each ``OutputEvent`` as the cell prints
                (within ~50 ms) and each ``InputRequest`` of its ``input()``, which a str it
                returns answers (else ``submit_input`` does). Without it, ``input()`` raises
                ``EOFError`` at once. See ``orchestrator.api.events``.
            context: the id of the context to run in (``create_context``); default: the
                session's own namespace (``"default"``).

        Returns:
            ExecResult; an exception raised by the code is in ``.error``, not raised. Output past
            ``Settings.max_output_bytes`` is a head-and-tail preview; the whole stream is in
            ``stdout_path`` / ``stderr_path``.

        Raises:
            ExecutionTimeout: the cell ran past ``timeout`` (``.restored`` says whether the
                worker was killed and the last checkpoint restored).
            SandboxCrashed: the interpreter or container died; the session was restored.
            SandboxOutOfMemory: the memory limit was hit; the session was restored.
            ProtocolError: the agent misbehaved; the session was restored.
            SessionAttachedElsewhere: another controller owns the session (this call was not kept).
            SessionClosed: the session was closed.
            ContextNotFound: ``context`` names no context of this session.
        """
        if not isinstance(code, str):
            raise ConfigError(f"code must be a str, not {type(code).__name__}")
        try:
            # The frame would fail (or silently change the code) on lone surrogates; ASCII is O(1) to rule out.
            code.isascii() or code.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(f"code must be valid Unicode text: {exc}") from None
        limit = self._settings.exec_timeout if timeout is None else float(timeout)
        if not 0 < limit < math.inf:  # every wait has a finite deadline
            raise ConfigError(f"timeout must be a positive, finite number of seconds, got {timeout!r}")
        if on_output is not None and not callable(on_output):
            raise ConfigError(f"on_output must be callable, got {type(on_output).__name__}")
        header = protocol.exec_request(
            code,
            limit,
            checkpoint_timeout=self._settings.checkpoint_timeout,
            send_limit=self._settings.max_output_file_bytes,
            stream=on_output is not None,
            input=on_output is not None,
        )
        slack = self._settings.interrupt_grace + self._settings.reply_margin
        with self._turn():
            self._name_context(header, context)
            desk = (
                None
                if host_calls is None
                else CallDesk(
                    host_calls, self._handler_pool(), max_held=self._settings.max_host_calls_per_cell, owner=self
                )
            )
            live = self._live = LiveCall(
                self._new_recorder, on_output, self._settings.input_timeout, owner=self, wakeup=self._wakeup()
            )
            started = time.monotonic()
            try:
                return self._call(
                    header,
                    b"",
                    limit + slack,
                    lambda r, b: self._exec_result(r, b, limit, live, time.monotonic() - started),
                    checkpoint_seconds=self._settings.checkpoint_timeout + slack,
                    desk=desk,
                    live=live,
                )
            finally:
                self._live = None
                live.close()
                if desk is not None:
                    desk.close()

    def stream(
        self,
        code: str,
        timeout: float | None = None,
        *,
        host_calls: HostCalls | None = None,
        context: str | None = None,
    ) -> Iterator[Event | ExecResult]:
        """``execute`` as an iterator: each ``OutputEvent`` and ``InputRequest`` as it happens, then the ``ExecResult``.

        Answer an ``InputRequest`` with ``submit_input``. The cell runs on a thread of its own;
        leaving the loop early interrupts it. Raises what ``execute`` raises, after the events.
        """
        events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()

        def run() -> None:
            try:
                result = self.execute(code, timeout, host_calls=host_calls, on_output=on_event, context=context)
                events.put(("result", result))
            except BaseException as exc:
                events.put(("error", exc))

        def on_event(event: Event) -> None:
            events.put(("event", event))

        runner = threading.Thread(target=run, name=f"stream-{self.id}", daemon=True)
        runner.start()
        finished = False
        try:
            while True:
                kind, item = events.get()
                if kind == "event":
                    yield item
                    continue
                finished = True
                if kind == "error":
                    raise item
                yield item
                return
        finally:
            while not finished and runner.is_alive() and not self.interrupt():
                runner.join(0.005)  # the call has not begun yet: interrupt it once it has
            runner.join()

    def submit_input(self, request_id: str, text: str) -> None:
        """Answer the running cell's ``input()`` request ``request_id`` (from any thread).

        Raises:
            InputRequestNotFound: no such request waits (unknown, answered, timed out, or no cell runs).
            ConfigError: ``text`` is not a str, or longer than 1 MiB.
        """
        live = self._live
        if live is None:
            raise InputRequestNotFound(f"no cell of session {self.id} is running, so no input request {request_id!r}")
        live.submit(request_id, text)

    def interrupt(self) -> bool:
        """Stop the running cell as its timeout would (interrupt, then kill after the grace); from any thread.

        The call gets ``ExecutionTimeout`` and the session stays usable. Returns False when no cell runs.
        """
        live = self._live
        return live is not None and live.interrupt()

    def as_tool(self, *, max_timeout: float | None = None) -> PythonTool:
        """This session as OpenAI-style function tools for a model (``execute_code``, ``reset_repl``); docs/tools.md."""
        return PythonTool(self, max_timeout=max_timeout)

    def set_scaffold(self, code: str, *, names: Collection[str] = ()) -> None:
        """Install the code that supports this session's cells in every worker, now and after each restart.

        ``code`` runs in a module of its own (not the session namespace), with ``host_call``
        and ``HostCallError`` among its globals. It may define ``before_cell(namespace)``,
        called before every cell (to install helpers or restore names a cell overwrote), and
        ``after_cell(namespace)``, whose JSON-able result every ``ExecResult.scaffold`` carries.
        ``names`` are the session names the scaffold makes: they are never checkpointed.

        Raises:
            ConfigError: the code or the names are not valid, or the code raised in the sandbox.
        """
        if not isinstance(code, str):
            raise ConfigError(f"scaffold code must be a str, not {type(code).__name__}")
        listed = sorted(set(names))
        if not all(isinstance(name, str) and name.isidentifier() for name in listed):
            raise ConfigError(f"scaffold names must be identifiers, got {listed!r}")
        with self._turn():
            previous, self._scaffold = self._scaffold, (code, listed)
            try:
                live = self._sandbox is not None
                self._ready_sandbox()  # a sandbox it starts gets the scaffold with its restore
                if live:
                    self._install_scaffold()
            except ConfigError:
                self._scaffold = previous
                raise

    def set_value(
        self, name: str, payload: str | bytes | dict[str, Any] | list[Any], *, aliases: Collection[str] = ()
    ) -> None:
        """Store ``payload`` as the variable ``name`` (and each alias), checkpointed; dicts and lists travel as JSON.

        Like ``add_context``, the value is made on the host, so it travels once, as raw bytes; a
        str or bytes value's checkpoint blob is written by the controller, so it never travels back.

        Raises:
            CheckpointQuotaExceeded: a str or bytes value would take the checkpoint past the quota
                (nothing was sent or stored).
            ConfigError: a name is not an identifier, or the payload is not str, bytes, dict or list.
        """
        self._set_value(name, payload, aliases, None)

    def _set_value(self, name: str, payload: Any, aliases: Collection[str], context: str | None) -> None:
        names = [name, *aliases]
        if not all(isinstance(n, str) and n.isidentifier() for n in names):
            raise ConfigError(f"variable names must be identifiers, got {names!r}")
        encoded = _encode_payload(payload)
        with self._turn():
            self._context_spec(context)
            self._store(name, list(aliases), encoded, {}, context)

    def add_context(self, payload: str | bytes | dict[str, Any] | list[Any], index: int | None = None) -> int:
        """Load a context into the namespace as ``context_<index>`` (``context`` aliases ``context_0``).

        The payload travels once, as raw bytes; for a str or bytes nothing travels back (the
        controller writes its checkpoint blob itself). Returns the index used.

        Raises:
            CheckpointQuotaExceeded: a str or bytes payload would take the checkpoint past the quota
                (nothing was sent or stored).
        """
        return self._add_versioned("context", payload, index)

    def add_history(self, messages: list[Any], index: int | None = None) -> int:
        """Store a message history as ``history_<index>`` (``history`` aliases ``history_0``)."""
        if not isinstance(messages, list):
            raise ConfigError(f"messages must be a list, not {type(messages).__name__}")
        return self._add_versioned("history", messages, index)

    def get_context_count(self) -> int:
        return self._ledger.record.context_count

    def get_history_count(self) -> int:
        return self._ledger.record.history_count

    def reset(self) -> None:
        """Clear every variable of the default context (the container keeps running, other contexts keep
        theirs); the empty state is checkpointed."""
        self._reset(None)

    def _reset(self, context: str | None) -> None:
        header = protocol.reset_request(self._settings.checkpoint_timeout)
        with self._turn():
            self._name_context(header, context)
            self._call(
                header,
                b"",
                self._control_seconds(),
                lambda r, b: self._commit_state(r, b, {"context_count": 0, "history_count": 0}, context),
            )

    def detach(self) -> None:
        """Let go of the session but keep its container and checkpoint, for ``Orchestrator.attach``.

        Raises:
            SessionAttachedElsewhere: another controller owns the session (nothing was touched).
        """
        with self._turn(call=False):
            if self.state is not SessionState.READY:
                return
            try:
                self._ledger.check_owner()
            except SessionAttachedElsewhere:
                self._become_stale()
                raise
            self._release_sandbox()
            self.state = SessionState.DETACHED

    def hibernate(self) -> None:
        """Give up the container and keep the checkpoint; the next call starts a new one and restores.

        An idle session then costs nothing but its stored checkpoint. Values that could not be
        checkpointed (``ExecResult.unsaved``) are lost, as in any restart.

        Raises:
            SessionAttachedElsewhere: another controller owns the session (nothing was touched).
            SessionClosed: the session was closed.
        """
        with self._turn(call=False):  # not a use: the session's idle time goes on
            self._check_usable()
            self._drop_sandbox()  # an error below leaves the record naming it: the next start removes it
            try:
                self._ledger.hibernate(self._discard_all)
            except SessionAttachedElsewhere:
                self._become_stale()
                raise
            logger.info("hibernated session %s", self.id)

    def hibernate_if_idle(self, idle_for: float) -> bool:
        """Hibernate if no call ran for ``idle_for`` seconds and none runs now (never waits); True if it did."""
        if self.state is not SessionState.READY or self._sandbox is None or serving(self):
            return False
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if time.time() - last_active(self._activity.path, 0.0) < idle_for or self._sandbox is None:
                return False
            self.hibernate()
            return True
        except OrchestratorError as exc:
            logger.warning("session %s: hibernating after %g s idle failed: %s", self.id, idle_for, exc)
            return False
        finally:
            self._lock.release()

    def forget_sandbox(self) -> None:
        """Let go of a sandbox someone else just removed (``Orchestrator.hibernate``), unless a call is using it
        (that call then finds it gone and restores, as after any lost container)."""
        if self._lock.acquire(blocking=False):
            try:
                self._drop_sandbox()
            finally:
                self._lock.release()

    @contextlib.contextmanager
    def _turn(self, *, call: bool = True) -> Iterator[None]:
        """One call at a time: the session's lock, and (for a ``call``) its activity file held (busy for prune)
        and touched.

        Raises:
            ConfigError: called from a handler serving this session's running cell (it would wait for ever).
            SessionBusy: another process held the session (pruning or hibernating it) too long.
        """
        if serving(self):
            raise ConfigError(
                f"a host-call handler or on_output callback of session {self.id} called back into that session, "
                "whose cell waits for it; use another session (or do the work in the handler)"
            )
        with self._lock, self._activity if call else contextlib.nullcontext():
            yield

    def _handler_pool(self) -> HandlerPool:
        """The session's host-call handlers (made on first use): bounded across its cells; each cell bounds its own."""
        if self._host_calls is None:
            self._host_calls = HandlerPool(self._settings.max_host_calls_per_session, name=f"host-calls-{self.id}")
        return self._host_calls

    def close(self) -> None:
        """Remove the container and the stored state. Closing twice is fine.

        Raises:
            SessionAttachedElsewhere: another controller owns the session; its container and
                state were left alone.
        """
        with self._turn(call=False):
            if self.state is SessionState.CLOSED:
                return
            try:
                with self._ledger.owned() as current:
                    self._drop_sandbox()
                    self._discard_all(current)
                    self._ledger.delete()
            except SessionAttachedElsewhere:
                self._become_stale()
                raise
            except SessionNotFound:
                self._release_sandbox()
            finally:
                self._drop_sandbox()  # when the close failed (an unreadable record): no channel stays open
                self._stop_host_calls()
                self._activity.close()
                if self.state is not SessionState.DETACHED:
                    self.state = SessionState.CLOSED
                if self._on_close is not None:
                    self._on_close(self)
            logger.info("closed session %s", self.id)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        try:
            self.close()
        except SessionAttachedElsewhere:
            if exc_type is None:
                raise

    def __repr__(self) -> str:
        return f"<Session {self.id} {self.state.value} generation={self.generation} epoch={self.epoch}>"

    # ----------------------------------------------------------------- sandbox life

    def adopt(self, sandbox: Sandbox) -> None:
        """Serve this session from a live sandbox (taken over); restore unless it already holds our generation."""
        with self._turn():
            self._sandbox = sandbox
            try:
                self._ledger.set_sandbox(sandbox.sandbox_id, sandbox.container_id)
            except BaseException:
                self._sandbox = None
                sandbox.release()
                raise
            if sandbox.generation != self.generation:
                self._restore()

    def start(self) -> None:
        """Start a new sandbox for this session and restore its checkpoint into it (busy meanwhile, for prune)."""
        with self._turn():
            if self._sandbox is not None:
                self._remove_sandbox()
            else:
                with self._ledger.owned() as current:
                    self._discard_recorded(current)
            image = self._ledger.record.image
            with self._make_room(self.id):
                sandbox = self._take_pooled(image) or Sandbox.start(
                    self._backend,
                    self._settings,
                    image=image,
                    scope=self._scope,
                    labels=self._labels,
                    placement=Placement.from_json(self._ledger.record.placement),
                )
            try:
                self._ledger.set_sandbox(sandbox.sandbox_id, sandbox.container_id)
            except BaseException:
                sandbox.remove()  # never registered: nobody else knows it
                raise
            self._sandbox = sandbox
            self._restore()

    def remove_strays(self) -> None:
        """Remove containers of this session other than its recorded one (left by a controller that died)."""
        with self._ledger.owned() as current:
            lifecycle.discard_strays(
                self._backend, self._settings.runtime_dir, self._session_labels(), keep=current.container_id
            )

    def _session_labels(self) -> dict[str, str]:
        return {key: self._labels[key] for key in (STORE_ID, SESSION_ID)}

    def _discard_all(self, record: SessionRecord) -> None:
        """Remove every container of this session and the recorded sandbox directory (call under ownership)."""
        lifecycle.discard_session_sandboxes(self._backend, self._settings.runtime_dir, self._session_labels(), record)

    def _discard_recorded(self, record: SessionRecord) -> None:
        """Remove the sandbox ``record`` names (call under ownership: the store lock is held meanwhile)."""
        if record.container_id:
            lifecycle.discard_sandbox(self._backend, self._settings.runtime_dir, record.sandbox_id, record.container_id)

    def _restore(self) -> None:
        """Load the stored checkpoint (and the scaffold) into the sandbox; a takeover meanwhile makes this handle
        stale."""
        try:
            self._load_checkpoint()
        except TakenOver:
            self._become_stale()
            raise SessionAttachedElsewhere(
                f"session {self.id} was attached by another controller while restoring"
            ) from None

    def _load_checkpoint(self) -> None:
        assert self._sandbox is not None
        record = self._ledger.record
        failures = self._sandbox.restore(record.variables, record.generation, self._ledger.mapped_blob, record.contexts)
        self._ledger.drop(failures)
        self.restore_failures = failures
        self._unreported_failures.update(failures)
        if failures:
            logger.warning("session %s: could not restore %s", self.id, ", ".join(sorted(failures)))
        if self._scaffold is not None:
            self._install_scaffold()

    def _install_scaffold(self) -> None:
        """Run the scaffold in the (fresh or restored) worker; a scaffold that raises there is the caller's error."""
        assert self._sandbox is not None and self._scaffold is not None
        code, names = self._scaffold
        seconds = self._settings.start_timeout
        header = protocol.install_request(code, names, seconds)
        reply, _ = self._sandbox.request(header, seconds=seconds + self._settings.interrupt_grace)
        failure = worker_failure(reply)
        reason = failure["reason"] if failure is not None else parse_install_reply(reply)
        if reason is not None:
            self._remove_sandbox()  # its worker may be empty now; the next call starts and restores a new one
            raise ConfigError(f"the scaffold of session {self.id} failed in the sandbox: {reason}")

    def _drop_sandbox(self) -> None:
        """Close our channel to the sandbox (the container is left to whoever removes or takes it over)."""
        if self._sandbox is not None:
            self._sandbox.release()
            self._sandbox = None

    def _release_sandbox(self) -> None:
        self._drop_sandbox()
        self._stop_host_calls()
        self._activity.close()

    def _stop_host_calls(self) -> None:
        """No more calls on this handle: the host-call threads and the call wake-up go."""
        if self._host_calls is not None:
            self._host_calls.close()  # nothing waiting starts; a handler still running finishes on its own
            self._host_calls = None
        if self._call_wakeup is not None:
            self._call_wakeup.close()
            self._call_wakeup = None

    def _become_stale(self) -> None:
        self._release_sandbox()
        self.state = SessionState.DETACHED

    # ----------------------------------------------------------------- calls

    def _check_usable(self) -> None:
        if self.state is SessionState.CLOSED:
            raise SessionClosed(f"session {self.id} is closed")
        if self.state is SessionState.DETACHED:
            raise SessionAttachedElsewhere(f"session {self.id} is detached; attach it again with Orchestrator.attach")

    def _ready_sandbox(self) -> Sandbox:
        """Before a call: a live, idle sandbox that this handle owns (started and restored if needed)."""
        self._check_usable()
        if self._sandbox is not None:
            try:
                self._sandbox.connection.check_idle()
            except TakenOver:
                self._become_stale()
                raise SessionAttachedElsewhere(f"session {self.id} was attached by another controller") from None
            except ChannelLost as exc:
                logger.info("session %s: the sandbox went away between calls (%s); restarting it", self.id, exc)
                self.start()
        if self._sandbox is None:
            self.start()
        assert self._sandbox is not None
        return self._sandbox

    def _call(
        self,
        header: protocol.Request,
        body: bytes,
        seconds: float,
        accept: Callable[[dict[str, Any], bytearray], T],
        *,
        checkpoint_seconds: float | None = None,
        desk: CallDesk | None = None,
        live: LiveCall | None = None,
    ) -> T:
        """One request with recovery: whatever goes wrong, the session is usable again before we raise."""
        try:
            try:
                return self._attempt(header, body, seconds, accept, checkpoint_seconds, desk, live)
            except (_WorkerReplaced, ChannelLost, AgentTimeoutError, ProtocolError) as exc:
                kind = _classify(exc)
                assert kind is not None
                death = self._recover(RECOVERY[kind], exc)
                raise self._recovered_error(RECOVERY[kind], kind, exc, death) from None
        except (TakenOver, SessionAttachedElsewhere) as exc:
            self._become_stale()
            raise SessionAttachedElsewhere(
                f"session {self.id} was attached by another controller; this call was not kept ({exc})"
            ) from None

    def _attempt(
        self,
        header: protocol.Request,
        body: bytes,
        seconds: float,
        accept: Callable[[dict[str, Any], bytearray], T],
        checkpoint_seconds: float | None,
        desk: CallDesk | None,
        live: LiveCall | None,
    ) -> T:
        for attempt in range(2):
            sandbox = self._ready_sandbox()
            header.pop("id", None)
            reply, reply_body = sandbox.request(
                header, body, seconds=seconds, checkpoint_seconds=checkpoint_seconds, desk=desk, live=live
            )
            failure = worker_failure(reply)
            if failure is None:
                return accept(reply, reply_body)
            if failure["status"] == protocol.STATUS_CRASHED and not failure["ran"] and attempt == 0:
                self._restore()  # the worker had died between calls; the request never ran
                continue
            raise _WorkerReplaced(failure)
        raise ProtocolError("the agent lost its worker twice before running the request")

    def _recover(self, recovery: Recovery, exc: BaseException) -> ContainerState | None:
        """Bring the session back to its last checkpoint; if even that fails, drop the sandbox for the next call.

        Returns how the container ended when the channel was lost with it (None otherwise, or when it is gone).
        """
        death = None
        try:
            if not recovery.replace_sandbox:
                self._restore()
                return None
            if isinstance(exc, ChannelLost) and self._sandbox is not None:
                death = self._sandbox.settled_state()
            self.start()
        except (TakenOver, SessionAttachedElsewhere):
            raise
        except OrchestratorError:
            self._remove_sandbox()
            raise
        return death

    def _remove_sandbox(self) -> None:
        """Remove our sandbox, only while we own the session (a stale handle stops here and keeps it to release)."""
        if self._sandbox is not None:
            with self._ledger.owned():
                self._sandbox.remove()
            self._sandbox = None

    def _recovered_error(
        self, recovery: Recovery, kind: str, exc: BaseException, death: ContainerState | None
    ) -> OrchestratorError:
        error = recovery.error(exc, death)
        detail = exc.failure["reason"] if isinstance(exc, _WorkerReplaced) else str(exc)
        if isinstance(exc, ChannelLost):
            detail = f"{death.describe() if death else 'the sandbox container was removed'} ({exc})"
        if isinstance(exc, _WorkerReplaced) and exc.failure["phase"] == "checkpoint":
            kind = "checkpointing took longer than checkpoint_timeout and ignored the interrupt"
        message = (
            f"{kind}: {detail[:2000]}; session {self.id} was restored to checkpoint generation {self.generation}"
            + (f" without {', '.join(sorted(self.restore_failures))}" if self.restore_failures else "")
        )
        failures, self._unreported_failures = self._unreported_failures, {}
        limits = (
            {k: getattr(exc, k) for k in ("unit", "size", "held", "quota")} if error is CheckpointLimitExceeded else {}
        )
        return error(message, restored=True, generation=self.generation, restore_failures=failures, **limits)  # type: ignore[call-arg]

    def _new_recorder(self, stream: str) -> StreamRecorder:
        """Where a stream of the running call goes when its output travels (made on its first frame)."""
        return StreamRecorder(
            self._ledger.store.outputs_dir(self.id),
            stream,
            self._settings.max_output_bytes,
            self._settings.max_output_file_bytes,
        )

    def _wakeup(self) -> Wakeup:
        if self._call_wakeup is None:
            self._call_wakeup = Wakeup()
        return self._call_wakeup

    def _output(self, parsed: protocol.ExecReply, live: LiveCall) -> dict[str, Any]:
        """What the result gets beside the reply: previews of streams kept in files (and their paths), the
        callback's errors. Empty for a call that printed little and had no callback (nothing to copy)."""
        live.finish_output()
        fields: dict[str, Any] = {"callback_errors": tuple(live.callback_errors)} if live.callback_errors else {}
        for name, recorder in live.recorders.items():
            if recorder.spilled:
                fields[name] = recorder.preview(parsed[f"{name}_bytes"])  # type: ignore[literal-required]
                fields[f"{name}_path"] = recorder.path
        if any(recorder.spilled for recorder in live.recorders.values()):
            keep_newest(self._ledger.store.outputs_dir(self.id), self._settings.max_output_files)
        return fields

    def _exec_result(
        self, reply: dict[str, Any], body: bytearray, limit: float, live: LiveCall, elapsed: float
    ) -> ExecResult:
        """The result of an exec reply, its checkpoint committed; ``elapsed`` is the call's time on the host's clock.

        The durations the agent reports are never more than ``elapsed``: whoever budgets with them (a
        grader's time for the tests) gets at most what the host measured, whatever the sandbox says.
        """
        parsed = parse_exec_reply(reply)
        if parsed["error"] is not None:
            ExecError.from_reply(parsed["error"])  # every field checked before anything is stored
        parsed["duration"] = min(parsed["duration"], elapsed)
        parsed["checkpoint_duration"] = min(parsed["checkpoint_duration"], elapsed)
        unsaved = local_names(self._ledger.commit(parsed["checkpoint"], body))
        failures, self._unreported_failures = self._unreported_failures, {}
        output = self._output(parsed, live)
        if parsed["status"] == protocol.STATUS_TIMEOUT:
            why = "was stopped by the caller" if live.interrupt_requested else f"ran past its {limit:g} s timeout"
            raise ExecutionTimeout(
                f"the cell {why} and was interrupted; session {self.id} keeps "
                f"what the cell did before the interrupt (generation {self.generation}"
                + (f"; not saved: {', '.join(sorted(unsaved))}" if unsaved else "")
                + ")",
                restored=False,
                generation=self.generation,
                restore_failures=failures,
                stdout=output.get("stdout", parsed["stdout"]),
                stderr=output.get("stderr", parsed["stderr"]),
            )
        result = ExecResult.from_reply(parsed, unsaved, self.generation, failures)
        return dataclasses.replace(result, **output) if output else result

    def _commit_state(
        self,
        reply: dict[str, Any],
        body: bytearray,
        counters: dict[str, int],
        context: str | None = None,
        staged: Collection[StagedBlob] = (),
    ) -> dict[str, str]:
        if context is None:
            return self._ledger.commit(parse_state_reply(reply), body, counters=counters, staged=staged)
        contexts = dict(self._ledger.record.contexts)
        contexts[context] = {**contexts[context], **counters}
        return self._ledger.commit(parse_state_reply(reply), body, contexts=contexts, staged=staged)

    def _control_seconds(self) -> float:
        return self._settings.start_timeout + self._settings.checkpoint_timeout + self._settings.reply_margin

    def _add_versioned(self, prefix: str, payload: Any, index: int | None, context: str | None = None) -> int:
        encoded = _encode_payload(payload)
        counter = f"{prefix}_count"
        with self._turn():
            spec = self._context_spec(context)
            count = getattr(self._ledger.record, counter) if spec is None else spec[counter]
            if index is None:
                index = count
            if not isinstance(index, int) or isinstance(index, bool) or index < 0:
                raise ConfigError(f"index must be a non-negative int, got {index!r}")
            aliases = [prefix] if index == 0 else []
            self._store(f"{prefix}_{index}", aliases, encoded, {counter: max(count, index + 1)}, context)
            return index

    def _store(
        self,
        name: str,
        aliases: list[str],
        encoded: tuple[str, bytes],
        counters: dict[str, int],
        context: str | None = None,
    ) -> None:
        """One ``set_value`` request: a host-made value (``_encode_payload``) under ``name`` and ``aliases``.

        A str or bytes value's checkpoint blob is made here, not in the sandbox: a pickle written
        around the raw bytes (``protocol.host_blob_parts``, no copy of them), named by a fresh id
        (no hash). It is checked against the quota before anything is sent and written to the store
        while the request is in flight; the agent adopts it and sends nothing back
        (docs/protocol.md, "Host-made blobs"). JSON values are pickled by the agent, as cells' are.

        Raises:
            CheckpointQuotaExceeded: a str or bytes value would take the checkpoint past the quota.
        """
        kind, raw = encoded
        header = protocol.set_value_request(name, kind, aliases, self._settings.checkpoint_timeout)
        self._name_context(header, context)
        staged: list[StagedBlob] = []
        if kind in protocol.HOST_BLOB_KINDS:
            keys = {checkpoint_key(header.get("context"), n) for n in [name, *aliases]}
            self._ledger.check_room(keys, len(raw) + protocol.HOST_BLOB_OVERHEAD, f"the {kind} value for {name}")
            staged.append(self._ledger.stage(protocol.host_blob_parts(kind, raw)))
            header["blob"], header["blob_size"] = staged[0].blob_id, staged[0].size
        try:
            self._call(
                header,
                raw,
                self._control_seconds(),
                lambda r, b: self._commit_state(r, b, counters, context, staged),
            )
        finally:
            for blob in staged:
                blob.discard()

    # ----------------------------------------------------------------- contexts

    @property
    def contexts(self) -> list[Context]:
        """Every context of the session: the default one (its own namespace, id ``"default"``) first, then by id."""
        return [Context(self, DEFAULT_CONTEXT), *(Context(self, c) for c in sorted(self._ledger.record.contexts))]

    def context(self, context_id: str) -> Context:
        """The handle of an existing context (``"default"``: the session's own), e.g. after ``attach``.

        Raises:
            ContextNotFound: the session has no such context (never created, or destroyed).
        """
        self._context_spec(context_id)
        return Context(self, context_id)

    def create_context(
        self, cwd: str | None = None, env: Mapping[str, str] | None = None, *, context_id: str | None = None
    ) -> Context:
        """Make a new, empty namespace in this session's sandbox, isolated from the others, checkpointed with them.

        Args:
            cwd: its working directory in the sandbox, inside the writable workspace (``/tmp``):
                relative paths are taken from there; default ``/tmp/contexts/<id>``. Created if missing.
            env: environment variables its cells see, on top of the sandbox's own.
            context_id: its id (letters, digits, ``_``, ``-``); default: a new ``ctx-<hex>``.

        Returns:
            The Context, with ``execute`` / ``add_context`` / ``set_value`` / ``reset`` / ``destroy``.

        Raises:
            ConfigError: a bad id, a ``cwd`` outside the workspace, a bad ``env``, an id in use, or the
                directory could not be made in the sandbox.
        """
        new_id = new_context_id() if context_id is None else validate_context_id(context_id)
        path = resolve_cwd(workspace(self._settings), new_id, cwd)
        variables = validate_env(env)
        spec = {"cwd": path, "env": variables, "context_count": 0, "history_count": 0}
        header = protocol.context_create_request(new_id, path, variables, self._settings.checkpoint_timeout)
        with self._turn():
            if new_id in self._ledger.record.contexts:
                raise ConfigError(
                    f"session {self.id} already has a context {new_id!r}; use session.context({new_id!r}) to reach it"
                )
            self._call(header, b"", self._control_seconds(), lambda r, b: self._commit_context(r, b, new_id, spec))
        logger.info("session %s: created context %s in %s", self.id, new_id, path)
        return Context(self, new_id)

    def _destroy_context(self, context_id: str) -> None:
        header = protocol.context_destroy_request(context_id, self._settings.checkpoint_timeout)
        with self._turn():
            self._context_spec(context_id)
            self._call(header, b"", self._control_seconds(), lambda r, b: self._commit_context(r, b, context_id, None))
        logger.info("session %s: destroyed context %s", self.id, context_id)

    def _commit_context(self, reply: dict[str, Any], body: bytearray, context_id: str, spec: Any) -> None:
        """Store a created (``spec``) or destroyed (None) context with the delta its request caused."""
        if reply.get("status") == protocol.STATUS_ERROR:
            reason = reply_reason(reply, "")
            raise ConfigError(f"the sandbox of session {self.id} could not create context {context_id}: {reason}")
        contexts = {k: v for k, v in self._ledger.record.contexts.items() if k != context_id}
        if spec is not None:
            contexts[context_id] = spec
        self._ledger.commit(parse_state_reply(reply), body, contexts=contexts)

    def _context_spec(self, context: str | None) -> dict[str, Any] | None:
        """The record of a context (None for the default one).

        Raises:
            ContextNotFound: the session has no such context.
        """
        if context is None or context == DEFAULT_CONTEXT:
            return None
        spec = self._ledger.record.contexts.get(context)
        if spec is None:
            known = ", ".join([DEFAULT_CONTEXT, *sorted(self._ledger.record.contexts)])
            raise ContextNotFound(
                f"session {self.id} has no context {context!r}: it was destroyed or never created (its contexts: "
                f"{known}); make one with session.create_context()"
            )
        return spec

    def _name_context(self, header: protocol.InContext, context: str | None) -> None:
        """Put the context a request runs in into its header (nothing for the default context)."""
        if context is not None and self._context_spec(context) is not None:
            header["context"] = context
