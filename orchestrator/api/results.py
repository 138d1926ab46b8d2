"""Typed results of calls, built from agent replies that ``wire.replies`` validated field by field."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..agent.reply_types import ExecReply
from ..runtime.output import StreamRecorder
from ..state.history import Snapshot
from ..state.store import SessionRecord
from ..wire.replies import expect, expect_count
from . import hints

_MAX_POSITION = 1 << 31  # a line or column number of a cell
_MAX_TYPE_NAME = 1000  # an exception's qualified class name


@dataclass(frozen=True)
class ExecError:
    """An exception raised by the user's code: data for the caller, never re-raised by us.

    Attributes:
        type: the exception's class name (``"NameError"``).
        message: ``str()`` of the exception (of a SyntaxError: its ``msg``, without the file and line).
        line: 1-based line in the cell where it happened, or None.
        snippet: that line of source as written, indentation kept ("" when unknown).
        traceback: the user's own frames and the exception, formatted as Python does.
        column: 1-based column in ``snippet``: a SyntaxError's offset, or (sandboxes on
            Python 3.11+) where the failing expression starts; None when unknown.
        end_column: 1-based column just past the failing range when it ends on the same line, or None.
    """

    type: str
    message: str
    line: int | None
    snippet: str
    traceback: str
    column: int | None = None
    end_column: int | None = None

    @property
    def hint(self) -> str | None:
        """What to do instead, for an error a sandbox makes by design (no pip, no network), else None."""
        return hints.hint(self.type, self.message)

    @property
    def pointer(self) -> str:
        """A caret line to print under ``snippet``: ``^`` under the column (``^^^`` over a known range), or "".

        Tabs in the snippet before the column are copied, so the carets line up however tabs are shown.
        """
        if self.column is None or not self.snippet or not 1 <= self.column <= len(self.snippet) + 1:
            return ""
        start = self.column - 1
        stop = start + 1
        if self.end_column is not None and self.end_column > self.column:
            stop = max(stop, min(self.end_column - 1, len(self.snippet)))
        pad = "".join("\t" if char == "\t" else " " for char in self.snippet[:start])
        return pad + "^" * (stop - start)

    @property
    def summary(self) -> str:
        """One line: ``SyntaxError at line 1, column 18: expected ':'`` (as much of that as is known)."""
        where = ""
        if self.line is not None:
            where = f" at line {self.line}" + (f", column {self.column}" if self.column is not None else "")
        lines = self.message.strip().splitlines()
        if not lines:
            return f"{self.type}{where}"
        return f"{self.type}{where}: {lines[0]}" + (" ..." if len(lines) > 1 else "")

    def __str__(self) -> str:
        where = f" (line {self.line}: {self.snippet.strip()})" if self.line else ""
        return f"{self.type}: {self.message}{where}"

    @classmethod
    def from_reply(cls, data: dict[str, Any]) -> ExecError:
        """The reply's ``error`` object, every field typed and bounded (ProtocolError otherwise)."""
        return cls(
            type=expect(data, "ename", str)[:_MAX_TYPE_NAME],
            message=expect(data, "evalue", str),
            line=expect_count(data, "line", _MAX_POSITION, optional=True),
            snippet=expect(data, "snippet", str),
            traceback=expect(data, "traceback", str),
            column=expect_count(data, "column", _MAX_POSITION, optional=True),
            end_column=expect_count(data, "end_column", _MAX_POSITION, optional=True),
        )


@dataclass(frozen=True)
class ExecResult:
    """What one ``Session.execute`` call produced.

    Attributes:
        stdout: captured standard output as text (truncated with a marker past the output limit); what the cell
            wrote is decoded as UTF-8, a byte that is not UTF-8 (``sys.stdout.buffer.write``) becomes U+FFFD.
        stderr: captured standard error (likewise).
        return_value: repr of the cell's trailing expression, or None.
        error: the user's exception, or None when the cell completed.
        duration: seconds the cell ran inside the sandbox.
        unsaved: variables that could not be checkpointed, with the reason; they are lost
            if the sandbox restarts. Every such name, at every call for as long as it stays unsaved.
        newly_unsaved: the names of ``unsaved`` that were not unsaved before this call (a generator this cell
            made, a value that grew past the quota): what to tell a person once (the CLI shows these only).
        generation: the checkpoint generation that holds the state after this call.
        checkpoint_duration: seconds the checkpoint of this call took (not part of ``duration``
            and not counted against the cell's timeout).
        restore_failures: values a restore before this call (the sandbox had died between
            calls) could not bring back, with the reason; they were dropped.
        scaffold: what the session scaffold's ``after_cell`` returned (``Session.set_scaffold``), or None.
        stdout_path: the whole stdout of the call on the host when it went past the output limit
            (the ``stdout`` field then holds a head-and-tail preview), else None.
        stderr_path: the whole stderr of the call on the host when it went past the output limit
            (the ``stderr`` field then holds a head-and-tail preview), else None.
        callback_errors: what the ``on_output`` callback raised during the call (it went on regardless).
        stdout_bytes: ``stdout`` byte for byte as the cell wrote it, where ``stdout`` is only its text (past the
            output limit: the preview's head and tail as written; ``stdout_path`` holds every byte).
        stderr_bytes: ``stderr`` byte for byte (likewise; ``stderr_path``).
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
    stdout_path: Path | None = None
    stderr_path: Path | None = None
    callback_errors: tuple[str, ...] = ()
    stdout_bytes: bytes = field(default=b"", repr=False)
    stderr_bytes: bytes = field(default=b"", repr=False)
    newly_unsaved: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Given only the text (the reply of an agent that sent no bytes, or a result made by hand): its UTF-8.
        for name in ("stdout", "stderr"):
            text = getattr(self, name)
            if text and not getattr(self, f"{name}_bytes"):
                object.__setattr__(self, f"{name}_bytes", text.encode("utf-8", "surrogatepass"))

    @property
    def ok(self) -> bool:
        """True when the user's code ran to the end without raising."""
        return self.error is None

    @classmethod
    def from_reply(
        cls,
        reply: ExecReply,
        unsaved: dict[str, str],
        generation: int,
        restore_failures: dict[str, str],
        newly_unsaved: dict[str, str] | None = None,
    ) -> ExecResult:
        """The result of a parsed reply; ``newly_unsaved`` None: every name of ``unsaved`` is new."""
        error = reply["error"]
        return cls(
            stdout=reply["stdout"],
            stderr=reply["stderr"],
            return_value=reply["return_value"],
            error=None if error is None else ExecError.from_reply(error),
            duration=reply["duration"],
            unsaved=unsaved,
            newly_unsaved=dict(unsaved if newly_unsaved is None else newly_unsaved),
            generation=generation,
            checkpoint_duration=reply["checkpoint_duration"],
            restore_failures=restore_failures,
            scaffold=reply["scaffold"],
        )


def output_fields(reply: ExecReply, recorders: Mapping[str, StreamRecorder]) -> dict[str, Any]:
    """The fields of a result that the call's ``output`` frames give, per stream that sent some: its bytes as they
    came; past the output limit also its preview and ``<stream>_path``. A stream whose every byte came (an agent
    sends a stream that is not UTF-8 whole) gets its bytes; one cut short keeps the reply's text."""
    fields: dict[str, Any] = {}
    for name, recorder in recorders.items():
        produced: int = reply[f"{name}_bytes"]  # type: ignore[literal-required]
        if recorder.spilled or recorder.received == produced:
            fields[f"{name}_bytes"] = recorder.data(produced)
        if recorder.spilled:
            fields[name] = recorder.preview(produced)
            fields[f"{name}_path"] = recorder.path
    return fields


@dataclass(frozen=True)
class Generation:
    """One generation a session keeps (``Session.history()``): a state ``rewind`` and ``fork(at=...)`` can go back to.

    Attributes:
        generation: its number (the checkpoint generation of ``ExecResult.generation``).
        at: when it was committed (seconds since the epoch, the host's clock).
        changed: names set or deleted to reach it from the generation before (for the first of a fork or a rewind:
            relative to the state before it).
        names: how many names it holds (a context's as ``<id>/<name>``).
        size: bytes of its checkpoint.
        current: whether it is the session's state now.
        rewound_from: the generation it copies, when ``rewind`` made it; else None.
        unsaved: names the worker held then that the checkpoint could not hold, with why (lost in a fork or rewind).
    """

    generation: int
    at: float
    changed: tuple[str, ...]
    names: int
    size: int
    current: bool
    rewound_from: int | None = None
    unsaved: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot, *, current: bool) -> Generation:
        return cls(
            generation=snapshot.generation,
            at=snapshot.at,
            changed=tuple(snapshot.changed),
            names=len(snapshot.variables),
            size=snapshot.size,
            current=current,
            rewound_from=snapshot.rewound_from,
            unsaved=dict(snapshot.unsaved),
        )


def generations(record: SessionRecord) -> list[Generation]:
    """The generations ``record`` keeps, oldest first; the last is the current one."""
    kept = [Generation.from_snapshot(s, current=False) for s in record.history]
    return [*kept, Generation.from_snapshot(record.snapshot(), current=True)]
