"""Density and scale (issue 26, item 5): many live sessions on this machine, then a store of many hibernated ones.

Live: sessions are opened in steps (500: 0, 50, 100, 200, 350, 500; 8 threads, each session used once) and at
each step it measures a new session (create, then its first call ``1``), a trivial cell on the oldest session
(median of 20), the containers' memory (``docker stats``' figure from the cgroup, and PSS summed over a
container's processes from ``/proc/<pid>/smaps_rollup``, on up to ``MEMORY_SAMPLE`` containers), the
``containerd-shim`` processes' PSS (a container's host cost outside its cgroup), this controller's RSS, threads
and descriptors, and the engine's (dockerd's) RSS and descriptors. An error while
opening stops the steps: where and why is reported (a finding, not a crash).

Hibernated: one session holding a small state is hibernated, then forked at the store level
(``CheckpointLedger.fork``: records and hard-linked blobs, no containers) into the rest; then it times
``list_sessions()``, ``orchestrator ls --json``, ``prune(dry_run=True)`` and ``prune --dry-run`` with a
criterion that makes half of them stale, one janitor pass that removes nothing, and resume (attach + first
call) of a sample; and profiles one ``list_sessions()`` and one dry-run prune.

    python bench/scale.py [--live N] [--hibernated N] [--quick] [--json PATH]

No timed assertion: the targets (issue 26) are printed beside the numbers. Everything it made (containers,
the temporary state directory) is removed at the end, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runners import OrchestratorRunner, container_memory

from orchestrator import Orchestrator, Session
from orchestrator.ops.janitor import Janitor
from orchestrator.state.index import RACY
from orchestrator.state.lease import LeaseFile
from orchestrator.state.ledger import CheckpointLedger, new_owner_token
from orchestrator.state.store import SessionRecord

STEP_FRACTIONS = (0.0, 0.1, 0.2, 0.4, 0.7, 1.0)
OPEN_THREADS = 8
TRIVIAL_REPS = 20
MEMORY_SAMPLE = 20
FORK_BATCH = 500
RESUME_SAMPLE = 10
REPS = 3
STALE_AGE = 7200.0
"""Half the hibernated sessions were last used this long ago; prune's criterion (``IDLE``) makes them stale."""
IDLE = 3600.0
SMALL_STATE = "x = list(range(1000)); s = 'hello' * 10"
TARGETS = {"ls_s": 1.0, "prune_s": 1.0, "resume_median_s": 0.5, "first_call_ratio": 2.0}


def steps(target: int) -> list[int]:
    """The session counts at which the live phase measures: 0 and ``target`` and a few between, none twice."""
    if target < 0:
        raise ValueError(f"the number of live sessions must be 0 or more, got {target}")
    return sorted({round(target * fraction) for fraction in STEP_FRACTIONS})


def summary(samples: list[float]) -> dict[str, float] | None:
    """Median, min and max of ``samples`` (None for none)."""
    if not samples:
        return None
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples)}


def status_field(text: str, name: str) -> int | None:
    """A ``kB`` or count field of ``/proc/<pid>/status`` text (``VmRSS``, ``Threads``) in bytes or units."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == name:
            number, _, unit = value.strip().partition(" ")
            return int(number) * (1024 if unit == "kB" else 1)
    return None


def rollup_pss(text: str) -> int | None:
    """The ``Pss`` of ``/proc/<pid>/smaps_rollup`` text, in bytes."""
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return None


def process_facts(pid: int | str) -> dict[str, int | None]:
    """A process's RSS, threads and open descriptors (None where unreadable)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds: int | None = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return {"rss": None, "threads": None, "fds": None}
    return {"rss": status_field(status, "VmRSS"), "threads": status_field(status, "Threads"), "fds": fds}


def container_pss(container_id: str) -> int | None:
    """PSS summed over a container's processes (cgroup v1 or v2 on this host); None when not readable here."""
    for procs in (
        f"/sys/fs/cgroup/memory/docker/{container_id}/cgroup.procs",
        f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/cgroup.procs",
        f"/sys/fs/cgroup/docker/{container_id}/cgroup.procs",
    ):
        try:
            pids = Path(procs).read_text().split()
        except OSError:
            continue
        total = 0
        for pid in pids:
            with contextlib.suppress(OSError):  # the process ended meanwhile
                total += rollup_pss(Path(f"/proc/{pid}/smaps_rollup").read_text()) or 0
        return total
    return None


def shims_pss() -> dict[str, int]:
    """The engine's per-container host cost outside the container's cgroup: how many ``containerd-shim`` processes
    run and their PSS summed, in bytes."""
    count = total = 0
    for comm in Path("/proc").glob("[0-9]*/comm"):
        with contextlib.suppress(OSError):
            if comm.read_text().startswith("containerd-shim"):
                count += 1
                total += rollup_pss((comm.parent / "smaps_rollup").read_text()) or 0
    return {"count": count, "pss_bytes": total}


def dockerd_pid() -> str | None:
    """The engine's pid when it runs on this host (its facts are read from /proc), else None."""
    try:
        found = subprocess.run(["pidof", "dockerd"], capture_output=True, text=True, check=False).stdout.split()
    except OSError:
        return None
    return found[0] if found else None


def limits() -> dict[str, Any]:
    """What may stop the live phase: this process's and the engine's descriptor limits, the pid limit."""
    facts: dict[str, Any] = {"controller_limits": _limit_lines("self")}
    pid = dockerd_pid()
    if pid is not None:
        facts["dockerd_limits"] = _limit_lines(pid)
    for name in ("/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max", "/proc/sys/fs/file-max"):
        with contextlib.suppress(OSError):
            facts[name] = Path(name).read_text().strip()
    return facts


def _limit_lines(pid: str) -> dict[str, str]:
    try:
        lines = Path(f"/proc/{pid}/limits").read_text().splitlines()
    except OSError:
        return {}
    wanted = ("Max open files", "Max processes")
    return {line[:26].strip(): " ".join(line[26:].split()) for line in lines if line.startswith(wanted)}


def timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def cpu_timed(call: Callable[[], object]) -> float:
    """CPU seconds of this process (all its threads) spent in ``call``."""
    started = time.process_time()
    call()
    return time.process_time() - started


def live_phase(runner: OrchestratorRunner, target: int) -> dict[str, Any]:
    """Open sessions in ``steps(target)``; measure at each; stop at the first error and say why."""
    orch = runner.orch
    opened: list[Session] = []
    rows: list[dict[str, Any]] = []
    stopped: str | None = None
    engine = dockerd_pid()

    def open_one() -> Session:
        session = orch.create_session()
        runner.execute(session, "x = 1")
        return session

    for step in steps(target):
        started = time.perf_counter()
        try:
            with ThreadPoolExecutor(OPEN_THREADS) as pool:
                futures = [pool.submit(open_one) for _ in range(step - len(opened))]
                errors = []
                for future in futures:
                    try:
                        opened.append(future.result())
                    except Exception as exc:
                        errors.append(f"{type(exc).__name__}: {exc}")
            if errors:
                stopped = f"opening toward {step}: {len(errors)} failed, first: {errors[0]}"
        except Exception as exc:
            stopped = f"opening toward {step}: {type(exc).__name__}: {exc}"
        open_seconds = time.perf_counter() - started
        row = measure_step(runner, opened, engine)
        row["open_seconds"] = open_seconds
        rows.append(row)
        print(_live_line(row), flush=True)
        if stopped:
            print(f"stopped: {stopped}", flush=True)
            break
    return {"steps": rows, "stopped": stopped, "reached": len(opened)}


def measure_step(runner: OrchestratorRunner, opened: list[Session], engine: str | None) -> dict[str, Any]:
    """One step: a new session's create and first call, a trivial cell on the oldest, memory, the processes."""
    started = time.perf_counter()
    session = runner.orch.create_session()
    create = time.perf_counter() - started
    try:
        first_call = timed(lambda: runner.execute(session, "1"))
    finally:
        session.close()
    trivial = []
    if opened:
        oldest = opened[0]
        trivial = [timed(lambda: runner.execute(oldest, "1")) for _ in range(TRIVIAL_REPS)]
    sample = opened[:: max(1, len(opened) // MEMORY_SAMPLE)][:MEMORY_SAMPLE]
    usage = [container_memory(runner.client, s.container_id) for s in sample if s.container_id]
    pss = [container_pss(s.container_id) for s in sample if s.container_id]
    return {
        "open": len(opened),
        "create_s": create,
        "first_call_s": first_call,
        "trivial_cell_s": summary(trivial),
        "container_usage_bytes": summary([float(u) for u in usage if u is not None]),
        "container_pss_bytes": summary([float(p) for p in pss if p is not None]),
        "controller": process_facts("self"),
        "dockerd": process_facts(engine) if engine else None,
        "shims": shims_pss(),
        "load_average": os.getloadavg()[0],
    }


def _mib(value: float | int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f}"


def _live_line(row: dict[str, Any]) -> str:
    trivial = "-" if row["trivial_cell_s"] is None else f"{row['trivial_cell_s']['median'] * 1e3:.2f}"
    usage, pss = row["container_usage_bytes"], row["container_pss_bytes"]
    dockerd, shims = row["dockerd"] or {}, row["shims"]
    return (
        f"live {row['open']:>4}: first call {row['first_call_s'] * 1e3:7.1f} ms, "
        f"create {row['create_s'] * 1e3:.0f} ms, trivial cell {trivial} ms, "
        f"container usage {_mib(usage and usage['median'])} MiB, pss {_mib(pss and pss['median'])} MiB, "
        f"controller rss {_mib(row['controller']['rss'])} MiB fds {row['controller']['fds']} "
        f"threads {row['controller']['threads']}, dockerd rss {_mib(dockerd.get('rss'))} MiB "
        f"fds {dockerd.get('fds')}, shims {shims['count']} pss {_mib(shims['pss_bytes'])} MiB, "
        f"opened in {row['open_seconds']:.1f} s, load {row['load_average']:.1f}"
    )


def fill_hibernated(orch: Orchestrator, count: int) -> tuple[list[str], float]:
    """One real session with ``SMALL_STATE``, hibernated, and ``count - 1`` store-level forks of it; half were
    last used ``STALE_AGE`` ago. Returns the ids and the seconds the forks took."""
    source = orch.create_session()
    source.execute(SMALL_STATE)
    source.hibernate()
    source.detach()
    ids = [source.id]
    image = orch.store.load(source.id).image
    started = time.perf_counter()
    now = time.time()
    made = 1
    while made < count:
        batch = min(FORK_BATCH, count - made)
        children = []
        for index in range(batch):
            used = now - (STALE_AGE if (made + index) % 2 else 0.0)
            children.append(
                SessionRecord(
                    session_id=f"h{made + index:011d}",
                    image=image,
                    created_at=used,
                    last_used_at=used,
                    owner=new_owner_token(),
                    epoch=1,
                    hibernated_at=used,
                )
            )
        CheckpointLedger.fork(orch.store, source.id, children, quota=2**40, keep=1)
        for child in children:  # as if their forker had detached them: any controller may attach them
            LeaseFile(orch.store.root / child.session_id).release(child.owner)
        ids += [child.session_id for child in children]
        made += batch
    return ids, time.perf_counter() - started


def profile_top(call: Callable[[], object], lines: int = 25) -> str:
    """The top of a cProfile of one ``call``, by cumulative time."""
    profiler = cProfile.Profile()
    profiler.runcall(call)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(lines)
    return out.getvalue()


def hibernated_phase(runner: OrchestratorRunner, count: int) -> dict[str, Any]:
    orch = runner.orch
    ids, fork_seconds = fill_hibernated(orch, count)
    filled_at = time.time()
    print(f"hibernated: {len(ids)} sessions stored in {fork_seconds:.1f} s", flush=True)
    env = {
        **{name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"},
        "ORCH_STATE_DIR": str(orch.settings.state_dir),
        "ORCH_RUNTIME_DIR": str(orch.settings.runtime_dir),
        # As an installed package runs: its modules compiled once (here into the run's temp dir, not the source tree).
        "PYTHONPYCACHEPREFIX": str(Path(orch.settings.runtime_dir) / "pycache"),
    }
    cli = [sys.executable, "-m", "orchestrator"]

    def run_cli(*args: str) -> None:
        subprocess.run([*cli, *args], env=env, check=True, capture_output=True)

    def cli_cpu(*args: str) -> float:
        """CPU seconds (user + system) of one CLI run: the machine's load does not stretch it as it stretches wall."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        run_cli(*args)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime

    # Hibernated sessions are older than this in practice: the store index caches no record younger than RACY.
    time.sleep(max(0.0, RACY + 1.0 - (time.time() - filled_at)))
    result: dict[str, Any] = {"sessions": count, "store_fork_s": fork_seconds}
    result["list_sessions_cold_s"] = [timed(orch.list_sessions)]  # no index yet: every record read, the index written
    result["listed"] = len(orch.list_sessions())
    result["list_sessions_s"] = [timed(orch.list_sessions) for _ in range(REPS)]
    run_cli("--version")  # compiles the package's modules once
    result["cli_ls_s"] = [timed(lambda: run_cli("ls", "--json")) for _ in range(REPS)]
    result["cli_ls_cpu_s"] = [cli_cpu("ls", "--json") for _ in range(REPS)]
    result["list_sessions_cpu_s"] = [cpu_timed(orch.list_sessions) for _ in range(REPS)]
    started = time.perf_counter()
    stale = len(orch.prune(idle_for=IDLE, dry_run=True).actions)  # the first: it locks and lists every session once
    result["prune_dry_run_cold_s"] = [time.perf_counter() - started]
    result["prune_dry_run_stale"] = stale
    result["prune_dry_run_s"] = [timed(lambda: orch.prune(idle_for=IDLE, dry_run=True)) for _ in range(REPS)]
    result["cli_prune_dry_run_s"] = [timed(lambda: run_cli("prune", "--dry-run", "--idle", "1h"))]
    result["prune_dry_run_cpu_s"] = [cpu_timed(lambda: orch.prune(idle_for=IDLE, dry_run=True)) for _ in range(REPS)]
    result["cli_prune_dry_run_cpu_s"] = [cli_cpu("prune", "--dry-run", "--idle", "1h") for _ in range(REPS)]
    janitor = Janitor(orch.settings, idle_for=10 * STALE_AGE, heartbeat=Path(orch.settings.runtime_dir) / "beat")
    result["janitor_pass_s"] = [timed(janitor.run_pass)]
    result["list_sessions_profile"] = profile_top(orch.list_sessions)
    result["prune_dry_run_profile"] = profile_top(lambda: orch.prune(idle_for=IDLE, dry_run=True))
    print(
        f"hibernated {count}: list_sessions {_s(result['list_sessions_s'])} "
        f"(cold {_s(result['list_sessions_cold_s'])}), ls --json {_s(result['cli_ls_s'])}, "
        f"prune --dry-run {_s(result['prune_dry_run_s'])} ({stale} stale; cold {_s(result['prune_dry_run_cold_s'])}), "
        f"cli prune --dry-run {_s(result['cli_prune_dry_run_s'])}, janitor pass {_s(result['janitor_pass_s'])}",
        flush=True,
    )
    print(
        f"CPU: list_sessions {_s(result['list_sessions_cpu_s'])}, ls --json {_s(result['cli_ls_cpu_s'])}, "
        f"prune --dry-run {_s(result['prune_dry_run_cpu_s'])}, "
        f"cli prune --dry-run {_s(result['cli_prune_dry_run_cpu_s'])}",
        flush=True,
    )
    resume = []
    for session_id in ids[1 :: max(1, (len(ids) - 1) // RESUME_SAMPLE)][:RESUME_SAMPLE]:
        started = time.perf_counter()
        session = orch.attach(session_id)
        runner.execute(session, "len(x)")
        resume.append(time.perf_counter() - started)
        session.hibernate()
        session.detach()
    result["resume_s"] = resume
    print(f"resume (attach + first call) of {len(resume)}: {_s(resume)}", flush=True)
    return result


def _s(samples: list[float]) -> str:
    found = summary(samples)
    if found is None:
        return "-"
    return f"{found['median']:.3f} s [{found['min']:.3f}-{found['max']:.3f}]"


def verdicts(live: dict[str, Any] | None, hibernated: dict[str, Any] | None) -> dict[str, Any]:
    """The issue's targets against what was measured (None where the phase did not run)."""
    found: dict[str, Any] = {}
    if live and live["steps"]:
        first = live["steps"][0]["first_call_s"]
        last = live["steps"][-1]
        found["first_call_ratio"] = {
            "open": last["open"],
            "value": last["first_call_s"] / first,
            "target": TARGETS["first_call_ratio"],
        }
        found["new_session_ratio"] = {
            "open": last["open"],
            "value": (last["create_s"] + last["first_call_s"]) / (live["steps"][0]["create_s"] + first),
            "target": TARGETS["first_call_ratio"],
        }
    if hibernated:
        for key, target in (
            ("list_sessions_s", "ls_s"),
            ("cli_ls_s", "ls_s"),
            ("prune_dry_run_s", "prune_s"),
            ("cli_prune_dry_run_s", "prune_s"),
            ("resume_s", "resume_median_s"),
        ):
            value = statistics.median(hibernated[key]) if hibernated[key] else None
            found[key] = {"value": value, "target": TARGETS[target]}
    for verdict in found.values():
        value = verdict["value"]
        verdict["met"] = None if value is None else value <= verdict["target"]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", type=int, default=500, metavar="N", help="live sessions to open (default 500)")
    parser.add_argument("--hibernated", type=int, default=10_000, metavar="N", help="hibernated sessions (10,000)")
    parser.add_argument("--quick", action="store_true", help="50 live and 1,000 hibernated")
    parser.add_argument("--json", metavar="PATH", type=Path, help="also write every number as JSON")
    args = parser.parse_args(argv)
    live_target, hibernated_target = (50, 1000) if args.quick else (args.live, args.hibernated)

    def terminate(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, terminate)
    report: dict[str, Any] = {"argv": sys.argv, "limits": limits(), "cpus": os.cpu_count()}
    report["load_average_start"] = os.getloadavg()
    live = hibernated = None
    status = 0
    for phase in ("live", "hibernated"):
        runner = OrchestratorRunner()
        try:
            if phase == "live" and live_target:
                live = report["live"] = live_phase(runner, live_target)
            elif phase == "hibernated" and hibernated_target:
                hibernated = report["hibernated"] = hibernated_phase(runner, hibernated_target)
        finally:
            runner.shutdown()
            left = runner.leftovers()
            if left:
                print(f"containers of the {phase} phase left behind: {', '.join(left)}", flush=True)
                report.setdefault("leftovers", []).extend(left)
                status = 1
    report["load_average_end"] = os.getloadavg()
    report["verdicts"] = verdicts(live, hibernated)
    for name, verdict in report["verdicts"].items():
        value = verdict["value"]
        shown = "-" if value is None else f"{value:.3f}"
        print(f"{name:<22} {shown:>8}  target <= {verdict['target']:g}  {'' if verdict['met'] else 'MISSED'}")
    if hibernated:
        print(hibernated["list_sessions_profile"])
        print(hibernated["prune_dry_run_profile"])
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return status


if __name__ == "__main__":
    sys.exit(main())
