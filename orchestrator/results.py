"""Typed results of calls, built from agent replies that ``messages`` validated field by field."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .messages import ExecReply, expect


@dataclass(frozen=True)
class ExecError:
    """An exception raised by the user's code: data for the caller, never re-raised by us."""

    type: str
    message: str
    line: int | None
    snippet: str
    traceback: str

    def __str__(self) -> str:
        where = f" (line {self.line}: {self.snippet.strip()})" if self.line else ""
        return f"{self.type}: {self.message}{where}"

    @classmethod
    def from_reply(cls, data: dict[str, Any]) -> ExecError:
        return cls(
            type=expect(data, "ename", str),
            message=expect(data, "evalue", str),
            line=expect(data, "line", int, optional=True),
            snippet=expect(data, "snippet", str),
            traceback=expect(data, "traceback", str),
        )


@dataclass(frozen=True)
class ExecResult:
    """What one ``Session.execute`` call produced.

    Attributes:
        stdout: captured standard output (truncated with a marker past the output limit).
        stderr: captured standard error (likewise).
        return_value: repr of the cell's trailing expression, or None.
        error: the user's exception, or None when the cell completed.
        duration: seconds the cell ran inside the sandbox.
        unsaved: variables that could not be checkpointed, with the reason; they are lost
            if the sandbox restarts.
        generation: the checkpoint generation that holds the state after this call.
        checkpoint_duration: seconds the checkpoint of this call took (not part of ``duration``
            and not counted against the cell's timeout).
        restore_failures: values a restore before this call (the sandbox had died between
            calls) could not bring back, with the reason; they were dropped.
        scaffold: what the session scaffold's ``after_cell`` returned (``Session.set_scaffold``), or None.
    """

    stdout: str = ""
    stderr: str = ""
    return_value: str | None = None
    error: ExecError | None = None
    duration: float = 0.0
    unsaved: dict[str, str] = field(default_factory=dict)
    generation: int = 0
    checkpoint_duration: float = 0.0
    restore_failures: dict[str, str] = field(default_factory=dict)
    scaffold: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        """True when the user's code ran to the end without raising."""
        return self.error is None

    @classmethod
    def from_reply(
        cls, reply: ExecReply, unsaved: dict[str, str], generation: int, restore_failures: dict[str, str]
    ) -> ExecResult:
        error = reply["error"]
        return cls(
            stdout=reply["stdout"],
            stderr=reply["stderr"],
            return_value=reply["return_value"],
            error=None if error is None else ExecError.from_reply(error),
            duration=reply["duration"],
            unsaved=unsaved,
            generation=generation,
            checkpoint_duration=reply["checkpoint_duration"],
            restore_failures=restore_failures,
            scaffold=reply["scaffold"],
        )
