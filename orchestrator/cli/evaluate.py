"""``orchestrator eval``: grade a JSONL file of submissions; a progress bar on a terminal, a summary at the end.

Sandbox-made text (a result's message: exception text, reasons) is printed one line per result through
``safe_text.visible``, so no message can move the cursor, set the clipboard or start a line of its own.

Its exit status is the evaluation's own (docs/eval.md): 0 every submission passed, 1 any did
not (or an input line was invalid), 2 an infrastructure error (a submission's, or the run's:
no engine, no image, an unreadable file or bad arguments).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ..api.manager import Orchestrator
from ..config import Settings
from ..errors import ConfigError, OrchestratorError
from ..evaluation import (
    EvalOptions,
    EvalReport,
    EvalResult,
    InvalidLine,
    ResultsFile,
    Status,
    Submission,
    read_submissions,
)
from ..evaluation.accounting import slowest
from ..evaluation.evaluator import MAX_RUNS, Evaluator, OnResult
from ..units import describe_bytes, positive_duration_argument, size_argument
from .output import Output, counted, error_line, one_line

INFRA = 2
_STYLE = {Status.PASSED: "green", Status.FAILED: "red", Status.INFRA_ERROR: "bold magenta"}

EXIT_HELP = """\
exit status:
  0    every submission passed
  1    any submission did not pass, or an input line was invalid
  2    an infrastructure error (a submission's infra_error, no engine, no image, bad arguments)

Results: one JSON record per submission in --out, written as each ends. See docs/eval.md."""


def _jobs(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 256:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of jobs from 1 to 256")
    return int(text)


def _runs(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MAX_RUNS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of runs from 1 to {MAX_RUNS}")
    return int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("submissions", metavar="SUBMISSIONS", help="JSONL file of submissions, or '-' for stdin")
    parser.add_argument("--out", type=Path, required=True, metavar="FILE", help="results file (JSON lines)")
    parser.add_argument("--junit", type=Path, metavar="FILE", help="also write a JUnit XML report")
    parser.add_argument("--jobs", "-j", type=_jobs, default=2, metavar="N", help="submissions at once (default 2)")
    parser.add_argument(
        "--timeout",
        type=positive_duration_argument,
        default=10.0,
        metavar="D",
        help="time (10, 90s, 2m) for code and tests of a submission without its own timeout (default 10 s)",
    )
    parser.add_argument(
        "--memory", type=size_argument, metavar="SIZE", help="memory limit per sandbox (default ORCH_MEM_LIMIT)"
    )
    parser.add_argument(
        "--max-output",
        type=size_argument,
        default=1 << 20,
        metavar="SIZE",
        help="most bytes a submission may print, stdout and stderr together (default 1m)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="strict grading: tests run in an interpreter of their own and reach the code through plain data only "
        "(a submission's own 'grading' field wins; docs/eval.md)",
    )
    parser.add_argument(
        "--runs",
        type=_runs,
        default=1,
        metavar="N",
        help="grade each submission N times, each in a fresh sandbox; 'flaky' when the verdicts differ (default 1)",
    )
    parser.add_argument("--resume", action="store_true", help="keep --out and skip the ids it already holds")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar and no per-problem lines")


def run(args: argparse.Namespace) -> int:
    """The command; returns the exit status."""
    out = Output(json_mode=args.json)
    try:
        options = EvalOptions(
            jobs=args.jobs,
            timeout=args.timeout,
            memory=args.memory,
            output_limit=args.max_output,
            strict=args.strict,
            runs=args.runs,
        )
        items = list(_read(args.submissions))
        orch = Orchestrator(Settings.from_env())
    except OrchestratorError as exc:
        out.note(error_line(exc))
        return INFRA
    try:
        for line in (item for item in items if isinstance(item, InvalidLine)):
            out.note(f"orchestrator eval: invalid input: {one_line(line.describe())}")
        results = ResultsFile(args.out, resume=args.resume)
        try:
            evaluator = Evaluator(orch.backend, orch.settings, options, image=orch.default_image, metrics=orch.metrics)
            total = sum(1 for item in items if not isinstance(item, InvalidLine))
            with _progress(out, total, args.quiet) as advance:
                report = evaluator.run(items, results_file=results, junit=args.junit, on_result=advance)
        finally:
            results.close()
    except OrchestratorError as exc:
        out.note(error_line(exc))
        return INFRA
    except KeyboardInterrupt:
        out.note("orchestrator eval: interrupted; the results written so far are in " + str(args.out))
        return 130
    finally:
        orch.close()
    _summary(out, report)
    return report.exit_code


def _read(source: str) -> Iterator[Submission | InvalidLine]:
    try:
        if source == "-":
            yield from read_submissions(sys.stdin.buffer)
            return
        with open(source, "rb") as handle:
            yield from read_submissions(handle)
    except OSError as exc:
        raise ConfigError(f"cannot read the submissions file {source}: {exc}") from None


@contextlib.contextmanager
def _progress(out: Output, total: int, quiet: bool) -> Iterator[OnResult | None]:
    """A callback for each result: a progress bar on a terminal, else a line per submission that did not pass."""
    if quiet:
        yield None
        return
    if not out.err_console.is_terminal:

        def note(result: EvalResult) -> None:
            if not result.passed:
                shown = (one_line(result.id), one_line(result.message))
                passes = sum(run.get("status") == Status.PASSED.value for run in result.runs)
                flaky = f" (flaky: passed {passes} of {counted(len(result.runs), 'run')})" if result.flaky else ""
                out.note(f"{shown[0]}: {result.status.value}{flaky}: {shown[1]}")

        yield note
        return
    columns = (
        TextColumn("eval"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=out.err_console, transient=True) as progress:
        task = progress.add_task("", total=total)
        failed = 0

        def advance(result: EvalResult) -> None:
            nonlocal failed
            failed += not result.passed
            progress.update(task, advance=1, description=f"{failed} not passed" if failed else "")

        yield advance


def _summary(out: Output, report: EvalReport) -> None:
    counts = report.counts
    figures = report.totals
    slow = slowest(report.results)
    if out.json_mode:
        out.json(
            {
                "counts": {status.value: count for status, count in counts.items()},
                "flaky": figures.flaky,
                "totals": figures.to_json(),
                "slowest": [
                    {
                        "id": result.id,
                        "status": result.status.value,
                        "wall_seconds": result.wall_seconds,
                        "cpu_seconds": result.cpu_seconds,
                        "peak_memory": result.peak_memory,
                    }
                    for result in slow
                ],
                "total": len(report.results),
                "invalid": [{"line": i.line, "id": i.id, "message": i.message} for i in report.invalid],
                "resumed": report.resumed,
                "seconds": report.seconds,
                "image": report.image,
                "exit_code": report.exit_code,
            }
        )
        return
    table = Table(box=None, pad_edge=False)  # no rules: as every table of ours (docs/cli.md)
    table.add_column("STATUS")
    table.add_column("COUNT", justify="right")
    for status, count in counts.items():
        if count:
            table.add_row(status.value, str(count), style=_STYLE.get(status, "yellow"))
    if report.invalid:
        table.add_row("invalid input", str(len(report.invalid)), style="red")
    if figures.flaky:
        table.add_row("flaky", str(figures.flaky), style="yellow")
    out.table(table)
    if slow:
        slowest_table = Table(box=None, pad_edge=False, title="slowest", title_justify="left")
        for column in ("ID", "STATUS", "WALL", "CPU", "PEAK"):
            slowest_table.add_column(column, justify="left" if column in ("ID", "STATUS") else "right")
        for result in slow:
            slowest_table.add_row(
                Text(one_line(result.id)),  # a Text: an id is never read as markup
                result.status.value,
                _seconds(result.wall_seconds),
                _seconds(result.cpu_seconds),
                describe_bytes(result.peak_memory),
            )
        out.table(slowest_table)
    peak = describe_bytes(figures.peak_memory)
    unmeasured = figures.runs - figures.measured
    missing = f" ({counted(unmeasured, 'run')} without a CPU figure)" if unmeasured else ""
    out.line(
        f"{counted(figures.runs, 'run')}: CPU {figures.cpu_seconds:.2f} s{missing}, wall {figures.wall_seconds:.2f} s, "
        f"largest peak memory {peak}"
    )
    rate = len(report.results) - report.resumed
    pace = f", {rate / report.seconds:.1f}/s" if report.seconds > 0 and rate else ""
    resumed = f" ({report.resumed} from the earlier run)" if report.resumed else ""
    out.line(
        f"{counts[Status.PASSED]} of {len(report.results)} passed{resumed} in "
        f"{report.seconds:.1f} s{pace}; image {report.image}"
    )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"
