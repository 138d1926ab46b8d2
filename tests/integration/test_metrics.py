"""Prometheus metrics on the real engine: ``/metrics`` scraped over HTTP while sessions run, crash and are restored;
the janitor's endpoint; live CPU and memory in ``orchestrator ls`` and ``inspect``."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import cli_env, kill_and_wait

from orchestrator import Orchestrator, SandboxCrashed, Session, Settings
from orchestrator.config import Capacity
from orchestrator.ops.janitor import Janitor
from orchestrator.runtime.hostcalls import HostCalls

pytestmark = pytest.mark.docker

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
SCAFFOLD = "def before_cell(ns):\n    ns['ask'] = host_call\n"


def scrape(address: str | None) -> Samples:
    """Every sample ``/metrics`` serves now, by name and labels (sorted)."""
    assert address is not None
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_move_during_a_real_run(
    settings_for: Callable[..., Settings],
    make_orch: Callable[[Settings], Orchestrator],
    new_session: Callable[..., Session],
) -> None:
    settings = settings_for(metrics_address="127.0.0.1:0", capacity=Capacity(pool_size=1))
    orch = make_orch(settings)
    assert orch.metrics_address is not None and orch.metrics_address.startswith("127.0.0.1:")
    session = new_session(orch)
    session.set_scaffold(SCAFFOLD, names=["ask"])
    calls = HostCalls(handlers={"double": lambda n: 2 * n})
    assert session.execute("ask('double', 21)", host_calls=calls).return_value == "42"
    session.execute("data = 'x' * 100_000")
    pooled = orch.create_session()  # no labels: it takes its sandbox from the warm pool
    try:
        first = scrape(orch.metrics_address)
        assert value(first, "orchestrator_sessions", state="running") == 2
        assert value(first, "orchestrator_host_calls_total", outcome="ok") == 1
        assert value(first, "orchestrator_call_duration_seconds_count", request="exec", outcome="ok") == 2
        assert value(first, "orchestrator_restore_duration_seconds_count", cause="start") >= 2
        assert value(first, "orchestrator_checkpoint_written_bytes_total") >= 100_000
        assert value(first, "orchestrator_pool_wait_seconds_count") == 1

        with pytest.raises(SandboxCrashed):
            session.execute("import os\nos._exit(3)")  # the worker dies in the call: restored into a fresh one
        kill_and_wait(orch, session.container_id)  # the container dies between calls: the next call replaces it
        assert session.execute("len(data)").return_value == "100000"

        second = scrape(orch.metrics_address)
        crashed = value(second, "orchestrator_call_duration_seconds_count", request="exec", outcome="SandboxCrashed")
        assert crashed == 1
        assert value(second, "orchestrator_restore_duration_seconds_count", cause="worker_crash") == 1
        assert value(second, "orchestrator_restore_duration_seconds_count", cause="sandbox_gone") == 1
        assert value(second, "orchestrator_restore_duration_seconds_sum", cause="sandbox_gone") > 0
        ok_calls = value(second, "orchestrator_call_duration_seconds_count", request="exec", outcome="ok")
        assert ok_calls == 3
        assert value(second, "orchestrator_call_duration_seconds_sum", request="exec", outcome="ok") > value(
            first, "orchestrator_call_duration_seconds_sum", request="exec", outcome="ok"
        )
        assert value(second, "orchestrator_pool_ready_sandboxes") in (0, 1)  # refilled in the background
    finally:
        pooled.close()


def test_the_janitor_serves_its_passes_and_the_stores_sessions(
    settings_for: Callable[..., Settings],
    make_orch: Callable[[Settings], Orchestrator],
    new_session: Callable[..., Session],
    tmp_path: Path,
) -> None:
    settings = settings_for()
    running = new_session(make_orch(settings))
    running.execute("x = 1")
    hibernated = new_session(make_orch(settings))
    hibernated.execute("y = 2")
    hibernated.hibernate()
    janitor = Janitor(settings, interval=0.5, heartbeat=tmp_path / "beat", metrics_address="127.0.0.1:0")
    stop = threading.Event()
    serving = threading.Thread(target=janitor.serve, args=(stop,))
    serving.start()
    try:
        deadline = time.monotonic() + 120  # its first pass, however slow the machine: no timing is asserted
        while True:
            samples = scrape(janitor.metrics_address)
            if value(samples, "orchestrator_janitor_passes_total", outcome="ok") >= 1 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert value(samples, "orchestrator_janitor_passes_total", outcome="ok") >= 1
        assert value(samples, "orchestrator_sessions", state="running") == 1
        assert value(samples, "orchestrator_sessions", state="hibernated") == 1
        assert value(samples, "orchestrator_sessions", state="broken") == 0
    finally:
        stop.set()
        serving.join()


def test_ls_and_inspect_show_live_cpu_and_memory(
    settings_for: Callable[..., Settings],
    make_orch: Callable[[Settings], Orchestrator],
    new_session: Callable[..., Session],
) -> None:
    settings = settings_for()
    orch = make_orch(settings)
    busy = new_session(orch)
    busy.execute("import threading\ndef spin():\n    while not stop:\n        pass\nstop = False\n")
    busy.execute("threading.Thread(target=spin, daemon=True).start()")  # burns a core after the cell returned
    idle = new_session(orch)
    idle.execute("x = 1")

    def cli(*argv: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator", *argv],
            capture_output=True,
            text=True,
            env=cli_env(settings),
            timeout=120,
            check=True,
        )
        return done.stdout

    try:
        listed = {row["id"]: row for row in json.loads(cli("ls", "--json"))}
        assert listed[busy.id]["cpu_percent"] > 20  # a spinning thread: most of a core
        assert listed[busy.id]["memory_bytes"] > 1 << 20 and listed[busy.id]["cpu_seconds"] > 0
        assert listed[idle.id]["cpu_percent"] < listed[busy.id]["cpu_percent"]
        table = cli("ls").splitlines()
        assert table[0].split()[5:7] == ["CPU", "MEMORY"]
        row = next(line.split() for line in table if line.startswith(busy.id))
        assert row[5].endswith("%") and row[6].endswith("iB")
        shown = dict(line.split(None, 1) for line in cli("inspect", busy.id).splitlines() if line.strip())
        assert shown["cpu"].endswith(" s in all)") and "%" in shown["cpu"]
    finally:
        busy.execute("stop = True")
