"""What metrics and live usage cost: a trivial cell with metrics off and on, a cgroup reading, ``ls``.

Run ``python bench/metrics.py`` (``--cells N``, ``--rounds N``, ``--sessions N``). It prints what
docs/metrics.md quotes: the median and 95th percentile of a trivial cell (``x``) on one session with
``Settings.metrics_address`` unset and set, each round alternating the two; the time of one
``Backend.resource_usage`` of ``--sessions`` running containers (their cgroup files) against the
engine's stats API (``container.stats(stream=False)``) for each; and ``list_sessions()`` (what
``orchestrator ls`` runs) with those sessions running and with none.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from orchestrator import Orchestrator, Settings


def trivial_cell(orch: Orchestrator, cells: int) -> tuple[float, float]:
    """Median and 95th percentile, in ms, of ``cells`` trivial cells on a new session."""
    with orch.create_session() as session:
        session.execute("x = 1")
        times = []
        for _ in range(cells):
            started = time.perf_counter()
            session.execute("x")
            times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3, statistics.quantiles(times, n=20)[-1] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=5)
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="bench-metrics-"))
    runtime = Path(tempfile.mkdtemp(prefix="bm-", dir="/tmp"))
    base = Settings.from_env().replace(state_dir=state, runtime_dir=runtime)
    try:
        for _ in range(args.rounds):
            for address in (None, "127.0.0.1:0"):
                with Orchestrator(base.replace(metrics_address=address)) as orch:
                    median, p95 = trivial_cell(orch, args.cells)
                print(f"metrics {'on ' if address else 'off'}: trivial cell median {median:.3f} ms, p95 {p95:.3f} ms")
        with Orchestrator(base) as orch:
            sessions = [orch.create_session() for _ in range(args.sessions)]
            ids = [s.container_id or "" for s in sessions]
            started = time.perf_counter()
            for _ in range(100):
                orch.backend.resource_usage(ids)
            each = (time.perf_counter() - started) / 100 * 1e3
            print(f"resource_usage of {len(ids)} running containers (cgroup files): {each:.3f} ms")
            client = getattr(orch.backend, "client", None)
            if client is not None:
                started = time.perf_counter()
                for container_id in ids:
                    client.containers.get(container_id).stats(stream=False)
                each = (time.perf_counter() - started) / len(ids) * 1e3
                print(f"the engine's stats API: {each:.0f} ms per container")
            started = time.perf_counter()
            orch.list_sessions()
            print(f"list_sessions, {len(ids)} running: {(time.perf_counter() - started) * 1e3:.0f} ms")
            for session in sessions:
                session.hibernate()
            started = time.perf_counter()
            orch.list_sessions()
            print(f"list_sessions, none running: {(time.perf_counter() - started) * 1e3:.0f} ms")
            for session in sessions:
                session.close()
    finally:
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)


if __name__ == "__main__":
    main()
