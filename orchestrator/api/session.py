"""The public handle on one persistent session: its calls, each a transaction on the session's checkpoint.

A call's reply carries the checkpoint delta it caused; it is stored (by the ledger, under the
store lock, only while this handle owns the session) before the call returns. What the sandbox
is and how it is restored live in ``runtime.restore``; what a failed request does to it, and
the error the caller gets, in ``runtime.recovery``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

from ..agent import blob_format, protocol, reply_types, request_table
from ..checks import is_count
from ..errors import (
    ConfigError,
    ContextNotFound,
    ExecutionTimeout,
    InputRequestNotFound,
    SessionAttachedElsewhere,
    SessionNotFound,
)
from ..ops import hibernation
from ..runtime.hostcalls import CallDesk, HostCalls
from ..runtime.output import StreamRecorder, keep_newest
from ..runtime.recovery import Recoverer
from ..runtime.restore import SessionSandbox, SessionState
from ..runtime.sandbox import ValueFile
from ..state.ledger import StagedBlob
from ..wire.connection import Body
from ..wire.payloads import encode_payload
from ..wire.replies import parse_exec_reply, parse_state_reply, reply_reason
from .contexts import (
    DEFAULT_CONTEXT,
    Context,
    ContextCalls,
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
from .results import ExecError, ExecResult, Generation, generations, output_fields
from .tools import DEFAULT_ANSWER_CHARS, PythonTool

__all__ = ["Session", "SessionState"]

logger = logging.getLogger(__name__)


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
        self._recovery = Recoverer(sandbox, sandbox.metrics)
        self._on_close = on_close
        self._live: LiveCall | None = None  # the running exec's output, input and interrupt (read by other threads)
        self._context_calls = ContextCalls(
            spec=self._context_spec,
            record=lambda: self._ledger.record,
            add_versioned=self._add_versioned,
            set_value=self._set_value,
            reset=self._reset,
            destroy=self._destroy_context,
        )

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
        context: str | None = None,
    ) -> ExecResult:
        """Run ``code`` in the session's namespace and checkpoint the result.

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
            context: the id of the context to run in (``create_context``); default: the
                session's own namespace (``"default"``).

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
        header = request_table.exec_request(
            code,
            limit,
            checkpoint_timeout=self._settings.timeouts.checkpoint,
            send_limit=self._settings.limits.max_output_file_bytes,
            stream=on_output is not None,
            input=on_output is not None,
        )
        slack = self._settings.timeouts.interrupt_grace + self._settings.timeouts.reply_margin
        with self._turn():
            self._name_context(header, context)
            desk = (
                None
                if host_calls is None
                else CallDesk(
                    host_calls,
                    self._sandbox.handler_pool(),
                    max_held=self._settings.limits.max_host_calls_per_cell,
                    owner=self._sandbox,
                    metrics=self._sandbox.metrics,
                )
            )
            live = self._live = LiveCall(
                self._new_recorder,
                on_output,
                self._settings.timeouts.input,
                owner=self._sandbox,
                wakeup=self._sandbox.wakeup(),
            )
            started = time.monotonic()
            try:
                return self._recovery.call(
                    header,
                    b"",
                    limit + slack,
                    lambda r, b: self._exec_result(r, b, limit, live, time.monotonic() - started, context),
                    checkpoint_seconds=self._settings.timeouts.checkpoint + slack,
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

    def fork(
        self, *, at: int | None = None, session_id: str | None = None, labels: Mapping[str, str] | None = None
    ) -> Session:
        """A new session, owned by the same orchestrator, whose state is this one's: its last committed generation
        (a call running now is not waited for and not included), or the kept generation ``at`` (``history()``).

        Variables, contexts, the scaffold and the unsaved report are the source's; stored values are shared with
        it, not copied. Each goes its own way after: removing either never breaks the other. ``labels`` are added
        to the source's. See ``Orchestrator.fork``.

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

        The sandbox's namespace is replaced by that state, restored as after a restart: imported modules stay
        loaded, names the checkpoint did not hold (``unsaved``) are gone, and files in the working directory are
        not part of a checkpoint (they stay as they are). Returns the new generation.

        Raises:
            GenerationNotFound: the session keeps no such generation (the message names those it keeps).
            SessionAttachedElsewhere: another controller owns the session; nothing changed.
        """
        if not is_count(generation):
            raise ConfigError(f"generation must be an integer >= 0, got {generation!r}")
        with self._turn():
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
        with self._turn():
            self._sandbox.set_scaffold((code, listed))

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
        encoded = encode_payload(payload)
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
        header = request_table.reset_request(self._settings.timeouts.checkpoint)
        with self._turn():
            self._name_context(header, context)
            self._recovery.call(
                header,
                b"",
                self._control_seconds(),
                lambda r, b: self._commit_state(r, b, {"context_count": 0, "history_count": 0}, context),
            )

    def detach(self) -> None:
        """Let go of the session but keep its container and checkpoint, for ``Orchestrator.attach``.

        Its lease ends, so any controller may attach it without ``force``. A stale handle (another controller took
        the session) only lets go of what it holds here, and logs that.
        """
        with self._turn(call=False):
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

    def _turn(self, *, call: bool = True) -> AbstractContextManager[None]:
        return self._sandbox.turn(call=call)

    def close(self) -> None:
        """Remove the container and the stored state. Closing twice is fine.

        A stale handle (another controller took the session over) does not raise: it lets go of what it holds
        here (channel, threads, files) and leaves the session, its container and its stored state to their owner,
        which it logs as a warning.
        """
        with self._turn(call=False):
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

    # ----------------------------------------------------------------- calls

    def _new_recorder(self, stream: str) -> StreamRecorder:
        """Where a stream of the running call goes when its output travels (made on its first frame)."""
        return StreamRecorder(
            self._ledger.store.outputs_dir(self.id),
            stream,
            self._settings.limits.max_output_bytes,
            self._settings.limits.max_output_file_bytes,
        )

    def _output(self, parsed: reply_types.ExecReply, live: LiveCall) -> dict[str, Any]:
        """What the result gets beside the reply: the bytes of streams that came as frames, previews of streams
        kept in files (and their paths), the callback's errors. Empty for a call that printed little text and had
        no callback (nothing to copy)."""
        live.finish_output()
        fields = output_fields(parsed, live.recorders)
        if live.callback_errors:
            fields["callback_errors"] = tuple(live.callback_errors)
        if any(recorder.spilled for recorder in live.recorders.values()):
            keep_newest(self._ledger.store.outputs_dir(self.id), self._settings.limits.max_output_files)
        return fields

    def _exec_result(
        self, reply: dict[str, Any], body: bytearray, limit: float, live: LiveCall, elapsed: float, context: str | None
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
        before = set(self._ledger.record.unsaved)  # the session's unsaved report up to this call
        reported = self._ledger.commit(parsed["checkpoint"], body, context=self._context_of(context))
        unsaved = local_names(reported)
        newly = local_names({k: why for k, why in reported.items() if k not in before and repr(k) not in before})
        failures = self._sandbox.take_unreported()
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
        result = ExecResult.from_reply(parsed, unsaved, self.generation, failures, newly)
        return dataclasses.replace(result, **output) if output else result

    def _commit_state(
        self,
        reply: dict[str, Any],
        body: bytearray,
        counters: dict[str, int],
        context: str | None = None,
        staged: Collection[StagedBlob] = (),
    ) -> dict[str, str]:
        context = self._context_of(context)
        if context is None:
            return self._ledger.commit(parse_state_reply(reply), body, counters=counters, staged=staged)
        contexts = dict(self._ledger.record.contexts)
        contexts[context] = {**contexts[context], **counters}
        return self._ledger.commit(parse_state_reply(reply), body, contexts=contexts, staged=staged, context=context)

    def _control_seconds(self) -> float:
        return self._settings.timeouts.start + self._settings.timeouts.checkpoint + self._settings.timeouts.reply_margin

    def _add_versioned(self, prefix: str, payload: Any, index: int | None, context: str | None = None) -> int:
        encoded = encode_payload(payload)
        counter = f"{prefix}_count"
        with self._turn():
            spec = self._context_spec(context)
            count = getattr(self._ledger.record, counter) if spec is None else spec[counter]
            if index is None:
                index = count
            if not is_count(index):
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
        """One ``set_value`` request: a host-made value (``encode_payload``) under ``name`` and ``aliases``.

        A str or bytes value's checkpoint blob is made here, not in the sandbox: a pickle written
        around the raw bytes (``blob_format.host_blob_parts``, no copy of them), named by a fresh id
        (no hash). It is checked against the quota before anything is sent and written to the store
        while the request is in flight; the agent adopts it and sends nothing back
        (docs/protocol.md, "Host-made blobs"). JSON values are pickled by the agent, as cells' are.

        Raises:
            CheckpointQuotaExceeded: a str or bytes value would take the checkpoint past the quota.
        """
        kind, raw = encoded
        header = request_table.set_value_request(name, kind, aliases, self._settings.timeouts.checkpoint)
        self._name_context(header, context)
        staged: list[StagedBlob] = []
        body: Body | ValueFile = raw
        if kind in blob_format.HOST_BLOB_KINDS:
            keys = {checkpoint_key(header.get("context"), n) for n in [name, *aliases]}
            self._ledger.check_room(keys, len(raw) + blob_format.HOST_BLOB_OVERHEAD, f"the {kind} value for {name}")
            staged.append(self._ledger.stage(blob_format.host_blob_parts(kind, raw)))
            header["blob"], header["blob_size"] = staged[0].blob_id, staged[0].size
            if staged[0].size >= blob_format.VALUE_FILE_MIN_BYTES:  # a local sandbox maps the staged file instead
                body = ValueFile(staged[0].directory, staged[0].written, staged[0].blob_id, raw)
        try:
            self._recovery.call(
                header,
                body,
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
        ids = [DEFAULT_CONTEXT, *sorted(self._ledger.record.contexts)]
        return [Context(self, context_id, self._context_calls) for context_id in ids]

    def context(self, context_id: str) -> Context:
        """The handle of an existing context (``"default"``: the session's own), e.g. after ``attach``.

        Raises:
            ContextNotFound: the session has no such context (never created, or destroyed).
        """
        self._context_spec(context_id)
        return Context(self, context_id, self._context_calls)

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
        header = request_table.context_create_request(new_id, path, variables, self._settings.timeouts.checkpoint)
        with self._turn():
            if new_id in self._ledger.record.contexts:
                raise ConfigError(
                    f"session {self.id} already has a context {new_id!r}; use session.context({new_id!r}) to reach it"
                )
            self._recovery.call(
                header, b"", self._control_seconds(), lambda r, b: self._commit_context(r, b, new_id, spec)
            )
        logger.info("session %s: created context %s in %s", self.id, new_id, path)
        return Context(self, new_id, self._context_calls)

    def _destroy_context(self, context_id: str) -> None:
        header = request_table.context_destroy_request(context_id, self._settings.timeouts.checkpoint)
        with self._turn():
            self._context_spec(context_id)
            self._recovery.call(
                header, b"", self._control_seconds(), lambda r, b: self._commit_context(r, b, context_id, None)
            )
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

    @staticmethod
    def _context_of(context: str | None) -> str | None:
        """The context id a delta's names are prefixed with (None for the default context)."""
        return None if context == DEFAULT_CONTEXT else context

    def _name_context(self, header: request_table.InContext, context: str | None) -> None:
        """Put the context a request runs in into its header (nothing for the default context)."""
        if context is not None and self._context_spec(context) is not None:
            header["context"] = context
