"""A session as an LLM tool: OpenAI-style function definitions, and plain-text answers the model can read.

``PythonTool`` offers two functions to a model, ``execute_code`` and ``reset_repl``, and turns
each call into text: the status, the time, the output, the value, and for an error its type,
message, line, column, source line with a caret under the column, and the user's traceback.
Nothing a model sends makes it raise: bad arguments and failures of the sandbox (a timeout, a
crash) are answers too, so a tool-calling loop can hand every call back to the model.
The text format and an example loop are in docs/tools.md.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from typing import Any, Protocol

from ..checks import is_number
from ..errors import ConfigError, ExecutionTimeout, OrchestratorError, SandboxCrashed, SandboxOutOfMemory
from .results import ExecResult

logger = logging.getLogger(__name__)

EXECUTE = "execute_code"
RESET = "reset_repl"


class ToolSession(Protocol):
    """What ``PythonTool`` needs of a session (``orchestrator.Session`` is one)."""

    def execute(self, code: str, timeout: float | None = None) -> ExecResult: ...

    def reset(self) -> None: ...


class _BadCall(Exception):
    """The model's call cannot be run; the message tells the model what to fix."""


class PythonTool:
    """Two tools for a model over one persistent session: run code, and reset the variables.

    Args:
        session: the session the code runs in (``Orchestrator.create_session()``, or anything
            with ``execute(code, timeout=...)`` and ``reset()``).
        max_timeout: the most seconds a model may ask for with ``timeout_seconds``; None for no cap.
    """

    def __init__(self, session: ToolSession, *, max_timeout: float | None = None) -> None:
        if max_timeout is not None and not (isinstance(max_timeout, int | float) and max_timeout > 0):
            raise ConfigError(f"max_timeout must be a positive number of seconds, got {max_timeout!r}")
        self.session = session
        self.max_timeout = max_timeout

    @property
    def definitions(self) -> list[dict[str, Any]]:
        """The tools in OpenAI's ``tools=`` format (a new list each time, free to change)."""
        limit = f" (at most {self.max_timeout:g})" if self.max_timeout is not None else ""
        return [
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
            raise _BadCall(f"There is no tool {str(name)[:100]!r}; the tools are {EXECUTE} and {RESET}.")
        except _BadCall as exc:
            logger.debug("tool call %.100r rejected: %s", name, exc)
            return f"status: invalid call\n{exc}\n"

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
            result = self.session.execute(code, timeout=timeout)
        except ConfigError as exc:  # the session refused the arguments (e.g. text that is not valid Unicode)
            raise _BadCall(str(exc)) from None
        except OrchestratorError as exc:
            return describe_failure(exc, time.monotonic() - started)
        return describe_result(result)

    def _reset(self) -> str:
        started = time.monotonic()
        try:
            self.session.reset()
        except OrchestratorError as exc:
            return describe_failure(exc, time.monotonic() - started)
        return (
            "status: success\n"
            "The Python session was reset: all variables, imports and functions are gone. "
            "The sandbox keeps running.\n"
        )


def describe_result(result: ExecResult) -> str:
    """The model's view of a completed call: status, time, output, value or error, and notes."""
    parts = [f"status: {'success' if result.ok else 'error'}\n", f"elapsed: {_seconds(result.duration)}\n"]
    parts += _output("stdout", result.stdout, result.stdout_path)
    parts += _output("stderr", result.stderr, result.stderr_path)
    if result.return_value is not None:
        parts.append(_block("return value", result.return_value))
    error = result.error
    if error is not None:
        parts.append(f"error: {error.summary}\n")
        if "\n" in error.message.strip():  # the summary has its first line only
            parts.append(_block("error message", error.message))
        if error.snippet:
            pointer = error.pointer
            parts.append(f"    {error.snippet}\n" + (f"    {pointer}\n" if pointer else ""))
        if error.traceback.startswith("Traceback"):  # the user's frames (none for a cell that did not parse)
            parts.append(_block("traceback", error.traceback))
    if not (result.stdout or result.stderr or result.return_value is not None or error is not None):
        parts.append("(no output and no value)\n")
    if result.unsaved:
        parts.append(
            "note: these variables could not be saved and will be lost if the sandbox restarts: "
            + "; ".join(f"{name} ({reason})" for name, reason in sorted(result.unsaved.items()))
            + "\n"
        )
    if result.restore_failures:
        parts.append(
            "note: the sandbox had restarted and these variables could not be brought back: "
            + "; ".join(f"{name} ({reason})" for name, reason in sorted(result.restore_failures.items()))
            + "\n"
        )
    return "".join(parts)


def describe_failure(exc: OrchestratorError, elapsed: float) -> str:
    """The model's view of a call the sandbox could not complete: a timeout, a crash, another failure."""
    if isinstance(exc, ExecutionTimeout):
        status = "timeout"
    elif isinstance(exc, SandboxOutOfMemory):
        status = "out of memory"
    elif isinstance(exc, SandboxCrashed):
        status = "crashed"
    else:
        status = "failed"
    parts = [f"status: {status}\n", f"elapsed: {_seconds(elapsed)}\n", _block("what happened", str(exc))]
    if isinstance(exc, ExecutionTimeout):
        parts += _output("stdout before the interrupt", exc.stdout, None)
        parts += _output("stderr before the interrupt", exc.stderr, None)
    if getattr(exc, "restored", False):
        parts.append(
            "note: the session was restored to its last saved state: what earlier calls defined is "
            "there, what this call changed is lost.\n"
        )
    return "".join(parts)


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


def _block(label: str, text: str) -> str:
    """``label: text`` on one line, or the label alone above a multi-line text."""
    text = text.rstrip("\n")
    if "\n" in text:
        return f"{label}:\n{text}\n"
    return f"{label}: {text}\n"


def _output(label: str, text: str, path: object) -> list[str]:
    if not text and path is None:
        return []
    parts = [f"{label}:\n{text}" + ("" if text.endswith("\n") or not text else "\n")]
    if path is not None:
        parts.append(
            f"note: {label} was too long: above is its beginning and end only; the full text is in the file {path}\n"
        )
    return parts
