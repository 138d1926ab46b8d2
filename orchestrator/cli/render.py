"""What the CLI shows: human units, rich tables, JSON documents, one-line errors and their exit codes."""

from __future__ import annotations

import contextlib
import enum
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..api.results import ExecResult, Generation
from ..errors import (
    CapacityExceeded,
    ConfigError,
    EngineError,
    GenerationNotFound,
    SandboxError,
    SessionAttachedElsewhere,
    SessionBusy,
    SessionNotFound,
    TransportError,
)
from ..ops.survey import SessionInfo, SessionStatus
from ..safe_text import visible
from ..units import describe_bytes, describe_duration


class Exit(enum.IntEnum):
    """The CLI's exit statuses (also in ``--help`` and docs/cli.md)."""

    OK = 0
    CODE_RAISED = 1
    """``exec``/``run``: the user's code raised (its traceback is on stderr)."""
    USAGE = 2
    """Bad arguments or settings (argparse, ``ConfigError``)."""
    PARTIAL = 3
    """Some of several targets failed (``hibernate``/``resume``/``rm`` with several ids, ``prune``)."""
    NOT_FOUND = 4
    """No session with that id (``SessionNotFound``), or no such generation kept (``GenerationNotFound``)."""
    UNAVAILABLE = 5
    """The session is in use: in a call, locked, attached elsewhere, or no room (``SessionBusy``, ...)."""
    ENGINE = 6
    """The Docker engine is unreachable or refused (``EngineUnavailable``, ``ImageMissing``, ``EngineError``)."""
    SANDBOX = 7
    """The call failed in the sandbox or its channel (``ExecutionTimeout``, ``SandboxCrashed``, ``ProtocolError``)."""
    FAILED = 8
    """Any other failure (``CheckpointError``, ``SessionClosed``, an unexpected error)."""
    OUTPUT_CUT = 9
    """``exec``/``run``: the cell ended, but output past the per-call limit (``ORCH_MAX_OUTPUT_FILE_BYTES``) was
    dropped: what reached stdout or stderr is not all the cell wrote."""
    INTERRUPTED = 130
    """Ctrl-C."""


EXIT_HELP = """\
exit status:
  0    success
  1    exec/run: the code raised (its traceback is on stderr)
  2    usage: bad arguments or settings (ConfigError)
  3    partial failure: some of several ids, or some prune actions, failed
  4    no such session or kept generation (SessionNotFound, GenerationNotFound)
  5    session unavailable: in a call, locked, attached elsewhere, no room (SessionBusy, ...)
  6    engine: unreachable, refused, image missing (EngineError)
  7    the call failed in the sandbox or its channel (SandboxError, TransportError)
  8    any other failure
  9    exec/run: output past the per-call limit was dropped (ORCH_MAX_OUTPUT_FILE_BYTES)
  130  interrupted (Ctrl-C)

Errors are one line on stderr: "orchestrator: <ErrorType>: <message>".
See docs/cli.md for every command, its output and its JSON shape."""


class UsageError(ConfigError):
    """The command line asks for something the command will not do as given (exit status 2, like argparse's)."""


_BY_ERROR: tuple[tuple[type[BaseException], Exit], ...] = (
    (GenerationNotFound, Exit.NOT_FOUND),  # a ConfigError too: the first match counts
    (ConfigError, Exit.USAGE),
    (SessionNotFound, Exit.NOT_FOUND),
    (SessionBusy, Exit.UNAVAILABLE),
    (SessionAttachedElsewhere, Exit.UNAVAILABLE),
    (CapacityExceeded, Exit.UNAVAILABLE),
    (EngineError, Exit.ENGINE),
    (SandboxError, Exit.SANDBOX),
    (TransportError, Exit.SANDBOX),
    (KeyboardInterrupt, Exit.INTERRUPTED),
)


def exit_code(exc: BaseException) -> Exit:
    """The exit status that reports ``exc``."""
    for kind, code in _BY_ERROR:
        if isinstance(exc, kind):
            return code
    return Exit.FAILED


def error_line(exc: BaseException) -> str:
    """``orchestrator: <ErrorType>: <message>`` on one line (the message's own line breaks folded, and anything a
    terminal would act on made visible: a message may quote the sandbox). An error that quotes a log's last lines
    (``log_tail``) gives its headline here; ``Output.error`` shows those lines below it."""
    message = one_line(" ".join(str(getattr(exc, "headline", exc)).split())) or "(no message)"
    step = next((step for kind, step in _NEXT_STEP if isinstance(exc, kind)), "")
    return f"orchestrator: {type(exc).__name__}: {message}" + (f"; {step}" if step and step not in message else "")


_NEXT_STEP: tuple[tuple[type[BaseException], str], ...] = ((SessionNotFound, "`orchestrator ls` lists the sessions"),)
"""What to do next, for errors whose message (written for the Python API) does not say it in CLI terms."""


OUR_PREFIX = "orchestrator"
"""Every line the CLI writes of its own on stderr starts with this (notes, errors, the shell's remarks)."""
SANDBOX_MARK = "[sandbox] "
"""Shown before a line of sandbox text that starts like one of ours, so it cannot pass for ours."""
SANDBOX_TEXT_MODES = ("auto", "escape", "raw")


def one_line(text: str) -> str:
    """A field that may come from a sandbox (a name, a reason, a message), for one line of ours: nothing in it can
    end the line, move the cursor or drive the terminal."""
    return visible(text, multiline=False)


def shown(text: str) -> str:
    """Lines of sandbox text (a cell's output, a container log) for a terminal: control characters made visible
    (carriage returns included), and a line that starts like one of ours marked ``[sandbox]``."""
    text = visible(text)
    if OUR_PREFIX not in text:
        return text
    return "".join(
        SANDBOX_MARK + line if line.startswith(OUR_PREFIX) else line for line in text.splitlines(keepends=True)
    )


def error_json(exc: BaseException) -> dict[str, Any]:
    """The JSON form of an error: its type, message and exit status (and a timed-out cell's output)."""
    document: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc), "exit_code": int(exit_code(exc))}
    if getattr(exc, "log_tail", None):
        document["log_tail"] = list(exc.log_tail)  # type: ignore[attr-defined]
    for name in ("stdout", "stderr"):
        if isinstance(getattr(exc, name, None), str):
            document[name] = getattr(exc, name)
    return document


def human_time(stamp: float | None, now: float) -> str:
    """A local time with how long ago it was: 2024-05-01 12:00:03 (3m 12s ago); "-" for none."""
    if not stamp:
        return "-"
    local = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))
    return f"{local} ({describe_duration(now - stamp)} ago)"


class Output:
    """Where one command writes: its stdout and stderr, as text, rich tables or JSON."""

    def __init__(
        self,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
        *,
        stdin: TextIO | None = None,
        json_mode: bool = False,
        sandbox_text: str = "auto",
    ) -> None:
        """``sandbox_text``: how a cell's output reaches a stream: "auto" (made visible on a terminal, as it is
        to a pipe or a file), "escape" (always made visible: ``--escape``), "raw" (always as it is: ``--raw``)."""
        if sandbox_text not in SANDBOX_TEXT_MODES:
            raise ValueError(f"sandbox_text must be one of {SANDBOX_TEXT_MODES}, not {sandbox_text!r}")
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.stdin = stdin or sys.stdin
        self.json_mode = json_mode
        self.sandbox_text = sandbox_text
        self.console = _console(self.stdout)
        self.err_console = _console(self.stderr)

    def write(self, text: str) -> None:
        """Text of ours exactly as given (sandbox text goes through ``program_output`` or ``sandbox_log``)."""
        self.stdout.write(text)
        self.stdout.flush()

    def program_output(self, text: str, stream: TextIO | None = None) -> None:
        """What the cell itself wrote (its stdout or stderr, its value's repr, its traceback) to ``stream``
        (stdout by default): the program's own bytes when the stream is a pipe or a file (or ``--raw``), made
        visible on a terminal (or ``--escape``)."""
        stream = stream or self.stdout
        raw = self.sandbox_text == "raw" or (self.sandbox_text == "auto" and not _isatty(stream))
        stream.write(text if raw else shown(text))
        stream.flush()

    def sandbox_log(self, text: str) -> None:
        """Sandbox text that is not a program's output (a container log): made visible unless ``--raw``."""
        self.write(text if self.sandbox_text == "raw" else shown(text))

    def line(self, text: str) -> None:
        self.write(text + "\n")

    def note(self, text: str) -> None:
        """A remark for the person at the terminal, on stderr (never part of what scripts parse); it starts with
        ``orchestrator``, and any sandbox field in it went through ``one_line``."""
        self.stderr.write(text + "\n")
        self.stderr.flush()

    def json(self, document: Any) -> None:
        """One JSON document on stdout."""
        self.write(json.dumps(document, indent=2, default=str) + "\n")

    def json_rows(self, rows: Sequence[Any]) -> None:
        """One JSON array on stdout, one compact element per line: a listing of 10,000 sessions is printed by the C
        encoder (``indent`` falls back to the pure-Python one, 5x slower) and stays a line per session."""
        if not rows:
            self.write("[]\n")
            return
        encode = json.JSONEncoder(separators=(",", ":"), default=str).encode
        self.write("[\n" + ",\n".join(encode(row) for row in rows) + "\n]\n")

    def error(self, exc: BaseException, hint: str = "") -> Exit:
        """Report ``exc`` as one line on stderr (and as JSON on stdout in JSON mode); return its exit status."""
        self.note(error_line(exc) + hint)
        for line in getattr(exc, "log_tail", ()):  # the end of a log it quotes (made safe where it was read)
            self.note(f"  | {one_line(line)}")
        if self.json_mode:
            self.json({"error": error_json(exc)})
        return exit_code(exc)

    @property
    def width(self) -> int | None:
        """The terminal's width when stdout is one, else None (a pipe or a file: whole rows, nothing dropped)."""
        return self.console.width if self.console.is_terminal else None

    def table(self, table: Table) -> None:
        if self.console.is_terminal:
            self.console.print(table)
            return
        # Plain text for pipes and files: no padding at line ends.
        with self.console.capture() as captured:
            self.console.print(table)
        self.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))

    @property
    def interactive(self) -> bool:
        """A person is there to answer: stdin and stderr are terminals."""
        return _isatty(self.stdin) and _isatty(self.stderr)

    def confirm(self, question: str) -> bool:
        """Ask on stderr, read the answer from stdin: True only for y or yes (end of input is no)."""
        self.stderr.write(question)
        self.stderr.flush()
        return self.stdin.readline().strip().lower() in ("y", "yes")

    @contextlib.contextmanager
    def progress(self, message: str) -> Iterator[None]:
        """A spinner on stderr while something slow runs, only when stderr is a terminal."""
        if not self.err_console.is_terminal:
            yield
            return
        with self.err_console.status(Text(message)):
            yield


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or foreign stream
        return False


def _console(stream: TextIO) -> Console:
    # Not a terminal: no colours and no width limit, so a pipe or a file gets whole rows to grep.
    terminal = _isatty(stream)
    return Console(
        file=stream,
        width=None if terminal else int(os.environ.get("COLUMNS", "0") or 0) or 1000,
        highlight=False,
        markup=False,
        emoji=False,
        soft_wrap=False,
    )


@dataclass(frozen=True)
class Column:
    """One column of a plain table: its header and cells, right-aligned for numbers."""

    name: str
    cells: list[str]
    right: bool = False

    @property
    def width(self) -> int:
        return max(len(text) for text in [self.name, *self.cells])


TABLE_GAP = "   "
"""Between columns: three spaces, as ``docker ps`` (no cell holds a space, so ``awk`` reads each as one field)."""
_DROPPED_FIRST = ("CHECKPOINT", "MEMORY", "CPU", "NODE", "IDLE", "AGE", "IMAGE", "STATE")
"""What ``ls`` gives up, in this order, to fit the terminal; ID is never dropped nor cut."""
_SHORTEST_IMAGE = 16


def _compact(text: str) -> str:
    return text.replace(" ", "")  # "3m 12s" -> "3m12s", "4.2 MiB" -> "4.2MiB": one field per cell


def session_columns(infos: Sequence[SessionInfo]) -> list[Column]:
    """The columns of ``orchestrator ls`` (NODE only when sandboxes run on several machines: the Swarm backend)."""
    columns = [
        Column("ID", [one_line(info.id) for info in infos]),
        Column("STATE", [info.status.value for info in infos]),
        Column("IMAGE", [_compact(one_line(info.image or "-")) for info in infos]),
    ]
    if any(info.node for info in infos):
        columns.append(Column("NODE", [_compact(one_line(info.node or "-")) for info in infos]))
    idle = ["-" if i.status is SessionStatus.BUSY else describe_duration(i.idle_seconds) for i in infos]
    columns += [
        Column("AGE", [_compact(describe_duration(info.age_seconds)) for info in infos], right=True),
        Column("IDLE", [_compact(text) for text in idle], right=True),
        Column("CPU", [_percent(info.cpu_percent) for info in infos], right=True),
        Column("MEMORY", [_compact(describe_bytes(info.memory_bytes)) for info in infos], right=True),
        Column("CHECKPOINT", [_compact(describe_bytes(info.checkpoint_bytes)) for info in infos], right=True),
    ]
    return columns


def fit_columns(columns: Sequence[Column], width: int | None) -> list[Column]:
    """The columns that fit in ``width`` characters (all of them for None: a pipe or a file).

    The IMAGE column is shortened first (its middle elided), then columns are dropped in the order of
    ``_DROPPED_FIRST``; ID is always whole, even when it alone is wider than ``width``.
    """
    if width is None:
        return list(columns)
    kept = list(columns)
    for name in (None, *_DROPPED_FIRST):
        kept = [column for column in kept if column.name != name]
        over = _table_width(kept) - width
        if over <= 0:
            return kept
        image = next((c for c in kept if c.name == "IMAGE"), None)
        if image is not None and image.width - over >= _SHORTEST_IMAGE:
            size = image.width - over
            shortened = Column(image.name, [_elide(text, size) for text in image.cells], image.right)
            return [shortened if column is image else column for column in kept]
    return kept


def _table_width(columns: Sequence[Column]) -> int:
    return sum(column.width for column in columns) + len(TABLE_GAP) * (len(columns) - 1)


def _elide(text: str, size: int) -> str:
    if len(text) <= size:
        return text
    head = (size - 1) // 2
    return text[:head] + "…" + text[len(text) - (size - 1 - head) :]


def plain_table(columns: Sequence[Column]) -> str:
    """Aligned columns, a header row, no rules or boxes; no line ends in spaces."""
    widths = [column.width for column in columns]
    rows = [[column.name for column in columns], *zip(*(column.cells for column in columns), strict=True)]
    lines = []
    for row in rows:
        cells = [
            text.rjust(size) if column.right else text.ljust(size)
            for text, size, column in zip(row, widths, columns, strict=True)
        ]
        lines.append(TABLE_GAP.join(cells).rstrip() + "\n")
    return "".join(lines)


def session_rows(info: SessionInfo, now: float) -> list[tuple[str, str]]:
    """Everything ``orchestrator inspect`` shows of a session, as (key, value) pairs."""
    return [
        ("id", info.id),
        ("state", info.status.value),
        ("problem", info.problem or "-"),
        ("image", info.image or "-"),
        ("created", human_time(info.created_at, now)),
        ("last active", human_time(info.last_active_at, now)),
        ("age", describe_duration(info.age_seconds)),
        ("idle", "- (in a call)" if info.status is SessionStatus.BUSY else describe_duration(info.idle_seconds)),
        ("hibernated", human_time(info.hibernated_at, now)),
        ("generation", str(info.generation)),
        ("variables", str(info.variables)),
        ("checkpoint", f"{describe_bytes(info.checkpoint_bytes)} ({info.checkpoint_bytes} bytes)"),
        ("checkpoint damaged", "yes" if info.checkpoint_damaged else "no"),
        ("forked from", _origin(info.forked_from)),
        ("generations kept", str(info.generations_kept)),
        ("history", f"{describe_bytes(info.history_bytes)} ({info.history_bytes} bytes, each blob once)"),
        ("shared", "-" if info.shared_bytes is None else _shared(info.shared_bytes)),
        ("epoch", str(info.epoch)),
        ("sandbox", info.sandbox_id or "-"),
        ("container", info.container_id or "-"),
        ("container status", info.container_status or "-"),
        ("node", info.node or "-"),
        ("memory", describe_bytes(info.memory_bytes)),
        (
            "cpu",
            _percent(info.cpu_percent) + ("" if info.cpu_seconds is None else f" ({info.cpu_seconds:.1f} s in all)"),
        ),
        ("labels", ", ".join(f"{k}={v}" for k, v in sorted(info.labels.items())) or "-"),
    ]


def _percent(value: float | None) -> str:
    """A CPU share as ``docker stats`` shows it ("12.5%"; 200% is two cores), "-" when unknown."""
    return "-" if value is None else f"{value:.1f}%"


def _origin(forked_from: dict[str, Any] | None) -> str:
    if not forked_from:
        return "-"
    return f"{forked_from['session_id']} at generation {forked_from['generation']}"


def _shared(size: int) -> str:
    return f"{describe_bytes(size)} ({size} bytes) with other sessions: stored once on the host"


def history_columns(generations: Sequence[Generation], now: float) -> list[Column]:
    """The columns of ``orchestrator history``, oldest generation first: COMMITTED is how long ago (as ``ls``'s AGE);
    CHANGED, the widest, is last."""
    return [
        Column("GENERATION", [str(g.generation) for g in generations], right=True),
        Column("COMMITTED", [_compact(describe_duration(now - g.at)) for g in generations], right=True),
        Column("NAMES", [str(g.names) for g in generations], right=True),
        Column("SIZE", [_compact(describe_bytes(g.size)) for g in generations], right=True),
        Column("CURRENT", ["*" if g.current else "-" for g in generations]),
        Column("REWOUND-FROM", ["-" if g.rewound_from is None else str(g.rewound_from) for g in generations]),
        Column("CHANGED", [_names(g.changed) for g in generations]),
    ]


def _names(names: Sequence[str]) -> str:
    """Names on one line, comma-separated without spaces (one field for ``awk``); "-" for none."""
    return ",".join(_compact(one_line(name)) for name in names) or "-"


def fit_last_column(columns: Sequence[Column], width: int | None) -> list[Column]:
    """The last column's cells cut (their end elided) so every row fits ``width`` (all of them for None: a pipe or a
    file); never below the column's header."""
    if width is None or not columns:
        return list(columns)
    *head, last = columns
    room = max(len(last.name), width - _table_width(head) - len(TABLE_GAP))
    cells = [text if len(text) <= room else text[: room - 1] + "…" for text in last.cells]
    return [*head, Column(last.name, cells, last.right)]


def generation_json(generation: Generation, session_id: str | None = None) -> dict[str, Any]:
    """A ``Generation`` as JSON (``history --json``), with the session's id first when given (``rewind --json``)."""
    return {**({"id": session_id} if session_id else {}), **asdict(generation)}


def key_value_table(rows: Sequence[tuple[str, str]]) -> Table:
    """Two columns, no header: the shape of ``inspect``."""
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(Text(key), Text(one_line(value)))
    return table


def exec_json(session_id: str, result: ExecResult) -> dict[str, Any]:
    """The JSON of ``orchestrator exec --json``: every field of the ExecResult, plus the id and ``ok``."""
    return {"id": session_id, "ok": result.ok, **asdict(result)}


def write_exec_result(out: Output, result: ExecResult, live: LiveOutput | None = None) -> None:
    """A cell's output as a REPL shows it: stdout and stderr as written, the value's repr, the traceback (each
    the program's own bytes to a pipe, made visible on a terminal); then our notes, always made visible.

    ``live``: the streams already went out as the cell printed them; only what follows them is written.
    """
    if live is not None:
        live.finish()
    else:
        if result.stdout:
            out.program_output(result.stdout)
        if result.stderr:
            out.program_output(result.stderr, out.stderr)
    if result.return_value is not None:
        ended = live.stdout.ends_line if live is not None else not result.stdout or result.stdout.endswith("\n")
        if not ended:
            out.write("\n")
        out.program_output(result.return_value + "\n")
    if result.error is not None:
        out.program_output(result.error.traceback or f"{result.error}\n", out.stderr)
    for name, reason in sorted(result.unsaved.items()):
        out.note(f"orchestrator: not saved (lost if the sandbox restarts): {one_line(name)}: {one_line(reason)}")
    for name, reason in sorted(result.restore_failures.items()):
        out.note(f"orchestrator: dropped by a restore before this call: {one_line(name)}: {one_line(reason)}")


class LiveStream:
    """One stream of a running cell, written piece by piece as it comes, by the rules of ``Output.program_output``.

    Made visible (a terminal, ``--escape``), a line of the cell that starts like one of ours gets its
    ``[sandbox]`` mark even when the line comes in several pieces: the start of a line that could
    still become ``orchestrator`` is held back until the next piece (or the end) decides it.
    """

    def __init__(self, out: Output, stream: TextIO) -> None:
        self.stream = stream
        self.raw = out.sandbox_text == "raw" or (out.sandbox_text == "auto" and not _isatty(stream))
        self._at_start = True  # the next character the cell writes begins a line
        self._held = ""
        self.broken = False  # the stream's reader went away

    @property
    def ends_line(self) -> bool:
        """Nothing was written, or the last of it was a newline."""
        return self._at_start and not self._held

    def write(self, text: str) -> None:
        if not text:
            return
        if self.raw:
            self._emit(text)
            self._at_start = text.endswith("\n")
            return
        text, self._held = self._held + visible(text), ""
        at_start = self._at_start
        lines = text.split("\n")
        shown = []
        for line in lines[:-1]:
            shown.append((SANDBOX_MARK if at_start and line.startswith(OUR_PREFIX) else "") + line + "\n")
            at_start = True
        last = lines[-1]
        if at_start and len(last) < len(OUR_PREFIX) and OUR_PREFIX.startswith(last):
            self._held = last  # "orch" (or nothing): cannot tell yet
        else:
            shown.append((SANDBOX_MARK if at_start and last.startswith(OUR_PREFIX) else "") + last)
            at_start = False
        self._at_start = at_start
        self._emit("".join(shown))

    def finish(self) -> None:
        """The cell ended: write what was held back."""
        if self._held:
            self._emit(self._held)
            self._held, self._at_start = "", False

    def _emit(self, text: str) -> None:
        if text and not self.broken:
            try:
                self.stream.write(text)
                self.stream.flush()
            except BrokenPipeError:  # the reader went away (`| head`): the call goes on, unread
                self.broken = True


class LiveOutput:
    """A running cell's stdout and stderr as they come (``Session.execute``'s ``on_output`` events)."""

    def __init__(self, out: Output) -> None:
        self.stdout = LiveStream(out, out.stdout)
        self.stderr = LiveStream(out, out.stderr)

    def write(self, stream: str, text: str) -> None:
        (self.stderr if stream == "stderr" else self.stdout).write(text)

    def finish(self) -> None:
        """The call ended: what was held back goes out.

        Raises:
            BrokenPipeError: a stream's reader went away meanwhile (reported as the CLI reports it: quietly).
        """
        self.stdout.finish()
        self.stderr.finish()
        if self.stdout.broken or self.stderr.broken:
            raise BrokenPipeError("the reader of the cell's output went away")
