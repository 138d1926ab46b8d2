"""What rlms sees of a cell: a REPLResult from our ExecResult, or from the sandbox failure the cell ended in.

rlms reads ``stdout``/``stderr`` and shows them to the model, so a cell that raised has its
traceback in ``stderr`` (as in the peer), and a cell that timed out or crashed the sandbox
comes back as a result whose ``stderr`` says what happened and what the variables are now,
never as an exception: for the model these are facts about its code, like any error.
"""

from __future__ import annotations

from typing import Any

from ..api.results import ExecResult
from ..errors import ExecutionTimeout, ProtocolError, SandboxError, SandboxOutOfMemory
from ._upstream import REPLResult, RLMChatCompletion

_ROLLED_BACK = "Variables are as they were after the last cell that completed; what this cell changed is lost."


class DockerREPLResult(REPLResult):
    """rlms' ``REPLResult`` plus what the session knows besides.

    Attributes:
        unsaved: variables that could not be checkpointed, with the reason: they live on in
            memory but would be lost if the sandbox restarted (the peer drops them silently).
        return_value: repr of the cell's trailing expression, or None (rlms does not show it).
    """

    def __init__(
        self,
        stdout: str,
        stderr: str,
        locals: dict[str, Any],
        execution_time: float | None = None,
        rlm_calls: list[RLMChatCompletion] | None = None,
        final_answer: str | None = None,
        *,
        unsaved: dict[str, str] | None = None,
        return_value: str | None = None,
    ) -> None:
        super().__init__(stdout, stderr, locals, execution_time, rlm_calls, final_answer)
        self.unsaved = dict(unsaved or {})
        self.return_value = return_value


def _join(text: str, more: str) -> str:
    if not more:
        return text
    if text and not text.endswith("\n"):
        text += "\n"
    return text + more


def _lost(failures: dict[str, str]) -> str:
    if not failures:
        return ""
    names = ", ".join(sorted(failures))
    return f"Note: the sandbox restarted, and these values could not be restored and are gone: {names}\n"


def from_exec(result: ExecResult, calls: list[RLMChatCompletion], seconds: float) -> DockerREPLResult:
    """The REPLResult of a cell that ran to its end (raising or not)."""
    stderr = _join(_lost(result.restore_failures), result.stderr)
    if result.error is not None:
        stderr = _join(stderr, result.error.traceback)
    scaffold: Any = result.scaffold
    scaffold = scaffold if isinstance(scaffold, dict) else {}
    shown = scaffold.get("locals")
    local_reprs = {k: v for k, v in shown.items() if isinstance(v, str)} if isinstance(shown, dict) else {}
    final = scaffold.get("final_answer")
    return DockerREPLResult(
        stdout=result.stdout,
        stderr=stderr,
        locals=local_reprs,
        execution_time=seconds,
        rlm_calls=calls,
        final_answer=final if isinstance(final, str) else None,
        unsaved=result.unsaved,
        return_value=result.return_value,
    )


def from_failure(
    exc: SandboxError | ProtocolError, calls: list[RLMChatCompletion], seconds: float, *, timeout: float, memory: str
) -> DockerREPLResult:
    """The REPLResult of a cell that timed out or took the sandbox down; the session is usable again."""
    stdout = stderr = ""
    if isinstance(exc, ExecutionTimeout):
        stdout, stderr = exc.stdout, exc.stderr
        if exc.restored:
            what = (
                f"TimeoutError: the cell ran longer than {timeout:g} s and did not stop when interrupted, "
                f"so the sandbox's Python process was replaced. {_ROLLED_BACK}"
            )
        else:
            what = (
                f"TimeoutError: the cell ran longer than {timeout:g} s and was interrupted. "
                "Variables keep what the cell did before the interrupt."
            )
    elif isinstance(exc, SandboxOutOfMemory):
        what = f"MemoryError: the cell used more than the sandbox's {memory} of memory and was killed. {_ROLLED_BACK}"
    elif isinstance(exc, ProtocolError):
        what = f"SandboxError: the sandbox broke the protocol with its host and was replaced. {_ROLLED_BACK}"
    else:
        what = f"SandboxCrashed: the Python process running the cell died. {_ROLLED_BACK}"
    stderr = _join(_join(stderr, what + "\n"), _lost(exc.restore_failures))
    return DockerREPLResult(stdout=stdout, stderr=stderr, locals={}, execution_time=seconds, rlm_calls=calls)
