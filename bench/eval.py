"""Eval throughput: ``orchestrator eval`` against one ``docker run --rm`` per submission, side by side in one run.

Every submission is small (a few ms of work): its ``code`` defines a function, computes a sum of
squares and prints it; its ``tests`` assert the result. All of them should pass.

- **ours**: ``Orchestrator(settings).evaluate(submissions, out=results file,
  options=EvalOptions(jobs=N))`` on the default sandbox image (built first if missing). Latency
  per submission is its ``durations["total"]``: from the job taking it up (waiting for a pooled
  sandbox included) to its verdict; the removal of its sandbox follows, overlapped with the next.
- **baseline**, the peer practice of a CI script: for each submission one
  ``docker run --rm -i`` on the *base* image with the same isolation and limits as our sandboxes
  (``--network none --read-only --tmpfs /tmp --user --cap-drop ALL --security-opt
  no-new-privileges --memory/--memory-swap --cpus --pids-limit --init``, read from ``Settings``),
  running ``python3 -c RUNNER``: RUNNER reads the submission as JSON on stdin, runs ``code`` then
  ``tests`` in one namespace with stdout captured, and prints a JSON verdict. It runs with
  ``--jobs`` threads each calling ``subprocess.run``, and sequentially (the usual shell loop).
  Latency per submission is the wall time of its ``docker run --rm`` (the CLI returns once the
  container is removed). It runs on ``--baseline-count`` submissions (default min(count, 200)):
  throughput is a rate, so a smaller sample is enough.
- **engine floor** (context): a bare container of our sandbox image running ``true`` with the same
  limits, started, waited for and removed through the Docker SDK, ``--jobs`` at a time: containers/s;
  then the same in shared loopback-only network namespaces, as eval's sandboxes get them (issue 26's
  target: ours at least 0.9x of that). Creating and removing containers dominates both sides.

Each part has an untimed warm-up of ``--jobs`` items first. Both sides must get every verdict
right (passed, with the expected stdout) or the run fails (exit 1). Everything runs with
``--network none``: no packet leaves the machine. Every container of this run carries a label;
the run fails (exit 1) if ``docker ps -a`` still lists one at the end (they are then removed).
Exit 2: the benchmark could not start (no engine, no image).

    python bench/eval.py [--count 1000] [--jobs 4] [--baseline-count N] [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import docker

from orchestrator import Orchestrator, OrchestratorError, Settings
from orchestrator.backends.base import SandboxSpec
from orchestrator.backends.docker import DockerBackend
from orchestrator.evaluation import EvalOptions, EvalResult, Status
from orchestrator.ops.pool import NetworkSlots

RUN_LABEL = "orchestrator.bench.eval-run"
EVAL_PID = "orchestrator.controller-pid"  # labels orchestrator eval puts on its containers (evaluation/evaluator.py)
EVAL_HOST = "orchestrator.controller-host"
QUICK_COUNT = 40
BASELINE_CAP = 200
DOCKER_RUN_TIMEOUT = 120.0

SUBMISSION_CODE = """\
def sum_squares(n):
    return sum(k * k for k in range(n))

result = sum_squares({n})
print("computed", result)
"""
SUBMISSION_TESTS = """\
assert result == {expected}, result
assert sum_squares(10) == 285
"""

# What a CI script runs in the container: submission JSON on stdin, a JSON verdict on stdout.
RUNNER = r"""
import contextlib, io, json, sys, time
submission = json.load(sys.stdin)
namespace = {"__name__": "__main__"}
out = io.StringIO()
verdict = {"id": submission["id"], "status": "passed", "message": ""}
started = time.perf_counter()
for phase in ("code", "tests"):
    source = submission.get(phase)
    if source is None:
        continue
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(source, "<" + phase + ">", "exec"), namespace)
    except AssertionError as exc:
        status = "failed" if phase == "tests" else "error"
        verdict.update(status=status, phase=phase, message="AssertionError: " + str(exc))
        break
    except BaseException as exc:
        verdict.update(status="error", phase=phase, message=type(exc).__name__ + ": " + str(exc))
        break
verdict["seconds"] = time.perf_counter() - started
verdict["stdout"] = out.getvalue()
print(json.dumps(verdict))
"""


def make_submissions(count: int, prefix: str) -> list[dict[str, Any]]:
    """``count`` passing submissions, each a few ms of work (sum of 40,000-49,900 squares)."""
    items = []
    for i in range(count):
        n = 40_000 + (i % 100) * 100
        expected = (n - 1) * n * (2 * n - 1) // 6
        items.append(
            {
                "id": f"{prefix}-{i:05d}",
                "code": SUBMISSION_CODE.format(n=n),
                "tests": SUBMISSION_TESTS.format(expected=expected),
                "expected": expected,  # for the checks here; not sent
            }
        )
    return items


def wire(item: dict[str, Any]) -> dict[str, Any]:
    """The submission as both sides receive it."""
    return {"id": item["id"], "code": item["code"], "tests": item["tests"]}


@dataclass
class Part:
    """One measured row: how many items, at what parallelism, their wall time and per-item latencies."""

    key: str
    label: str
    unit: str  # what is counted: "submissions" or "containers"
    count: int
    jobs: int
    wall: float = 0.0
    latencies: list[float] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.count / self.wall if self.wall else 0.0

    def summary(self) -> dict[str, Any]:
        data = asdict(self)
        data["rate_per_second"] = self.rate
        if self.latencies:
            data.update(
                latency_median=statistics.median(self.latencies),
                latency_min=min(self.latencies),
                latency_max=max(self.latencies),
            )
        return data


# --------------------------------------------------------------------------- ours


def check_ours(result: EvalResult, expected: int) -> str | None:
    """Why ``result`` is not the right verdict, or None."""
    if result.status is not Status.PASSED:
        return f"{result.id}: {result.status.value}: {result.message}"
    if result.stdout.strip() != f"computed {expected}":
        return f"{result.id}: passed but stdout is {result.stdout!r}"
    return None


def run_ours(
    orch: Orchestrator, items: list[dict[str, Any]], jobs: int, tmp: Path, warmup: list[dict[str, Any]]
) -> Part:
    options = EvalOptions(jobs=jobs)
    orch.evaluate([wire(item) for item in warmup], out=tmp / "warmup.jsonl", options=options)
    part = Part("ours", f"ours: orchestrator eval, jobs={jobs}", "submissions", len(items), jobs)
    out = tmp / "results.jsonl"
    started = time.perf_counter()
    report = orch.evaluate([wire(item) for item in items], out=out, options=options)
    part.wall = time.perf_counter() - started
    expected = {item["id"]: item["expected"] for item in items}
    if report.invalid:
        part.wrong.extend(line.describe() for line in report.invalid)
    if len(report.results) != len(items):
        part.wrong.append(f"{len(report.results)} results for {len(items)} submissions")
    for result in report.results:
        problem = check_ours(result, expected[result.id])
        if problem:
            part.wrong.append(problem)
    written = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    if sorted(r["id"] for r in written) != sorted(expected) or any(r["status"] != "passed" for r in written):
        part.wrong.append(f"the results file holds {len(written)} records, not {len(items)} passed ones")
    part.latencies = [r.durations["total"] for r in report.results]
    for phase in ("sandbox", "code", "tests"):
        values = [r.durations[phase] for r in report.results if phase in r.durations]
        if values:
            part.extra[f"median_{phase}_seconds"] = statistics.median(values)
    part.extra.update(image=report.image, exit_code=report.exit_code, evaluate_seconds=report.seconds)
    return part


# --------------------------------------------------------------------------- baseline


def docker_run_command(settings: Settings, image: str, name: str, labels: dict[str, str]) -> list[str]:
    """``docker run --rm -i`` with the isolation and limits of our sandboxes (docker_backend.run_sandbox)."""
    command = ["docker", "run", "--rm", "-i", "--name", name, "--init", "--network", settings.confinement.network_mode]
    for key, value in labels.items():
        command += ["--label", f"{key}={value}"]
    if settings.confinement.read_only:
        command.append("--read-only")
    for path, opts in settings.confinement.tmpfs.items():
        command += ["--tmpfs", f"{path}:{opts}"]
    uid = settings.confinement.worker_uids[0]  # the code runs as a sandbox's worker does: a non-root uid, no capability
    command += ["--workdir", "/tmp", "--user", f"{uid}:{uid}"]
    if settings.confinement.cap_drop_all:
        command += ["--cap-drop", "ALL"]
    if settings.confinement.no_new_privileges:
        command += ["--security-opt", "no-new-privileges"]
    command += [
        "--memory",
        settings.limits.memory,
        "--memory-swap",
        settings.limits.memory,
        "--cpus",
        f"{settings.limits.nano_cpus / 1e9:g}",
        "--pids-limit",
        str(settings.limits.pids),
    ]
    return [*command, image, "python3", "-c", RUNNER]


def docker_run_one(settings: Settings, image: str, labels: dict[str, str], item: dict[str, Any]) -> tuple[float, str]:
    """One submission in its own ``docker run --rm``: (wall seconds, problem or "")."""
    name = f"orch-bench-eval-{secrets.token_hex(5)}"
    command = docker_run_command(settings, image, name, labels)
    started = time.perf_counter()
    try:
        done = subprocess.run(
            command, input=json.dumps(wire(item)), capture_output=True, text=True, timeout=DOCKER_RUN_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
        return time.perf_counter() - started, f"{item['id']}: docker run took over {DOCKER_RUN_TIMEOUT:g} s"
    took = time.perf_counter() - started
    if done.returncode:
        return took, f"{item['id']}: docker run exited {done.returncode}: {done.stderr.strip()[-300:]}"
    try:
        verdict = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return took, f"{item['id']}: no JSON verdict in {done.stdout[-300:]!r}"
    if verdict.get("id") != item["id"] or verdict.get("status") != "passed":
        return took, f"{item['id']}: {verdict.get('status')}: {verdict.get('message')}"
    if verdict.get("stdout", "").strip() != f"computed {item['expected']}":
        return took, f"{item['id']}: passed but stdout is {verdict.get('stdout')!r}"
    return took, ""


def run_pool(
    key: str, label: str, unit: str, items: Sequence[Any], jobs: int, one: Callable[[Any], tuple[float, str]]
) -> Part:
    """``one(item)`` for every item, ``jobs`` threads at a time (in this thread when jobs is 1)."""
    part = Part(key, label, unit, len(items), jobs)
    started = time.perf_counter()
    if jobs == 1:
        outcomes = [one(item) for item in items]
    else:
        with ThreadPoolExecutor(jobs, thread_name_prefix=f"bench-{key}") as pool:
            outcomes = list(pool.map(one, items))
    part.wall = time.perf_counter() - started
    part.latencies = [took for took, _ in outcomes]
    part.wrong = [problem for _, problem in outcomes if problem]
    return part


def run_baseline(
    settings: Settings, labels: dict[str, str], items: list[dict[str, Any]], jobs: int, warmup: list[dict[str, Any]]
) -> Part:
    def one(item: dict[str, Any]) -> tuple[float, str]:
        return docker_run_one(settings, settings.base_image, labels, item)

    run_pool(f"warmup-{jobs}", "", "", warmup, jobs, one)
    key = "baseline" if jobs > 1 else "baseline_sequential"
    how = f"{jobs} threads" if jobs > 1 else "sequential"
    return run_pool(key, f"baseline: docker run --rm per submission, {how}", "submissions", items, jobs, one)


# --------------------------------------------------------------------------- engine floor


def run_floor(
    settings: Settings,
    image: str,
    labels: dict[str, str],
    count: int,
    jobs: int,
    *,
    shared: bool = False,
    python: bool = False,
) -> Part:
    """Bare containers of ``image`` (the one eval uses) running ``true`` with the same limits: create+start, wait,
    remove, ``jobs`` at a time.

    They start through our own ``DockerBackend.run_sandbox`` (the very flags of a sandbox). ``shared``: each joins a
    loopback-only network namespace lent by our ``NetworkSlots``, one container per namespace at a time, as our
    pool's sandboxes do (the floor of a container per submission). ``python``: the container runs ``python3 -c pass``
    instead of ``true`` (the engine plus one interpreter's start: the floor of any sandbox that runs Python).
    """
    backend = DockerBackend(docker.from_env(timeout=120, max_pool_size=max(10, 2 * jobs)))
    slots = NetworkSlots(backend, settings, image=image, scope="bench", labels=labels) if shared else None

    def one(_: int) -> tuple[float, str]:
        started = time.perf_counter()
        slot = slots.lease() if slots is not None else None
        try:
            spec = SandboxSpec(
                name=f"orch-bench-floor-{secrets.token_hex(6)}",
                image=image,
                labels=labels,
                command=("python3", "-c", "pass") if python else ("true",),
                network_of=slot,
            )
            container = backend.run_sandbox(spec, settings)
            try:
                status = backend.client.api.wait(container, timeout=60)
            finally:
                backend.remove(container)
        finally:
            if slots is not None and slot is not None:
                slots.give_back(slot)
        code = status.get("StatusCode")
        return time.perf_counter() - started, "" if code == 0 else f"`true` exited {code}"

    try:
        run_pool("floor-warmup", "", "", range(jobs), jobs, one)
        if shared and python:
            label = f"engine floor, shared loopback netns: bare container `python3 -c pass`, SDK, {jobs} threads"
            return run_pool("engine_floor_python", label, "containers", range(count), jobs, one)
        if shared:
            label = f"engine floor, shared loopback netns: bare container `true`, SDK, {jobs} threads"
            return run_pool("engine_floor_shared", label, "containers", range(count), jobs, one)
        label = f"engine floor: bare container `true`, start+remove, SDK, {jobs} threads"
        return run_pool("engine_floor", label, "containers", range(count), jobs, one)
    finally:
        if slots is not None:
            slots.close()
        backend.close()


# --------------------------------------------------------------------------- report


def leftovers(run_id: str) -> list[str]:
    """Ids of containers of this run (baseline, floor, our eval's) that ``docker ps -a`` still lists."""
    ids: set[str] = set()
    for filters in (
        [f"label={RUN_LABEL}={run_id}"],
        [f"label={EVAL_PID}={os.getpid()}", f"label={EVAL_HOST}={socket.gethostname()}"],
    ):
        command = ["docker", "ps", "-a", "-q"] + [arg for f in filters for arg in ("--filter", f)]
        listing = subprocess.run(command, capture_output=True, text=True)
        if listing.returncode:
            print(f"bench: could not check for left-over containers: {listing.stderr.strip()}", file=sys.stderr)
        ids.update(listing.stdout.split())
    return sorted(ids)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 0.1 else f"{seconds * 1000:,.0f} ms"


def table(parts: list[Part]) -> list[str]:
    ours = next(p for p in parts if p.key == "ours")
    header = ["", "n", "jobs", "wall", "per second", "median", "min", "max", "ours/this (rate)"]
    rows = []
    for p in parts:
        rows.append(
            [
                p.label,
                str(p.count),
                str(p.jobs),
                f"{p.wall:.1f} s",
                f"{p.rate:.2f} {'subm' if p.unit == 'submissions' else 'ctrs'}/s",
                ms(statistics.median(p.latencies)),
                ms(min(p.latencies)),
                ms(max(p.latencies)),
                "" if p is ours else f"{ours.rate / p.rate:.2f}x",
            ]
        )
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--count", type=int, help=f"submissions graded by ours (default 1000, {QUICK_COUNT} with --quick)"
    )
    parser.add_argument("--jobs", type=int, default=4, help="submissions at once, both sides (default 4)")
    parser.add_argument(
        "--baseline-count",
        type=int,
        help=f"submissions of each baseline and containers of the floor (min(count, {BASELINE_CAP}))",
    )
    parser.add_argument("--quick", action="store_true", help=f"a smoke run: {QUICK_COUNT} submissions")
    parser.add_argument("--json", metavar="FILE", type=Path, help="also write the table and every sample as JSON")
    args = parser.parse_args(argv)
    count = args.count or (QUICK_COUNT if args.quick else 1000)
    baseline_count = min(count, args.baseline_count or BASELINE_CAP)
    if count < 1 or args.jobs < 1 or baseline_count < 1:
        parser.error("--count, --jobs and --baseline-count must be at least 1")
    run_id = secrets.token_hex(6)
    labels = {RUN_LABEL: run_id}
    items = make_submissions(count, "s")
    sample = items[:baseline_count]
    warmup = make_submissions(args.jobs, "warmup")
    parts: list[Part] = []
    load_before = os.getloadavg()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="orch-eval-", dir="/tmp") as tmp:  # short: Unix socket paths
        settings = Settings.from_env().replace(state_dir=Path(tmp) / "s", runtime_dir=Path(tmp) / "r")
        try:
            try:
                with Orchestrator(settings) as orch:
                    image = orch.build_image()
                    engine = orch.backend.client.version().get("Version")
                    print(f"bench: ours, {count} submissions, jobs={args.jobs} ...", file=sys.stderr, flush=True)
                    parts.append(run_ours(orch, items, args.jobs, Path(tmp), warmup))
            except OrchestratorError as exc:
                print(f"bench: {type(exc).__name__}: {exc}", file=sys.stderr)
                if "ORCH_BASE_IMAGE" not in os.environ:
                    print("bench: without a registry, set ORCH_BASE_IMAGE to a local base image", file=sys.stderr)
                return 2
            for jobs in (args.jobs, 1):
                print(f"bench: baseline, {baseline_count} submissions, jobs={jobs} ...", file=sys.stderr, flush=True)
                parts.append(run_baseline(settings, labels, sample, jobs, warmup))
            print(f"bench: engine floor, {baseline_count} containers ...", file=sys.stderr, flush=True)
            parts.append(run_floor(settings, image, labels, baseline_count, args.jobs))
            print(f"bench: engine floor with shared network slots, {baseline_count} containers ...", file=sys.stderr)
            parts.append(run_floor(settings, image, labels, baseline_count, args.jobs, shared=True))
            print(f"bench: the same running python3, {baseline_count} containers ...", file=sys.stderr)
            parts.append(run_floor(settings, image, labels, baseline_count, args.jobs, shared=True, python=True))
        finally:
            left = leftovers(run_id)
            if left:
                subprocess.run(["docker", "rm", "-f", *left], capture_output=True)
    wall = time.perf_counter() - started
    load_after = os.getloadavg()

    lines = table(parts)
    by_key = {p.key: p for p in parts}
    ours, base, seq, floor = by_key["ours"], by_key["baseline"], by_key["baseline_sequential"], by_key["engine_floor"]
    ours_median, base_median = statistics.median(ours.latencies), statistics.median(base.latencies)
    split = ", ".join(f"{k.split('_')[1]} {ms(v)}" for k, v in ours.extra.items() if k.startswith("median_"))
    limits = (
        f"{settings.limits.memory} memory (= swap), {settings.limits.nano_cpus / 1e9:g} cpu, "
        f"{settings.limits.pids} pids, "
        f"network {settings.confinement.network_mode}, read-only, tmpfs {dict(settings.confinement.tmpfs)}, "
        f"worker uid from {settings.confinement.worker_uids[0]}-{settings.confinement.worker_uids[1]}, "
        "no capabilities, no-new-privileges, --init"
    )
    notes = [
        f"ours graded {count} submissions; each baseline ran {baseline_count} of them and the floor {baseline_count} "
        f"containers{' (throughput is a rate: a smaller sample is enough)' if baseline_count < count else ''}.",
        f"ours/baseline: {ours.rate / base.rate:.2f}x the throughput at jobs={args.jobs}, "
        f"{ours.rate / seq.rate:.2f}x that of the sequential loop; median latency {ms(ours_median)} "
        f"against {ms(base_median)} ({ours_median / base_median:.2f}x).",
        f"engine floor: {floor.rate:.2f} bare containers/s at {args.jobs} threads; ours reached "
        f"{ours.rate / floor.rate:.2f}x of it, the baseline {base.rate / floor.rate:.2f}x; with shared network "
        f"slots the engine does {by_key['engine_floor_shared'].rate:.2f}/s: the most a container per submission "
        f"can reach here, {by_key['engine_floor_shared'].rate / base.rate:.2f}x the baseline.",
        f"issue 26 target, ours at least 0.9x the shared floor: ours {ours.rate:.2f}/s is "
        f"{ours.rate / by_key['engine_floor_shared'].rate:.2f}x: "
        f"{'PASS' if ours.rate >= 0.9 * by_key['engine_floor_shared'].rate else 'MISSED'}; the same containers "
        f"starting one Python interpreter do {by_key['engine_floor_python'].rate:.2f}/s (ours "
        f"{ours.rate / by_key['engine_floor_python'].rate:.2f}x of that).",
        f"ours' median split: {split} (sandbox: waiting for a pooled sandbox).",
        "latency: ours from taking a submission up to its verdict; baseline the whole `docker run --rm`; "
        "floor create+start+wait+remove.",
        f"image: ours and the floor {image} on base {settings.base_image}; baseline on {settings.base_image}.",
        f"limits, all sides: {limits}.",
        f"wall time {wall:.0f} s, {os.cpu_count()} cpus, engine {engine}; load average {load_before[0]:.1f} at the "
        f"start, {load_after[0]:.1f} at the end (1 min); containers left over: {len(left)}",
    ]
    print()
    print("\n".join(lines))
    print()
    print("\n".join(notes))
    wrong = [(p.label, problem) for p in parts for problem in p.wrong]
    if args.json:
        report = {
            "count": count,
            "baseline_count": baseline_count,
            "jobs": args.jobs,
            "quick": args.quick,
            "ratios": {
                "ours_over_baseline_rate": ours.rate / base.rate,
                "ours_over_baseline_sequential_rate": ours.rate / seq.rate,
                "ours_over_floor_rate": ours.rate / floor.rate,
                "ours_over_baseline_median_latency": ours_median / base_median,
            },
            "parts": [p.summary() for p in parts],
            "table": lines,
            "notes": notes,
            "host": {
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "engine": engine,
                "loadavg_start": load_before,
                "loadavg_end": load_after,
            },
            "image": image,
            "base_image": settings.base_image,
            "wall_seconds": wall,
            "left_over": left,
            "wrong_verdicts": wrong,
        }
        args.json.write_text(json.dumps(report, indent=1))
        print(f"written to {args.json}")
    for label, problem in wrong[:20]:
        print(f"WRONG VERDICT ({label}): {problem}", file=sys.stderr)
    if wrong:
        print(f"bench: {len(wrong)} wrong verdicts: the numbers above do not count", file=sys.stderr)
    if left:
        print(f"bench: containers of this run were left over (now removed): {' '.join(left)}", file=sys.stderr)
    return 1 if wrong or left else 0


if __name__ == "__main__":
    sys.exit(main())
