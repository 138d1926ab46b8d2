"""DockerREPL: a drop-in for rlms' DockerREPL that runs on one persistent, checkpointed orchestrator session.

Same constructor and surface as the peer (``rlm.environments.docker_repl.DockerREPL``), and
rlms' ``SupportsPersistence``; underneath, one long-lived sandbox instead of a ``docker exec``
and a full state load and dump per cell. Nothing listens on a network port: the sandbox has
no network, and its LM calls reach the host as host calls on the controller channel
(``bridge``). A cell that times out keeps the session, a crash restores it, and values that
cannot be saved are named (``DockerREPLResult.unsaved``) instead of dropped. For tree search
over one conversation, ``fork()`` branches an environment (its session forked, values shared
with it) and ``rewind()`` takes one back to an earlier generation.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

from ..agent import framing
from ..api.files import Files
from ..api.manager import Orchestrator
from ..api.results import Generation
from ..api.session import Session
from ..config import Settings
from ..errors import (
    ConfigError,
    ExecutionTimeout,
    OrchestratorError,
    ProtocolError,
    SandboxCrashed,
    SessionClosed,
    SessionNotFound,
)
from ..runtime.hostcalls import HostCalls
from ..units import describe_bytes, parse_duration
from . import outcome
from ._upstream import NonIsolatedEnv, RLMChatCompletion, validate_custom_tools
from .bridge import Address, LMBridge, SubcallFn
from .calls import CellCalls
from .image import ensure_image, resolve_settings
from .scaffold import COMPACTION_NAME, EMPTY_ANSWER, owned_names, scaffold_source
from .tools import plan_tools

logger = logging.getLogger(__name__)

DEFAULT_CELL_TIMEOUT = 600.0
"""Seconds a cell may run (the peer has no limit at all; long LM sub-calls need a generous one)."""


def _address(address: Any) -> Address | None:
    if address is None:
        return None
    host, port = address
    return (str(host), int(port))


def _open_session(
    orch: Orchestrator, session_id: str | None, image: str, labels: Mapping[str, str]
) -> tuple[Session, bool]:
    """(session, created): ``session_id`` attached when it is stored, else created (or a session with a new id)."""
    if session_id is not None:
        try:
            return orch.attach(session_id), False
        except SessionNotFound:
            pass
    # No label of our own: a session with labels never takes a sandbox from the warm pool, and forks should.
    return orch.create_session(session_id=session_id, image=image, labels=labels), True


class _SharedOrchestrator:
    """The orchestrator of an environment and of the forks made from it (one engine client, one warm pool), closed
    when the last of them lets go of its session."""

    def __init__(self, orch: Orchestrator) -> None:
        self.orch = orch
        self._users = 1
        self._lock = threading.Lock()

    def join(self) -> None:
        """One more environment uses it.

        Raises:
            SessionClosed: the last one let go meanwhile (the orchestrator is closed).
        """
        with self._lock:
            if self._users == 0:
                raise SessionClosed("this DockerREPL was cleaned up or detached while it was being forked")
            self._users += 1

    def leave(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users == 0
        if last:
            self.orch.close()


def _release_session(session: Session, shared: _SharedOrchestrator, *, keep: bool) -> None:
    """Detach (``keep``) or remove the session, then let go of the orchestrator; never raises an engine's error."""
    try:
        if keep:
            session.detach()
        else:
            session.close()
    except OrchestratorError as exc:
        logger.warning("DockerREPL: releasing session %s failed: %s", session.id, exc)
    finally:
        shared.leave()


def _release_left(session: Session, shared: _SharedOrchestrator, pid: int) -> None:
    """An environment collected or left at exit without ``cleanup()``: clean it up, as ``cleanup()`` would.

    Only in the process that made it: a forked child inherits the finalizer, not the environment.
    """
    if os.getpid() == pid:
        _release_session(session, shared, keep=False)


def _cell_timeout(cell_timeout: float | str | None, settings: Settings) -> float:
    """Seconds one cell may run: ``cell_timeout`` (seconds, or a duration: "10m"), or None for ``timeouts.exec``.

    Raises:
        ConfigError: not a positive, finite duration.
    """
    try:
        timeout = settings.timeouts.exec if cell_timeout is None else parse_duration(cell_timeout)
    except ConfigError:
        timeout = 0
    if not 0 < timeout < math.inf:
        raise ConfigError(
            f"cell_timeout must be a positive duration (seconds, or 90s, 10m) or None, got {cell_timeout!r}"
        )
    return float(timeout)


class DockerREPL(NonIsolatedEnv):
    """rlms' Docker environment on an orchestrator session.

    Use it where rlms takes an environment (``RLM(environment="docker")`` through
    ``orchestrator.rlm.RLM`` or after ``orchestrator.rlm.register()``), or directly. Leave it
    with ``cleanup()`` (or a ``with`` block), which removes the container and the stored state;
    ``detach()`` keeps both for a later ``DockerREPL(session_id=...)``, in this process or another.
    One left without either is cleaned up when it is collected or, at the latest, when the process
    exits (as rlms' own DockerREPL is): a ``weakref.finalize``, not ``__del__``, so it runs once and
    before the interpreter tears its modules down.
    """

    def __init__(
        self,
        image: str | None = None,
        lm_handler_address: tuple[str, int] | None = None,
        context_payload: dict[str, Any] | list[Any] | str | None = None,
        setup_code: str | None = None,
        persistent: bool = False,
        depth: int = 1,
        subcall_fn: SubcallFn | None = None,
        custom_tools: dict[str, Any] | None = None,
        custom_sub_tools: dict[str, Any] | None = None,
        compaction: bool = False,
        max_concurrent_subcalls: int = 4,
        *,
        settings: Settings | None = None,
        cell_timeout: float | str | None = DEFAULT_CELL_TIMEOUT,
        session_id: str | None = None,
        labels: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        """Start (or, with ``session_id``, resume) a sandbox session.

        Args:
            image: a base image with python3 (3.9+), as in rlms; the sandbox image is built on it once,
                offline. Default: ``settings.base_image`` (``ORCH_BASE_IMAGE``). A sandbox image (one
                ``orchestrator image build`` made) is run as it is.
            lm_handler_address: (host, port) of rlms' LMHandler; ``update_handler_address``
                changes it. Without one, ``llm_query`` returns an "Error: ..." string.
            context_payload: loaded as ``context_0`` (and ``context``).
            setup_code: run as a first cell.
            persistent, depth, max_concurrent_subcalls: as in rlms' environments.
            subcall_fn: the recursive sub-call behind ``rlm_query`` (plain LM calls without it).
            custom_tools: code strings (run in the sandbox) and JSON data; a host callable
                cannot cross into the sandbox: its name raises an error that says so.
            custom_sub_tools: the tools of sub-calls (default: ``custom_tools``); kept for rlms.
            compaction: ``history`` is the running list rlms appends to.
            settings: limits, security and paths of the sandbox (default ``Settings.from_env()``).
            cell_timeout: seconds (or a duration: "10m") one cell may run before it is interrupted (None:
                ``settings.timeouts.exec``).
            session_id: resume this stored session if it exists, else create it under this id.
            labels: extra container labels (keys ``orchestrator.<you>.<name>``).

        Raises:
            ValueError: a custom tool has a reserved or invalid name, or cannot go into the sandbox;
                a limit is out of range (``ConfigError`` is a ValueError too).
            ConfigError: the base image has no usable python3.
            ImageMissing: the base image is not on this engine.
            EngineUnavailable: no Docker engine answers.
        """
        super().__init__(persistent=persistent, depth=depth, max_concurrent_subcalls=max_concurrent_subcalls, **kwargs)
        validate_custom_tools(custom_tools)
        if not isinstance(max_concurrent_subcalls, int) or max_concurrent_subcalls < 1:
            raise ConfigError(f"max_concurrent_subcalls must be an int >= 1, got {max_concurrent_subcalls!r}")
        self.lm_handler_address = _address(lm_handler_address)
        self.subcall_fn = subcall_fn
        self.compaction = compaction
        self.custom_tools: dict[str, Any] = custom_tools or {}
        self.custom_sub_tools: dict[str, Any] = custom_sub_tools if custom_sub_tools is not None else self.custom_tools
        self._tools = plan_tools(self.custom_tools)
        self._settings = resolve_settings(settings, image)
        self.cell_timeout = _cell_timeout(cell_timeout, self._settings)
        self.image = self._settings.base_image
        self._requested_id = session_id
        self._labels = dict(labels or {})
        self._bridge = self._new_bridge()
        self._compaction_history: list[Any] = []
        self._orch: _SharedOrchestrator | None = None
        self._session: Session | None = None
        self._finalizer: weakref.finalize[..., DockerREPL] | None = None
        self._closed = False
        self.setup()
        try:
            if context_payload is not None:
                self.load_context(context_payload)
            if setup_code:
                self.execute_code(setup_code)
        except BaseException:
            self.cleanup()
            raise

    # ----------------------------------------------------------------- lifecycle

    def setup(self) -> None:
        """Build (or reuse) the sandbox image, open the session and install the REPL scaffold in it."""
        if self._session is not None or self._closed:
            return
        orch = Orchestrator(self._settings)
        session: Session | None = None
        created = True
        try:
            image = ensure_image(orch)
            session, created = _open_session(orch, self._requested_id, image, self._labels)
            session.set_scaffold(
                scaffold_source(compaction=self.compaction, tools=self._tools), names=owned_names(self._tools)
            )
            for name, value in self._tools.data.items():
                self._inject(session, name, value)
            if self.compaction:
                if not created:
                    self._compaction_history = self._stored_compaction_history(session)
                else:
                    session.set_value(COMPACTION_NAME, [], aliases=("history",))
        except BaseException:
            if session is not None and not created:
                with contextlib.suppress(OrchestratorError):
                    session.detach()  # a resumed session outlives a failed start: it holds someone's state
            orch.close()  # removes a session created here
            raise
        self._hold(_SharedOrchestrator(orch), session)
        logger.info("DockerREPL on session %s (container %s)", session.id, (session.container_id or "?")[:12])

    def _hold(self, shared: _SharedOrchestrator, session: Session) -> None:
        """Make ``session`` (owned by ``shared``'s orchestrator, which this environment has joined) this one's."""
        self._orch, self._session, self._closed = shared, session, False
        # It must not hold self: it is what runs when self is collected (or at exit) without cleanup().
        self._finalizer = weakref.finalize(self, _release_left, session, shared, os.getpid())

    def _new_bridge(self) -> LMBridge:
        """The host side of this environment's LM calls: its own handler address, depth and sub-call slots."""
        return LMBridge(
            address=lambda: self.lm_handler_address,
            depth=lambda: self.depth,
            subcall_fn=self.subcall_fn,
            max_concurrent_subcalls=self.max_concurrent_subcalls,
        )

    def cleanup(self) -> None:
        """Remove the container and the stored state. Calling it again does nothing."""
        self._release(keep=False)

    def detach(self) -> None:
        """Let go of the session but keep its container and state, for ``DockerREPL(session_id=...)`` later."""
        self._release(keep=True)

    def _release(self, *, keep: bool) -> None:
        if self._closed:
            return
        self._closed = True
        session, orch, finalizer = self._session, self._orch, self._finalizer
        self._session = self._orch = self._finalizer = None
        if session is not None and orch is not None and finalizer is not None and finalizer.detach() is not None:
            _release_session(session, orch, keep=keep)

    def __enter__(self) -> DockerREPL:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cleanup()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"session={self.session_id}"
        return f"<DockerREPL {state} image={self.image!r}>"

    @property
    def session(self) -> Session:
        """The orchestrator session underneath (for what rlms has no word for)."""
        return self._live()

    @property
    def files(self) -> Files:
        """The session's ``/workspace``, where the cells run (``Session.files``): kept through a restart, like rlms'
        host folder, and read or written from here."""
        return self._live().files

    @property
    def session_id(self) -> str | None:
        """The id to resume this session with (``DockerREPL(session_id=...)``), None once cleaned up."""
        return None if self._session is None else self._session.id

    @property
    def container_id(self) -> str | None:
        """The container serving the session now (a restart gives a new one); None once cleaned up."""
        return None if self._session is None else self._session.container_id

    def _live(self) -> Session:
        if self._closed or self._session is None:
            raise SessionClosed(
                "this DockerREPL was cleaned up or detached (cleanup(), detach(), RLM.close() or the end of its "
                "with block); create a new DockerREPL, or resume a detached one with DockerREPL(session_id=...)"
            )
        return self._session

    # ----------------------------------------------------------------- cells

    def execute_code(self, code: str) -> outcome.DockerREPLResult:
        """Run ``code`` in the persistent namespace.

        Returns:
            A REPLResult (a ``DockerREPLResult``): output with the traceback of a raising cell
            in ``stderr``, bounded reprs of the variables in ``locals``, this cell's LM calls in
            ``rlm_calls``, and ``final_answer`` once ``answer["ready"]`` is true. A cell that
            timed out or crashed the sandbox gives a result whose ``stderr`` says so.

        Raises:
            SessionClosed: the environment was cleaned up.
            RuntimeError: called from this environment's own ``subcall_fn`` (it would wait for itself).
        """
        session = self._live()
        self._refuse_in_subcall("execute_code")
        started = time.perf_counter()
        calls = CellCalls()
        host_calls = HostCalls(handlers=self._bridge.handlers(calls), timeout=None)
        failure: ExecutionTimeout | SandboxCrashed | ProtocolError | None = None
        try:
            result = session.execute(code, timeout=self.cell_timeout, host_calls=host_calls)
        except (ExecutionTimeout, SandboxCrashed, ProtocolError) as exc:
            failure = exc
            logger.warning("DockerREPL session %s: %s: %s", session.id, type(exc).__name__, exc)
        finally:
            made: list[RLMChatCompletion] = calls.close()
        seconds = time.perf_counter() - started
        if failure is not None:
            return outcome.from_failure(
                failure,
                made,
                seconds,
                timeout=self.cell_timeout,
                memory=describe_bytes(self._settings.limits.memory_bytes),
            )
        if result.unsaved:
            logger.debug("DockerREPL session %s: not saved: %s", session.id, result.unsaved)
        return outcome.from_exec(result, made, seconds)

    def _refuse_in_subcall(self, what: str) -> None:
        if self._bridge.in_subcall:
            raise RuntimeError(
                f"{what} was called from this DockerREPL's own subcall_fn while a cell of it is running; "
                "a sub-call needs an environment of its own (fork() gives one)"
            )

    # ----------------------------------------------------------------- branches: fork and rewind

    def fork(self, *, at: int | None = None, session_id: str | None = None) -> DockerREPL:
        """A new environment of the same kind whose session is a fork of this one's, for tree search.

        The fork starts where this environment's last completed cell left it (or at the kept generation ``at``:
        ``generations()``): variables, contexts and histories with their counters, custom tools, the scaffold,
        ``answer``; stored values are shared with this session, not copied. It has this environment's
        settings, cell timeout, depth, ``subcall_fn`` and LM handler address, each its own from then on:
        ``update_handler_address`` on either changes only that one, and each has its own
        ``max_concurrent_subcalls`` slots. A cell running here meanwhile is not waited for and not included, so
        a ``subcall_fn`` of this environment may fork it. Leave the fork with ``cleanup()`` or ``detach()`` as
        any environment; cleaning up either never breaks the other.

        Args:
            at: a generation this session keeps (``generations()``); default its current one.
            session_id: the fork's session id (to resume it with ``DockerREPL(session_id=...)``); default a new one.

        Raises:
            GenerationNotFound: ``at`` is not a generation this session keeps.
            ConfigError: ``session_id`` is invalid or taken.
            SessionClosed: this environment was cleaned up.
        """
        source, shared = self._live(), self._orch
        assert shared is not None  # held with the session
        shared.join()
        try:
            session = source.fork(at=at, session_id=session_id)
        except BaseException:
            shared.leave()
            raise
        # The configuration (what rlms' base and __init__ set) is the same; what is one environment's is made anew.
        child = copy.copy(self)
        child._requested_id = session.id
        child._labels = dict(self._labels)
        child._bridge = child._new_bridge()
        child._compaction_history = list(self._compaction_history)
        child._hold(shared, session)
        logger.info("DockerREPL on session %s forked from %s", session.id, source.id)
        return child

    @property
    def generation(self) -> int:
        """The generation of the session's state now (every cell that changed a variable makes a new one)."""
        return self._live().generation

    def generations(self) -> list[Generation]:
        """The generations the session keeps, oldest first, the current one last (``Session.history()``): what
        ``rewind`` and ``fork(at=...)`` can go back to. Named so because rlms' ``history`` is a message history."""
        return self._live().history()

    def rewind(self, generation: int) -> Generation:
        """Bring the session back to a generation it keeps (``Session.rewind``): variables, contexts and their
        counters, ``answer`` and (with compaction) ``history`` as they were then. Files the cells wrote and the LM
        handler address stay as they are. Returns the new generation (history stays linear).

        Raises:
            GenerationNotFound: the session keeps no such generation (the message names those it keeps).
            SessionClosed: the environment was cleaned up.
            RuntimeError: called from this environment's own ``subcall_fn`` (it would wait for itself).
        """
        session = self._live()
        self._refuse_in_subcall("rewind")
        rewound = session.rewind(generation)
        if self.compaction:
            self._compaction_history = self._stored_compaction_history(session)
        return rewound

    # ----------------------------------------------------------------- SupportsPersistence

    def load_context(self, context_payload: dict[str, Any] | list[Any] | str) -> None:
        """Load ``context_payload`` as ``context_0`` (and ``context``)."""
        self.add_context(context_payload, 0)

    def update_handler_address(self, address: tuple[str, int]) -> None:
        """Send LM calls to a new handler from now on (rlms starts one per completion).

        It starts a new turn, so ``answer`` is reset to ``{"content": "", "ready": False}``.
        """
        session = self._live()
        self.lm_handler_address = _address(address)
        session.set_value("answer", dict(EMPTY_ANSWER))

    def add_context(self, context_payload: dict[str, Any] | list[Any] | str, context_index: int | None = None) -> int:
        """Store a context as ``context_<index>`` (next free index by default; ``context`` aliases ``context_0``).

        The payload travels once, as raw bytes (JSON for a dict or list). Returns the index used.
        """
        return self._live().add_context(context_payload, context_index)

    def get_context_count(self) -> int:
        return self._live().get_context_count()

    def add_history(self, message_history: list[dict[str, Any]], history_index: int | None = None) -> int:
        """Store a copy of a message history as ``history_<index>``.

        ``history`` aliases ``history_0``, except under compaction, where it is the running list.
        """
        return self._live().add_history(message_history, history_index)

    def get_history_count(self) -> int:
        return self._live().get_history_count()

    def set_completion_context(self, context_payload: dict[str, Any] | list[Any] | str) -> None:
        """Store a completion's prompt as ``completion_context``, replacing the one before."""
        self._live().set_value("completion_context", context_payload)

    def append_compaction_entry(self, entry: list[dict[str, Any]] | dict[str, Any]) -> None:
        """Append a trajectory segment or summary to ``history`` (compaction only; a no-op otherwise).

        The host keeps the list and stores all of it again, so a cell that rebinds or edits
        ``history`` cannot corrupt what accumulated.
        """
        if not self.compaction:
            return
        session = self._live()
        self._compaction_history.append(json.loads(json.dumps(entry)))
        session.set_value(COMPACTION_NAME, self._compaction_history, aliases=("history",))

    # ----------------------------------------------------------------- helpers

    def _inject(self, session: Session, name: str, value: Any) -> None:
        """Store one custom data tool as a variable of the session."""
        if isinstance(value, (str, dict, list)):
            session.set_value(name, value)
            return
        result = session.execute(f"{name} = __import__('json').loads({json.dumps(value)!r})")
        if result.error is not None:
            raise ConfigError(f"custom tool {name!r} could not be stored: {result.error}")

    def _stored_compaction_history(self, session: Session) -> list[Any]:
        """The compaction list a resumed session holds, read back as JSON (empty when it cannot be read)."""
        result = session.execute(f"print(__import__('json').dumps({COMPACTION_NAME}))")
        raw = result.stdout.encode("utf-8", "surrogatepass")  # a lying reply's lone surrogate: not UTF-8, refused
        try:
            stored = framing.decode_json(raw, "compaction history") if result.error is None else None
        except framing.ProtocolViolation:  # the sandbox's text: strict, bounded JSON or nothing
            stored = None
        if not isinstance(stored, list):
            logger.warning("DockerREPL session %s: its compaction history could not be read back", session.id)
            return []
        return stored
