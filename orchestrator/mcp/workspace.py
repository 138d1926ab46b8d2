"""The sessions of one MCP client, and each tool's answer: the texts of ``PythonTool``, never an exception.

A workspace holds the client's default session (a named one attached at start, or a new one made
at the first call that needs it) and the forks the client made; a tool's ``session`` argument
names one of them, and names nothing else: a client cannot reach a session it did not make or
name at start. ``close`` lets them go when the client goes: the named session (and with
``keep``, every one) is detached and keeps running for the next client; the others are removed.
Running code, reset and undo are ``PythonTool``'s own calls (the same answers as the OpenAI
tool); the other answers are built from the same ``Answer`` pieces, so sandbox text in them is
made visible and cut to the answer's cap.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any

from ..api.answers import FIELD_CHARS, Answer, field, listed_names
from ..api.manager import Orchestrator
from ..api.session import Session, SessionState
from ..api.tools import DEFAULT_ANSWER_CHARS, EXECUTE, RESET, PythonTool, describe_failure
from ..api.undo import UNDO
from ..errors import ConfigError, OrchestratorError, SessionNotFound
from ..units import describe_bytes
from .files import BadCall, read_context_file
from .seats import Refused, Seats

logger = logging.getLogger(__name__)

DEFAULT_MAX_CONTEXT_BYTES = 16 << 20
"""The largest file ``add_context`` reads (16 MiB): a context is kept in the checkpoint, within its quota."""
DEFAULT_MAX_SESSIONS = 8
"""The most sandbox sessions the server holds at once, every client's default session and forks together."""
_NAMES_CHARS = 4_000  # the variable names an answer lists; more are counted


@dataclass(frozen=True)
class Limits:
    """What a client may ask of the server (the flags of ``orchestrator mcp``; docs/mcp.md)."""

    max_timeout: float | None = None
    max_answer_chars: int = DEFAULT_ANSWER_CHARS
    max_sessions: int = DEFAULT_MAX_SESSIONS
    max_context_bytes: int = DEFAULT_MAX_CONTEXT_BYTES
    file_roots: tuple[Path, ...] = ()
    """Directories under which ``add_context`` may read a file the client names; none: no file may be read."""


@dataclass(frozen=True)
class Binding:
    """Which session a workspace's default one is, and what becomes of the sessions it makes (the flags of
    ``orchestrator mcp``)."""

    named: str | None = None
    """Bind the default session to this stored session (attached, or created when missing); it survives the client.
    None: a new session, removed when the client goes."""
    force: bool = False
    """Take ``named`` even from a live controller that holds it."""
    keep: bool = False
    """When the client goes, detach every session it made instead of removing them."""
    image: str | None = None
    """The image of the sessions the workspace creates (None: the default image)."""
    labels: Mapping[str, str] = dataclass_field(default_factory=dict)
    """Labels of the sessions the workspace creates."""


class Workspace:
    """The sessions one MCP client uses: its default session and its forks; every method returns the answer's text.

    Args:
        orch: the orchestrator that owns the sessions (this process's).
        binding: which session is the default one, and what becomes of them all (None: ``Binding()``, a new
            session, removed with the others when the client goes).
        seats: the server's places for sessions, shared by its workspaces (None: ``limits.max_sessions`` of its own).
    """

    def __init__(
        self,
        orch: Orchestrator,
        limits: Limits,
        binding: Binding | None = None,
        *,
        seats: Seats | None = None,
    ) -> None:
        self._orch = orch
        self.limits = limits
        binding = binding or Binding()
        self._named, self._force, self._keep = binding.named, binding.force, binding.keep
        self._image, self._labels = binding.image, dict(binding.labels)
        self._seats = seats if seats is not None else Seats(limits.max_sessions)
        self._lock = threading.Lock()  # the session table; the calls themselves are serialized by each Session
        self._sessions: dict[str, tuple[Session, PythonTool]] = {}
        self._default: str | None = None
        self._closed = False  # a call that comes after close (the client is gone) must not start a session

    def open(self) -> None:
        """Bind the named session now, so that a session held elsewhere is refused before the client is served.

        Raises:
            SessionHeld: a live controller holds the named session and ``force`` was not given.
            OrchestratorError: the session could not be attached or created.
        """
        if self._named is not None:
            with self._lock:
                self._default_session()

    # ----------------------------------------------------------------- the tools

    def execute(self, code: str, timeout_seconds: float | None, session: str | None) -> str:
        arguments: dict[str, Any] = {"code": code}
        if timeout_seconds is not None:
            arguments["timeout_seconds"] = timeout_seconds
        return self._tool_call(session, EXECUTE, arguments)

    def reset(self, session: str | None) -> str:
        return self._tool_call(session, RESET, {})

    def undo(self, session: str | None) -> str:
        return self._tool_call(session, UNDO, {})

    def list_variables(self, session: str | None) -> str:
        def answer(handle: Session) -> Answer:
            names = handle.variables
            text = Answer()
            text.line("status: success")
            text.line(f"session: {handle.id} (generation {handle.generation})")
            text.line(f"variables ({len(names):,}): {listed_names(names, _NAMES_CHARS)}")
            unsaved = handle.unsaved
            if unsaved:
                text.line(
                    "note: these names are held by the sandbox but not saved, and are lost if it restarts: "
                    + listed_names(sorted(unsaved), _NAMES_CHARS)
                )
            return text

        return self._call(session, answer)

    def add_context(self, text: str | None, path: str | None, session: str | None) -> str:
        def answer(handle: Session) -> Answer:
            payload, source = self._context_payload(text, path)
            index = handle.add_context(payload)
            reply = Answer()
            reply.line("status: success")
            reply.line(
                f"The {source} is now the variable context_{index}"
                + (" (also named context)" if index == 0 else "")
                + f" in session {handle.id}: {type(payload).__name__}, {len(payload):,} "
                + ("characters." if isinstance(payload, str) else "bytes.")
            )
            return reply

        return self._call(session, answer, changes=True)

    def fork(self, session: str | None, at: int | None) -> str:
        def answer(handle: Session) -> Answer:
            with self._seat():
                fork = handle.fork(at=at, labels=self._labels or None)
            self._sessions[fork.id] = (fork, self._tool(fork))
            reply = Answer()
            reply.line("status: success")
            origin = fork.forked_from
            generation = f" at generation {origin[1]}" if origin else ""
            reply.line(f"new session: {fork.id} (a copy of session {handle.id}{generation})")
            reply.line(
                f'Pass session="{fork.id}" to the other tools to use it; without a session they use '
                f"{self._default or handle.id}. The two go their own ways from here."
            )
            return reply

        return self._call(session, answer, table=True)

    def history(self, session: str | None) -> str:
        def answer(handle: Session) -> Answer:
            reply = Answer()
            reply.line("status: success")
            reply.line(f"session: {handle.id}; the states it keeps, oldest first (rewind takes a generation):")
            for generation in handle.history():
                changed = listed_names(generation.changed, _NAMES_CHARS) if generation.changed else "(nothing)"
                rewound = f", a copy of {generation.rewound_from}" if generation.rewound_from is not None else ""
                current = " (current)" if generation.current else ""
                reply.line(
                    f"generation {generation.generation}{current}{rewound}: {generation.names} names, "
                    f"{describe_bytes(generation.size)}; changed: {changed}"
                )
            return reply

        return self._call(session, answer)

    def rewind(self, generation: int, session: str | None) -> str:
        def answer(handle: Session) -> Answer:
            rewound = handle.rewind(generation)
            reply = Answer()
            reply.line("status: success")
            reply.line(
                f"Session {handle.id} is back to the state of generation {generation}, as the new generation "
                f"{rewound.generation}; generation {rewound.generation - 1} can be rewound to in turn."
            )
            reply.line(f"names restored or removed: {listed_names(rewound.changed, _NAMES_CHARS)}")
            reply.line("note: only variables are rewound: files the code wrote stay, imported modules stay loaded.")
            return reply

        return self._call(session, answer, changes=True)

    def sessions(self) -> str:
        with self._lock:
            held = [(sid, handle) for sid, (handle, _) in self._sessions.items()]
            default = self._default
        reply = Answer()
        reply.line("status: success")
        if default is None:
            reply.line("No session yet: the first call that needs one starts it.")
        for sid, handle in held:
            origin = handle.forked_from
            fork = f", forked from {origin[0]} at generation {origin[1]}" if origin else ""
            mark = " (default)" if sid == default else ""
            reply.line(
                f"{sid}{mark}: generation {handle.generation}, variables: {len(handle.variables):,}, "
                f"{handle.state.value}{fork}"
            )
        return self._render(reply)

    def close_session(self, session: str) -> str:
        def answer(handle: Session) -> Answer:
            if handle.id == self._default:
                raise BadCall(f"{handle.id} is your default session, which lasts as long as you are connected.")
            self._sessions.pop(handle.id)
            self._seats.give_back()
            handle.close()
            reply = Answer()
            reply.line("status: success")
            reply.line(f"Session {handle.id} was removed (its sandbox and its stored state).")
            return reply

        return self._call(session, answer, table=True)

    def interrupt(self, session: str | None) -> None:
        """Stop the call running in the session the client named, if any (the client cancelled it)."""
        with self._lock:
            held = self._sessions.get(session if session is not None else self._default or "")
        if held is not None:
            held[0].interrupt()

    # ----------------------------------------------------------------- the client goes

    def close(self) -> None:
        """Let go of every session: detach the named one (all with ``keep``), remove the others; never raises."""
        with self._lock:
            held, self._sessions, self._closed = list(self._sessions.values()), {}, True
        self._seats.give_back(len(held))
        for handle, _ in held:  # a call still running (its client gone) is stopped, not waited for
            handle.interrupt()
        for handle, _ in held:
            keep = self._keep or handle.id == self._named
            try:
                if handle.state is SessionState.READY:
                    (handle.detach if keep else handle.close)()
            except OrchestratorError as exc:
                logger.warning(
                    "could not %s session %s: %s: %s",
                    "detach" if keep else "remove",
                    handle.id,
                    type(exc).__name__,
                    exc,
                )
            else:
                logger.info("%s session %s", "detached" if keep else "removed", handle.id)

    # ----------------------------------------------------------------- plumbing

    def _tool_call(self, session: str | None, name: str, arguments: dict[str, Any]) -> str:
        try:
            with self._lock:
                _, tool = self._pick(session)
        except BadCall as exc:
            return self._invalid(exc)
        except OrchestratorError as exc:
            return self._render(describe_failure(exc, 0.0))
        return tool.handle(name, arguments)

    def _call(
        self,
        session: str | None,
        build: Callable[[Session], Answer],
        *,
        table: bool = False,
        changes: bool = False,
    ) -> str:
        """``build``'s answer on the session the client named; bad calls and failures are answers too.

        ``table``: hold the session table for the call (it adds or removes a session); ``changes``: the call may
        change the variables, so ``undo_last_cell`` can take it back."""
        started = time.monotonic()
        try:
            if table:
                with self._lock:
                    return self._render(build(self._pick(session)[0]))
            with self._lock:
                handle, tool = self._pick(session)
            # The model's own call, as its cells are: undo_last_cell (the tool's log) takes it back.
            with tool._changes() if changes else contextlib.nullcontext():
                return self._render(build(handle))
        except BadCall as exc:
            return self._invalid(exc)
        except ConfigError as exc:  # the arguments, as the session judged them (a generation not kept...)
            return self._invalid(BadCall(str(exc)))
        except OrchestratorError as exc:
            return self._render(describe_failure(exc, time.monotonic() - started))

    def _pick(self, session: str | None) -> tuple[Session, PythonTool]:
        """The session the client named (its default one when None); the table lock is held."""
        if self._closed:
            raise BadCall("This client's sessions were let go of (it went away, or the server is stopping).")
        if session is None:
            return self._default_session()
        held = self._sessions.get(session)
        if held is None:
            listed = ", ".join(sorted(self._sessions)) or "none yet"
            raise BadCall(
                f"There is no session {field(str(session), 100)!r} of yours; yours are: {listed}. "
                "Leave session out to use your default session."
            )
        return held

    def _default_session(self) -> tuple[Session, PythonTool]:
        if self._default is not None:
            return self._sessions[self._default]
        with self._seat():
            handle = self._bind()
        self._sessions[handle.id] = (handle, self._tool(handle))
        self._default = handle.id
        return self._sessions[handle.id]

    @contextlib.contextmanager
    def _seat(self) -> Iterator[None]:
        """Hold a place of the server's for a session about to be made; given back if it is not made."""
        self._seats.take()
        try:
            yield
        except BaseException:
            self._seats.give_back()
            raise

    def _bind(self) -> Session:
        if self._named is None:
            handle = self._orch.create_session(image=self._image, labels=self._labels or None)
            logger.info("created session %s for the MCP client", handle.id)
            return handle
        try:
            handle = self._orch.attach(self._named, force=self._force)
            logger.info("attached session %s for the MCP client", handle.id)
        except SessionNotFound:
            handle = self._orch.create_session(session_id=self._named, image=self._image, labels=self._labels or None)
            logger.info("created session %s for the MCP client", handle.id)
        return handle

    def _tool(self, handle: Session) -> PythonTool:
        return handle.as_tool(
            max_timeout=self.limits.max_timeout, max_answer_chars=self.limits.max_answer_chars, undo=True
        )

    def _context_payload(self, text: str | None, path: str | None) -> tuple[str | bytes, str]:
        if (text is None) == (path is None):
            raise BadCall('add_context takes either "text" (the context itself) or "path" (a file to read), not both.')
        if text is not None:
            return text, "text"
        assert path is not None
        return read_context_file(path, self.limits.file_roots, self.limits.max_context_bytes), f"file {path}"

    def _render(self, answer: Answer) -> str:
        return answer.render(self.limits.max_answer_chars, lambda label, text: None)

    def _invalid(self, exc: BadCall) -> str:
        answer = Answer()
        answer.line("status: refused" if isinstance(exc, Refused) else "status: invalid call")
        answer.line(field(str(exc), 4 * FIELD_CHARS))
        return self._render(answer)
