"""Live calls: what streaming output costs, how soon a print reaches the host, asyncio against threads, big output.

One run measures four things:

- trivial cell: ``execute("1")`` without ``on_output`` and with a no-op ``on_output``,
  interleaved (10 x ``--reps`` calls each, after 20 warm-ups each). Streaming must not slow the
  plain path; the ratio with/without says what asking for a stream costs.
- first chunk: a cell prints ``time.time()`` with ``flush=True`` and sleeps 0.3 s; the callback
  notes the host's ``time.time()`` when that chunk arrives. The difference is the latency from
  the ``print`` in the sandbox to the callback (containers read the host's clock). ``--reps``
  samples; the issue's target is within ~50 ms.
- many sessions: ``--sessions`` sessions x ``--cells`` trivial cells, driven three ways over the
  same sessions: from one asyncio loop (``AsyncSession.execute`` under ``asyncio.gather``), from
  a ``ThreadPoolExecutor`` with a thread per session (``Session.execute``), and one after the
  other in one thread. Wall time of all the cells; ``--reps // 6`` rounds (at least 1), the
  three ways taking turns.
- big output: a cell writes 50 MB to stdout in 1000-byte lines; the call's time, the size of
  the file at ``result.stdout_path`` (the whole stream) and the length of the preview in
  ``result.stdout``. ``--reps // 6`` samples (at least 1).

Sessions live in temporary state and runtime directories under ``/tmp`` and are closed in
``finally``; every container carries a label of this run, and the run fails (exit 1) if
``docker ps -a`` still lists one at the end. Exit 2: the benchmark could not start.

    python bench/live.py [--reps 30] [--sessions 20] [--cells 50] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from orchestrator import Orchestrator, OrchestratorError, Session, Settings
from orchestrator.api.aio import AsyncOrchestrator, AsyncSession
from orchestrator.api.events import Event, OutputEvent

RUN_LABEL = "orchestrator.bench.live-run"
TRIVIAL = "1"
TRIVIAL_WARMUP = 20
FIRST_CHUNK = "import time\nprint(time.time(), flush=True)\ntime.sleep(0.3)"
FIRST_CHUNK_TARGET = 0.050
BIG_LINES = 50_000
BIG_LINE = 1000  # bytes, newline included
BIG_OUTPUT = (
    f"import sys\nline = 'x' * {BIG_LINE - 1} + '\\n'\nfor _ in range({BIG_LINES}):\n    sys.stdout.write(line)"
)


def timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def trivial(session: Session, on_output: Callable[[Event], None] | None = None) -> None:
    result = session.execute(TRIVIAL, on_output=on_output)
    if result.return_value != "1":
        raise RuntimeError(f"trivial cell returned {result.return_value!r} ({result.error})")


def ignore(event: Event) -> None:
    pass


def bench_trivial(session: Session, calls: int) -> list[dict[str, Any]]:
    for _ in range(TRIVIAL_WARMUP):
        trivial(session)
        trivial(session, ignore)
    plain, streamed = [], []
    for _ in range(calls):  # interleaved, so drift from other work on the machine hits both alike
        plain.append(timed(lambda: trivial(session)))
        streamed.append(timed(lambda: trivial(session, ignore)))
    return [
        {"metric": 'trivial cell execute("1"), no on_output', "unit": "ms", "samples": plain},
        {"metric": 'trivial cell execute("1"), no-op on_output', "unit": "ms", "samples": streamed},
    ]


def first_stdout(arrivals: list[tuple[float, str]]) -> Callable[[Event], None]:
    """A callback that notes the host's clock and the text when the first stdout chunk arrives."""

    def on_output(event: Event) -> None:
        if isinstance(event, OutputEvent) and event.stream == "stdout" and not arrivals:
            arrivals.append((time.time(), event.text))

    return on_output


def bench_first_chunk(session: Session, reps: int) -> dict[str, Any]:
    samples = []
    for rep in range(reps + 1):  # the first is a warm-up
        arrivals: list[tuple[float, str]] = []
        result = session.execute(FIRST_CHUNK, on_output=first_stdout(arrivals))
        if not result.ok or not arrivals:
            raise RuntimeError(f"first-chunk cell: no stdout event ({result.error})")
        arrived, text = arrivals[0]
        if rep:
            samples.append(arrived - float(text.split()[0]))
    return {
        "metric": "first streamed chunk, print in sandbox -> callback",
        "unit": "ms",
        "samples": samples,
        "target": FIRST_CHUNK_TARGET,
    }


def bench_big_output(session: Session, reps: int) -> dict[str, Any]:
    samples, files, previews = [], [], []
    for _ in range(reps):
        started = time.perf_counter()
        result = session.execute(BIG_OUTPUT)
        samples.append(time.perf_counter() - started)
        if not result.ok or result.stdout_path is None:
            raise RuntimeError(f"big-output cell: no stdout file ({result.error})")
        files.append(result.stdout_path.stat().st_size)
        previews.append(len(result.stdout))
        result.stdout_path.unlink()
    if any(size != BIG_LINES * BIG_LINE for size in files):
        raise RuntimeError(f"stdout file sizes {files}, expected {BIG_LINES * BIG_LINE} bytes each")
    return {
        "metric": f"cell printing {BIG_LINES * BIG_LINE // 1_000_000} MB (1000-byte lines)",
        "unit": "s",
        "samples": samples,
        "stdout_file_bytes": files,
        "preview_chars": previews,
    }


async def async_round(sessions: list[AsyncSession], cells: int) -> None:
    async def drive(session: AsyncSession) -> None:
        for _ in range(cells):
            result = await session.execute(TRIVIAL)
            if result.return_value != "1":
                raise RuntimeError(f"trivial cell returned {result.return_value!r} ({result.error})")

    await asyncio.gather(*(drive(session) for session in sessions))


def threads_round(pool: ThreadPoolExecutor, sessions: list[Session], cells: int) -> None:
    def drive(session: Session) -> None:
        for _ in range(cells):
            trivial(session)

    for future in [pool.submit(drive, session) for session in sessions]:
        future.result()


def sequential_round(sessions: list[Session], cells: int) -> None:
    for session in sessions:
        for _ in range(cells):
            trivial(session)


async def bench_many(
    settings: Settings, labels: dict[str, str], count: int, cells: int, rounds: int
) -> list[dict[str, Any]]:
    ways: dict[str, list[float]] = {"asyncio": [], "threads": [], "sequential": []}
    async with AsyncOrchestrator(settings) as orch:
        sessions: list[AsyncSession] = []
        try:
            for _ in range(count):  # one at a time: the engine on 2 cores starts them no faster together
                sessions.append(await orch.create_session(labels=labels))
            plain = [session.sync for session in sessions]
            with ThreadPoolExecutor(max_workers=count, thread_name_prefix="bench-live") as pool:
                threads_round(pool, plain, 2)  # warm-up: every session, every pool thread, the loop's executor
                await async_round(sessions, 2)
                for turn in range(rounds):
                    order = list(ways)[turn % 3 :] + list(ways)[: turn % 3]
                    for way in order:
                        started = time.perf_counter()
                        if way == "asyncio":
                            await async_round(sessions, cells)
                        elif way == "threads":
                            threads_round(pool, plain, cells)
                        else:
                            sequential_round(plain, cells)
                        ways[way].append(time.perf_counter() - started)
        finally:
            await asyncio.gather(*(session.close() for session in sessions), return_exceptions=True)
    how = {
        "asyncio": "one asyncio loop, AsyncSession.execute + gather",
        "threads": f"ThreadPoolExecutor({count}), Session.execute",
        "sequential": "one thread, one session after another",
    }
    return [
        {"metric": f"{count} sessions x {cells} cells: {how[way]}", "unit": "s", "samples": samples, "way": way}
        for way, samples in ways.items()
    ]


def leftovers(run_id: str) -> list[str]:
    """Ids of this run's containers that ``docker ps -a`` still lists."""
    command = ["docker", "ps", "-a", "-q", "--filter", f"label={RUN_LABEL}={run_id}"]
    listing = subprocess.run(command, capture_output=True, text=True)
    if listing.returncode:
        print(f"bench: could not check for left-over containers: {listing.stderr.strip()}", file=sys.stderr)
    return listing.stdout.split()


def show(value: float, unit: str) -> str:
    return f"{value * 1000:8.2f} ms" if unit == "ms" else f"{value:8.3f} s "


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, help="first-chunk samples (default 30, 10 with --quick); see the docstring")
    parser.add_argument("--sessions", type=int, default=20, help="sessions of the many-sessions rows")
    parser.add_argument("--cells", type=int, default=50, help="trivial cells per session in the many-sessions rows")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    parser.add_argument("--json", metavar="PATH", type=Path, help="also write the samples as JSON")
    args = parser.parse_args(argv)
    reps = args.reps or (10 if args.quick else 30)
    rounds = max(1, reps // 6)
    run_id = secrets.token_hex(6)
    labels = {RUN_LABEL: run_id}
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="orch-live-", dir="/tmp") as tmp:  # short: Unix socket paths
        base = Settings.from_env()
        one = base.replace(state_dir=Path(tmp) / "s", runtime_dir=Path(tmp) / "r")
        many = base.replace(state_dir=Path(tmp) / "ms", runtime_dir=Path(tmp) / "mr")
        try:
            with Orchestrator(one) as orch:
                image = orch.build_image()
                with orch.create_session(labels=labels) as session:
                    rows.extend(bench_trivial(session, 10 * reps))
                    rows.append(bench_first_chunk(session, reps))
                    rows.append(bench_big_output(session, rounds))
            rows.extend(asyncio.run(bench_many(many, labels, args.sessions, args.cells, rounds)))
        except OrchestratorError as exc:
            print(f"bench: {type(exc).__name__}: {exc}", file=sys.stderr)
            if "ORCH_BASE_IMAGE" not in os.environ:
                print("bench: without a registry, set ORCH_BASE_IMAGE to a local base image", file=sys.stderr)
            return 2 if not rows else 1
        finally:
            left = leftovers(run_id)
    wall = time.perf_counter() - started

    print(f"\n{'metric':<70} {'median':>11} {'min':>11} {'max':>11}")
    for row in rows:
        samples, unit = row["samples"], row["unit"]
        print(
            f"{row['metric']:<70} {show(statistics.median(samples), unit)} {show(min(samples), unit)} "
            f"{show(max(samples), unit)}"
        )
    median = {row["metric"]: statistics.median(row["samples"]) for row in rows}
    plain, streamed = rows[0], rows[1]
    ratio = median[streamed["metric"]] / median[plain["metric"]]
    print(f"\ntrivial cell, no-op on_output / no on_output: {ratio:.2f}x (medians)")
    chunk = rows[2]
    verdict = "ok" if median[chunk["metric"]] < chunk["target"] else "MISSED"
    target = chunk["target"]
    print(f"first chunk: median {median[chunk['metric']] * 1000:.1f} ms, target < {target * 1000:g} ms: {verdict}")
    big = rows[3]
    print(
        f"big output: stdout file {big['stdout_file_bytes'][0]:,} bytes, preview {big['preview_chars'][0]:,} chars, "
        f"{BIG_LINES * BIG_LINE / 1e6 / median[big['metric']]:.0f} MB/s"
    )
    by_way = {row["way"]: median[row["metric"]] for row in rows if "way" in row}
    cells = args.sessions * args.cells
    print(
        f"{cells} cells: asyncio/threads {by_way['asyncio'] / by_way['threads']:.2f}x, "
        f"asyncio/sequential {by_way['asyncio'] / by_way['sequential']:.2f}x, "
        f"threads/sequential {by_way['threads'] / by_way['sequential']:.2f}x; "
        + ", ".join(f"{way} {cells / seconds:.0f} cells/s" for way, seconds in by_way.items())
    )
    print(f"\nwall time {wall:.1f} s, {os.cpu_count()} cpus, image {image}; containers left over: {len(left)}")
    if args.json:
        report = {"reps": reps, "rounds": rounds, "sessions": args.sessions, "cells": args.cells, "rows": rows}
        args.json.write_text(json.dumps({**report, "wall_seconds": wall, "image": image, "left_over": left}, indent=1))
        print(f"samples written to {args.json}")
    if left:
        print(f"containers of this run still exist: {' '.join(left)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
