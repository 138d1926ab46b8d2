"""What an ``orchestrator`` command costs to start (issue 38): ours against the interpreter and ``docker``, one run.

Run ``python bench/cli_start.py`` (``--reps N``, default 20; ``--json PATH`` keeps every sample). Each
repetition runs, one after the other so that the machine's load falls alike on all of them:

- ``python -c pass``: the interpreter's own start, the floor under any Python command;
- ``python -m orchestrator --version``: parsing only;
- ``python -m orchestrator ls`` on an empty store (a temporary ``ORCH_STATE_DIR``): the settings and the
  store read, no engine;
- ``docker version``: the client of the engine most users know, as a yardstick (left out without one).

It prints each one's median with its min and max, the median's difference from ``python -c pass`` and its ratio
to it and to ``docker version``, and whether ``--version`` is within the issue's 150 ms of ``python -c pass``
(``PASS`` / ``MISSED``; the exit status is 0 either way). Every command runs with this checkout first on
``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
TARGET_MS = 150.0
"""``--version`` within this of ``python -c pass`` (issue 38)."""


def commands(docker: str | None) -> dict[str, list[str]]:
    """Each row's command line, by its label."""
    python = sys.executable
    rows = {
        "python -c pass": [python, "-c", "pass"],
        "orchestrator --version": [python, "-m", "orchestrator", "--version"],
        "orchestrator ls (empty store)": [python, "-m", "orchestrator", "ls"],
    }
    if docker is not None:
        rows["docker version"] = [docker, "version"]
    return rows


def run_once(argv: list[str], env: dict[str, str]) -> float:
    """Seconds ``argv`` took, start to exit (it must exit 0)."""
    started = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=120)
    return time.perf_counter() - started


def measure(rows: dict[str, list[str]], reps: int, env: dict[str, str]) -> dict[str, list[float]]:
    """``reps`` samples of each row, the rows interleaved in every repetition, after one warm-up of each."""
    samples: dict[str, list[float]] = {label: [] for label in rows}
    for rep in range(reps + 1):
        for label, argv in rows.items():
            took = run_once(argv, env)
            if rep:  # the first is a warm-up: the page cache, the engine's first answer
                samples[label].append(took)
    return samples


def report(samples: dict[str, list[float]]) -> list[str]:
    """The table's lines, and the verdict on the target."""
    medians = {label: statistics.median(times) * 1e3 for label, times in samples.items()}
    floor = medians["python -c pass"]
    docker = medians.get("docker version")
    lines = [
        f"{'command':<32}{'median ms':>10}{'min-max ms':>16}{'- pass ms':>11}{'/ pass':>8}{'/ docker':>10}",
    ]
    for label, times in samples.items():
        median = medians[label]
        spread = f"{min(times) * 1e3:.0f}-{max(times) * 1e3:.0f}"
        against_docker = "-" if docker is None else f"{median / docker:.2f}x"
        lines.append(
            f"{label:<32}{median:>10.0f}{spread:>16}{median - floor:>11.0f}{median / floor:>7.2f}x{against_docker:>10}"
        )
    over = medians["orchestrator --version"] - floor
    verdict = "PASS" if over <= TARGET_MS else "MISSED"
    lines.append(f"target: --version within {TARGET_MS:.0f} ms of python -c pass: {over:.0f} ms, {verdict}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20, help="samples of each command (default 20)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write every sample (seconds) here")
    args = parser.parse_args()
    docker = shutil.which("docker")
    with tempfile.TemporaryDirectory(prefix="cli-start-") as scratch:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(CHECKOUT), *filter(None, [os.environ.get("PYTHONPATH")])]),
            "ORCH_STATE_DIR": str(Path(scratch) / "state"),
            "ORCH_RUNTIME_DIR": str(Path(scratch) / "run"),
        }
        if docker is not None:
            try:
                run_once([docker, "version"], env)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
                print("docker version failed (no engine?): its row is left out", file=sys.stderr)
                docker = None
        load = os.getloadavg()[0]
        samples = measure(commands(docker), args.reps, env)
    print(f"{args.reps} samples each, interleaved; load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} now")
    print("\n".join(report(samples)))
    if args.json is not None:
        args.json.write_text(json.dumps({"reps": args.reps, "samples": samples}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
