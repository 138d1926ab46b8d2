"""Benchmark: our sessions and the peer's (rlms' DockerREPL) side by side, every number measured in this run.

    python bench/run.py [--quick] [--only WORD ...] [--json PATH] [--chart PATH]

Every row is measured for both systems on the same base image (``ORCH_BASE_IMAGE``): ours is
``orchestrator`` (``Orchestrator(settings).create_session()``); the peer is rlms' own
``rlm.environments.docker_repl.DockerREPL(image=..., persistent=True)`` on the image
``peer.py`` builds on that base. Both go through one ``Runner`` protocol, so a metric is one
function run once per system. The table shows per row the median with min and max of each
system, the ratio peer/ours, the issue's target and PASS/FAIL; ``--json`` keeps every sample,
the host's facts and the engine's version; ``--chart`` draws latency against state size
(matplotlib, the ``bench`` extra; without it the chart is skipped and said so).

The exit status is 0 even when a target is missed (this is a report; the table says which), 1
when a metric could not be measured (its traceback is printed, its row says NOT MEASURED) or a
container of either system was left behind, and 2 when the benchmark could not start (no
engine, no image).

This module is the command line and the run loop; its siblings hold the rest: ``runners.py``
(the two systems), ``measures.py`` (how each metric is measured, and how often), ``rows.py``
(the rows, their targets and verdicts) and ``report.py`` (table, notes, chart, JSON).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import docker.errors
from measures import FULL, QUICK, Measured, Reps
from report import draw_chart, host_facts, print_notes, print_table, summary, write_json
from rows import Metric, RowResult, Side, metrics
from runners import OURS, PEER, SYSTEMS, OrchestratorRunner, PeerRunner, Runner, shut_down

from orchestrator import OrchestratorError

DEFAULT_CHART = Path(__file__).resolve().parent / "latency-vs-state.png"


def chosen(plan: list[Metric], only: Sequence[str]) -> list[Metric]:
    """The metrics whose name contains one of ``only`` (case-insensitive); all of them when ``only`` is empty.

    Raises:
        ValueError: a word matches no metric (the message names them all).
    """
    words = [word.lower() for word in only]
    unmatched = [word for word in words if not any(word in metric.name.lower() for metric in plan)]
    if unmatched:
        names = ", ".join(repr(metric.name) for metric in plan)
        raise ValueError(f"--only {', '.join(unmatched)} matches no metric; the metrics are {names}")
    return [metric for metric in plan if not words or any(word in metric.name.lower() for word in words)]


def run(
    reps: Reps, runners: dict[str, Runner | None], runner_errors: dict[str, str], only: Sequence[str] = ()
) -> tuple[list[RowResult], dict[str, Any]]:
    """Run every metric (or those ``only`` names) for each system; a failure is printed and fills that system's rows
    with the error."""
    measured: dict[str, dict[str, Side]] = {system: {} for system in SYSTEMS}
    facts: dict[str, Any] = {system: {} for system in SYSTEMS}
    plan = chosen(metrics(reps), only)

    def record(metric: Metric, system: str, outcome: Measured | str) -> None:
        for row in metric.rows:
            if isinstance(outcome, str):
                measured[system][row.key] = Side(error=outcome)
            elif row.key in outcome.samples:
                measured[system][row.key] = Side(outcome.samples[row.key], text=outcome.texts.get(row.key))
        if isinstance(outcome, Measured) and outcome.facts:
            facts[system][metric.name] = outcome.facts

    def attempt(label: str, call: Callable[[], Any]) -> Any | str:
        print(f"  {label} ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        try:
            return call()
        except Exception as exc:  # one broken metric must not hide the others
            traceback.print_exc()
            return f"{type(exc).__name__}: {exc}"
        finally:
            print(f"  {label} done in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)

    for metric in plan:
        if metric.joint is not None:
            outcome = attempt(f"{metric.name} (both)", functools.partial(metric.joint, runners, reps))
            for system in SYSTEMS:
                record(metric, system, outcome if isinstance(outcome, str) else outcome[system])
            continue
        for system in metric.systems:
            runner = runners[system]
            if runner is None:
                record(metric, system, runner_errors[system])
                continue
            measure = metric.measure
            assert measure is not None
            record(metric, system, attempt(f"{metric.name} ({system})", functools.partial(measure, runner, reps)))

    results = []
    for metric in plan:
        for row in metric.rows:
            missing = "not reached" if row.key.startswith("idle_probe") else "-"
            results.append(
                RowResult(
                    row,
                    measured[OURS].get(row.key, Side(text="-")),
                    measured[PEER].get(row.peer_key or row.key, Side(text=missing)),
                )
            )
    by_key = {r.row.key: r for r in results}
    for result in results:
        result.judge(by_key)
    return results, facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="far fewer repetitions (a smoke run, ~2 min)")
    parser.add_argument(
        "--only",
        metavar="WORD",
        action="append",
        default=[],
        help="run only the metrics whose name contains WORD (repeatable; e.g. --only fork --only rewind --only "
        "restore); no chart unless --chart is given",
    )
    parser.add_argument(
        "--json", metavar="PATH", type=Path, help="also write every sample and the host's facts as JSON"
    )
    parser.add_argument(
        "--chart",
        metavar="PATH",
        type=Path,
        help=f"PNG of latency against state size (default {DEFAULT_CHART.name} beside this script; none with --only)",
    )
    args = parser.parse_args(argv)
    reps = QUICK if args.quick else FULL
    try:
        chosen(metrics(reps), args.only)
    except ValueError as exc:
        parser.error(str(exc))
    mode = ("quick" if args.quick else "full") + (f" (only {', '.join(args.only)})" if args.only else "")
    chart = args.chart or (None if args.only else DEFAULT_CHART)
    started = time.perf_counter()
    try:
        ours = OrchestratorRunner()
    except (OrchestratorError, docker.errors.DockerException) as exc:
        print(f"bench: cannot start: {type(exc).__name__}: {exc}", file=sys.stderr)
        if "ORCH_BASE_IMAGE" not in os.environ:
            print("bench: without a registry, set ORCH_BASE_IMAGE to a local base image", file=sys.stderr)
        return 2
    runners: dict[str, Runner | None] = {OURS: ours, PEER: None}
    runner_errors: dict[str, str] = {}
    leftovers: list[str] = []
    try:
        try:
            runners[PEER] = PeerRunner(ours.settings.base_image)
        except Exception as exc:  # the peer's rows say NOT MEASURED; ours still run
            traceback.print_exc()
            runner_errors[PEER] = f"the peer could not start: {type(exc).__name__}: {exc}"
        print(f"bench: {mode} mode, base image {ours.settings.base_image}", file=sys.stderr)
        host = host_facts(runners, ours.client)
        results, facts = run(reps, runners, runner_errors, args.only)
    finally:
        leftovers += shut_down([runner for runner in (runners[PEER], ours) if runner is not None])
    wall = time.perf_counter() - started
    host["load_average_end"] = os.getloadavg()

    print()
    print_table(results)
    print_notes(results, facts, reps)
    line = summary(mode, wall, ours.settings.base_image, host)
    print(line)
    for container in leftovers:
        print(f"LEFT OVER container: {container}")
    skipped = "--only without --chart" if chart is None else draw_chart(results, chart, line)
    print(f"chart skipped: {skipped}" if skipped else f"chart written to {chart}")
    if args.json:
        write_json(args.json, mode, reps, wall, host, results, facts, leftovers)
        print(f"results written to {args.json}")
    errors = any(r.ours.error or (r.peer.error and not r.row.peer_key) for r in results)
    return 1 if errors or leftovers else 0


if __name__ == "__main__":
    sys.exit(main())
