"""What a run reports: the table and its notes, the chart of latency against state size, the JSON document,
and the facts of the host and the engine it ran on."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import platform
import statistics
import subprocess
from pathlib import Path
from typing import Any

import docker
from measures import MB, RESTORE_SIZES, STATE_SIZES, Reps, mb
from rows import RowResult, Side, fmt, fmt_ratio
from runners import OURS, PEER, SYSTEMS, Runner


def fmt_range(side: Side, unit: str) -> str:
    """``median [min-max]`` in the median's unit."""
    if side.error:
        return "NOT MEASURED"
    if side.text is not None:
        return side.text
    median = side.median
    if median is None:
        return "-"
    if len(side.samples) == 1:
        return fmt(median, unit)
    lo, hi = min(side.samples), max(side.samples)
    if unit == "s":
        scale, suffix, digits = (1000.0, "ms", 2 if median < 0.01 else 1) if median < 1.0 else (1.0, "s", 2)
        return f"{median * scale:.{digits}f} {suffix} [{lo * scale:.{digits}f}-{hi * scale:.{digits}f}]"
    if unit == "B":
        scale, suffix = (2**20, "MiB") if abs(median) >= 2**20 else (2**10, "KiB")
        return f"{median / scale:,.1f} {suffix} [{lo / scale:,.1f}-{hi / scale:,.1f}]"
    if unit == "x":
        return f"{median:.2f}x [{lo:.2f}-{hi:.2f}]"
    return f"{median:,.0f} [{lo:,.0f}-{hi:,.0f}]"


def print_table(results: list[RowResult]) -> None:
    """Per row: ours and the peer as ``median [min-max]``, their sample counts, peer/ours, the target, the verdict."""
    header = ["row", "ours: median [min-max]", "peer: median [min-max]", "n ours/peer", "peer/ours", "target", "result"]
    rows = []
    for r in results:
        verdict = {True: "PASS", False: "FAIL", None: ""}[r.passed]
        if r.row.target() and r.passed is None:
            verdict = "NOT MEASURED" if r.ours.error or r.peer.error else "n/a"
        rows.append(
            [
                r.row.label,
                fmt_range(r.ours, r.row.unit),
                fmt_range(r.peer, r.row.unit) + (" (*)" if r.row.peer_key else ""),
                f"{len(r.ours.samples)}/{len(r.peer.samples)}",
                fmt_ratio(r.ratio),
                r.row.target(),
                verdict,
            ]
        )
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    line = "  ".join("-" * w for w in widths)
    left = (0, 5, 6)
    print(line)
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print(line)
    for row in rows:
        print(
            "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        )
    print(line)


NOTES = (
    (
        "",
        "times are wall clock, measured here in this run for both systems; min-max in the median's unit",
    ),
    (
        "",
        "peer: rlms' DockerREPL(image=<peer image>, persistent=True), `docker exec python` per cell that loads and "
        "saves the whole dill state; its execute_code returns output, not values, so values are read with "
        "print(repr(...))",
    ),
    (
        "pooled_session",
        "(*) warm pool: ours only (Settings.capacity.pool_size=2, a pause before each session so the pool refilled); "
        "the peer has no pool, its plain new session is shown for the ratio",
    ),
    (
        "add_context",
        "add_context: each sample into a fresh session holding nothing else, so the peer (which reloads and re-saves "
        "all state in every call) is at its fastest",
    ),
    (
        "restore",
        "restore: ours, on a warm pool of 2: `docker kill` the container, time the next call (a started sandbox from "
        "the pool + restore + cell); the peer has no restore (its container is --rm'd): a new DockerREPL whose "
        "workspace gets the old state.dill, then the cell",
    ),
    (
        "fork",
        "fork: ours, `Orchestrator.fork(source, 8)` on a warm pool of 8 (full before each fork); the peer has no "
        "fork: 8 new DockerREPLs made at once, each given a copy of the source's state.dill. Then each child's first "
        "call `1 + 1` (not touching the 100 MB) in a thread of its own, all at once; a child's time runs from the "
        "fork call until it answered. Host bytes: every file under the nine state directories (ours: the store's; "
        "the peer: the workspaces), allocated blocks, each inode once (a hard-linked blob is one copy); copies: "
        "against the source's before the fork",
    ),
    (
        "rewind",
        "rewind: ours, `Session.rewind(generation)` to the generation before the cell; the peer has no rewind: its "
        "user copies state.dill aside before the cell (not timed: a cost before every cell) and copies it back "
        "(timed); its next cell then loads the whole state, as each of its cells does. Target: ours at most its "
        "restore of 100 MB in this run",
    ),
    (
        "idle",
        "idle sessions: each used once, opened by threads (untimed), then one more created alone (timed) at each "
        "step; memory per session is the container's (docker stats) and this controller's RSS growth divided by the "
        "sessions",
    ),
)
"""Each note with the start of the row keys it explains: printed when such a row ran (an empty start: always)."""


def print_notes(results: list[RowResult], facts: dict[str, Any], reps: Reps) -> None:
    for prefix, note in NOTES:
        if any(r.row.key.startswith(prefix) for r in results):
            print(f"- {note}")
    for system in SYSTEMS:
        idle = facts[system].get("idle sessions") or {}
        if idle:
            how = idle.get("stopped") or f"all steps up to {reps.idle_steps[-1]} taken"
            print(
                f"- idle sessions ({system}): {how}; opening took {idle['opening_seconds']:.0f} s with "
                f"{idle['open_threads']} threads; start-up {'doubled' if idle['doubled'] else 'never doubled'}"
            )
    unmeasured: dict[tuple[str, str], list[str]] = {}
    for r in results:
        for system, side in ((OURS, r.ours), (PEER, r.peer)):
            if side.error and not (system == PEER and r.row.peer_key):
                unmeasured.setdefault((system, side.error), []).append(r.row.key)
    for (system, error), keys in unmeasured.items():
        print(f"NOT MEASURED ({system}) {', '.join(keys)}: {error}")
    for r in results:
        if r.passed is False:
            print(f"MISSED target: {r.row.label}: {'; '.join(r.failures)}")
    targets = [r for r in results if r.row.target()]
    met = sum(r.passed is True for r in targets)
    unjudged = sum(r.passed is None for r in targets)
    print(f"targets: {met} of {len(targets)} met" + (f", {unjudged} not judged (not measured)" if unjudged else ""))


def _ms_or_s(value: float, _pos: object = None) -> str:
    if value >= 1:
        return f"{value:g} s"
    return f"{value * 1000:g} ms"


def draw_chart(results: list[RowResult], path: Path, subtitle: str) -> str | None:
    """Latency against state size for both systems (log-log, min-max bars); returns why it was skipped, or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]')"
    by_key = {r.row.key: r for r in results}
    series = (
        ("cell `y = 1` beside the state", "beside", STATE_SIZES, "o"),
        ("add_context of the state (fresh session)", "add_context", STATE_SIZES, "s"),
        ("restore after docker kill", "restore", RESTORE_SIZES, "^"),
    )
    colors = {OURS: "tab:blue", PEER: "tab:red"}
    fig, ax = plt.subplots(figsize=(12, 6))
    for system in SYSTEMS:
        for label, prefix, sizes, marker in series:
            xs, ys, lo, hi = [], [], [], []
            for size in sizes:
                result = by_key.get(f"{prefix}_{mb(size)}")
                side = None if result is None else (result.ours if system == OURS else result.peer)
                if side is None or not side.samples:
                    continue
                median = statistics.median(side.samples)
                xs.append(size / MB)
                ys.append(median)
                lo.append(median - min(side.samples))
                hi.append(max(side.samples) - median)
            if xs:
                ax.errorbar(
                    xs,
                    ys,
                    yerr=[lo, hi],
                    color=colors[system],
                    marker=marker,
                    linestyle="-" if system == OURS else "--",
                    capsize=3,
                    label=f"{system}: {label}",
                )
        trivial = by_key.get("trivial")
        side = None if trivial is None else (trivial.ours if system == OURS else trivial.peer)
        if side is not None and side.samples:
            ax.axhline(
                statistics.median(side.samples),
                color=colors[system],
                linestyle=":",
                linewidth=1,
                label=f"{system}: trivial cell `1`, no state",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks([s / MB for s in STATE_SIZES], [f"{s // MB} MB" for s in STATE_SIZES])
    ax.yaxis.set_major_formatter(FuncFormatter(_ms_or_s))
    ax.set_xlabel("state size (a str of this many bytes)")
    ax.set_ylabel("latency (median; bars: min-max)")
    ax.set_title("Latency against state size: ours (orchestrator) and the peer (rlms DockerREPL)", fontsize=11)
    ax.text(0.0, -0.13, subtitle, transform=ax.transAxes, fontsize=8, color="dimgray", va="top")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def host_facts(runners: dict[str, Runner | None], client: docker.DockerClient) -> dict[str, Any]:
    """Where the run happens: the host, the engine, the git commit and each runner's set-up, taken at the start."""
    facts: dict[str, Any] = {
        "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "load_average_start": os.getloadavg(),
        "engine": _engine_facts(client),
    }
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        repo = Path(__file__).resolve().parent.parent
        facts["git_commit"] = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
    for system, runner in runners.items():
        if runner is not None:
            facts[system] = runner.describe()
    return facts


def _engine_facts(client: docker.DockerClient) -> dict[str, Any]:
    version = client.version()
    info = client.info()
    return {
        "version": version.get("Version"),
        "api_version": version.get("ApiVersion"),
        "os": info.get("OperatingSystem"),
        "kernel": info.get("KernelVersion"),
        "cgroup_driver": info.get("CgroupDriver"),
        "cgroup_version": info.get("CgroupVersion"),
        "storage_driver": info.get("Driver"),
        "cpus": info.get("NCPU"),
        "memory_bytes": info.get("MemTotal"),
    }


def summary(mode: str, wall: float, base_image: str, host: dict[str, Any]) -> str:
    """One line under the table (and on the chart): the mode, the wall time, the base image, the host and the load."""
    engine = host["engine"]
    return (
        f"{mode} mode, {wall:.0f} s; base {base_image}; {host['cpus']} CPUs, "
        f"{host['memory_bytes'] / 2**30:.0f} GiB; Docker {engine['version']} (cgroup v{engine['cgroup_version']}); "
        f"load {host['load_average_start'][0]:.1f} -> {host['load_average_end'][0]:.1f}"
    )


def write_json(
    path: Path,
    mode: str,
    reps: Reps,
    wall: float,
    host: dict[str, Any],
    results: list[RowResult],
    facts: dict[str, Any],
    leftovers: list[str],
) -> None:
    """Every sample of both systems, the targets and verdicts, the host's and engine's facts, what was left over."""
    path.write_text(
        json.dumps(
            {
                "mode": mode,
                "reps": dataclasses.asdict(reps),
                "wall_seconds": wall,
                "host": host,
                "rows": [r.to_json() for r in results],
                "facts": facts,
                "leftover_containers": leftovers,
            },
            indent=1,
            default=str,
        )
    )
