"""A session as an LLM tool: OpenAI-style function definitions, and plain-text answers the model can read.

``PythonTool`` offers two functions to a model, ``execute_code`` and ``reset_repl`` (and, when
asked, ``undo_last_cell``: ``undo.py``), and turns each call into text: the status, the time,
the output, the value, and for an error its type, message, line, column, source line with a
caret under the column, and the user's traceback.
Nothing a model sends makes it raise: bad arguments and failures of the sandbox (a timeout, a
crash) are answers too, so a tool-calling loop can hand every call back to the model. An answer
is model-sized: at most ``max_answer_chars`` characters, sandbox text cut to its head and tail
with a note naming the file on the host that holds all of it (``answers.py``).
The text format and an example loop are in docs/tools.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol, cast

from ..checks import is_count, is_integer, is_number
from ..errors import ConfigError, ExecutionTimeout, OrchestratorError, SandboxCrashed, SandboxOutOfMemory
from ..runtime.output import keep_newest, save_output
from .answers import FIELD_CHARS, Answer, field
from .results import ExecResult
from .undo import UNDO, Rewindable, UndoLog

logger = logging.getLogger(__name__)

EXECUTE = "execute_code"
RESET = "reset_repl"
DEFAULT_ANSWER_CHARS = 20_000
"""The default cap of one answer, in characters (about 5,000 tokens); docs/tools.md says why."""
MIN_ANSWER_CHARS = 2_000
"""The smallest cap: room for the status lines, an error's location and the notes, with some output."""
_NOTE_CHARS = 1_000  # the names and reasons of a note (unsaved variables...); more are counted


class ToolSession(Protocol):
    """What ``PythonTool`` needs of a session (``orchestrator.Session`` is one)."""

    def execute(self, code: str, timeout: float | None = None) -> ExecResult: ...

    def reset(self) -> None: ...


class _BadCall(Exception):
    """The model's call cannot be run; the message tells the model what to fix."""


class PythonTool:
    """Tools for a model over one persistent session: run code, reset the variables, and (``undo``) take a call back.

    Args:
        session: the session the code runs in (``Orchestrator.create_session()``, or anything
            with ``execute(code, timeout=...)`` and ``reset()``).
        max_timeout: the most seconds a model may ask for with ``timeout_seconds``; None for no cap.
        max_answer_chars: the most characters of one answer (default 20,000): longer output, values and
            tracebacks are cut to their head and tail, with a marker saying what was left out.
        output_dir: a directory on the host where the whole text of what an answer cut is kept, when the session
            kept no file of it (``Session.as_tool`` gives the session's own); None keeps nothing more.
        max_output_files: files kept in ``output_dir``; the oldest go first.
        undo: also offer ``undo_last_cell``, which rewinds the session to before the model's last call that changed
            its variables (again: the call before that); the session needs ``generation``, ``history()`` and
            ``rewind()``, as ``orchestrator.Session`` has. Off by default.

    Raises:
        ConfigError: an argument out of range (a cap below ``MIN_ANSWER_CHARS``, a timeout cap that is not positive),
            or ``undo`` for a session that cannot rewind.
    """

    def __init__(
        self,
        session: ToolSession,
        *,
        max_timeout: float | None = None,
        max_answer_chars: int = DEFAULT_ANSWER_CHARS,
        output_dir: str | os.PathLike[str] | None = None,
        max_output_files: int = 64,
        undo: bool = False,
    ) -> None:
        if max_timeout is not None and not (is_number(max_timeout) and 0 < max_timeout < math.inf):
            raise ConfigError(f"max_timeout must be a positive number of seconds, got {max_timeout!r}")
        if not (is_integer(max_answer_chars) and max_answer_chars >= MIN_ANSWER_CHARS):
            raise ConfigError(
                f"max_answer_chars must be a number of characters of at least {MIN_ANSWER_CHARS:,}, "
                f"got {max_answer_chars!r}"
            )
        if not (is_count(max_output_files) and max_output_files > 0):
            raise ConfigError(f"max_output_files must be a positive int, got {max_output_files!r}")
        if output_dir is not None and not isinstance(output_dir, str | os.PathLike):
            raise ConfigError(f"output_dir must be a path (str or os.PathLike), got {type(output_dir).__name__}")
        if not isinstance(undo, bool):
            raise ConfigError(f"undo must be True or False, got {undo!r}")
        if undo and not all(hasattr(session, name) for name in ("generation", "history", "rewind")):
            raise ConfigError(
                f"undo=True needs a session that can rewind (generation, history(), rewind()), which a "
                f"{type(session).__name__} cannot; orchestrator.Session can"
            )
        self.session = session
        self.max_timeout = max_timeout
        self.max_answer_chars = max_answer_chars
        self.output_dir = None if output_dir is None else Path(output_dir)
        self.max_output_files = max_output_files
        self._undo = UndoLog(cast(Rewindable, session)) if undo else None

    @property
    def undo(self) -> bool:
        """Whether the model is offered ``undo_last_cell``."""
        return self._undo is not None

    @property
    def definitions(self) -> list[dict[str, Any]]:
        """The tools in OpenAI's ``tools=`` format (a new list each time, free to change)."""
        limit = f" (at most {self.max_timeout:g})" if self.max_timeout is not None else ""
        tools = [
            _function(
                EXECUTE,
                "Run Python code in a persistent Python session in a sandbox (no network). Variables, "
                "imports and functions stay from one call to the next. Returns what the code printed, the "
                "value of a final expression (as in a REPL), and for an error its type, message, line, "
                "column and traceback.",
                {
                    "code": {"type": "string", "description": "The Python code to run."},
                    "timeout_seconds": {
                        "type": "number",
                        "description": f"Seconds the code may run{limit}; the session's default when left out.",
                    },
                },
                required=["code"],
            ),
            _function(
                RESET,
                "Reset the Python session: clears all variables, imports and functions. The runtime (the "
                "sandbox and what is installed in it) keeps running.",
                {},
            ),
        ]
        if self._undo is not None:
            tools.append(
                _function(
                    UNDO,
                    f"Undo your last {EXECUTE} (or {RESET}) call that changed variables: they go back to what they "
                    "were before it. Call it again to undo the call before that one. Only variables are undone: "
                    "files the code wrote stay, and what it printed is not taken back.",
                    {},
                )
            )
        return tools

    def handle(self, name: str, arguments: str | Mapping[str, Any] | None) -> str:
        """Run one tool call and describe its outcome for the model.

        Args:
            name: the function the model called.
            arguments: its arguments, as the JSON text the model wrote or as a dict.

        Returns:
            The text to hand back to the model; bad arguments and failed calls are described, not raised.
        """
        try:
            args = _parse(arguments)
            if name == EXECUTE:
                code, timeout = self._execute_args(args)
                return self._execute(code, timeout)
            if name == RESET:
                _no_other_keys(args, set())
                return self._reset()
            if name == UNDO and self._undo is not None:
                _no_other_keys(args, set())
                return self._undo_last()
            names = [tool["function"]["name"] for tool in self.definitions]
            listed = ", ".join(names[:-1]) + f" and {names[-1]}"
            raise _BadCall(f"There is no tool {str(name)[:100]!r}; the tools are {listed}.")
        except _BadCall as exc:
            logger.debug("tool call %.100r rejected: %s", name, exc)
            answer = Answer()
            answer.line("status: invalid call")
            answer.line(field(str(exc), 4 * FIELD_CHARS))
            return self._render(answer)

    def handle_tool_call(self, tool_call: Any) -> dict[str, str]:
        """Run a tool call from a chat completion and build the message that answers it.

        Args:
            tool_call: an ``openai`` ``ChatCompletionMessageToolCall`` (``.id``, ``.function.name``,
                ``.function.arguments``), or the same as a dict.

        Returns:
            ``{"role": "tool", "tool_call_id": ..., "content": ...}``, to append to the messages.
        """
        function = _field(tool_call, "function")
        content = self.handle(str(_field(function, "name")), _field(function, "arguments"))
        return {"role": "tool", "tool_call_id": str(_field(tool_call, "id")), "content": content}

    def _execute_args(self, args: dict[str, Any]) -> tuple[str, float | None]:
        _no_other_keys(args, {"code", "timeout_seconds"})
        if "code" not in args:
            raise _BadCall(f'{EXECUTE} needs the argument "code" (a string of Python source).')
        code = args["code"]
        if not isinstance(code, str):
            raise _BadCall(f'"code" must be a string of Python source, not {_json_type(code)}.')
        timeout = args.get("timeout_seconds")
        if timeout is None:
            return code, None
        if not is_number(timeout):
            raise _BadCall(f'"timeout_seconds" must be a number of seconds, not {_json_type(timeout)}.')
        try:
            seconds = float(timeout)
        except OverflowError:  # an integer too large for a float
            seconds = math.inf
        if not math.isfinite(seconds):
            raise _BadCall('"timeout_seconds" must be a finite number of seconds.')
        if seconds <= 0:
            raise _BadCall(f'"timeout_seconds" must be more than 0, got {seconds:g}.')
        if self.max_timeout is not None and seconds > self.max_timeout:
            raise _BadCall(f'"timeout_seconds" may be at most {self.max_timeout:g}, got {seconds:g}.')
        return code, seconds

    def _execute(self, code: str, timeout: float | None) -> str:
        started = time.monotonic()
        try:
            with self._changes():
                result = self.session.execute(code, timeout=timeout)
        except ConfigError as exc:  # the session refused the arguments (e.g. text that is not valid Unicode)
            raise _BadCall(str(exc)) from None
        except OrchestratorError as exc:
            return self._render(describe_failure(exc, time.monotonic() - started))
        return self._render(describe_result(result))

    def _reset(self) -> str:
        started = time.monotonic()
        try:
            with self._changes():
                self.session.reset()
        except OrchestratorError as exc:
            return self._render(describe_failure(exc, time.monotonic() - started))
        return (
            "status: success\n"
            "The Python session was reset: all variables, imports and functions are gone. "
            "The sandbox keeps running.\n"
        )

    def _changes(self) -> AbstractContextManager[None]:
        """Around a call that may change the variables: noted for ``undo_last_cell`` when it is offered (``orchestrator
        mcp`` wraps the model's other calls that change them in it too: a rewind, a context)."""
        return contextlib.nullcontext() if self._undo is None else self._undo.call()

    def _undo_last(self) -> str:
        assert self._undo is not None
        started = time.monotonic()
        try:
            return self._render(self._undo.undo())
        except OrchestratorError as exc:
            return self._render(describe_failure(exc, time.monotonic() - started))

    def _render(self, answer: Answer) -> str:
        return answer.render(self.max_answer_chars, self._keep)

    def _keep(self, label: str, text: str) -> Path | None:
        """Save the whole text of a section an answer cut, in ``output_dir``; None when there is none or it failed."""
        if self.output_dir is None:
            return None
        try:
            path = save_output(self.output_dir, label.replace(" ", "-"), text.encode("utf-8", "surrogatepass"))
        except OSError as exc:
            logger.warning("could not keep the whole %s of a tool answer in %s: %s", label, self.output_dir, exc)
            return None
        keep_newest(self.output_dir, self.max_output_files)
        return path


def describe_result(result: ExecResult) -> Answer:
    """The model's view of a completed call: status, time, output, value or error, and notes."""
    answer = Answer()
    answer.line(f"status: {'success' if result.ok else 'error'}")
    answer.line(f"elapsed: {_seconds(result.duration)}")
    if result.stdout or result.stdout_path is not None:
        answer.section("stdout", result.stdout, file=result.stdout_path)
    if result.stderr or result.stderr_path is not None:
        answer.section("stderr", result.stderr, file=result.stderr_path)
    if result.return_value is not None:
        answer.section("return value", result.return_value, inline=True)
    error = result.error
    if error is not None:
        answer.line(f"error: {field(error.summary, 2 * FIELD_CHARS)}")
        if "\n" in error.message.strip():  # the summary has its first line only
            answer.section("error message", error.message, inline=True)
        if error.snippet:
            source = error.snippet.expandtabs()  # the pointer copies the snippet's tabs: expanded alike, they line up
            snippet = field(source)
            pointer = error.pointer.expandtabs() if snippet == source else ""  # under the source as written only
            answer.line(f"    {snippet}" + (f"\n    {pointer}" if pointer else ""))
        if error.traceback.startswith("Traceback"):  # the user's frames (none for a cell that did not parse)
            answer.section("traceback", error.traceback)
    if error is not None and error.hint is not None:
        answer.line(f"hint: {error.hint}")
    if not (result.stdout or result.stderr or result.return_value is not None or error is not None):
        answer.line("(no output and no value)")
    if result.unsaved:
        answer.line(
            "note: these variables could not be saved and will be lost if the sandbox restarts: "
            + _listed(result.unsaved)
        )
    if result.restore_failures:
        answer.line(
            "note: the sandbox had restarted and these variables could not be brought back: "
            + _listed(result.restore_failures)
        )
    return answer


def describe_failure(exc: OrchestratorError, elapsed: float) -> Answer:
    """The model's view of a call the sandbox could not complete: a timeout, a crash, another failure."""
    if isinstance(exc, ExecutionTimeout):
        status = "timeout"
    elif isinstance(exc, SandboxOutOfMemory):
        status = "out of memory"
    elif isinstance(exc, SandboxCrashed):
        status = "crashed"
    else:
        status = "failed"
    answer = Answer()
    answer.line(f"status: {status}")
    answer.line(f"elapsed: {_seconds(elapsed)}")
    answer.section("what happened", str(exc), inline=True)
    if isinstance(exc, ExecutionTimeout):
        if exc.stdout:
            answer.section("stdout before the interrupt", exc.stdout)
        if exc.stderr:
            answer.section("stderr before the interrupt", exc.stderr)
    if getattr(exc, "restored", False):
        answer.line(
            "note: the session was restored to its last saved state: what earlier calls defined is "
            "there, what this call changed is lost."
        )
    return answer


def _listed(reasons: Mapping[str, str]) -> str:
    """``name (reason); ...`` for a note: sandbox text made safe, as many as fit ``_NOTE_CHARS``, the rest counted."""
    names = sorted(reasons)
    listed: list[str] = []
    size = 0
    for name in names:
        entry = f"{field(name, 100)} ({field(reasons[name], 200)})"
        if size + len(entry) > _NOTE_CHARS and listed:
            return "; ".join(listed) + f"; and {len(names) - len(listed):,} more"
        listed.append(entry)
        size += len(entry) + 2
    return "; ".join(listed)


def _function(
    name: str, description: str, properties: dict[str, Any], required: list[str] | None = None
) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": required or [], "additionalProperties": False}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def _parse(arguments: str | Mapping[str, Any] | None) -> dict[str, Any]:
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if not isinstance(arguments, str):
        raise _BadCall("The arguments must be a JSON object.")
    try:
        parsed = json.loads(arguments)
    except ValueError as exc:
        raise _BadCall(f"The arguments are not valid JSON ({exc}); send a JSON object.") from None
    if not isinstance(parsed, dict):
        raise _BadCall(f"The arguments must be a JSON object, not {_json_type(parsed)}.")
    return parsed


def _no_other_keys(args: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(str(key)[:100] for key in args if key not in allowed)
    if unknown:
        expected = ", ".join(sorted(allowed)) or "none"
        raise _BadCall(f"Unexpected argument(s): {', '.join(unknown)}. The arguments are: {expected}.")


def _json_type(value: object) -> str:
    names = {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "an object",
    }
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def _seconds(value: float) -> str:
    return f"{value:.3f} s"
