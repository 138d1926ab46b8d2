"""From what the cells of a submission did to its outcome: pure logic, no sandbox.

Precedence: the code must run to its end (else ``timeout``, ``oom``, ``output_limit``,
``crashed`` or ``error``), then its tests (an ``AssertionError`` is ``failed``, any other
exception ``error``), then its stdout must match ``expected_stdout`` (else ``failed`` with a diff).
A ``MemoryError`` raised in Python counts as ``oom``: the submission ran out of its memory
limit either way, whether the kernel killed it or the allocator refused.
"""

from __future__ import annotations

import difflib
import enum
from dataclasses import dataclass
from typing import Any

from ..api.results import ExecError

MAX_DIFF_LINES = 60


class Status(str, enum.Enum):
    """A submission's outcome (its ``status`` in the results file)."""

    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    TIMEOUT = "timeout"
    OOM = "oom"
    OUTPUT_LIMIT = "output_limit"
    CRASHED = "crashed"
    INFRA_ERROR = "infra_error"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class CellRun:
    """What one cell of a submission did in its sandbox.

    ``ended`` is the cell's own ending: "ok", "error" (its code raised), or the status that
    stopped it ("timeout", "oom", "output_limit", "crashed"); ``reason`` says why for those.
    """

    ended: str
    stdout: str = ""
    stderr: str = ""
    error: ExecError | None = None
    duration: float = 0.0
    reason: str = ""
    signal: str | None = None
    """The signal that ended the submission's interpreter (``SIGSEGV``), as the grading harness saw it from
    ``waitpid``; None when it exited, or the grading stopped it (timeout, output limit)."""


@dataclass(frozen=True)
class Verdict:
    status: Status
    message: str
    phase: str | None = None  # "code" or "tests": the cell that decided it
    error: ExecError | None = None
    diff: str | None = None
    signal: str | None = None


def grade(code: CellRun, tests: CellRun | None, expected_stdout: str | None) -> Verdict:
    """The outcome of a submission whose ``code`` cell (and ``tests`` cell, when it has tests) ran."""
    stopped = _stopped(code, "code")
    if stopped is not None:
        return stopped
    if tests is not None:
        stopped = _stopped(tests, "tests")
        if stopped is not None:
            if stopped.status is Status.ERROR and stopped.error is not None and stopped.error.type == "AssertionError":
                return Verdict(Status.FAILED, _assertion_message(stopped.error), "tests", stopped.error)
            return stopped
    if expected_stdout is not None and not stdout_matches(expected_stdout, code.stdout):
        diff = stdout_diff(expected_stdout, code.stdout)
        return Verdict(Status.FAILED, "stdout differs from expected_stdout", "code", diff=diff)
    return Verdict(Status.PASSED, "passed" + (" its tests" if tests is not None else ""))


def _stopped(run: CellRun, phase: str) -> Verdict | None:
    """The verdict of a cell that did not run to its end (None when it did)."""
    if run.ended == "ok":
        return None
    if run.ended == "error":
        assert run.error is not None
        if run.error.type == "MemoryError":
            return Verdict(Status.OOM, f"the {phase} ran out of memory (MemoryError)", phase, run.error)
        return Verdict(Status.ERROR, f"the {phase} raised {run.error.summary}", phase, run.error)
    status = Status(run.ended)
    message = f"the {phase} {run.reason}" if run.reason else str(status)
    return Verdict(status, message, phase, run.error, signal=run.signal)


def _assertion_message(error: ExecError) -> str:
    where = f" at line {error.line}" if error.line is not None else ""
    text = f"assertion failed{where}"
    if error.snippet.strip():
        text += f": {error.snippet.strip()}"
    if error.message.strip():
        text += f" ({error.message.strip().splitlines()[0]})"
    return text


def _normal_lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def stdout_matches(expected: str, actual: str) -> bool:
    """Equal line by line, ignoring trailing whitespace on each line and blank lines at the end."""
    return _normal_lines(expected) == _normal_lines(actual)


def stdout_diff(expected: str, actual: str) -> str:
    """A unified diff (expected -> actual) of at most ``MAX_DIFF_LINES`` lines."""
    lines = list(
        difflib.unified_diff(
            _normal_lines(expected), _normal_lines(actual), "expected_stdout", "stdout", n=2, lineterm=""
        )
    )
    if len(lines) > MAX_DIFF_LINES:
        lines = [*lines[:MAX_DIFF_LINES], f"... ({len(lines) - MAX_DIFF_LINES} more diff lines)"]
    return "\n".join(lines)


def error_json(error: ExecError | None) -> dict[str, Any] | None:
    """The exception of a result as the results file writes it."""
    if error is None:
        return None
    return {
        "type": error.type,
        "message": error.message,
        "line": error.line,
        "column": error.column,
        "snippet": error.snippet,
        "traceback": error.traceback,
    }
