"""Swarm scale-out: sessions on a three-node Swarm on this machine, against local sessions and the peer, in one run.

    python bench/swarm.py [--quick] [--sessions N] [--threads N] [--json PATH] [--keep-swarm]

``scripts/swarm-up`` brings up three Docker-in-Docker engines on a private bridge (the sandbox
image loaded on each; reused if it runs already) and ``scripts/swarm-down`` removes them at the end
unless ``--keep-swarm``. Ours runs twice: on the host's engine (``backend="docker"``, a Unix socket)
and on the Swarm (``backend="swarm"``, each call through the node's relay over mutual TLS). The peer
(rlms' DockerREPL) runs on the host's engine, as in ``bench/run.py``. Rows:

- trivial cell ``1``: one session of each, blocks of calls alternating local/swarm so both see the
  same load; the relay's cost is swarm minus local (target: under 2 ms added, issue 12).
- new session: ``create_session()`` until it takes calls, one at a time.
- N sessions (100) created ``--threads`` at a time, then one cell each: the wall time, how they
  spread over the nodes, then a new session and a round of trivial cells with all N open (each
  node's relay holds about N/3 connections), and what each open session costs the controller
  (RSS, threads, descriptors) and a node's relay (its container's memory), and how many trivial cells a
  second one controller process completes with ``--threads`` callers over the N sessions.
- restore on another node, 10 MB: a session holding ``big = "x" * 10_000_000``; its node is
  drained (Swarm shuts the task down) and the time until ``len(big)`` is answered again is taken:
  a new service on another node, the checkpoint streamed there through that node's relay, the cell.
  Local: ``docker kill`` then the same call (no warm pool on either). Peer: a new DockerREPL given
  the dead one's ``state.dill``.

The three nodes share this machine's two cores with the host's engine and the controller, so the
Swarm's absolute numbers are a floor for real nodes' CPU, and network latency between machines
(typically 0.1-0.5 ms in a data centre) comes on top of the relay's cost.

Exit status: 0 (a missed target is reported, not an error), 1 when a row could not be measured or a
container or service was left, 2 when the Swarm or the engine could not be brought up.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
from measures import MB, expect, new_sessions, restores, timed
from report import fmt_range
from rows import Side, fmt, fmt_ratio
from runners import OrchestratorRunner, PeerRunner, Runner, session, shut_down

from orchestrator import Session
from orchestrator.backends.base import STORE_ID, Phase

REPO = Path(__file__).resolve().parents[1]
RELAY_PORT = 7443
RESTORE_SIZE = 10 * MB
ADDED_TARGET = 0.002
"""Issue 12: the relay adds under 2 ms to a trivial cell."""


@dataclass(frozen=True)
class Reps:
    trivial_rounds: int = 10
    trivial_block: int = 200
    """Calls per block; blocks alternate local/swarm, ``trivial_rounds`` of each after one warm-up block."""
    peer_trivial: int = 20
    new_session: int = 8
    peer_new_session: int = 5
    fleet_rounds: int = 5
    """Rounds of one trivial cell in each of the N open sessions."""
    restore: int = 5
    peer_restore: int = 3


FULL = Reps()
QUICK = Reps(
    trivial_rounds=3,
    trivial_block=100,
    peer_trivial=5,
    new_session=3,
    peer_new_session=2,
    fleet_rounds=2,
    restore=2,
    peer_restore=1,
)


class Swarm:
    """The test Swarm ``scripts/swarm-up`` runs: its manager's URL, its nodes' engines, drain and activate."""

    def __init__(self, images: list[str], nodes: int = 3) -> None:
        command = [str(REPO / "scripts" / "swarm-up"), "--nodes", str(nodes)]
        for tag in images:
            command += ["--image", tag]
        exports = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        found = dict(re.findall(r"^export (\w+)='?(.*?)'?$", exports, re.MULTILINE))
        self.manager_url = found["ORCH_SWARM_MANAGER"]
        self.node_names = found["ORCH_SWARM_NODES"].split()
        self.manager = docker.DockerClient(base_url=self.manager_url, timeout=60)

    def node_client(self, name: str) -> docker.DockerClient:
        """The engine of node container ``name`` (its socket sits beside the manager's)."""
        manager_name = self.node_names[0]
        return docker.DockerClient(base_url=self.manager_url.replace(f"/{manager_name}/", f"/{name}/"), timeout=60)

    def _node(self, hostname: str) -> Any:
        (node,) = [n for n in self.manager.nodes.list() if n.attrs["Description"]["Hostname"] == hostname]
        return node

    def set_availability(self, hostname: str, availability: str) -> None:
        node = self._node(hostname)
        node.update({**node.attrs["Spec"], "Availability": availability})

    def activate_all(self) -> None:
        for node in self.manager.nodes.list():
            if node.attrs["Spec"]["Availability"] != "active":
                node.update({**node.attrs["Spec"], "Availability": "active"})

    def close(self) -> None:
        self.manager.close()

    @staticmethod
    def down() -> None:
        subprocess.run([str(REPO / "scripts" / "swarm-down")], check=True, stdout=subprocess.DEVNULL)


@contextlib.contextmanager
def docker_host(url: str) -> Iterator[None]:
    """DOCKER_HOST set to ``url`` while the runner connects (the SDK and the Orchestrator read it then, not later)."""
    before = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = url
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = before


class SwarmRunner(OrchestratorRunner):
    """Our sessions on the Swarm: ``kill`` drains the session's node, so the next call restores on another node."""

    name = "swarm"

    def __init__(self, local: OrchestratorRunner, swarm: Swarm) -> None:
        self.swarm = swarm
        self._drained: str | None = None
        settings = local.settings.replace(
            backend="swarm",
            swarm=local.settings.swarm.replace(relay_port=RELAY_PORT),
            timeouts=local.settings.timeouts.replace(start=60.0),
        )
        with docker_host(swarm.manager_url):
            super().__init__(settings)

    def node_of(self, handle: Session) -> str:
        (node,) = {c.node for c in self.orch.containers(handle.id) if c.running and c.node}
        return node

    def kill(self, handle: Session) -> None:
        """Drain the session's node and return once Swarm has shut its task down (the other nodes are active)."""
        self.swarm.activate_all()
        self._drained = self.node_of(handle)
        self.swarm.set_availability(self._drained, "drain")
        ends = time.monotonic() + 60
        while any(c.running or c.phase is Phase.REMOVING for c in self.orch.containers(handle.id)):
            if time.monotonic() > ends:
                raise RuntimeError(f"session {handle.id}: its task still runs 60 s after the drain")
            time.sleep(0.05)

    def evaluate(self, handle: Session, expression: str) -> str:
        """As ours, and the first call after a ``kill`` checks that the session came back on another node."""
        value = super().evaluate(handle, expression)
        drained, self._drained = self._drained, None
        if drained is not None and self.node_of(handle) == drained:
            raise RuntimeError(f"session {handle.id} was restored on the drained node {drained}")
        return value

    def memory(self, handle: Session) -> int | None:
        return None  # the sandbox runs in a node's engine; relay_memory() reads what the fleet rows need

    def relay_memory(self) -> dict[str, int]:
        """Each node's relay container memory (``docker stats``' usage), by node hostname (as sessions name nodes)."""
        found = {}
        for name in self.swarm.node_names:
            client = self.swarm.node_client(name)
            try:
                for container in client.containers.list(
                    filters={"label": f"com.docker.swarm.service.name={self.relay_service}"}
                ):
                    usage = container.stats(stream=False)["memory_stats"].get("usage", 0)
                    found[str(client.info()["Name"])] = int(usage)
            finally:
                client.close()
        return found

    @property
    def relay_service(self) -> str:
        return f"orch-relay-{self.orch.store.store_id}"

    def leftovers(self) -> list[str]:
        services = self.swarm.manager.services.list(filters={"label": f"{STORE_ID}={self.orch.store.store_id}"})
        return [f"service {s.name}" for s in services if s.name != self.relay_service]

    def shutdown(self) -> None:
        """Close every session, remove any service of ours that is left and the relay service, then the files."""
        try:
            self.orch.close()
            for service in self.swarm.manager.services.list(
                filters={"label": f"{STORE_ID}={self.orch.store.store_id}"}
            ):
                with contextlib.suppress(docker.errors.NotFound):
                    service.remove()
        finally:
            self.swarm.activate_all()
            self.client.close()
            shutil.rmtree(self._tmp, ignore_errors=True)


@dataclass
class Line:
    """One row of the table: swarm, local and peer samples; the target is on swarm minus local, or on swarm."""

    label: str
    unit: str = "s"
    swarm: Side = field(default_factory=Side)
    local: Side = field(default_factory=Side)
    peer: Side = field(default_factory=Side)
    added_max: float | None = None
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def added(self) -> float | None:
        if self.unit != "s" or self.swarm.median is None or self.local.median is None:
            return None
        return self.swarm.median - self.local.median

    @property
    def passed(self) -> bool | None:
        if self.added_max is None or self.added is None:
            return None
        return self.added < self.added_max


def attempt(label: str, call: Callable[[], None]) -> str | None:
    """Run one measurement; a failure is printed and returned as text, so the other rows still run."""
    print(f"  {label} ...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    try:
        call()
        return None
    except Exception as exc:
        traceback.print_exc()
        return f"{type(exc).__name__}: {exc}"
    finally:
        print(f"  {label} done in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)


def measure_trivial(line: Line, local: Runner, swarm: Runner, reps: Reps) -> None:
    """``1`` in one session of each, in alternating blocks after a warm-up block of each."""
    with session(local) as near, session(swarm) as far:
        pairs = ((local, near, line.local), (swarm, far, line.swarm))
        for runner, handle, _ in pairs:
            for _ in range(reps.trivial_block):
                runner.execute(handle, "1")
            expect(f"{runner.name}: 1 + 1", runner.evaluate(handle, "1 + 1"), "2")
        for _ in range(reps.trivial_rounds):
            for runner, handle, side in pairs:
                call = functools.partial(runner.execute, handle, "1")
                side.samples += [timed(call) for _ in range(reps.trivial_block)]


def peer_trivial(peer: Runner, reps: Reps) -> list[float]:
    """``1`` in one session of the peer, after one warm-up."""
    with session(peer) as handle:
        peer.execute(handle, "1")
        return [timed(lambda: peer.execute(handle, "1")) for _ in range(reps.peer_trivial)]


def controller_usage() -> dict[str, int]:
    """This process's resident memory, threads and open descriptors."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return {
        "rss": int(status["VmRSS"].split()[0]) * 1024,
        "threads": threading.active_count(),
        "fds": len(os.listdir("/proc/self/fd")),
    }


def create_fleet(runner: Runner, count: int, threads: int) -> tuple[float, list[Session]]:
    """``count`` sessions made ``threads`` at a time, each given ``i = <its number>``; the wall time."""

    def make(i: int) -> Session:
        handle: Session = runner.create()
        runner.execute(handle, f"i = {i}")
        return handle

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        futures = [pool.submit(make, i) for i in range(count)]
        handles = [f.result() for f in futures]  # the first failure propagates; shutdown() closes the rest
    return time.perf_counter() - started, handles


def measure_fleet(lines: dict[str, Line], runner: Runner, target: str, count: int, threads: int, reps: Reps) -> None:
    """``count`` sessions at once on ``runner``; its side of the fleet rows (``target``: "swarm" or "local")."""
    relay_before = runner.relay_memory() if isinstance(runner, SwarmRunner) else {}
    before = controller_usage()
    wall, handles = create_fleet(runner, count, threads)
    try:
        after = controller_usage()
        getattr(lines["fleet_wall"], target).samples = [wall]
        getattr(lines["fleet_per_session"], target).samples = [wall / count]
        for i, handle in enumerate(handles):
            expect(f"{target} session {i}: i", runner.evaluate(handle, "i"), str(i))
        getattr(lines["fleet_new"], target).samples = new_sessions(runner, 3)
        getattr(lines["fleet_trivial"], target).samples = [
            timed(functools.partial(runner.execute, handle, "1"))
            for _ in range(reps.fleet_rounds)
            for handle in handles
        ]
        getattr(lines["fleet_throughput"], target).samples = [
            calls_per_second(runner, handles, threads, reps.fleet_rounds) for _ in range(3)
        ]
        facts = lines["fleet_wall"].facts
        orch = runner.orch if isinstance(runner, OrchestratorRunner) else None
        if orch is not None:  # one survey of the engine: what every `orchestrator ls` and prune pays
            facts[f"{target}_list_sessions_seconds"] = min(timed(orch.list_sessions) for _ in range(3))
        facts[f"{target}_controller_per_session"] = {k: round((after[k] - before[k]) / count, 1) for k in before}
        if isinstance(runner, SwarmRunner):
            ids = {h.id for h in handles}
            spread = Counter(info.node for info in runner.orch.list_sessions() if info.id in ids)
            facts["swarm_sessions_per_node"] = dict(spread)
            relay_after = runner.relay_memory()
            facts["swarm_relay_memory"] = relay_after
            facts["swarm_relay_memory_per_connection"] = {
                name: round((relay_after[name] - relay_before.get(name, 0)) / max(1, spread[name]))
                for name in relay_after
                if name in spread
            }
    finally:
        for handle in handles:
            with contextlib.suppress(Exception):
                runner.close(handle)


def calls_per_second(runner: Runner, handles: list[Session], threads: int, rounds: int) -> float:
    """Trivial cells per second this one controller process completes with ``threads`` callers at once, each
    going through its share of ``handles`` ``rounds`` times."""
    shares = [handles[i::threads] for i in range(threads)]

    def call_all(share: list[Session]) -> None:
        for _ in range(rounds):
            for handle in share:
                runner.execute(handle, "1")

    with ThreadPoolExecutor(threads) as pool:
        took = timed(lambda: list(pool.map(call_all, shares)))
    return len(handles) * rounds / took


def print_table(lines: list[Line]) -> None:
    header = ["row", "swarm: median [min-max]", "local", "peer", "n", "swarm - local", "peer/swarm", "target"]
    rows = []
    for line in lines:
        added = line.added
        ratio = line.peer.median / line.swarm.median if line.peer.median and line.swarm.median else None
        target = "" if line.added_max is None else f"added < {fmt(line.added_max, 's')}"
        if line.passed is not None:
            target += " PASS" if line.passed else " FAIL"
        rows.append(
            [
                line.label,
                fmt_range(line.swarm, line.unit),
                fmt_range(line.local, line.unit),
                fmt_range(line.peer, line.unit),
                f"{len(line.swarm.samples)}/{len(line.local.samples)}/{len(line.peer.samples)}",
                "" if added is None else fmt(added, "s") if added >= 0 else f"-{fmt(-added, 's')}",
                fmt_ratio(ratio),
                target,
            ]
        )
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, ["-" * w for w in widths], *rows]:
        print(" | ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)))


def make_lines(count: int, threads: int) -> dict[str, Line]:
    return {
        "trivial": Line("trivial cell `1` (swarm: through the relay)", added_max=ADDED_TARGET),
        "new": Line("new session ready (image on the node)"),
        "fleet_wall": Line(f"{count} sessions created, {threads} at a time: wall"),
        "fleet_per_session": Line(f"{count} sessions created: wall / sessions"),
        "fleet_new": Line(f"new session with {count} open"),
        "fleet_trivial": Line(f"trivial cell in each of {count} open sessions (round robin)"),
        "fleet_throughput": Line(f"trivial cells per second, {threads} callers over the {count} sessions", unit="n"),
        "restore": Line("restore of 10 MB on another node (local: after docker kill)"),
    }


FLEET_ROWS = ["fleet_wall", "fleet_per_session", "fleet_new", "fleet_trivial", "fleet_throughput"]


def run(lines: dict[str, Line], sides: dict[str, Runner | str], reps: Reps, count: int, threads: int) -> None:
    """Every row for every side; a side that could not start (a str: why) or a failed measurement fills its rows
    with the error, and the others still run."""

    def measure(keys: list[str], side: str, call: Callable[[Runner], list[float] | None]) -> None:
        """``call``'s samples (if it returns them) are ``keys[0]``'s for ``side``."""
        runner = sides[side]
        if isinstance(runner, str):
            error: str | None = runner
        else:
            samples: list[list[float] | None] = []
            error = attempt(f"{keys[0]} ({side})", lambda: samples.append(call(runner)))
            if samples and samples[0] is not None:
                getattr(lines[keys[0]], side).samples = samples[0]
        for key in keys if error else []:
            getattr(lines[key], side).error = error

    local, far = sides["local"], sides["swarm"]
    assert not isinstance(local, str) and not isinstance(far, str)
    error = attempt("trivial (swarm and local)", lambda: measure_trivial(lines["trivial"], local, far, reps))
    lines["trivial"].swarm.error = lines["trivial"].local.error = error
    measure(["trivial"], "peer", functools.partial(peer_trivial, reps=reps))
    for side in ("swarm", "local", "peer"):
        n = reps.peer_new_session if side == "peer" else reps.new_session
        measure(["new"], side, functools.partial(new_sessions, count=n))
    for side in ("swarm", "local"):
        measure(
            FLEET_ROWS,
            side,
            functools.partial(measure_fleet, lines, target=side, count=count, threads=threads, reps=reps),
        )
    for side in ("swarm", "local", "peer"):
        n = reps.peer_restore if side == "peer" else reps.restore
        measure(["restore"], side, functools.partial(restores, size=RESTORE_SIZE, count=n, pause=0.0))


def write_json(path: Path, lines: dict[str, Line], wall: float, leftovers: list[str]) -> None:
    rows = {
        key: {
            "label": line.label,
            **{side: getattr(line, side).to_json() for side in ("swarm", "local", "peer")},
            "added": line.added,
            "passed": line.passed,
            "facts": line.facts,
        }
        for key, line in lines.items()
    }
    path.write_text(json.dumps({"rows": rows, "wall": wall, "leftovers": leftovers}, indent=1, default=str))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and 30 sessions (a smoke run)")
    parser.add_argument("--sessions", type=int, help="sessions open at once in the fleet rows (default 100; quick 30)")
    parser.add_argument("--threads", type=int, default=8, help="sessions created at a time in the fleet rows")
    parser.add_argument("--json", metavar="PATH", type=Path, help="also write every sample and the facts as JSON")
    parser.add_argument("--keep-swarm", action="store_true", help="leave the Swarm running (the next run reuses it)")
    args = parser.parse_args(argv)
    reps = QUICK if args.quick else FULL
    count = args.sessions or (30 if args.quick else 100)
    lines = make_lines(count, args.threads)
    started = time.perf_counter()
    try:
        local = OrchestratorRunner()
    except Exception as exc:
        print(f"bench: cannot start: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    started_runners: list[Runner] = [local]
    swarm: Swarm | None = None
    leftovers: list[str] = []
    try:
        print("bench: bringing up the three-node Swarm (scripts/swarm-up)", file=sys.stderr, flush=True)
        try:
            swarm = Swarm([local.image])
            far = SwarmRunner(local, swarm)
        except Exception as exc:
            detail = exc.stderr if isinstance(exc, subprocess.CalledProcessError) else ""
            print(f"bench: the Swarm could not start: {type(exc).__name__}: {exc}\n{detail}", file=sys.stderr)
            return 2
        started_runners.append(far)
        sides: dict[str, Runner | str] = {"local": local, "swarm": far}
        try:
            sides["peer"] = PeerRunner(local.settings.base_image)
            started_runners.append(sides["peer"])  # type: ignore[arg-type]
        except Exception as exc:  # the peer's cells say NOT MEASURED; ours still run
            traceback.print_exc()
            sides["peer"] = f"the peer could not start: {type(exc).__name__}: {exc}"
        run(lines, sides, reps, count, args.threads)
    finally:
        leftovers += shut_down(started_runners[::-1])
        if swarm is not None:
            swarm.close()
            if not args.keep_swarm:
                Swarm.down()
    wall = time.perf_counter() - started
    print()
    print_table(list(lines.values()))
    for key, value in lines["fleet_wall"].facts.items():
        print(f"{key}: {json.dumps(value, default=str)}")
    print(f"bench/swarm.py: {'quick' if args.quick else 'full'} mode, {wall:.0f} s, load {os.getloadavg()}")
    for leftover in leftovers:
        print(f"LEFT OVER: {leftover}")
    if args.json:
        write_json(args.json, lines, wall, leftovers)
    errors = any(line.swarm.error or line.local.error for line in lines.values())
    return 1 if errors or leftovers else 0


if __name__ == "__main__":
    sys.exit(main())
