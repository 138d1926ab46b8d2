"""Benchmark of persistent sessions against the issue's targets, with the peer's reference numbers beside ours.

Run ``python bench/run.py`` (``--quick`` for a smoke run, ``--json PATH`` to keep the numbers).
Every metric is a function that takes a *runner*: an object with ``create``, ``execute``,
``add_context``, ``kill``, ``close`` and ``memory`` methods. ``OrchestratorRunner`` is ours;
a runner for the peer (rlms' ``DockerREPL``) can be added to ``RUNNERS`` and measured by the
same functions. Until then the peer's numbers for those metrics are constants measured on this
machine; the RLM conversation (``rlm_conversation.py``) runs the peer itself, in this run.

The exit status is 0 even when a target is missed (this is a report), 1 when a metric could
not be measured, and 2 when the benchmark could not start (no engine, no image).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from orchestrator import Orchestrator, OrchestratorError, Session, Settings

BIG_STATE = 'big = "x" * 100_000_000'
BIG_LEN = "100000000"
CONTEXT_BYTES = 10_000_000
PEER_SOURCE = "reference, ENGINE-AND-IMAGES.md"
PEER_MEASURED = "measured in this run: rlms' DockerREPL"
RLM_CONTEXT_BYTES = 1_000_000


@dataclass(frozen=True)
class Reps:
    """How many times each metric repeats; ``--quick`` uses fewer."""

    trivial: int = 200
    trivial_warmup: int = 20
    unchanged: int = 50
    unchanged_warmup: int = 5
    add_context: int = 5
    new_session: int = 5
    restore: int = 3
    idle_sessions: int = 50
    rlm_conversation: int = 3


FULL = Reps()
QUICK = Reps(
    trivial=30,
    trivial_warmup=5,
    unchanged=10,
    unchanged_warmup=2,
    add_context=2,
    new_session=2,
    restore=1,
    idle_sessions=10,
    rlm_conversation=1,
)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Peer:
    """A peer's number for one metric, and where it comes from."""

    seconds: float
    text: str
    source: str = PEER_SOURCE


# rlms' DockerREPL (PyPI rlms 0.1.3) on this machine: it runs `docker exec python` per cell and
# loads and dumps the whole dill state each time. A later issue measures it side by side.
PEER_REFERENCE: dict[str, Peer] = {
    "new_session": Peer(1.8, "1.8 s"),
    "trivial_median": Peer(0.300, "~300 ms"),
    "unchanged_big_median": Peer(3.2, "~3.2 s"),
    "add_context_median": Peer(4.1, "~4.1 s"),
}


@dataclass
class Result:
    """One row of the report. Times are in seconds; ``target`` is an upper bound on ``value``."""

    key: str
    metric: str
    value: float | None
    unit: str = "s"
    target: float | None = None
    samples: list[float] = field(default_factory=list)
    note: str = ""
    peer: Peer | None = None
    error: str | None = None
    """Set when the metric could not be measured (the benchmark failed, not the target)."""

    @property
    def passed(self) -> bool | None:
        if self.target is None or self.value is None:
            return None
        return self.value < self.target

    @property
    def ratio(self) -> float | None:
        """peer / ours: how many times faster we are (times only)."""
        if self.peer is None or not self.value or self.unit != "s":
            return None
        return self.peer.seconds / self.value

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.update(passed=self.passed, ratio_peer_over_ours=self.ratio)
        return data


def median(samples: list[float]) -> float:
    return statistics.median(samples)


def p95(samples: list[float]) -> float:
    """Nearest-rank 95th percentile."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


# --------------------------------------------------------------------------- runners


class Runner(Protocol):
    """What a metric needs from a system under test; ``handle`` is whatever ``create`` returns."""

    name: str

    def create(self) -> Any: ...

    def execute(self, handle: Any, code: str) -> str | None:
        """Run a cell; return the repr of its trailing expression; raise if the cell raised."""
        ...

    def add_context(self, handle: Any, payload: str, index: int) -> None: ...

    def kill(self, handle: Any) -> None:
        """Kill the sandbox from outside, as a crash would, and return once it is dead."""
        ...

    def close(self, handle: Any) -> None: ...

    def memory(self, handle: Any) -> dict[str, Any] | None:
        """The sandbox's memory from docker stats, or None when the runner cannot tell."""
        ...

    def describe(self) -> dict[str, Any]:
        """Facts about the setup (image, engine) for the report."""
        ...

    def shutdown(self) -> None:
        """Close whatever is still open; called once, in a finally."""
        ...


class OrchestratorRunner:
    """Our sessions, each in a temporary state and runtime directory, on a freshly built or reused image."""

    name = "orchestrator"

    def __init__(self, settings: Settings | None = None) -> None:
        self._tmp = Path(tempfile.mkdtemp(prefix="orch-", dir="/tmp"))  # short: Unix socket paths max ~107 bytes
        base = settings or Settings.from_env()
        self.settings = base.replace(state_dir=self._tmp / "state", runtime_dir=self._tmp / "run")
        self.orch = Orchestrator(self.settings)
        self._ids: list[str] = []
        try:
            self.image = self.orch.build_image()
        except BaseException:
            self.shutdown()
            raise

    def describe(self) -> dict[str, Any]:
        version = self.orch.backend.client.version()
        return {
            "image": self.image,
            "base_image": self.settings.base_image,
            "mem_limit": self.settings.mem_limit,
            "nano_cpus": self.settings.nano_cpus,
            "engine": f"{version.get('Version')} (API {version.get('ApiVersion')})",
        }

    def create(self) -> Session:
        session = self.orch.create_session()
        self._ids.append(session.id)
        return session

    def execute(self, handle: Session, code: str) -> str | None:
        result = handle.execute(code)
        if result.error is not None:
            raise RuntimeError(f"benchmark cell {code!r} failed: {result.error}")
        return result.return_value

    def add_context(self, handle: Session, payload: str, index: int) -> None:
        handle.add_context(payload, index)

    def kill(self, handle: Session) -> None:
        container_id = handle.container_id
        assert container_id is not None
        self.orch.backend.kill(container_id)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            state = self.orch.backend.inspect(container_id)
            if state is None or not state.running:
                return
            time.sleep(0.02)
        raise RuntimeError(f"container {container_id[:12]} still runs 10 s after SIGKILL")

    def close(self, handle: Session) -> None:
        handle.close()

    def memory(self, handle: Session) -> dict[str, Any] | None:
        if handle.container_id is None:
            return None
        stats = self.orch.backend.client.containers.get(handle.container_id).stats(stream=False)
        mem = stats.get("memory_stats") or {}
        usage = int(mem.get("usage", 0))
        detail = mem.get("stats") or {}
        # What `docker stats` shows: usage minus inactive page cache (cgroup v1: total_inactive_file).
        inactive = int(detail.get("total_inactive_file", detail.get("inactive_file", 0)))
        out: dict[str, Any] = {"usage": usage, "used": usage - inactive if 0 < inactive < usage else usage}
        for key in ("rss", "total_rss", "anon", "cache", "file"):
            if key in detail:
                out[key] = int(detail[key])
        if "limit" in mem:
            out["limit"] = int(mem["limit"])
        if "max_usage" in mem:
            out["max_usage"] = int(mem["max_usage"])
        with contextlib.suppress(Exception):  # per-process RSS (KiB) from the host's ps; nice to have
            top = self.orch.backend.client.containers.get(handle.container_id).top(ps_args="-o rss,args")
            for rss, args in top.get("Processes") or []:
                out[f"rss_kib {args[:60]}"] = int(rss)
        return out

    def shutdown(self) -> None:
        """Close every session and remove any container of ours that is left, then the temporary directory."""
        try:
            self.orch.close()
            for container in self.orch.containers():
                self.orch.backend.remove(container.id)
        finally:
            shutil.rmtree(self._tmp, ignore_errors=True)


RUNNERS: dict[str, Callable[[], Runner]] = {"orchestrator": OrchestratorRunner}


@contextlib.contextmanager
def session(runner: Runner) -> Iterator[Any]:
    handle = runner.create()
    try:
        yield handle
    finally:
        runner.close(handle)


# --------------------------------------------------------------------------- metrics


def bench_new_session(runner: Runner, reps: Reps) -> list[Result]:
    """Wall time of ``create`` until the session takes calls; closed in between (one untimed warm-up)."""
    samples = []
    closes = []
    for i in range(reps.new_session + 1):
        started = time.perf_counter()
        handle = runner.create()
        took = time.perf_counter() - started
        closes.append(timed(functools.partial(runner.close, handle)))
        if i:
            samples.append(took)
    return [
        Result(
            "new_session",
            f"new session ready, median of {len(samples)}",
            median(samples),
            target=1.5,
            samples=samples,
        ),
        Result("close_session", "close a session (info)", median(closes), samples=closes),
    ]


def repeated(runner: Runner, handle: Any, code: str, warmup: int, count: int) -> list[float]:
    """Seconds per ``execute(code)``, ``count`` times after ``warmup`` untimed runs."""
    for _ in range(warmup):
        runner.execute(handle, code)
    return [timed(lambda: runner.execute(handle, code)) for _ in range(count)]


def bench_trivial(runner: Runner, reps: Reps) -> list[Result]:
    """``execute("1")`` repeated after a warm-up."""
    with session(runner) as handle:
        samples = repeated(runner, handle, "1", reps.trivial_warmup, reps.trivial)
    return [
        Result(
            "trivial_median",
            f'trivial cell execute("1"), median of {len(samples)}',
            median(samples),
            target=0.002,
            samples=samples,
        ),
        Result("trivial_p95", 'trivial cell execute("1"), p95', p95(samples)),
    ]


def bench_context_trivial(runner: Runner, reps: Reps) -> list[Result]:
    """``execute("1")`` in a second context of the session (README "Contexts"); runners without contexts skip it."""
    with session(runner) as handle:
        if not hasattr(handle, "create_context"):
            return []
        samples = repeated(runner, handle.create_context(), "1", reps.trivial_warmup, reps.trivial)
    return [
        Result(
            "trivial_context_median",
            f'trivial cell execute("1") in a second context, median of {len(samples)}',
            median(samples),
            target=0.002,
            samples=samples,
        )
    ]


def bench_unchanged_state(runner: Runner, reps: Reps) -> list[Result]:
    """A cell ``y = 1`` in a session without, then beside, an untouched 100 MB string; memory with it."""

    def series() -> list[float]:
        return repeated(runner, handle, "y = 1", reps.unchanged_warmup, reps.unchanged)

    with session(runner) as handle:
        without = series()
        load = timed(lambda: runner.execute(handle, BIG_STATE))
        memory_loaded = runner.memory(handle)
        with_big = series()
        memory_after = runner.memory(handle)
    results = [
        Result(
            "unchanged_big_median",
            f"`y = 1` beside untouched 100 MB str, median of {len(with_big)}",
            median(with_big),
            target=0.010,
            samples=with_big,
        ),
        Result("unchanged_big_p95", "`y = 1` beside untouched 100 MB str, p95", p95(with_big)),
        Result(
            "unchanged_none_median",
            f"`y = 1` without the big str, median of {len(without)} (info)",
            median(without),
            samples=without,
        ),
        Result("load_big", f"`{BIG_STATE}` with 1st checkpoint (info)", load),
    ]
    for key, when, memory in (
        ("memory_loaded", "right after loading 100 MB", memory_loaded),
        ("memory_after", f"{len(with_big) + reps.unchanged_warmup} cells later", memory_after),
    ):
        value = None if memory is None else float(memory["used"])
        note = "" if memory is None else json.dumps(memory)
        results.append(Result(key, f"memory {when} (docker stats, info)", value, unit="B", note=note))
    return results


def bench_add_context(runner: Runner, reps: Reps) -> list[Result]:
    """``add_context`` of a distinct 10 MB string, each into a new context index."""
    payloads = [f"{i:08d}".ljust(CONTEXT_BYTES, "c") for i in range(reps.add_context)]
    with session(runner) as handle:
        samples = [timed(functools.partial(runner.add_context, handle, p, i)) for i, p in enumerate(payloads)]
    return [
        Result(
            "add_context_median",
            f"add_context of a 10 MB str, median of {len(samples)}",
            median(samples),
            target=0.150,
            samples=samples,
        )
    ]


def bench_restore_after_kill(runner: Runner, reps: Reps) -> list[Result]:
    """Kill the sandbox holding 100 MB of state; time the next call, which restarts and restores it."""
    samples = []
    with session(runner) as handle:
        runner.execute(handle, BIG_STATE)
        for _ in range(reps.restore):
            runner.kill(handle)
            started = time.perf_counter()
            value = runner.execute(handle, "len(big)")
            samples.append(time.perf_counter() - started)
            if value != BIG_LEN:
                raise RuntimeError(f"after the restore len(big) is {value!r}, expected {BIG_LEN}")
    return [
        Result(
            "restore_big_median",
            f"restore after kill, 100 MB state, median of {len(samples)}",
            median(samples),
            target=5.0,
            samples=samples,
        )
    ]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS:"))


def bench_idle_sessions(runner: Runner, reps: Reps) -> list[Result]:
    """Open N idle sessions in this one controller process, past 1,024 file descriptors, and use each one.

    Reports what an idle session costs the controller (descriptors, memory) and its sandbox
    (container memory), and how many idle sessions this machine's memory would hold.
    """
    filler = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]  # select() would fail past fd 1024
    handles = []
    try:
        fds, rss = _open_fds(), _rss_bytes()
        for _ in range(reps.idle_sessions):
            handles.append(runner.create())
        for handle in handles:
            if runner.execute(handle, "1 + 1") != "2":
                raise RuntimeError("an idle session did not answer")
        fds_each = (_open_fds() - fds) / len(handles)
        rss_each = (_rss_bytes() - rss) / len(handles)
        sandbox = runner.memory(handles[-1]) or {}
        sandbox_used = float(sandbox.get("used", 0))
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        fit = total / (sandbox_used + rss_each) if sandbox_used else None
    finally:
        for handle in handles:
            with contextlib.suppress(Exception):
                runner.close(handle)
        for fd in filler:
            os.close(fd)
    return [
        Result("idle_sessions", "idle sessions open at once, past fd 1,024 (info)", float(len(handles)), unit="n"),
        Result("idle_fds_each", "controller file descriptors per idle session (info)", fds_each, unit="n"),
        Result("idle_rss_each", "controller memory per idle session (info)", rss_each, unit="B"),
        Result("idle_sandbox_mem", "sandbox memory of an idle session (docker stats, info)", sandbox_used, unit="B"),
        Result("idle_fit", "idle sessions this machine's memory holds (estimate, info)", fit, unit="n"),
    ]


def bench_rlm_conversation(runner: Runner, reps: Reps) -> list[Result]:
    """A two-turn persistent RLM conversation (10 cells, 2 llm_query) with ours and with the peer, alternating.

    Both run rlms' own loop against the same scripted model on loopback; ours on
    ``orchestrator.rlm``, the peer on rlms' ``DockerREPL`` with an image on the same base
    (``peer.py``). See ``rlm_conversation.py``, which also runs alone with a fuller table.
    """
    import rlm_conversation  # a sibling module; it imports rlms only when it runs

    settings = getattr(runner, "settings", None)
    if not isinstance(settings, Settings):
        raise RuntimeError(f"the RLM conversation runs on orchestrator.rlm; runner {runner.name} has no Settings")
    comparison = rlm_conversation.compare(settings, reps.rlm_conversation, RLM_CONTEXT_BYTES)
    n = reps.rlm_conversation
    peer_note = f"{PEER_MEASURED} on {comparison.setup['peer_image']}"
    medians = {key: (ours, peer) for key, _, ours, peer in comparison.rows()}
    note = json.dumps({"medians": {k: {"ours": o, "peer": p} for k, (o, p) in medians.items()}, **comparison.setup})

    def row(key: str, metric: str, unit: str, value: Callable[[rlm_conversation.Sample], float]) -> Result:
        ours, peer = medians[key]
        return Result(
            f"rlm_conversation_{key}",
            metric,
            ours,
            unit=unit,
            samples=[value(s) for s in comparison.ours],
            note=note,
            peer=Peer(peer, fmt_value(peer, unit), source=peer_note),
        )

    return [
        row("wall", f"RLM 2-turn conversation, 10 cells, wall time, median of {n}", "s", lambda s: s.wall),
        row("environment", f"RLM conversation: time in the environment, median of {n}", "s", lambda s: s.environment),
        row("share", "RLM conversation: environment share of the wall time (info)", "%", lambda s: s.share),
    ]


METRICS: list[Callable[[Runner, Reps], list[Result]]] = [
    bench_new_session,
    bench_trivial,
    bench_context_trivial,
    bench_unchanged_state,
    bench_add_context,
    bench_restore_after_kill,
    bench_idle_sessions,
    bench_rlm_conversation,
]


# --------------------------------------------------------------------------- report


def fmt_value(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "B":
        return f"{value / 2**20:.1f} MiB"
    if unit == "%":
        return f"{value * 100:.0f}%"
    if unit == "n":
        return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"
    if value < 1.0:
        return f"{value * 1000:.{2 if value < 0.01 else 1}f} ms"
    return f"{value:.2f} s"


def fmt_ratio(ratio: float | None) -> str:
    if ratio is None:
        return ""
    return f"{ratio:,.0f}x" if ratio >= 10 else f"{ratio:.1f}x"


def print_table(runner_name: str, results: list[Result]) -> None:
    header = ["metric", f"ours ({runner_name})", "target", "pass/fail", "peer", "peer/ours"]
    rows = []
    sources: dict[str, str] = {}
    for r in results:
        if r.peer is not None:
            measured = sum(1 for mark in sources.values() if mark)
            sources.setdefault(r.peer.source, "" if r.peer.source == PEER_SOURCE else "*" * (measured + 1))
        verdict = "ERROR" if r.error else {True: "PASS", False: "FAIL", None: ""}[r.passed]
        rows.append(
            [
                r.metric,
                fmt_value(r.value, r.unit),
                f"< {fmt_value(r.target, r.unit)}" if r.target is not None else "",
                verdict,
                r.peer.text + sources[r.peer.source] if r.peer else "",
                fmt_ratio(r.ratio),
            ]
        )
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    line = "  ".join("-" * w for w in widths)
    print(line)
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print(line)
    left = (0, 4)  # metric and peer columns are text; the others are numbers
    for row in rows:
        cells = (c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        print("  ".join(cells))
    print(line)
    for source, mark in sources.items():
        print(f"peer{mark}: {source}")


def run(runner: Runner, reps: Reps) -> list[Result]:
    results: list[Result] = []
    for metric in METRICS:
        print(f"  {metric.__name__} ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        try:
            results.extend(metric(runner, reps))
        except Exception as exc:  # one broken metric must not hide the others
            traceback.print_exc()
            error = f"{type(exc).__name__}: {exc}"
            results.append(Result(metric.__name__, f"{metric.__name__} (could not run)", None, error=error))
        print(f"  {metric.__name__} done in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    for r in results:
        if r.peer is None:  # a metric that ran the peer itself keeps its number
            r.peer = PEER_REFERENCE.get(r.key)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    parser.add_argument("--json", metavar="PATH", type=Path, help="also write the results as JSON")
    parser.add_argument("--runner", choices=sorted(RUNNERS), default="orchestrator", help="system under test")
    args = parser.parse_args(argv)
    reps = QUICK if args.quick else FULL
    started = time.perf_counter()
    try:
        runner = RUNNERS[args.runner]()
    except OrchestratorError as exc:
        print(f"bench: cannot start the {args.runner} runner: {type(exc).__name__}: {exc}", file=sys.stderr)
        if "ORCH_BASE_IMAGE" not in os.environ:
            print("bench: without a registry, set ORCH_BASE_IMAGE to a local base image", file=sys.stderr)
        return 2
    print(f"bench: runner {runner.name}, {'quick' if args.quick else 'full'} mode", file=sys.stderr)
    try:
        environment = runner.describe()
        results = run(runner, reps)
    finally:
        runner.shutdown()
    wall = time.perf_counter() - started

    print()
    print_table(runner.name, results)
    missed = [r for r in results if r.passed is False]
    errors = [r for r in results if r.error]
    print(f"\nwall time {wall:.1f} s ({'quick' if args.quick else 'full'} mode); image {environment['image']}")
    for r in errors:
        print(f"NOT MEASURED {r.key}: {r.error}")
    for r in missed:
        print(f"MISSED target: {r.metric}: {fmt_value(r.value, r.unit)}, target < {fmt_value(r.target, r.unit)}")
    if not missed and not errors:
        print(f"all {sum(r.passed is not None for r in results)} targets met")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "runner": runner.name,
                    "mode": "quick" if args.quick else "full",
                    "reps": dataclasses.asdict(reps),
                    "wall_seconds": wall,
                    "host": {"python": platform.python_version(), "cpus": os.cpu_count(), **environment},
                    "results": [r.to_json() for r in results],
                },
                indent=1,
            )
        )
        print(f"results written to {args.json}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
