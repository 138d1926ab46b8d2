"""Typed results of calls, built from agent replies that are validated field by field.

The host never trusts an agent reply: every field is checked for type and size before it
becomes part of an ``ExecResult``; anything else raises ``ProtocolError``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from .errors import ProtocolError

T = TypeVar("T")
_MAX_NAMES = 100_000


def expect(header: dict[str, Any], key: str, kind: type[T] | tuple[type, ...], *, optional: bool = False) -> T:
    """Return ``header[key]`` if it has the expected type, else raise ProtocolError."""
    value = header.get(key)
    if value is None and optional:
        return value  # type: ignore[return-value]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise ProtocolError(f"agent reply field {key!r} should be {kind}, got {type(value).__name__}")
    return value  # type: ignore[return-value]


def expect_str_map(header: dict[str, Any], key: str) -> dict[str, str]:
    """A JSON object of string to string (variable names to digests or reasons)."""
    value = expect(header, key, dict)
    if len(value) > _MAX_NAMES or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ProtocolError(f"agent reply field {key!r} should map names to strings")
    return value


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
    def from_reply(cls, data: Any) -> ExecError:
        if not isinstance(data, dict):
            raise ProtocolError("agent reply field 'error' should be an object")
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
    """

    stdout: str = ""
    stderr: str = ""
    return_value: str | None = None
    error: ExecError | None = None
    duration: float = 0.0
    unsaved: dict[str, str] = field(default_factory=dict)
    generation: int = 0

    @property
    def ok(self) -> bool:
        """True when the user's code ran to the end without raising."""
        return self.error is None

    @classmethod
    def from_reply(cls, header: dict[str, Any], unsaved: dict[str, str], generation: int) -> ExecResult:
        error = header.get("error")
        return cls(
            stdout=expect(header, "stdout", str),
            stderr=expect(header, "stderr", str),
            return_value=expect(header, "return_value", str, optional=True),
            error=None if error is None else ExecError.from_reply(error),
            duration=float(expect(header, "duration", (int, float))),
            unsaved=unsaved,
            generation=generation,
        )
