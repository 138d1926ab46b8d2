"""Where a command writes: its stdout and stderr as text, JSON or rich tables, one-line errors and their exit codes.

Every command imports this, ``--version`` included, so it imports no more than it must: rich only when a table, a
spinner or a progress bar is drawn (``Output.console``), nothing of the API (cli/render.py shows its values).
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import sys
from collections.abc import Iterator, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, TextIO

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
from ..safe_text import visible

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


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


def counted(count: int, noun: str) -> str:
    """``1 run``, ``2 runs``, ``0 runs``: a count with its noun (a regular plural)."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


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

    @cached_property
    def console(self) -> Console:
        """rich's console on stdout (made when a table is drawn)."""
        return _console(self.stdout)

    @cached_property
    def err_console(self) -> Console:
        """rich's console on stderr (made when a spinner or a progress bar may be drawn)."""
        return _console(self.stderr)

    def write(self, text: str) -> None:
        """Text of ours exactly as given (sandbox text goes through ``program_output`` or ``sandbox_log``)."""
        self.stdout.write(text)
        self.stdout.flush()

    def program_output(self, text: str, stream: TextIO | None = None, data: bytes | None = None) -> None:
        """What the cell itself wrote (its stdout or stderr, its value's repr, its traceback) to ``stream``
        (stdout by default): the program's own bytes when the stream is a pipe or a file (or ``--raw``): ``data``
        when given, else ``text`` as UTF-8; made visible on a terminal (or ``--escape``)."""
        stream = stream or self.stdout
        if self.passes_through(stream):
            write_bytes(stream, text.encode("utf-8", "replace") if data is None else data)
        else:
            stream.write(shown(text))
            stream.flush()

    def passes_through(self, stream: TextIO) -> bool:
        """A cell's output reaches ``stream`` as it was written (a pipe or a file, or ``--raw``), not made visible."""
        return self.sandbox_text == "raw" or (self.sandbox_text == "auto" and not _isatty(stream))

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
        if not _isatty(self.stderr):
            yield
            return
        from rich.text import Text  # rich costs a tenth of a second to import: only where it draws

        with self.err_console.status(Text(message)):
            yield


def write_bytes(stream: TextIO, data: bytes) -> None:
    """``data`` as it is, after the text ``stream`` holds: to its binary buffer (``sys.stdout.buffer``), or decoded
    (a byte that is not UTF-8 as U+FFFD) to a stream of text only (``io.StringIO``)."""
    buffer = getattr(stream, "buffer", None)
    if buffer is None:
        stream.write(data.decode("utf-8", "replace"))
        stream.flush()
        return
    stream.flush()
    buffer.write(data)
    buffer.flush()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or foreign stream
        return False


def _console(stream: TextIO) -> Console:
    from rich.console import Console  # rich costs a tenth of a second to import: only where it draws

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
