"""A real sandbox container reached through a node relay (``RelayEndpoint``), as on a Swarm node, on this engine.

The relay runs as a host process on 127.0.0.1 and serves a node directory on this host; the
sandbox is an ordinary container started with the endpoint's mounts and environment. The
secret handshake runs end to end through the relay, a cell runs, 10 MB travel each way, a
second controller takes the sandbox over (the first one's channel is lost), and the relay
is killed and started again under the live sandbox without losing the agent's state. Also:
the directory of a sandbox removed while its relay was down, listed and swept once the relay is
back; the round trip of a trivial call through the relay against the plain Unix socket, and the
relay on the oldest Python the image supports.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
from relay_support import RelayProcess

from orchestrator import ChannelLost, Orchestrator, Settings
from orchestrator.agent import protocol, request_table
from orchestrator.backends.base import SANDBOX_ID, SandboxSpec
from orchestrator.backends.docker import DockerBackend
from orchestrator.backends.swarm.backend import stale_sandbox_dirs
from orchestrator.backends.swarm.relay_client import NodeDirectory, RelayClient, RelayEndpoint
from orchestrator.backends.swarm.tls import Credentials, client_context, ensure_credentials
from orchestrator.runtime.sandbox import agent_environment
from orchestrator.wire.call import Call
from orchestrator.wire.connection import AgentConnection
from orchestrator.wire.endpoint import Endpoint, UnixSocketEndpoint

pytestmark = pytest.mark.docker

TEST_LABEL = "orchestrator.test.run"
NODE_ID = "this-host"
CALLS = 1000
WARM_UP = 200


@pytest.fixture(scope="module")
def credentials() -> Iterator[Credentials]:
    directory = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))
    yield ensure_credentials(directory / "tls")
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def relay(credentials: Credentials) -> Iterator[RelayProcess]:
    base = Path(tempfile.mkdtemp(prefix="rn-", dir="/tmp"))
    process = RelayProcess(base / "node", credentials, base / "relay.log")
    process.start()
    try:
        yield process
    finally:
        process.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def opened() -> Iterator[Any]:
    """Keeps the connections a test opens, and closes them after it."""
    connections: list[AgentConnection] = []

    def keep(connection: AgentConnection) -> AgentConnection:
        connections.append(connection)
        return connection

    yield keep
    for connection in connections:
        close(connection)


@pytest.fixture
def backend() -> Iterator[DockerBackend]:
    made = DockerBackend()
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def containers(backend: DockerBackend) -> Iterator[list[str]]:
    """Container ids to remove after the test."""
    made: list[str] = []
    try:
        yield made
    finally:
        for container_id in made:
            with contextlib.suppress(Exception):
                backend.remove(container_id)


def endpoint_options(settings: Settings) -> dict[str, Any]:
    uid, gid = (int(part) for part in settings.confinement.user.split(":"))
    return {
        "sandbox_uid": uid,
        "sandbox_gid": gid,
        "max_header": settings.limits.max_header_bytes,
        "max_body": settings.limits.max_body_bytes,
    }


def relay_endpoint(relay: RelayProcess, settings: Settings, sandbox_id: str, *, take_over: bool = False) -> Endpoint:
    make = RelayEndpoint.open if take_over else RelayEndpoint.create
    return make(relay.client(), sandbox_id, node=NodeDirectory(NODE_ID, relay.node_dir), **endpoint_options(settings))


def run_sandbox(
    backend: DockerBackend, settings: Settings, image: str, endpoint: Endpoint, run_id: str, containers: list[str]
) -> None:
    """Start the sandbox's container as ``Sandbox.start`` does, with the endpoint's mounts and environment."""
    sandbox_id = endpoint.sandbox_id
    spec = SandboxSpec(
        name=f"orch-relaytest-{sandbox_id}",
        image=image,
        labels={TEST_LABEL: run_id, SANDBOX_ID: sandbox_id},
        environment=agent_environment(endpoint, settings),
        mounts=endpoint.mounts(),
        command=settings.agent_command,
    )
    containers.append(backend.run_sandbox(spec, settings))


def connect(endpoint: Endpoint, seconds: float = 30.0) -> AgentConnection:
    """One hop, as a session takes it through a node relay: relayed (no descriptor crosses it)."""
    deadline = time.monotonic() + seconds
    return AgentConnection.open(endpoint, sandbox_id=endpoint.sandbox_id, deadline=deadline, carrier="relayed")


def run(connection: AgentConnection, code: str) -> str:
    header = {"type": request_table.EXEC, "code": code, "timeout": 10.0, "checkpoint_timeout": 10.0}
    # checkpoint_seconds, as Session passes it: the worker's ``cell_done`` moves the deadline to it.
    reply, _ = connection.request(header, b"", Call(time.monotonic() + 30, checkpoint_seconds=10.0))
    assert reply.get("status") == protocol.STATUS_OK, reply
    return str(reply["return_value"])


def close(connection: AgentConnection) -> None:
    connection.close()


def new_id() -> str:
    return "sb-" + os.urandom(6).hex()


def test_a_sandbox_behind_the_relay_works_is_taken_over_and_outlives_a_relay_restart(
    relay: RelayProcess,
    settings: Settings,
    image: str,
    backend: DockerBackend,
    containers: list[str],
    run_id: str,
    opened: Any,
) -> None:
    sandbox_id = new_id()
    first = relay_endpoint(relay, settings, sandbox_id)
    assert first.constraints() == [f"node.id=={NODE_ID}"]
    assert first.mounts() == {str(relay.node_dir / sandbox_id): "/run/orchestrator"}
    run_sandbox(backend, settings, image, first, run_id, containers)
    connection = opened(connect(first))  # the secret handshake, end to end through the relay
    assert connection.hello["sandbox_id"] == sandbox_id
    assert not connection.passes_descriptors  # the relayed carrier: no descriptor crosses
    assert run(connection, "1 + 1") == "2"
    worker = run(connection, "import os; os.getpid()")

    payload = os.urandom(10 << 20)
    header = {
        "type": request_table.SET_VALUE,
        "name": "blob",
        "kind": "bytes",
        "aliases": [],
        "checkpoint_timeout": 30.0,
    }
    reply, body = connection.request(header, payload, Call(time.monotonic() + 60, checkpoint_seconds=30.0))
    assert reply.get("status") == protocol.STATUS_OK, reply
    assert len(body) >= len(payload) and payload in body  # its checkpoint came back: 10 MB each way, unchanged
    assert run(connection, "len(blob), blob[:4].hex()") == repr((len(payload), payload[:4].hex()))

    # A second controller takes the sandbox over: the relay cuts the first one's bridge, the agent reconnects.
    second = relay_endpoint(relay, settings, sandbox_id, take_over=True)
    assert second.secret == first.secret
    with pytest.raises(ChannelLost):
        run(connection, "1")
    close(connection)
    connection = opened(connect(second))
    assert run(connection, "os.getpid(), len(blob)") == repr((int(worker), len(payload)))  # the same worker

    # The relay dies under the live sandbox and comes back: the agent reconnects, its state intact.
    relay.kill()
    with pytest.raises(ChannelLost):
        run(connection, "1")
    close(connection)
    relay.start()
    started = time.monotonic()
    connection = opened(connect(second))
    reconnected = time.monotonic() - started
    assert connection.hello["generation"] >= 1
    assert run(connection, "os.getpid(), len(blob), blob[:4].hex()") == repr(
        (int(worker), len(payload), payload[:4].hex())
    )
    close(connection)
    print(f"\nagent reconnected through the restarted relay in {reconnected * 1000:.0f} ms")
    assert reconnected < 5

    second.remove()
    assert not os.path.lexists(relay.node_dir / sandbox_id)


def test_a_directory_whose_removal_missed_the_relay_is_listed_with_its_age_and_swept_later(
    relay: RelayProcess,
    settings: Settings,
    image: str,
    backend: DockerBackend,
    containers: list[str],
    run_id: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    live_id, gone_id = new_id(), new_id()
    endpoints = {sandbox_id: relay_endpoint(relay, settings, sandbox_id) for sandbox_id in (live_id, gone_id)}
    for endpoint in endpoints.values():
        run_sandbox(backend, settings, image, endpoint, run_id, containers)
    relay.kill()  # its node was drained: the relay's task stopped with the sandboxes'
    backend.remove(containers[-1])
    endpoints[gone_id].remove()  # clean-up: logged, not raised
    assert "the next removal's sweep removes it" in caplog.text
    assert (relay.node_dir / gone_id).is_dir()

    relay.start()
    ages = relay.client().sandbox_ages()
    assert sorted(ages) == sorted([live_id, gone_id])
    assert all(0 <= age < 30 for age in ages.values()), ages  # the restart renewed them: it listens in each again
    live = {container.labels[SANDBOX_ID] for container in backend.find({TEST_LABEL: run_id})}
    assert live_id in live and gone_id not in live
    assert stale_sandbox_dirs(ages, live, 2 * settings.timeouts.start) == []  # too young to tell from a new one
    assert stale_sandbox_dirs(ages, live, 0) == [gone_id]
    relay.client().remove(gone_id)
    assert list(relay.client().sandbox_ages()) == [live_id]
    assert not os.path.lexists(relay.node_dir / gone_id)


def _round_trips(connection: AgentConnection) -> list[float]:
    header = {"type": request_table.EXEC, "code": "1", "timeout": 10.0, "checkpoint_timeout": 10.0}
    times = []
    for i in range(WARM_UP + CALLS):
        started = time.perf_counter()
        reply, _ = connection.request(dict(header), b"", Call(time.monotonic() + 10))
        elapsed = time.perf_counter() - started
        assert reply["status"] == protocol.STATUS_OK
        if i >= WARM_UP:
            times.append(elapsed)
    return times


def test_round_trip_through_the_relay_against_the_plain_socket(
    relay: RelayProcess, settings: Settings, image: str, backend: DockerBackend, containers: list[str], run_id: str
) -> None:
    direct_endpoint = UnixSocketEndpoint.create(settings.runtime_dir, new_id(), **endpoint_options(settings))
    relayed_endpoint = relay_endpoint(relay, settings, new_id())
    connections = []
    try:
        for endpoint in (direct_endpoint, relayed_endpoint):
            run_sandbox(backend, settings, image, endpoint, run_id, containers)
            connections.append(connect(endpoint))
        direct, relayed = connections
        results: dict[str, list[float]] = {"unix": [], "relay": []}
        for _ in range(2):  # interleaved rounds, so both see the same machine
            results["unix"] += _round_trips(direct)
            results["relay"] += _round_trips(relayed)
    finally:
        for connection in connections:
            close(connection)
        direct_endpoint.remove()
        relayed_endpoint.remove()
    summary = {
        name: (
            statistics.median(times) * 1e3,
            sorted(times)[int(len(times) * 0.9)] * 1e3,
            sorted(times)[int(len(times) * 0.99)] * 1e3,
            min(times) * 1e3,
        )
        for name, times in results.items()
    }
    added = summary["relay"][0] - summary["unix"][0]
    print()
    for name, (median, p90, p99, fastest) in summary.items():
        print(f"trivial exec via {name:5}: median {median:.3f} ms, p90 {p90:.3f}, p99 {p99:.3f}, min {fastest:.3f}")
    print(f"the relay adds {added:.3f} ms at the median ({2 * CALLS} calls each, after warm-up)")
    assert added < 2.0


def test_the_relay_runs_on_the_oldest_python(
    settings: Settings,
    make_orch: Any,
    credentials: Credentials,
    backend: DockerBackend,
    containers: list[str],
    run_id: str,
) -> None:
    """The relay in the image of the oldest base (Python 3.9), with the Swarm service's user and capabilities,
    serving a sandbox of the same image: the whole path on 3.9."""
    base_image = os.environ.get("ORCH_OLDEST_BASE_IMAGE")
    if not base_image:
        if os.environ.get("ORCH_REQUIRE_DOCKER") == "1":
            pytest.fail("ORCH_OLDEST_BASE_IMAGE is not set; run the tests through scripts/test")
        pytest.skip("ORCH_OLDEST_BASE_IMAGE is not set (scripts/ensure-image sets it)")
    oldest = settings.replace(base_image=base_image)
    orch: Orchestrator = make_orch(oldest)
    image = orch.build_image()
    node = Path(tempfile.mkdtemp(prefix="rn-", dir="/tmp"))
    client = docker.from_env()
    relay = None
    try:
        relay = client.containers.run(
            image,
            ["python3", "-m", "orchestrator_agent.node_relay"],
            detach=True,
            name=f"orch-relaytest-relay-{os.urandom(4).hex()}",
            labels={TEST_LABEL: run_id},
            user="0:0",
            network_mode="host",  # it listens on 127.0.0.1 only
            read_only=True,
            cap_drop=["ALL"],
            cap_add=["CHOWN", "DAC_OVERRIDE", "FOWNER"],
            environment={
                "ORCH_RELAY_LISTEN": "127.0.0.1:0",
                "ORCH_RELAY_DIR": "/relay/store",
                "ORCH_RELAY_CERT": "/tls/relay.crt",
                "ORCH_RELAY_KEY": "/tls/relay.key",
                "ORCH_RELAY_CA": "/tls/ca.crt",
            },
            volumes={str(node): {"bind": "/relay", "mode": "rw"}, str(credentials.directory): {"bind": "/tls"}},
        )
        port = _listening_port(relay)
        node_dir = node / "store"
        client_ = RelayClient("127.0.0.1", port, client_context(credentials), timeout=5)
        endpoint = RelayEndpoint.create(
            client_, new_id(), node=NodeDirectory(NODE_ID, node_dir), **endpoint_options(oldest)
        )
        run_sandbox(backend, oldest, image, endpoint, run_id, containers)
        connection = connect(endpoint)
        try:
            assert connection.hello["python"].startswith("3.9"), connection.hello
            assert run(connection, "sum(range(10))") == "45"
        finally:
            close(connection)
        endpoint.remove()
        assert client_.sandbox_ages() == {}
    finally:
        if relay is not None:
            logs = relay.logs().decode(errors="replace")
            with contextlib.suppress(docker.errors.APIError):
                relay.remove(force=True)
            print("\n" + logs)
        client.close()
        shutil.rmtree(node, ignore_errors=True)


def _listening_port(container: Any, timeout: float = 30.0) -> int:
    ends = time.monotonic() + timeout
    while time.monotonic() < ends:
        logs = container.logs().decode(errors="replace")
        found = re.search(r"listening on 127\.0\.0\.1:(\d+)", logs)
        if found:
            return int(found.group(1))
        container.reload()
        if container.status == "exited":
            raise AssertionError(f"the relay exited:\n{logs}")
        time.sleep(0.1)
    raise AssertionError(f"the relay did not listen within {timeout} s")
