"""What a submission cost and how it ended, from sources it cannot write: CPU, wall, peak memory, signal; its runs.

Where each figure comes from (docs/eval.md, "Figures"):

- ``cpu_seconds``: the CPU counter of the sandbox's cgroup, read from outside it (``Backend.usage``: this host's
  cgroup files when the engine runs here, else the engine's stats), once when the run takes the sandbox and once
  after its verdict: the difference (the submission, with the agent serving it).
- ``peak_memory``: the peak of the sandbox's cgroup (v1 ``max_usage_in_bytes``, v2 ``memory.peak``), read the same
  way: the whole sandbox since it started, the idle agent included.
- ``wall_seconds``: this host's clock around the submission's code and tests.
- ``signal``: the signal that ended the submission's interpreter, from the grading harness's ``waitpid`` (a process
  the submission cannot ptrace), checked on the host to be a signal's name.

None of them is read from what the submission prints or from its interpreter. A figure the engine cannot give
(a backend on other machines, a container already gone) is None, never a guess.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..backends.base import Backend, ContainerUsage
from ..errors import OrchestratorError
from .grading import Status
from .records import EvalResult

logger = logging.getLogger(__name__)

SLOWEST = 5
"""Submissions the summary names as the slowest."""


def read_usage(backend: Backend, container_id: str) -> ContainerUsage | None:
    """The sandbox's cgroup counters through the engine; None (logged) when the engine cannot tell: a figure that is
    missing never stops a submission's grading."""
    try:
        return backend.usage(container_id)
    except OrchestratorError as exc:
        logger.warning("eval: no figures for container %s: %s", container_id[:12], exc)
        return None


def cpu_seconds(before: ContainerUsage | None, after: ContainerUsage | None) -> float | None:
    """CPU seconds the sandbox used between two readings; None when either has none or the counter went back."""
    if before is None or after is None or before.cpu_ns is None or after.cpu_ns is None:
        return None
    used = after.cpu_ns - before.cpu_ns
    return used / 1e9 if used >= 0 else None


def run_summary(result: EvalResult) -> dict[str, Any]:
    """One run of a submission as its record lists it under ``runs``."""
    return {
        "status": result.status.value,
        "message": result.message,
        "signal": result.signal,
        "cpu_seconds": result.cpu_seconds,
        "wall_seconds": result.wall_seconds,
        "peak_memory": result.peak_memory,
        "sandbox_id": result.sandbox_id,
    }


def combine_runs(results: Sequence[EvalResult]) -> EvalResult:
    """The record of a submission graded ``len(results)`` times, each in a fresh sandbox.

    Its fields are those of the run that decides: an ``infra_error`` if any run had one (no verdict then: it runs
    again on ``--resume``, and it is not called flaky), else the first run that did not pass, else the first run.
    ``flaky``: the runs' statuses differ. ``runs``: every run's status, message and figures, in the order they
    ended.
    """
    if not results:
        raise ValueError("combine_runs needs at least one run")
    runs = [run_summary(result) for result in results]
    infra = next((result for result in results if result.status is Status.INFRA_ERROR), None)
    if infra is not None:
        return replace(infra, runs=runs, flaky=False)
    chosen = next((result for result in results if not result.passed), results[0])
    return replace(chosen, runs=runs, flaky=len({result.status for result in results}) > 1)


@dataclass(frozen=True)
class Totals:
    """The figures of a whole evaluation, over every run of every submission."""

    runs: int
    cpu_seconds: float
    """Summed over the runs that have the figure (``measured`` of them)."""
    wall_seconds: float
    peak_memory: int | None
    """The largest peak of any run."""
    measured: int
    """Runs with a CPU figure."""
    flaky: int
    """Submissions whose runs' verdicts differ."""

    def to_json(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "cpu_seconds": round(self.cpu_seconds, 3),
            "wall_seconds": round(self.wall_seconds, 3),
            "peak_memory": self.peak_memory,
            "measured": self.measured,
            "flaky": self.flaky,
        }


def totals(results: Iterable[EvalResult]) -> Totals:
    """Totals over ``results`` (records read back from an older results file may lack figures: they count none)."""
    runs = cpu = wall = 0.0
    measured = flaky = 0
    peak: int | None = None
    for result in results:
        flaky += result.flaky is True
        each = result.runs if isinstance(result.runs, list) and result.runs else [run_summary(result)]
        for run in each:
            runs += 1
            run = run if isinstance(run, dict) else {}
            used = _seconds(run.get("cpu_seconds"))
            if used is not None:
                cpu += used
                measured += 1
            wall += _seconds(run.get("wall_seconds")) or 0.0
            high = run.get("peak_memory")
            if type(high) is int and high >= 0:
                peak = high if peak is None else max(peak, high)
    return Totals(int(runs), cpu, wall, peak, measured, flaky)


def slowest(results: Iterable[EvalResult], count: int = SLOWEST) -> list[EvalResult]:
    """The ``count`` submissions with the most wall seconds (their deciding run's), slowest first."""
    timed = [result for result in results if _seconds(result.wall_seconds) is not None]
    return sorted(timed, key=lambda result: -(_seconds(result.wall_seconds) or 0.0))[:count]


def _seconds(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None
