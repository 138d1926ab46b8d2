"""What the CLI shows of the API's values: human units, session and history tables, a cell's result and live output."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, TextIO

from ..safe_text import visible
from ..units import describe_bytes, describe_duration
from .labels import shown_key
from .output import OUR_PREFIX, SANDBOX_MARK, Output, one_line, write_bytes

if TYPE_CHECKING:
    from rich.table import Table

    from ..api.results import ExecResult, Generation
    from ..ops.survey import SessionInfo


def human_time(stamp: float | None, now: float) -> str:
    """A local time with how long ago it was: 2024-05-01 12:00:03 (3m 12s ago); "-" for none."""
    if not stamp:
        return "-"
    local = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))
    return f"{local} ({describe_duration(now - stamp)} ago)"


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
    idle = ["-" if _busy(i) else describe_duration(i.idle_seconds) for i in infos]
    columns += [
        Column("AGE", [_compact(describe_duration(info.age_seconds)) for info in infos], right=True),
        Column("IDLE", [_compact(text) for text in idle], right=True),
        Column("CPU", [_percent(info.cpu_percent) for info in infos], right=True),
        Column("MEMORY", [_compact(describe_bytes(info.memory_bytes)) for info in infos], right=True),
        Column("CHECKPOINT", [_compact(describe_bytes(info.checkpoint_bytes)) for info in infos], right=True),
    ]
    return columns


def _busy(info: SessionInfo) -> bool:
    from ..ops.survey import SessionStatus  # loaded already, with the infos

    return info.status is SessionStatus.BUSY


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


def session_rows(info: SessionInfo, now: float, unsaved: str = "-") -> list[tuple[str, str]]:
    """Everything ``orchestrator inspect`` shows of a session, as (key, value) pairs; ``unsaved`` the names its
    record reports not saved (``Session.unsaved``), listed."""
    return [
        ("id", info.id),
        ("state", info.status.value),
        ("problem", info.problem or "-"),
        ("image", info.image or "-"),
        ("created", human_time(info.created_at, now)),
        ("last active", human_time(info.last_active_at, now)),
        ("age", describe_duration(info.age_seconds)),
        ("idle", "- (in a call)" if _busy(info) else describe_duration(info.idle_seconds)),
        ("hibernated", human_time(info.hibernated_at, now)),
        ("generation", str(info.generation)),
        ("variables", str(info.variables)),
        ("not saved", unsaved),
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
        ("labels", ", ".join(f"{k}={v}" for k, v in sorted((shown_key(k), v) for k, v in info.labels.items())) or "-"),
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
    from rich.table import Table  # rich costs a tenth of a second to import: only where it draws
    from rich.text import Text

    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(Text(key), Text(one_line(value)))
    return table


def exec_json(session_id: str, result: ExecResult) -> dict[str, Any]:
    """The JSON of ``orchestrator exec --json``: every field of the ExecResult but the bytes (JSON holds text: the
    ``stdout`` and ``stderr`` fields), plus the id and ``ok``."""
    fields = {key: value for key, value in asdict(result).items() if key not in _BYTES_FIELDS}
    return {"id": session_id, "ok": result.ok, **fields}


_BYTES_FIELDS = ("stdout_bytes", "stderr_bytes")


def write_exec_result(out: Output, result: ExecResult, live: LiveOutput | None = None) -> None:
    """A cell's output as a REPL shows it: stdout and stderr as written, the value's repr, the traceback (each
    the program's own bytes to a pipe, made visible on a terminal); then our notes, always made visible.

    ``live``: the streams already went out as the cell printed them; only what follows them is written.
    """
    if live is not None:
        live.finish()
    else:
        if result.stdout:
            out.program_output(result.stdout, data=result.stdout_bytes)
        if result.stderr:
            out.program_output(result.stderr, out.stderr, data=result.stderr_bytes)
    if result.return_value is not None:
        ended = live.stdout.ends_line if live is not None else not result.stdout or result.stdout.endswith("\n")
        if not ended:
            out.write("\n")
        out.program_output(result.return_value + "\n")
    if result.error is not None:
        out.program_output(result.error.traceback or f"{result.error}\n", out.stderr)
        if result.error.hint is not None:
            out.note(f"orchestrator: hint: {result.error.hint}")
    for name, reason in sorted(result.newly_unsaved.items()):  # once: `inspect` lists them all
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
        self.raw = out.passes_through(stream)
        self._at_start = True  # the next character the cell writes begins a line
        self._held = ""
        self.broken = False  # the stream's reader went away

    @property
    def ends_line(self) -> bool:
        """Nothing was written, or the last of it was a newline."""
        return self._at_start and not self._held

    def write(self, text: str, data: bytes) -> None:
        """A piece of the stream (an ``OutputEvent``): ``data`` its bytes as the cell wrote them, ``text`` them as
        text. Passed through, the bytes go out; made visible, the text."""
        if self.raw:
            if data:
                self._emit(data)
                self._at_start = data.endswith(b"\n")
            return
        if not text:
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

    def _emit(self, piece: str | bytes) -> None:
        if not piece or self.broken:
            return
        try:
            if isinstance(piece, bytes):
                write_bytes(self.stream, piece)
            else:
                self.stream.write(piece)
                self.stream.flush()
        except BrokenPipeError:  # the reader went away (`| head`): the call goes on, unread
            self.broken = True


class LiveOutput:
    """A running cell's stdout and stderr as they come (``Session.execute``'s ``on_output`` events)."""

    def __init__(self, out: Output) -> None:
        self.stdout = LiveStream(out, out.stdout)
        self.stderr = LiveStream(out, out.stderr)

    def write(self, stream: str, text: str, data: bytes) -> None:
        (self.stderr if stream == "stderr" else self.stdout).write(text, data)

    def finish(self) -> None:
        """The call ended: what was held back goes out.

        Raises:
            BrokenPipeError: a stream's reader went away meanwhile (reported as the CLI reports it: quietly).
        """
        self.stdout.finish()
        self.stderr.finish()
        if self.stdout.broken or self.stderr.broken:
            raise BrokenPipeError("the reader of the cell's output went away")
