"""``orchestrator.metrics``: the definitions, a registry per controller, the no-op recorder, the server, the doc."""

from __future__ import annotations

import logging
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import Answer, FakeAgent, FakeBackend, Header, fake_settings, worker_lost
from prometheus_client.parser import text_string_to_metric_families

from orchestrator import ConfigError, Orchestrator, SandboxCrashed
from orchestrator.agent import request_table
from orchestrator.backends.base import ResourceUsage
from orchestrator.metrics import DEFINED, NO_METRICS, Metrics, MetricsServer, Recorder, parse_address
from orchestrator.runtime.recovery import RECOVERY

DOC = Path(__file__).parents[2] / "docs" / "metrics.md"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, by name and labels."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client import generate_latest

    return samples(generate_latest(metrics.registry).decode())


def families(metrics: Metrics) -> dict[str, tuple[str, frozenset[str]]]:
    """Each metric's name as scraped (a counter's with ``_total``), its type and its labels (``le`` aside)."""
    from prometheus_client import generate_latest

    found = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        if family.name.endswith("_created"):  # prometheus_client's start time of each series (docs/metrics.md)
            continue
        name = family.name + "_total" if family.type == "counter" else family.name
        labels = frozenset(k for s in family.samples for k in s.labels if k != "le")
        found[name] = (family.type, labels)
    return found


def test_a_metrics_registers_exactly_what_is_defined() -> None:
    metrics = Metrics()
    metrics.watch_sessions(lambda: ["running", "busy", "running"])
    metrics.call("exec", "ok", 0.01)
    metrics.restore("start", 0.01)
    metrics.host_call("ok")
    metrics.eval_result("passed")
    metrics.janitor_passes.labels("ok").inc()
    metrics.janitor_actions.labels("remove", "true").inc()
    assert families(metrics) == {d.name: (d.kind, frozenset(d.labels)) for d in DEFINED}
    assert all(d.name.startswith("orchestrator_") for d in DEFINED)
    assert all(d.name.endswith("_total") == (d.kind == "counter") for d in DEFINED)


def test_sessions_by_state_are_counted_when_scraped() -> None:
    metrics = Metrics()
    states = ["running", "busy", "running"]
    metrics.watch_sessions(lambda: states)
    got = scrape(metrics)
    assert got[("orchestrator_sessions", (("state", "running"),))] == 2
    assert got[("orchestrator_sessions", (("state", "hibernated"),))] == 0
    states.append("hibernated")
    assert scrape(metrics)[("orchestrator_sessions", (("state", "hibernated"),))] == 1


def test_a_failing_count_of_sessions_is_logged_and_the_rest_is_served(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> list[str]:
        raise OSError("the store went away")

    metrics = Metrics()
    metrics.watch_sessions(broken)
    metrics.call("exec", "ok", 0.5)
    with caplog.at_level(logging.WARNING, "orchestrator.metrics"):
        got = scrape(metrics)
    assert not any(name == "orchestrator_sessions" for name, _ in got)
    assert got[("orchestrator_call_duration_seconds_count", (("outcome", "ok"), ("request", "exec")))] == 1
    assert "the store went away" in caplog.text


def test_the_fixed_outcomes_are_there_at_zero_from_the_start() -> None:
    got = scrape(Metrics())
    for outcome in ("ok", "error", "refused", "expired"):
        assert got[("orchestrator_host_calls_total", (("outcome", outcome),))] == 0
    assert got[("orchestrator_janitor_passes_total", (("outcome", "failed"),))] == 0


def test_two_controllers_in_one_process_do_not_collide() -> None:
    one, two = Metrics(), Metrics()
    one.checkpoint(100, 1000)
    assert scrape(one)[("orchestrator_checkpoint_written_bytes_total", ())] == 100
    assert scrape(two)[("orchestrator_checkpoint_written_bytes_total", ())] == 0


def test_the_recorder_of_no_metrics_does_nothing() -> None:
    assert type(NO_METRICS) is Recorder and not NO_METRICS.enabled
    for method in ("call", "restore", "checkpoint", "host_call", "pool_ready", "pool_wait", "eval_result"):
        assert getattr(Metrics, method) is not getattr(Recorder, method), f"Metrics.{method} counts nothing"
    assert NO_METRICS.call("exec", "ok", 1.0) is None


def test_metrics_off_do_not_import_prometheus_client() -> None:
    code = "import sys, orchestrator, orchestrator.cli; print('prometheus_client' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("9464", ("127.0.0.1", 9464)),  # a port alone is loopback, never every interface
        (":9464", ("127.0.0.1", 9464)),
        ("0.0.0.0:9464", ("0.0.0.0", 9464)),
        ("metrics.internal:0", ("metrics.internal", 0)),
        ("[::1]:9464", ("::1", 9464)),
    ],
)
def test_addresses(text: str, address: tuple[str, int]) -> None:
    assert parse_address(text) == address


@pytest.mark.parametrize("text", ["", "host", "host:port", "1:2:3", "70000", "-1", "[::1]", "[nope]:1"])
def test_bad_addresses_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="not an address to serve metrics on"):
        parse_address(text)


def test_the_server_serves_the_registry_and_stops() -> None:
    metrics = Metrics()
    metrics.call("exec", "ok", 0.2)
    server = MetricsServer(metrics, "127.0.0.1:0")
    try:
        host, _, port = server.address.rpartition(":")
        assert host == "127.0.0.1" and int(port) > 0
        with urllib.request.urlopen(f"http://{server.address}/metrics", timeout=10) as reply:
            got = samples(reply.read().decode())
        assert got[("orchestrator_call_duration_seconds_count", (("outcome", "ok"), ("request", "exec")))] == 1
        with pytest.raises(ConfigError, match="cannot serve metrics on"):
            MetricsServer(Metrics(), server.address)  # taken
    finally:
        server.close()
        server.close()  # idempotent
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{server.address}/metrics", timeout=2)


def test_idle_connections_past_the_cap_make_room_for_a_scrape_and_a_token_is_required() -> None:
    server = MetricsServer(Metrics(), "127.0.0.1:0", "a-token-of-enough-length", max_connections=2, timeout=60)
    host, _, port = server.address.rpartition(":")
    idle = [socket.create_connection((host, int(port)), timeout=30) for _ in range(2)]
    try:
        request = urllib.request.Request(f"http://{server.address}/metrics")
        with pytest.raises(urllib.error.HTTPError) as refused:  # the first idle one made room; no token: 401
            urllib.request.urlopen(request, timeout=10)
        refused.value.close()
        assert refused.value.code == 401 and refused.value.headers["WWW-Authenticate"] == "Bearer"
        assert idle[0].recv(1) == b""  # the oldest idle connection was shut down for it
        request.add_header("Authorization", "Bearer a-token-of-enough-length")
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.status == 200 and "orchestrator_" in reply.read().decode()
    finally:
        for connection in idle:
            connection.close()
        server.close()


def test_the_doc_lists_every_metric_with_its_type_and_labels() -> None:
    rows = re.findall(r"^\| `(orchestrator_\w+)` \| (\w+) \| ([^|]*) \|", DOC.read_text(), re.MULTILINE)
    listed = {name: (kind, frozenset(re.findall(r"`(\w+)`", labels))) for name, kind, labels in rows}
    assert listed == {d.name: (d.kind, frozenset(d.labels)) for d in DEFINED}


def test_the_doc_names_every_restore_cause() -> None:
    text = DOC.read_text()
    causes = {row.cause for row in RECOVERY.values()} | {"start", "resume", "sandbox_gone", "worker_gone"}
    causes |= {"takeover", "rewind"}
    assert all(f"`{cause}`" in text for cause in causes)


# ---------------------------------------------------------------- an Orchestrator on the fake engine


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def orch(tmp_path: Path, backend: FakeBackend) -> Iterator[Orchestrator]:
    settings = fake_settings(tmp_path, ORCH_METRICS_ADDRESS="127.0.0.1:0", ORCH_INTERRUPT_GRACE="0.05")
    with Orchestrator(settings, backend=backend) as orchestrator:
        yield orchestrator


def fetch(orch: Orchestrator) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://{orch.metrics_address}/metrics", timeout=10) as reply:
        return samples(reply.read().decode())


def test_an_orchestrator_measures_calls_restores_and_checkpoints(orch: Orchestrator, backend: FakeBackend) -> None:
    session = orch.create_session()
    session.execute("x = 'one'")
    first = fetch(orch)
    assert first[("orchestrator_sessions", (("state", "running"),))] == 1
    assert first[("orchestrator_restore_duration_seconds_count", (("cause", "start"),))] == 1
    assert first[("orchestrator_call_duration_seconds_count", (("outcome", "ok"), ("request", "exec")))] == 1
    assert first[("orchestrator_checkpoint_written_bytes_total", ())] > 0

    failed: list[bool] = []

    def crash_once(agent: FakeAgent, request: Header, body: bytes) -> Answer:
        if request["type"] == request_table.EXEC and not failed:
            failed.append(True)
            return worker_lost()
        return agent.answer(request, body)

    backend.handler = crash_once
    with pytest.raises(SandboxCrashed):
        session.execute("x = 'lost'")
    session.execute("y = 'two'")
    second = fetch(orch)
    crashed = ("orchestrator_call_duration_seconds_count", (("outcome", "SandboxCrashed"), ("request", "exec")))
    assert second[crashed] == 1
    assert second[("orchestrator_restore_duration_seconds_count", (("cause", "worker_crash"),))] == 1
    assert second[("orchestrator_call_duration_seconds_count", (("outcome", "ok"), ("request", "exec")))] == 2
    assert second[("orchestrator_checkpoint_bytes_count", ())] == 2
    session.hibernate()
    assert fetch(orch)[("orchestrator_sessions", (("state", "hibernated"),))] == 1
    session.execute("z = 3")
    assert fetch(orch)[("orchestrator_restore_duration_seconds_count", (("cause", "resume"),))] == 1


def test_an_orchestrator_without_an_address_serves_nothing(tmp_path: Path, backend: FakeBackend) -> None:
    with Orchestrator(fake_settings(tmp_path), backend=backend) as orch:
        assert orch.metrics is NO_METRICS and orch.metrics_address is None


def test_the_survey_gives_live_cpu_from_two_readings(orch: Orchestrator, backend: FakeBackend) -> None:
    session = orch.create_session()
    assert session.container_id is not None
    container = session.container_id
    readings = iter([1.0, 1.1])  # 0.1 s of CPU time in a window of at least 0.2 s: at most 50 %

    class Usage(dict[str, ResourceUsage]):
        def __contains__(self, key: object) -> bool:
            return key == container

        def __getitem__(self, key: str) -> ResourceUsage:
            return ResourceUsage(memory_bytes=18 << 20, cpu_seconds=next(readings))

    backend.resources = Usage()
    [info] = orch.list_sessions()
    assert info.memory_bytes == 18 << 20 and info.cpu_seconds == pytest.approx(1.1)
    assert info.cpu_percent is not None and 0 < info.cpu_percent <= 50
    backend.resources = {}
    [info] = orch.list_sessions()  # an engine that does not say: no number rather than a wrong one
    assert (info.memory_bytes, info.cpu_percent, info.cpu_seconds) == (None, None, None)


def test_an_address_in_use_is_refused_when_the_orchestrator_is_made(tmp_path: Path, orch: Orchestrator) -> None:
    backend = FakeBackend()
    taken = fake_settings(tmp_path / "other", ORCH_METRICS_ADDRESS=str(orch.metrics_address))
    with pytest.raises(ConfigError, match="cannot serve metrics on"):
        Orchestrator(taken, backend=backend)
