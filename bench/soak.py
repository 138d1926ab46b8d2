"""Soak (issue 34): one hostile session beside ordinary ones of the same controller costs them nothing.

    python bench/soak.py [--ordinary 7] [--seconds 60] [--quota 16MiB] [--json PATH]

Two phases on one controller (one ``Orchestrator``, one process): first the ordinary sessions alone (the
baseline), then the same with one hostile session beside them. An ordinary session holds a deferred value (a
random 2 MiB ``bytes`` and its digest, checked inside the sandbox) and a counter; it runs ``n += 1`` cells and,
every ``KILL_EVERY``-th call, has its container killed so that the next call restores and loads the deferred
value. The hostile session does, in turn and for as long as the phase lasts, every abuse issue 34 names: it
floods blob calls (every name of 5,000 bound to one deferred object, 4 times each, and keys never deferred),
pins the blob's descriptor in a ``setsid`` process of its own, re-announces a stored blob with a 1-byte body,
reports unsaved keys of a context it is not in and 200 KB of UTF-8 reasons, and writes one-byte output
frames for seconds. Its own errors are expected (a lying sandbox is replaced); they are counted, not failures.

Printed per phase: the ordinary calls' latency (cells and post-kill restores apart: median and p99), the
controller's peak descriptors, threads and RSS (sampled every 0.2 s from ``/proc/self``), the hostile
session's peak disk use (its store directory plus any deleted file under the state dir some process still
holds open) against its quota, and every ordinary session's losses. Verdicts against the issue's bounds:
nothing lost, p99 of cells within 2x of the baseline, the hostile session within its quota, the controller's
descriptors, threads and memory under the stated bounds. Exit status 1 when a verdict fails, 2 when it could
not start. ``run_soak`` is what tests/integration/test_soak.py runs, smaller and without the timing verdict.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from orchestrator import Orchestrator, OrchestratorError, Session, Settings
from orchestrator.config import ResourceLimits

KILL_EVERY = 6
"""Every this many calls an ordinary session's container is killed: the next call restores, lazily."""
BIG = 2 << 20
"""The ordinary sessions' deferred value (above DEFER_BYTES, so a restore defers it)."""
FD_SLACK = 64
"""Descriptors the hostile phase may hold above the baseline's peak (one sandbox's channels and a few in flight)."""
THREAD_SLACK = 16
RSS_SLACK = 256 << 20
LATENCY_RATIO = 2.0
CYCLE_WAIT = 600.0
"""How long a phase may run past its length for the hostile session to have done every abuse once."""

ORDINARY_SETUP = f"import hashlib, os\nbig = os.urandom({BIG})\nh = hashlib.sha256(big).hexdigest()\nn = 0"
ORDINARY_CHECK = "n, hashlib.sha256(big).hexdigest() == h"

HOSTILE_PREP = """\
import gc, itertools, os, subprocess, sys
from orchestrator_agent import hostcall
worker = next(o for o in gc.get_objects() if type(o).__name__ == 'Worker')
real_map = getattr(hostcall, 'map_file', None)
real_checkpoint = type(worker).checkpoint.__get__(worker)
counter = itertools.count()
def stored_digest():
    saved = worker.tracker._saved.get('bait')
    return saved.digest if saved is not None else worker.active.deferred.pending['bait'][0]
def pin(fd, size):
    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'], pass_fds=[fd],
                     start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return real_map(fd, size)
def lie(extra):
    def lying():
        delta, parts, took = real_checkpoint()
        if not (delta['vars'] or delta['deleted']):
            worker.tracker.generation += 1
            delta['generation'] = worker.tracker.generation
        extra(delta, parts, next(counter))
        return delta, parts, took
    worker.checkpoint = lying
stored = stored_digest()
def reannounce(delta, parts, i):
    delta['vars']['dup%d' % i] = stored
    delta['blobs'].append({'digest': stored, 'size': 1})
    parts.append(b'x')
def foreign_unsaved(delta, parts, i):
    delta['unsaved'].update({'ctx%d/v%d' % (i, j): 'not saved' for j in range(900)})
def wide_reasons(delta, parts, i):
    delta['unsaved'].update({'w%d_%d' % (i, j): '\\u00e9' * 1999 for j in range(900)})
"""
HOSTILE_SETUP = "bait = 'b' * (2 << 20)\ntiny = [0]\nfor i in range(5000):\n    globals()['n%d' % i] = tiny"
HOSTILE_FLOOD = """\
asked = 0
for name, saved in list(worker.tracker._saved.items()) + [('nothing', worker.tracker._saved['bait'])] * 100:
    for _ in range(4):
        try:
            blob = worker.calls.call_raw('__blob__', {'key': name, 'digest': saved.digest})
            getattr(blob, 'close', lambda: None)()
        except Exception:
            pass
        asked += 1
asked
"""
HOSTILE_STEPS: tuple[tuple[str, str, int], ...] = (
    ("pin", "hostcall.map_file = pin\nbait = 'p%d' % len(bait) * (2 << 20)", 1),
    ("flood", HOSTILE_FLOOD, 1),
    ("reannounce", "lie(reannounce)\nbait = 'b%d' % next(counter) * (2 << 20)", 5),
    ("foreign unsaved", "lie(foreign_unsaved)\nx = next(counter)", 3),
    ("wide reasons", "lie(wide_reasons)\nx = next(counter)", 3),
    ("output frames", "import sys\nfor i in range(10 ** 8):\n    sys.stdout.write('.'); sys.stdout.flush()", 1),
)
"""What the hostile session does, in turn: (name, cell, times in a row). Each round starts after a kill (values
are deferred then) and ``HOSTILE_PREP``; a cell that made the controller replace the sandbox ends its round."""


@dataclass
class Peaks:
    """The controller's peaks and the hostile session's, sampled while a phase runs."""

    fds: int = 0
    threads: int = 0
    rss: int = 0
    hostile_disk: int = 0


@dataclass
class Phase:
    """One phase's results."""

    name: str
    seconds: float
    cells: list[float] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    peaks: Peaks = field(default_factory=Peaks)
    hostile_steps: dict[str, int] = field(default_factory=dict)
    hostile_errors: dict[str, int] = field(default_factory=dict)


def _status(name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == name:
            number, _, unit = value.strip().partition(" ")
            return int(number) * (1024 if unit == "kB" else 1)
    return 0


def held_deleted_bytes(state_dir: Path) -> int:
    """Bytes of deleted files under ``state_dir`` that some process on this host still holds open (each once)."""
    root = str(state_dir.resolve())
    seen: dict[tuple[int, int], int] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith(root) and target.endswith(" (deleted)"):
                        found = os.stat(f"/proc/{pid}/fd/{fd}")
                        seen[(found.st_dev, found.st_ino)] = found.st_blocks * 512
    return sum(seen.values())


def disk_bytes(directory: Path) -> int:
    """Bytes allocated to the files under ``directory``."""
    total = 0
    for path in directory.rglob("*"):
        with contextlib.suppress(OSError):
            found = path.lstat()
            total += found.st_blocks * 512 if path.is_file() else 0
    return total


def kill(orch: Orchestrator, session: Session) -> None:
    """SIGKILL the session's container and wait until the engine sees it dead (the next call restores)."""
    container = session.container_id
    if container is None:
        return
    with contextlib.suppress(OrchestratorError):
        orch.backend.kill(container)
    ends = time.monotonic() + 15
    while time.monotonic() < ends:
        state = orch.backend.inspect(container)
        if state is None or not state.running:
            return
        time.sleep(0.05)


def ordinary(orch: Orchestrator, session: Session, stop: threading.Event, phase: Phase) -> None:
    """Cells and restores until ``stop``; every answer checked against what this loop knows it stored."""
    count = 0
    calls = 0
    try:
        while not stop.is_set():
            calls += 1
            if calls % KILL_EVERY == 0:
                kill(orch, session)
                started = time.monotonic()
                got = session.execute(ORDINARY_CHECK).return_value
                phase.loads.append(time.monotonic() - started)
                if got != f"({count}, True)":
                    phase.lost.append(f"{session.id}: after a restore {got!r}, expected ({count}, True)")
                    return
                continue
            started = time.monotonic()
            got = session.execute("n += 1\nn").return_value
            phase.cells.append(time.monotonic() - started)
            count += 1
            if got != str(count):
                phase.lost.append(f"{session.id}: n is {got!r}, expected {count}")
                return
        kill(orch, session)
        got = session.execute(ORDINARY_CHECK).return_value
        if got != f"({count}, True)":
            phase.lost.append(f"{session.id}: at the end {got!r}, expected ({count}, True)")
    except Exception as exc:  # any failure of an ordinary session's call is a cost the hostile one imposed
        phase.lost.append(f"{session.id}: {type(exc).__name__}: {exc}")


def hostile(orch: Orchestrator, session: Session, stop: threading.Event, phase: Phase, cycled: threading.Event) -> None:
    """Every abuse in turn until ``stop``, setting ``cycled`` once each was done; its own errors are counted, never
    raised."""
    rounds = 0
    while not stop.is_set():
        if rounds == len(HOSTILE_STEPS):
            cycled.set()
        name, cell, times = HOSTILE_STEPS[rounds % len(HOSTILE_STEPS)]
        rounds += 1
        try:
            if rounds % len(HOSTILE_STEPS) == 1:
                session.execute(HOSTILE_SETUP, timeout=30)
            kill(orch, session)
            session.execute(HOSTILE_PREP, timeout=30)
            for _ in range(times):
                session.execute(cell, timeout=3)
        except OrchestratorError as exc:
            error = f"{name}: {type(exc).__name__}"
            phase.hostile_errors[error] = phase.hostile_errors.get(error, 0) + 1
        phase.hostile_steps[name] = phase.hostile_steps.get(name, 0) + 1
    cycled.set()


def sample(orch: Orchestrator, hostile_id: str | None, stop: threading.Event, peaks: Peaks, state_dir: Path) -> None:
    """The controller's descriptors, threads and RSS, and the hostile session's disk use, every 0.2 s."""
    while not stop.wait(0.2):
        peaks.fds = max(peaks.fds, len(os.listdir("/proc/self/fd")))
        peaks.threads = max(peaks.threads, _status("Threads"))
        peaks.rss = max(peaks.rss, _status("VmRSS"))
        if hostile_id is not None:
            used = disk_bytes(orch.store.root / hostile_id) + held_deleted_bytes(state_dir)
            peaks.hostile_disk = max(peaks.hostile_disk, used)


def run_phase(orch: Orchestrator, name: str, count: int, seconds: float, with_hostile: bool) -> Phase:
    """Open ``count`` ordinary sessions (and a hostile one), run them for ``seconds`` (and until the hostile one
    did every abuse once, ``CYCLE_WAIT`` at most), close them all."""
    phase = Phase(name, seconds)
    stop = threading.Event()
    cycled = threading.Event()
    sessions: list[Session] = []
    try:
        for _ in range(count):
            session = orch.create_session()
            sessions.append(session)
            session.execute(ORDINARY_SETUP)
        rogue = orch.create_session() if with_hostile else None
        workers = [threading.Thread(target=ordinary, args=(orch, s, stop, phase)) for s in sessions]
        if rogue is not None:
            sessions.append(rogue)
            workers.append(threading.Thread(target=hostile, args=(orch, rogue, stop, phase, cycled)))
        sampler = threading.Thread(
            target=sample, args=(orch, rogue.id if rogue else None, stop, phase.peaks, orch.settings.state_dir)
        )
        started = time.monotonic()
        for thread in [*workers, sampler]:
            thread.start()
        time.sleep(seconds)
        if rogue is not None:
            cycled.wait(CYCLE_WAIT)
        phase.seconds = time.monotonic() - started
        stop.set()
        for thread in [*workers, sampler]:
            thread.join(timeout=120)
    finally:
        stop.set()
        for session in sessions:
            with contextlib.suppress(OrchestratorError):
                session.close()
    return phase


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98] if len(samples) >= 2 else (samples[0] if samples else 0.0)


def verdicts(base: Phase, attacked: Phase, quota: int) -> dict[str, bool]:
    """The issue's bounds, each a named verdict."""
    return {
        "ordinary sessions lost nothing": not base.lost and not attacked.lost,
        "ordinary cells' p99 within 2x": p99(attacked.cells) <= LATENCY_RATIO * max(p99(base.cells), 1e-3),
        "hostile disk within its quota": attacked.peaks.hostile_disk <= quota,
        "controller descriptors bounded": attacked.peaks.fds <= base.peaks.fds + FD_SLACK,
        "controller threads bounded": attacked.peaks.threads <= base.peaks.threads + THREAD_SLACK,
        "controller memory bounded": attacked.peaks.rss <= base.peaks.rss + RSS_SLACK,
    }


def run_soak(settings: Settings, count: int, seconds: float, quota: int) -> tuple[Phase, Phase]:
    """Both phases on one controller whose sessions have checkpoint quota ``quota``."""
    limited = settings.replace(limits=settings.limits.replace(checkpoint_quota=quota))
    with Orchestrator(limited) as orch:
        orch.build_image()
        base = run_phase(orch, "ordinary alone", count, seconds, with_hostile=False)
        attacked = run_phase(orch, "with a hostile session", count, seconds, with_hostile=True)
    return base, attacked


def _ms(samples: list[float], how: Callable[[list[float]], float]) -> str:
    return f"{how(samples) * 1000:8.1f}" if samples else "       -"


def print_report(base: Phase, attacked: Phase, quota: int) -> bool:
    mib = 1 << 20
    print(
        f"{'phase':24} {'s':>4} {'cells':>6} {'p50 ms':>8} {'p99 ms':>8} {'loads':>6} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'fds':>5} {'thr':>4} {'RSS MiB':>8} {'hostile disk MiB':>17}"
    )
    for phase in (base, attacked):
        print(
            f"{phase.name:24} {phase.seconds:4.0f} {len(phase.cells):6} {_ms(phase.cells, statistics.median)} "
            f"{_ms(phase.cells, p99)} "
            f"{len(phase.loads):6} {_ms(phase.loads, statistics.median)} {_ms(phase.loads, p99)} "
            f"{phase.peaks.fds:5} {phase.peaks.threads:4} {phase.peaks.rss / mib:8.1f} "
            f"{phase.peaks.hostile_disk / mib:17.2f}"
        )
    print(
        f"hostile steps: {attacked.hostile_steps}; its own errors: {attacked.hostile_errors}; quota {quota / mib} MiB"
    )
    for lost in base.lost + attacked.lost:
        print("LOST:", lost)
    results = verdicts(base, attacked, quota)
    for name, ok in results.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    return all(results.values())


@contextlib.contextmanager
def private_settings() -> Iterator[Settings]:
    """Settings from the environment with a temporary state and runtime dir, removed after."""
    with (
        tempfile.TemporaryDirectory(prefix="orch-soak-") as state,
        tempfile.TemporaryDirectory(prefix="orch-", dir="/tmp") as runtime,
    ):
        yield Settings.from_env().replace(state_dir=Path(state), runtime_dir=Path(runtime))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ordinary", type=int, default=7, help="ordinary sessions (default 7)")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each phase (default 60)")
    parser.add_argument("--quota", default="16MiB", help="every session's checkpoint quota (default 16MiB)")
    parser.add_argument("--json", type=Path, help="also write every sample here")
    args = parser.parse_args(argv)
    quota = ResourceLimits(checkpoint_quota=args.quota).checkpoint_quota_bytes
    try:
        with private_settings() as settings:
            base, attacked = run_soak(settings, args.ordinary, args.seconds, quota)
    except OrchestratorError:
        traceback.print_exc()
        return 2
    passed = print_report(base, attacked, quota)
    if args.json is not None:
        args.json.write_text(json.dumps({"quota": quota, "phases": [asdict(base), asdict(attacked)]}, indent=1))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
