"""Grade many submissions, ``jobs`` at a time, each in a fresh sandbox from a pool, never losing a result.

Every result is written (flushed, fsynced) to the results file the moment its submission ends (its last run,
with ``runs``), then its sandbox is removed; the pool starts the next sandboxes meanwhile. Containers carry the
run's labels (``orchestrator.eval-run``, the controller's host and pid), so a run that was
killed leaves nothing a later run does not remove (``sweep_dead_runs``).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..backends.base import Backend
from ..checks import is_integer
from ..config import Settings
from ..errors import ConfigError, ImageMissing, OrchestratorError
from ..metrics import NO_METRICS, Recorder
from ..ops.pool import SandboxPool, SandboxTemplate
from ..runtime.discard import discard_left_behind
from ..runtime.sandbox import Sandbox
from ..state.controllers import EVAL_RUN, controller_labels, left_behind
from ..units import parse_size
from .accounting import Totals, combine_runs, cpu_seconds, read_usage, totals
from .grading import Status, error_json
from .records import EvalResult, ResultsFile, status_counts, write_junit
from .runner import SubmissionRunner
from .submissions import InvalidLine, Submission, read_memory, read_timeout

logger = logging.getLogger(__name__)

MAX_RUNS = 100


@dataclass(frozen=True)
class EvalOptions:
    """How a run grades: the defaults a submission can override (``timeout``, ``memory``) and the run's shape."""

    jobs: int = 2
    """Submissions running at once (1 to 256)."""
    timeout: float = 10.0
    """Seconds (or a duration: "90s", "2m") for a submission's code and tests together, unless it sets
    ``timeout``; more than 0, at most a day."""
    memory: int | str | None = None
    """The sandbox's memory limit (bytes, or a size: "512m") unless a submission sets ``memory``, at least
    ``MIN_SANDBOX_MEMORY`` (None: ``Settings.limits.memory``)."""
    output_limit: int = 1 << 20
    """Most bytes (or a size: "1m") a submission may print (stdout and stderr together), 1 KiB to 1 GiB; past it:
    ``output_limit``."""
    pool_size: int | None = None
    """Sandboxes started ahead (None: ``jobs``)."""
    share_network: bool = True
    """Lend loopback-only network namespaces between sandboxes one at a time (``pool.NetworkSlots``)."""
    strict: bool = False
    """Grade in strict mode unless a submission sets ``grading``: its tests run in an interpreter of their own and
    reach its functions through plain data only (docs/eval.md, "Strict mode")."""
    runs: int = 1
    """Times each submission is graded, each in a fresh sandbox (1 to 100); its record is ``flaky`` when the runs'
    statuses differ (docs/eval.md, "Runs and flaky submissions")."""

    def __post_init__(self) -> None:
        if not is_integer(self.jobs) or not 1 <= self.jobs <= 256:
            raise ConfigError(f"jobs must be an integer from 1 to 256, got {self.jobs!r}")
        object.__setattr__(self, "timeout", read_timeout("timeout", self.timeout))
        if self.memory is not None:
            object.__setattr__(self, "memory", read_memory("memory", self.memory))
        try:
            output_limit = parse_size(self.output_limit)
        except ConfigError:
            output_limit = -1
        if not 1024 <= output_limit <= 1 << 30:
            raise ConfigError(f"output_limit must be a size from 1 KiB to 1 GiB, got {self.output_limit!r}")
        object.__setattr__(self, "output_limit", output_limit)
        if self.pool_size is not None and (not isinstance(self.pool_size, int) or self.pool_size < 0):
            raise ConfigError(f"pool_size must be a non-negative integer, got {self.pool_size!r}")
        if not isinstance(self.strict, bool):
            raise ConfigError(f"strict must be True or False, got {self.strict!r}")
        if not is_integer(self.runs) or not 1 <= self.runs <= MAX_RUNS:
            raise ConfigError(f"runs must be an integer from 1 to {MAX_RUNS}, got {self.runs!r}")


@dataclass
class EvalReport:
    """A finished run: every submission's result in input order (earlier runs' for resumed ids), the invalid lines."""

    results: list[EvalResult] = field(default_factory=list)
    invalid: list[InvalidLine] = field(default_factory=list)
    resumed: int = 0
    """Results taken from the results file of an earlier run (not run again)."""
    seconds: float = 0.0
    image: str = ""

    @property
    def counts(self) -> dict[Status, int]:
        return status_counts(self.results)

    @property
    def totals(self) -> Totals:
        """CPU, wall and peak memory over every run, and how many submissions were flaky."""
        return totals(self.results)

    @property
    def exit_code(self) -> int:
        """0: every submission passed; 1: any did not, or a line was invalid; 2: any infrastructure error."""
        counts = self.counts
        if counts[Status.INFRA_ERROR]:
            return 2
        return 0 if counts[Status.PASSED] == len(self.results) and not self.invalid else 1


OnResult = Callable[[EvalResult], None]


class Evaluator:
    """Runs submissions under one ``Settings`` and ``EvalOptions`` on one backend."""

    def __init__(
        self,
        backend: Backend,
        settings: Settings,
        options: EvalOptions | None = None,
        *,
        image: str,
        metrics: Recorder = NO_METRICS,
    ) -> None:
        """``image``: the sandbox image (with the agent) every submission runs in; ``metrics``: told each outcome."""
        self._metrics = metrics
        self._backend = backend
        self._image = image
        self._options = options or EvalOptions()
        memory = self._options.memory if self._options.memory is not None else settings.limits.memory
        self._settings = settings.replace(
            limits=settings.limits.replace(max_output_bytes=self._options.output_limit, memory=memory)
        )
        self._default_memory = self._settings.limits.memory_bytes
        self._run_id = secrets.token_hex(4)
        self._labels = {EVAL_RUN: self._run_id, **controller_labels("eval", self._settings.runtime_dir)}
        self._lock = threading.Lock()
        self._in_use: set[Sandbox] = set()
        self._stopping = threading.Event()

    def run(
        self,
        items: Iterable[Submission | InvalidLine],
        *,
        results_file: ResultsFile | None = None,
        junit: Path | None = None,
        on_result: OnResult | None = None,
    ) -> EvalReport:
        """Grade ``items`` (invalid lines are reported, not run); ids ``results_file`` finished are not run again.

        Raises:
            ImageMissing: the sandbox image is not built.
            EngineError: the engine cannot be used at all (one submission's failure is its ``infra_error``).
        """
        started = time.monotonic()
        image = self._image
        image_id = self._backend.image_id(image)
        if image_id is None:
            raise ImageMissing(f"sandbox image {image!r} does not exist; build it with `orchestrator image build`")
        sweep_dead_runs(self._backend)
        if results_file is not None:
            results_file.begin()
        report = EvalReport(image=image)
        done = results_file.finished() if results_file is not None else set()
        previous = results_file.previous if results_file is not None else {}
        order, todo = _sort(items, done, report)
        finished: dict[str, EvalResult] = {}
        pool = self._pool(todo)
        try:
            self._grade_all(todo, pool, image_id, self._finisher(finished, results_file, on_result))
        finally:
            pool.close()
        report.results = [
            finished[key] if key in finished else previous[key] for key in order if key in finished or key in previous
        ]
        report.seconds = time.monotonic() - started
        if junit is not None:
            _write_junit(junit, report)
        return report

    def _pool(self, todo: list[Submission]) -> SandboxPool:
        """The warm sandboxes of this run: as many as run at once, no more than the runs of the default memory."""
        size = self._options.jobs if self._options.pool_size is None else self._options.pool_size
        return SandboxPool(
            self._backend,
            self._settings,
            SandboxTemplate(self._image, f"eval-{self._run_id}", self._labels),
            size=min(size, self._options.runs * sum(1 for s in todo if s.memory in (None, self._default_memory))),
            share_network=self._options.share_network,
            metrics=self._metrics,
        )

    def _finisher(
        self, finished: dict[str, EvalResult], results_file: ResultsFile | None, on_result: OnResult | None
    ) -> Callable[[EvalResult], None]:
        """What is done with each submission's result: kept, written, counted and passed to ``on_result``."""

        def finish(result: EvalResult) -> None:
            with self._lock:
                if self._stopping.is_set():
                    return
                if results_file is not None:
                    results_file.append(result)
                finished[result.id] = result
            self._metrics.eval_result(result.status.value)
            if on_result is not None:
                try:
                    on_result(result)
                except Exception:  # the caller's bug must not stop the run: the result is written already
                    logger.warning("eval: the on_result callback raised on %s", result.id, exc_info=True)

        return finish

    def _grade_all(
        self, todo: list[Submission], pool: SandboxPool, image_id: str, finish: Callable[[EvalResult], None]
    ) -> None:
        """Grade each submission ``runs`` times, ``jobs`` at once; interrupted, stop them all."""
        runner = SubmissionRunner(self._settings, output_limit=self._options.output_limit)
        with ThreadPoolExecutor(self._options.jobs, thread_name_prefix="eval") as jobs:
            try:
                futures = []
                for submission in todo:
                    collect = _RunsOf(self._options.runs, finish)  # one per submission, shared by its runs
                    futures += [
                        jobs.submit(self._grade, pool, runner, submission, image_id, collect)
                        for _ in range(self._options.runs)
                    ]
                for future in futures:
                    future.result()
            except BaseException:
                self._stop()
                raise

    def _stop(self) -> None:
        """Interrupted: keep no more results and remove the sandboxes still running (their jobs end at once)."""
        self._stopping.set()
        with self._lock:
            running = list(self._in_use)
        for sandbox in running:
            with contextlib.suppress(OrchestratorError):
                self._backend.remove(sandbox.container_id)

    def _grade(
        self,
        pool: SandboxPool,
        runner: SubmissionRunner,
        submission: Submission,
        image_id: str,
        collect: _RunsOf,
    ) -> None:
        """One run of ``submission`` in a fresh sandbox (its runs are jobs of their own, so they run side by side),
        handed to ``collect`` before its sandbox is removed: the last run's record is written first."""
        if self._stopping.is_set():
            return
        started = time.monotonic()
        timeout = submission.timeout or self._options.timeout
        memory = submission.memory or self._default_memory
        strict = submission.grading == "strict" or (submission.grading is None and self._options.strict)
        limits = self._limits(timeout, memory)
        common: dict[str, Any] = {
            "id": submission.id,
            "line": submission.line,
            "limits": limits,
            "image": self._image,
            "image_id": image_id,
            "grading": "strict" if strict else "default",
        }
        try:
            if memory == self._default_memory:
                sandbox = pool.take()
            else:
                sandbox = pool.start(self._settings.replace(limits=self._settings.limits.replace(memory=memory)))
        except OrchestratorError as exc:
            collect.add(_infra_error(common, started, f"no sandbox could be started: {type(exc).__name__}: {exc}"))
            return
        with self._lock:
            self._in_use.add(sandbox)
        try:
            waited = time.monotonic() - started
            before = read_usage(self._backend, sandbox.container_id)
            try:
                verdict, code, tests = runner.run(sandbox, submission, timeout, strict=strict)
            except Exception as exc:  # a fault of the controller's: this submission's infra_error, the run goes on
                logger.exception("eval: grading %s failed", submission.id)
                collect.add(_infra_error(common, started, f"grading it failed: {type(exc).__name__}: {exc}"))
                return
            after = read_usage(self._backend, sandbox.container_id)
            stdout = code.stdout + (tests.stdout if tests is not None else "")
            stderr = code.stderr + (tests.stderr if tests is not None else "")
            durations = {"total": time.monotonic() - started, "sandbox": waited, "code": code.duration}
            if tests is not None:
                durations["tests"] = tests.duration
            result = EvalResult(
                status=verdict.status,
                message=verdict.message,
                phase=verdict.phase,
                stdout=stdout,
                stderr=stderr,
                output_truncated=verdict.status is Status.OUTPUT_LIMIT,
                error=error_json(verdict.error),
                diff=verdict.diff,
                durations=durations,
                sandbox_id=sandbox.sandbox_id,
                finished_at=time.time(),
                cpu_seconds=cpu_seconds(before, after),
                wall_seconds=code.duration + (tests.duration if tests is not None else 0.0),
                peak_memory=after.peak_memory if after is not None else None,
                signal=verdict.signal,
                **common,
            )
            collect.add(result)
        finally:
            with self._lock:
                self._in_use.discard(sandbox)
            try:
                pool.discard(sandbox)
            except OrchestratorError as exc:
                logger.warning("eval: removing sandbox %s failed: %s", sandbox.sandbox_id, exc)

    def _limits(self, timeout: float, memory: int) -> dict[str, Any]:
        settings = self._settings
        return {
            "timeout": timeout,
            "memory": memory,
            "cpus": settings.limits.nano_cpus / 1e9,
            "pids": settings.limits.pids,
            "output": self._options.output_limit,
            "network": "loopback only"
            if settings.confinement.network_mode == "none"
            else settings.confinement.network_mode,
            "read_only": settings.confinement.read_only,
            "user": settings.confinement.user,
            # the submission's own uid, one per sandbox from this range (the user above is its supervisor's)
            "worker_uids": "{}-{}".format(*settings.confinement.worker_uids)
            if settings.confinement.separate_worker
            else None,
            "tmpfs": dict(settings.confinement.tmpfs),
        }


class _RunsOf:
    """The runs of one submission as they end (in any order, from several jobs); the last one finishes its record."""

    def __init__(self, runs: int, finish: OnResult) -> None:
        self._runs = runs
        self._finish = finish
        self._lock = threading.Lock()
        self._ended: list[EvalResult] = []

    def add(self, result: EvalResult) -> None:
        with self._lock:
            self._ended.append(result)
            if len(self._ended) < self._runs:
                return
            ended = self._ended
        self._finish(ended[0] if len(ended) == 1 else combine_runs(ended))


def _infra_error(common: dict[str, Any], started: float, message: str) -> EvalResult:
    took = time.monotonic() - started
    return EvalResult(
        status=Status.INFRA_ERROR, message=message, durations={"total": took}, finished_at=time.time(), **common
    )


def sweep_dead_runs(backend: Backend) -> list[str]:
    """Remove the containers of eval runs on this host whose controller process is gone, with their channel
    directories (in the runtime dir each names in a label); return their names."""
    removed = []
    for container in left_behind(backend, "eval"):
        with contextlib.suppress(OrchestratorError):
            discard_left_behind(backend, container)
            removed.append(container.name)
    if removed:
        logger.info("eval: removed %d containers of runs that died: %s", len(removed), ", ".join(removed))
    return removed


def _sort(
    items: Iterable[Submission | InvalidLine], done: set[str], report: EvalReport
) -> tuple[list[str], list[Submission]]:
    """The ids in the input's order and the submissions to grade; invalid lines and resumed ids go to ``report``."""
    order: list[str] = []
    todo: list[Submission] = []
    for item in items:
        if isinstance(item, InvalidLine):
            report.invalid.append(item)
            continue
        order.append(item.id)
        if item.id in done:
            report.resumed += 1
        else:
            todo.append(item)
    return order, todo


def _write_junit(junit: Path, report: EvalReport) -> None:
    figures = {f"total_{key}": str(value) for key, value in report.totals.to_json().items() if value is not None}
    write_junit(
        junit, report.results, report.invalid, name="orchestrator eval", seconds=report.seconds, properties=figures
    )
