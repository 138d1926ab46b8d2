"""Contexts: a namespace in the one worker (what we built) against a worker of its own, measured.

Run ``python bench/contexts.py`` (``--cells N``, ``--json PATH``). It prints what README
"Contexts" quotes: a trivial cell in the default context, in a second context, and alternating
between two (a switch of namespace, directory and environment before every cell); the cost of
a context as a namespace (``create_context`` time, the worker's memory per context); and the
cost of the alternative that was not built, a worker process per context, measured inside the
sandbox: how long a fresh ``python3`` takes to import the worker (dill included) and say it is
ready, and how much memory it holds when idle.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from statistics import median
from typing import Any

from runners import OrchestratorRunner

SPAWN = r"""
import subprocess, sys, time
def _spawn():
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, orchestrator_agent.worker; print('ready', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    child.stdout.readline()
    took = time.perf_counter() - started
    with open("/proc/%d/status" % child.pid) as fh:
        rss = [int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS:")][0]
    child.stdin.close()
    child.wait()
    return took, rss
"""
RSS = "[int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmRSS:')][0]"


def p95(samples: list[float]) -> float:
    """Nearest-rank 95th percentile."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def timed_cells(target: Any, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        target.execute("1")
        samples.append(time.perf_counter() - started)
    return samples


def measure(cells: int, contexts: int, spawns: int) -> dict[str, Any]:
    runner = OrchestratorRunner()
    try:
        session = runner.create()
        second = session.create_context(context_id="second")
        third = session.create_context(context_id="third")
        for target in (session, second, third):
            timed_cells(target, 20)  # warm-up
        default = timed_cells(session, cells)
        other = timed_cells(second, cells)
        alternating: list[float] = []
        for i in range(cells):
            alternating += timed_cells(second if i % 2 else third, 1)

        creates = []
        rss_before = int(session.execute(RSS).return_value or 0)
        for i in range(contexts):
            started = time.perf_counter()
            ctx = session.create_context(context_id=f"many-{i}")
            creates.append(time.perf_counter() - started)
            ctx.execute("x = 1")
        rss_after = int(session.execute(RSS).return_value or 0)

        assert session.execute(SPAWN).ok
        spawned = [
            json.loads((session.execute("list(_spawn())").return_value or "").replace("'", '"')) for _ in range(spawns)
        ]
        runner.close(session)
    finally:
        runner.shutdown()
    return {
        "cell_default": {"median": median(default), "p95": p95(default)},
        "cell_second_context": {"median": median(other), "p95": p95(other)},
        "cell_alternating": {"median": median(alternating), "p95": p95(alternating)},
        "create_context": {"median": median(creates)},
        "worker_rss": rss_before,
        "rss_per_context": (rss_after - rss_before) / contexts,
        "spawn_worker": {"median": median([s[0] for s in spawned])},
        "worker_process_rss": median([s[1] for s in spawned]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=300)
    parser.add_argument("--contexts", type=int, default=50)
    parser.add_argument("--spawns", type=int, default=5)
    parser.add_argument("--json", help="also write the numbers here")
    args = parser.parse_args(argv)
    out = measure(args.cells, args.contexts, args.spawns)
    ms = 1000.0
    print(f"{'what':<62} value")
    print(
        f"{'trivial cell, default context (median / p95)':<62} {out['cell_default']['median'] * ms:.2f} / "
        f"{out['cell_default']['p95'] * ms:.2f} ms"
    )
    print(
        f"{'trivial cell, second context (median / p95)':<62} {out['cell_second_context']['median'] * ms:.2f} / "
        f"{out['cell_second_context']['p95'] * ms:.2f} ms"
    )
    print(
        f"{'trivial cell, alternating two contexts (median / p95)':<62} {out['cell_alternating']['median'] * ms:.2f}"
        f" / {out['cell_alternating']['p95'] * ms:.2f} ms"
    )
    print(f"{'namespace: create_context (median)':<62} {out['create_context']['median'] * ms:.2f} ms")
    print(
        f"{'namespace: worker memory per context (RSS growth / contexts)':<62} {out['rss_per_context'] / 1024:.0f} KiB"
    )
    print(f"{'the one worker, idle (RSS)':<62} {out['worker_rss'] / 2**20:.1f} MiB")
    print(
        f"{'worker per context: spawn python3 + import worker, dill (median)':<62} "
        f"{out['spawn_worker']['median'] * ms:.0f} ms"
    )
    print(f"{'worker per context: one more idle worker (RSS)':<62} {out['worker_process_rss'] / 2**20:.1f} MiB")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
