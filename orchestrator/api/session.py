"""The public handles on one persistent session: ``Session``, whose calls are each defined once here, and
``Context``, a namespace of it, whose calls are the session's with ``context=`` it.

Each call checks its arguments and runs as a transaction on the session's checkpoint (``transactions.py``;
a cell: ``execution.py``; a value made on the host: ``values.py``). What the sandbox is and how it is restored
live in ``runtime.restore``; what a failed request does to it, and the error the caller gets, in
``runtime.recovery``. The async twins are made from these calls in ``aio.py``."""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, Concatenate, ParamSpec, TypeVar

from ..agent import request_table
from ..checks import is_count
from ..errors import ConfigError, InputRequestNotFound, SessionAttachedElsewhere, SessionNotFound
from ..ops import hibernation
from ..runtime.hostcalls import HostCalls
from ..runtime.restore import SessionSandbox, SessionState
from ..wire.payloads import encode_payload
from . import streams, values
from .contexts import (
    DEFAULT_CONTEXT,
    names_of,
    new_context_id,
    resolve_cwd,
    validate_context_id,
    validate_env,
    writable_dirs,
)
from .events import Event, OnOutput
from .execution import run_cell
from .file_writes import FileWriter
from .files import Files
from .results import ExecResult, Generation, generations
from .tools import DEFAULT_ANSWER_CHARS, PythonTool
from .transactions import Transactions

__all__ = ["Context", "Session", "SessionState"]

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")


class Session:
    """The handle on one persistent sandbox session; obtain it from ``Orchestrator``.

    One call runs at a time; concurrent callers wait their turn. Use as a context manager
    to ``close()`` the session (container and stored state) on exit.
    """

    def __init__(
        self,
        sandbox: SessionSandbox,
        *,
        on_close: Callable[[Session], None] | None = None,
        forker: Callable[..., list[Session]] | None = None,
    ) -> None:
        """Use ``Orchestrator.create_session`` or ``attach``; ``sandbox`` is the session's runtime, which
        ``Orchestrator`` also drives (start, take over, hibernate when idle); ``forker``: its ``Orchestrator.fork``."""
        self._sandbox = sandbox
        self._forker = forker
        self._ledger = sandbox.ledger
        self._settings = sandbox.settings
        self._calls = Transactions(sandbox)
        self._on_close = on_close

    # ----------------------------------------------------------------- public surface

    @property
    def id(self) -> str:
        return self._ledger.session_id

    @property
    def state(self) -> SessionState:
        """``READY``; ``DETACHED`` once detached or attached by another controller; ``CLOSED``."""
        return self._sandbox.state

    @property
    def restore_failures(self) -> dict[str, str]:
        """Values the last restore could not bring back, with the reason (they were dropped)."""
        return self._sandbox.restore_failures

    @property
    def sandbox_id(self) -> str | None:
        sandbox = self._sandbox.sandbox
        return sandbox.sandbox_id if sandbox else None

    @property
    def container_id(self) -> str | None:
        sandbox = self._sandbox.sandbox
        return sandbox.container_id if sandbox else None

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
        """Size of the stored checkpoint in bytes (at most ``Settings.limits.checkpoint_quota_bytes``)."""
        return self._ledger.record.checkpoint_bytes

    @property
    def unsaved(self) -> dict[str, str]:
        """Names the worker holds that the checkpoint does not (a context's as ``<id>/<name>``), with why: a restart,
        a fork or a rewind loses them. A fork starts with its source's (it does not have those names)."""
        return dict(self._ledger.record.unsaved)

    @property
    def forked_from(self) -> tuple[str, int] | None:
        """The session and generation this one was forked from, or None."""
        origin = self._ledger.record.forked_from
        return (origin["session_id"], origin["generation"]) if origin else None

    @property
    def files(self) -> Files:
        """The session's workspace (``/workspace``): ``read``, ``list``, ``exists``, ``download`` from its last
        checkpoint (a hibernated session is not started for them); ``write``, ``remove``, ``upload`` as calls
        whose change the checkpoint holds when they return (docs/files.md)."""
        return Files(lambda: self._ledger.record, self._ledger.store, FileWriter(self._calls, None))

    @property
    def agent_info(self) -> dict[str, Any]:
        """The agent's handshake: protocol, Python and dill versions."""
        sandbox = self._sandbox.sandbox
        if sandbox is None:
            return {}
        hello = sandbox.connection.hello
        return {"protocol": hello["protocol"], "python": hello["python"], "dill": hello["dill"]}

    def execute(
        self,
        code: str,
        timeout: float | None = None,
        *,
        host_calls: HostCalls | None = None,
        on_output: OnOutput | None = None,
        context: Context | str | None = None,
    ) -> ExecResult:
        """Run ``code`` in the session's namespace (or ``context``'s) and checkpoint the result.

        Args:
            code: Python source; a trailing expression's repr becomes ``return_value``.
            timeout: seconds the cell may run (default ``Settings.timeouts.exec``); the
                checkpoint afterwards has its own limit, ``Settings.timeouts.checkpoint``.
                Time its ``input()`` waits for an answer does not count.
            host_calls: handlers that code in the sandbox may call while this cell runs
                (``host_call(name, payload)`` in the scaffold; see ``set_scaffold``).
            on_output: called on this thread with each ``OutputEvent`` as the cell prints
                (within ~50 ms) and each ``InputRequest`` of its ``input()``, which a str it
                returns answers (else ``submit_input`` does). Without it, ``input()`` raises
                ``EOFError`` at once. See ``orchestrator.api.events``.
            context: the context to run in (a ``Context`` of this session or its id, ``create_context``);
                default: the session's own namespace (``"default"``).

        Returns:
            ExecResult; an exception raised by the code is in ``.error``, not raised. Output past
            ``Settings.limits.max_output_bytes`` is a head-and-tail preview; the whole stream is in
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
        limit = self._settings.timeouts.exec if timeout is None else float(timeout)
        if not 0 < limit < math.inf:  # every wait has a finite deadline
            raise ConfigError(f"timeout must be a positive, finite number of seconds, got {timeout!r}")
        if on_output is not None and not callable(on_output):
            raise ConfigError(f"on_output must be callable, got {type(on_output).__name__}")
        return run_cell(self._calls, code, limit, host_calls, on_output, self._context_id(context))

    def stream(
        self,
        code: str,
        timeout: float | None = None,
        *,
        host_calls: HostCalls | None = None,
        context: Context | str | None = None,
    ) -> Iterator[Event | ExecResult]:
        """``execute`` as an iterator: each ``OutputEvent`` and ``InputRequest`` as it happens, then the ``ExecResult``.

        Answer an ``InputRequest`` with ``submit_input``. The cell runs on a thread of its own;
        leaving the loop early interrupts it. Raises what ``execute`` raises, after the events.
        """
        return streams.stream(
            lambda on_output: self.execute(code, timeout, host_calls=host_calls, on_output=on_output, context=context),
            self.interrupt,
            f"stream-{self.id}",
        )

    def submit_input(self, request_id: str, text: str) -> None:
        """Answer the running cell's ``input()`` request ``request_id`` (from any thread).

        Raises:
            InputRequestNotFound: no such request waits (unknown, answered, timed out, or no cell runs).
            ConfigError: ``text`` is not a str, or longer than 1 MiB.
        """
        live = self._calls.live
        if live is None:
            raise InputRequestNotFound(f"no cell of session {self.id} is running, so no input request {request_id!r}")
        live.submit(request_id, text)

    def interrupt(self) -> bool:
        """Stop the running cell as its timeout would (interrupt, then kill after the grace); from any thread.

        The call gets ``ExecutionTimeout`` and the session stays usable. Returns False when no cell runs.
        """
        live = self._calls.live
        return live is not None and live.interrupt()

    def fork(
        self, *, at: int | None = None, session_id: str | None = None, labels: Mapping[str, str] | None = None
    ) -> Session:
        """A new session, owned by the same orchestrator, whose state is this one's: its last committed generation
        (a call running now is not waited for and not included), or the kept generation ``at`` (``history()``).

        Variables, the workspace's files, contexts, the scaffold and the unsaved report are the source's; stored
        values and files are shared with it, not copied. Each goes its own way after: removing either never breaks
        the other. ``labels`` are added to the source's. See ``Orchestrator.fork``.

        Raises:
            GenerationNotFound: ``at`` is not a generation this session keeps.
            ConfigError: ``session_id`` is invalid or taken.
            SessionClosed: this session was closed.
        """
        self._sandbox.check_usable()
        if self._forker is None:
            raise ConfigError(f"session {self.id} has no orchestrator to fork it with; use Orchestrator.fork")
        ids = None if session_id is None else [session_id]
        return self._forker(self.id, 1, at=at, labels=labels, session_ids=ids)[0]

    def history(self) -> list[Generation]:
        """The generations this session keeps, oldest first; the last is the current one.

        How many are kept: ``Settings.limits.history_generations``, all within the checkpoint quota (a blob that
        several of them name counts once; the oldest go first).
        """
        return generations(self._ledger.record)

    def rewind(self, generation: int) -> Generation:
        """Bring the session back to the state of the kept generation ``generation``, as a new generation (history
        stays linear: nothing is rewritten, and the generation left can be rewound to in turn).

        The sandbox's namespace and its ``/workspace`` are replaced by that state, restored as after a restart:
        imported modules stay loaded, names and files the checkpoint did not hold (``unsaved``) are gone, a file
        made since is gone and one deleted since is back (``/tmp`` is scratch: it stays as it is). Returns the new
        generation.

        Raises:
            GenerationNotFound: the session keeps no such generation (the message names those it keeps).
            SessionAttachedElsewhere: another controller owns the session; nothing changed.
        """
        if not is_count(generation):
            raise ConfigError(f"generation must be an integer >= 0, got {generation!r}")
        with self._calls.turn():
            self._sandbox.check_usable()
            self._ledger.rewind(generation)
            self._sandbox.load_current()
        logger.info("session %s: rewound to generation %d as %d", self.id, generation, self.generation)
        return self.history()[-1]

    def as_tool(
        self, *, max_timeout: float | None = None, max_answer_chars: int = DEFAULT_ANSWER_CHARS, undo: bool = False
    ) -> PythonTool:
        """This session as OpenAI-style function tools for a model (``execute_code``, ``reset_repl``, and with
        ``undo`` ``undo_last_cell``); docs/tools.md.

        Answers are at most ``max_answer_chars`` characters; the whole text of what one cuts is kept with the
        session's output files (``Settings.limits.max_output_files``), and the answer names the file.
        """
        return PythonTool(
            self,
            max_timeout=max_timeout,
            max_answer_chars=max_answer_chars,
            output_dir=self._ledger.store.outputs_dir(self.id),
            max_output_files=self._settings.limits.max_output_files,
            undo=undo,
        )

    def set_scaffold(self, code: str, *, names: Collection[str] = ()) -> None:
        """Install the code that supports this session's cells in every worker, now and after each restart.

        ``code`` runs in a module of its own (not the session namespace), with ``host_call``,
        ``HostCallError``, ``deferred_values()`` (names a restore has not loaded yet, with their stored sizes: they
        are not in ``namespace`` until used) and ``load_deferred(name)`` among its globals (docs/protocol.md, "The
        scaffold"). It may define ``before_cell(namespace)``,
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
        with self._calls.turn():
            self._sandbox.set_scaffold((code, listed))

    def set_value(
        self,
        name: str,
        payload: str | bytes | dict[str, Any] | list[Any],
        *,
        aliases: Collection[str] = (),
        context: Context | str | None = None,
    ) -> None:
        """Store ``payload`` as the variable ``name`` (and each alias) of the session (or of ``context``),
        checkpointed; dicts and lists travel as JSON.

        Like ``add_context``, the value is made on the host, so it travels once, as raw bytes; a
        str or bytes value's checkpoint blob is written by the controller, so it never travels back.

        Raises:
            CheckpointQuotaExceeded: a str or bytes value would take the checkpoint past the quota
                (nothing was sent or stored).
            ConfigError: a name is not an identifier, or the payload is not str, bytes, dict or list.
            ContextNotFound: ``context`` names no context of this session.
        """
        names = [name, *aliases]
        if not all(isinstance(n, str) and n.isidentifier() for n in names):
            raise ConfigError(f"variable names must be identifiers, got {names!r}")
        encoded = encode_payload(payload)
        context_id = self._context_id(context)
        with self._calls.turn():
            values.store(self._calls, name, list(aliases), encoded, {}, context_id)

    def add_context(
        self,
        payload: str | bytes | dict[str, Any] | list[Any],
        index: int | None = None,
        *,
        context: Context | str | None = None,
    ) -> int:
        """Load a context into the namespace (or ``context``'s) as ``context_<index>`` (``context`` aliases
        ``context_0``).

        The payload travels once, as raw bytes; for a str or bytes nothing travels back (the
        controller writes its checkpoint blob itself). Returns the index used.

        Raises:
            CheckpointQuotaExceeded: a str or bytes payload would take the checkpoint past the quota
                (nothing was sent or stored).
        """
        return values.add_versioned(self._calls, "context", payload, index, self._context_id(context))

    def add_history(
        self, messages: list[Any], index: int | None = None, *, context: Context | str | None = None
    ) -> int:
        """Store a message history as ``history_<index>`` (``history`` aliases ``history_0``)."""
        if not isinstance(messages, list):
            raise ConfigError(f"messages must be a list, not {type(messages).__name__}")
        return values.add_versioned(self._calls, "history", messages, index, self._context_id(context))

    def get_context_count(self, *, context: Context | str | None = None) -> int:
        return self._calls.count("context_count", self._context_id(context))

    def get_history_count(self, *, context: Context | str | None = None) -> int:
        return self._calls.count("history_count", self._context_id(context))

    def reset(self, *, context: Context | str | None = None) -> None:
        """Clear every variable of the default context, or of ``context`` (the container keeps running, other
        contexts keep theirs); the empty state is checkpointed."""
        context_id = self._context_id(context)
        header = request_table.reset_request(self._settings.timeouts.checkpoint)
        with self._calls.turn():
            self._calls.in_context(header, context_id)
            counters = {"context_count": 0, "history_count": 0}
            self._calls.control(header, lambda r, b: self._calls.commit_state(r, b, counters, context_id))

    def detach(self) -> None:
        """Let go of the session but keep its container and checkpoint, for ``Orchestrator.attach``.

        Its lease ends, so any controller may attach it without ``force``. A stale handle (another controller took
        the session) only lets go of what it holds here, and logs that.
        """
        with self._calls.turn(call=False):
            if self.state is not SessionState.READY:
                return
            try:
                self._ledger.check_owner()
            except SessionAttachedElsewhere as exc:
                logger.info("session %s: detached a stale handle (%s)", self.id, exc)
            self._sandbox.become_stale()

    def hibernate(self) -> None:
        """Give up the container and keep the checkpoint; the next call starts a new one and restores.

        An idle session then costs nothing but its stored checkpoint. Values that could not be
        checkpointed (``ExecResult.unsaved``) are lost, as in any restart.

        Raises:
            SessionAttachedElsewhere: another controller owns the session (nothing was touched).
            SessionClosed: the session was closed.
        """
        hibernation.hibernate(self._sandbox)

    def close(self) -> None:
        """Remove the container and the stored state. Closing twice is fine.

        A stale handle (another controller took the session over) does not raise: it lets go of what it holds
        here (channel, threads, files) and leaves the session, its container and its stored state to their owner,
        which it logs as a warning.
        """
        with self._calls.turn(call=False):
            if self.state is SessionState.CLOSED:
                return
            sandbox = self._sandbox
            try:
                with self._ledger.owned() as current:
                    sandbox.drop()
                    sandbox.discard_all(current)
                    self._ledger.delete()
            except SessionAttachedElsewhere as exc:
                sandbox.become_stale()
                logger.warning(
                    "session %s: this handle was stale (%s); closing it released only this handle: the session, its "
                    "container and its stored state were left to the controller that holds it",
                    self.id,
                    exc,
                )
                return
            except SessionNotFound:
                pass  # removed already (``Orchestrator.remove``): nothing left to remove
            finally:
                sandbox.release()  # also when the close failed (an unreadable record): no channel stays open
                if sandbox.state is not SessionState.DETACHED:
                    sandbox.state = SessionState.CLOSED
                if self._on_close is not None:
                    self._on_close(self)
            logger.info("closed session %s", self.id)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Session {self.id} {self.state.value} generation={self.generation} epoch={self.epoch}>"

    # ----------------------------------------------------------------- contexts

    @property
    def contexts(self) -> list[Context]:
        """Every context of the session: the default one (its own namespace, id ``"default"``) first, then by id."""
        return [Context(self, context_id) for context_id in [DEFAULT_CONTEXT, *sorted(self._ledger.record.contexts)]]

    def context(self, context_id: str) -> Context:
        """The handle of an existing context (``"default"``: the session's own), e.g. after ``attach``.

        Raises:
            ContextNotFound: the session has no such context (never created, or destroyed).
        """
        self._calls.spec(context_id)
        return Context(self, context_id)

    def create_context(
        self, cwd: str | None = None, env: Mapping[str, str] | None = None, *, context_id: str | None = None
    ) -> Context:
        """Make a new, empty namespace in this session's sandbox, isolated from the others, checkpointed with them.

        Args:
            cwd: its working directory in the sandbox, inside ``/workspace`` (or the scratch ``/tmp``): relative
                paths are taken from ``/workspace``; default ``/workspace/contexts/<id>``. Created if missing.
            env: environment variables its cells see, on top of the sandbox's own.
            context_id: its id (letters, digits, ``_``, ``-``); default: a new ``ctx-<hex>``.

        Returns:
            The Context, with ``execute`` / ``add_context`` / ``set_value`` / ``reset`` / ``destroy``; or pass it
            as ``context=`` to the session's calls.

        Raises:
            ConfigError: a bad id, a ``cwd`` outside the workspace, a bad ``env``, an id in use, or the
                directory could not be made in the sandbox.
        """
        new_id = new_context_id() if context_id is None else validate_context_id(context_id)
        path = resolve_cwd(writable_dirs(self._settings), new_id, cwd)
        variables = validate_env(env)
        spec = {"cwd": path, "env": variables, "context_count": 0, "history_count": 0}
        header = request_table.context_create_request(new_id, path, variables, self._settings.timeouts.checkpoint)
        with self._calls.turn():
            if new_id in self._ledger.record.contexts:
                raise ConfigError(
                    f"session {self.id} already has a context {new_id!r}; use session.context({new_id!r}) to reach it"
                )
            self._calls.control(header, lambda r, b: self._calls.commit_context(r, b, new_id, spec))
        logger.info("session %s: created context %s in %s", self.id, new_id, path)
        return Context(self, new_id)

    def _destroy_context(self, context_id: str) -> None:
        header = request_table.context_destroy_request(context_id, self._settings.timeouts.checkpoint)
        with self._calls.turn():
            self._calls.spec(context_id)
            self._calls.control(header, lambda r, b: self._calls.commit_context(r, b, context_id, None))
        logger.info("session %s: destroyed context %s", self.id, context_id)

    def _context_id(self, context: Context | str | None) -> str | None:
        """The id of the context a call names (None for the default one); whether it exists is checked in the call.

        Raises:
            ConfigError: a ``Context`` of another session, or neither a ``Context`` nor a str.
        """
        if isinstance(context, Context):
            if context.session is not self:
                raise ConfigError(f"context {context.id!r} is of another session, not {self.id}; use its own session")
            context = context.id
        if context is not None and not isinstance(context, str):
            raise ConfigError(f"context must be a Context or its id (a str), not {type(context).__name__}")
        return None if context == DEFAULT_CONTEXT else context


def _in_context(call: Callable[Concatenate[Session, P], T]) -> Callable[Concatenate[Context, P], T]:
    """A ``Context`` method from the ``Session`` call it is: the call with ``context=`` the context (the one
    definition of each call is the session's; the method has its parameters but ``context``)."""
    name = call.__name__

    def method(self: Context, /, *args: P.args, **kwargs: P.kwargs) -> T:
        result: T = getattr(self.session, name)(*args, context=self, **kwargs)
        return result

    signature = inspect.signature(call)
    parameters = [p for p in signature.parameters.values() if p.name != "context"]
    method.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    method.__name__, method.__qualname__ = name, f"Context.{name}"
    method.__doc__ = f"``Session.{name}`` in this context: the same arguments, result and errors."
    return method


class Context:
    """One isolated namespace of a session, with the session's call surface; from ``Session.create_context``,
    ``Session.context(id)`` or ``Session.contexts``.

    Each call is the session's with ``context=`` this context (``ctx.execute(code)`` is
    ``session.execute(code, context=ctx)``), one at a time per session. The default context (id
    ``"default"``) is the session's own namespace, working directory and environment. A call on a destroyed
    context raises ``ContextNotFound``.
    """

    def __init__(self, session: Session, context_id: str) -> None:
        self._session = session
        self._id = context_id

    @property
    def id(self) -> str:
        return self._id

    @property
    def session(self) -> Session:
        return self._session

    @property
    def cwd(self) -> str | None:
        """The working directory in the sandbox the context was created with (None: the default context's,
        the image's working directory). A cell's ``os.chdir`` lasts in its context until the next restore."""
        spec = self._session._calls.spec(self._id)
        return None if spec is None else str(spec["cwd"])

    @property
    def env(self) -> dict[str, str]:
        """The environment variables the context was created with, on top of the sandbox's own."""
        spec = self._session._calls.spec(self._id)
        return {} if spec is None else dict(spec["env"])

    @property
    def files(self) -> Files:
        """``Session.files``, its writes' checkpoint deltas committed in this context (the workspace is shared)."""
        session = self._session
        return Files(lambda: session._ledger.record, session._ledger.store, FileWriter(session._calls, self._id))

    @property
    def variables(self) -> list[str]:
        """The context's names held by the last checkpoint."""
        spec = self._session._calls.spec(self._id)
        return names_of(self._session._ledger.record.variables, None if spec is None else self._id)

    execute = _in_context(Session.execute)
    stream = _in_context(Session.stream)
    add_context = _in_context(Session.add_context)
    add_history = _in_context(Session.add_history)
    set_value = _in_context(Session.set_value)
    get_context_count = _in_context(Session.get_context_count)
    get_history_count = _in_context(Session.get_history_count)
    reset = _in_context(Session.reset)

    def destroy(self) -> None:
        """Delete the context and its variables from the sandbox and the checkpoint; the others are untouched.

        Raises:
            ConfigError: this is the default context (close the session instead).
            ContextNotFound: the context was destroyed already.
        """
        if self._id == DEFAULT_CONTEXT:
            raise ConfigError("the default context is the session's own namespace; use Session.close() to end it")
        self._session._destroy_context(self._id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Context) and (other._session, other._id) == (self._session, self._id)

    def __hash__(self) -> int:
        return hash((id(self._session), self._id))

    def __repr__(self) -> str:
        return f"<Context {self._id} of session {self._session.id}>"
