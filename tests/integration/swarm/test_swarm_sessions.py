"""Sessions on a three-node Swarm (Docker-in-Docker nodes on a private bridge this run made).

Sessions spread over the nodes; a session's state survives its node being drained or stopped
(restored on another node); relays restarted under running sessions are survived; a relay
refuses a connection without our credentials; a sandbox has no network on any node; its cells run as
a uid of their own, out of the supervisor's reach. No packet
leaves this machine: the only addresses dialled are the nodes' and the sandboxes' own.
"""

from __future__ import annotations

import ast
import contextlib
import socket
import ssl
import time
from collections.abc import Iterator

import pytest
from support import ATTEMPT_SOURCE

from orchestrator import Orchestrator, Session, Settings
from orchestrator.backends.base import SUPERVISOR_CAPABILITIES, WORKER_UID, Placement
from orchestrator.errors import OrchestratorError, SandboxCrashed

pytestmark = pytest.mark.docker

RELAY_PORT = 7443


@pytest.fixture(scope="module")
def swarm_settings(swarm_cluster, settings, settings_for) -> Settings:  # type: ignore[no-untyped-def]
    return settings_for(
        backend="swarm",
        swarm=settings.swarm.replace(relay_port=RELAY_PORT),
        timeouts=settings.timeouts.replace(start=60.0),
    )


@pytest.fixture(scope="module")
def orch(swarm_cluster, swarm_settings: Settings) -> Iterator[Orchestrator]:  # type: ignore[no-untyped-def]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DOCKER_HOST", swarm_cluster.manager_url)
        with Orchestrator(swarm_settings) as orchestrator:
            try:
                yield orchestrator
            finally:  # relays are the Swarm's, not a session's: this store's goes with the test module
                manager = swarm_cluster.manager_client()
                for service in manager.services.list(filters={"name": f"orch-relay-{orchestrator.store.store_id}"}):
                    service.remove()


def node_of(orch: Orchestrator, session: Session) -> str:
    (container,) = [c for c in orch.containers(session.id) if c.id == session.container_id]
    assert container.node, container
    return container.node


def pinned(orch: Orchestrator, hostname: str) -> Session:
    return orch.create_session(placement=Placement((f"node.hostname=={hostname}",)))


def wait_until_stopped(orch: Orchestrator, session: Session, seconds: float = 30.0) -> None:
    """Until Swarm has shut the session's task down (a drain takes ~1.5 s)."""
    ends = time.monotonic() + seconds
    while any(c.running or c.status == "removing" for c in orch.containers(session.id)):
        assert time.monotonic() < ends, "the drained node's task is still running"
        time.sleep(0.2)


def hostnames(swarm_cluster) -> list[str]:  # type: ignore[no-untyped-def]
    return [swarm_cluster.hostname(name) for name in swarm_cluster.node_names]


def test_sessions_spread_over_the_nodes_and_ls_names_them(orch: Orchestrator, swarm_cluster) -> None:  # type: ignore[no-untyped-def]
    sessions = [orch.create_session() for _ in range(3)]
    try:
        for i, session in enumerate(sessions):
            session.execute(f"x = {i}")
        assert sorted(node_of(orch, s) for s in sessions) == sorted(hostnames(swarm_cluster))
        listed = {info.id: info.node for info in orch.list_sessions()}
        assert {s.id: node_of(orch, s) for s in sessions}.items() <= listed.items()
        assert [s.execute("x").return_value for s in sessions] == ["0", "1", "2"]
    finally:
        for session in sessions:
            session.close()


def test_ls_shows_live_cpu_and_memory_read_by_each_nodes_relay(orch: Orchestrator, swarm_cluster) -> None:  # type: ignore[no-untyped-def]
    here, there = hostnames(swarm_cluster)[:2]
    busy, idle = pinned(orch, here), pinned(orch, there)
    try:
        busy.execute("import threading\ndef spin():\n    while not stop:\n        pass\nstop = False\n")
        busy.execute("threading.Thread(target=spin, daemon=True).start()")  # burns a core after the cell
        idle.execute("x = 1")
        listed = {info.id: info for info in orch.list_sessions()}
        for session in (busy, idle):
            info = listed[session.id]
            assert info.memory_bytes is not None and info.memory_bytes > 1 << 20, info
            assert info.cpu_seconds is not None and info.cpu_percent is not None, info
        assert listed[busy.id].cpu_percent > 20 > listed[idle.id].cpu_percent  # type: ignore[operator]
    finally:
        with contextlib.suppress(OrchestratorError):
            busy.execute("stop = True")
        busy.close()
        idle.close()


def test_a_fork_lands_on_another_node_with_its_sources_state(orch: Orchestrator, swarm_cluster) -> None:  # type: ignore[no-untyped-def]
    here, there = hostnames(swarm_cluster)[:2]
    source = pinned(orch, here)
    try:
        source.execute("def twice(v):\n    return 2 * v\ndata = list(range(1000))")
        (fork,) = orch.fork(source.id, placement=Placement((f"node.hostname=={there}",)))
        try:
            assert node_of(orch, fork) == there and node_of(orch, source) == here
            assert fork.execute("twice(sum(data))").return_value == str(2 * sum(range(1000)))
            fork.execute("data.append(-1)")
            assert source.execute("len(data)").return_value == "1000"
        finally:
            fork.close()
    finally:
        source.close()


def test_state_survives_its_node_being_drained(orch: Orchestrator, swarm_cluster) -> None:  # type: ignore[no-untyped-def]
    session = orch.create_session(placement=Placement(("node.role==worker",)))
    try:
        session.execute("data = list(range(1000)); import json")
        drained = node_of(orch, session)
        swarm_cluster.drain(swarm_cluster.by_hostname(drained))
        try:
            wait_until_stopped(orch, session)
            assert session.execute("sum(data)").return_value == str(sum(range(1000)))
            assert node_of(orch, session) != drained
        finally:
            swarm_cluster.activate(swarm_cluster.by_hostname(drained))
    finally:
        session.close()


def test_state_survives_its_node_being_stopped(orch: Orchestrator, swarm_cluster) -> None:  # type: ignore[no-untyped-def]
    session = orch.create_session(placement=Placement(("node.role==worker",)))
    try:
        session.execute("kept = {'a': 1, 'b': [1, 2, 3]}")
        lost = node_of(orch, session)
        swarm_cluster.stop(swarm_cluster.by_hostname(lost))
        try:
            started = time.monotonic()
            try:
                reply = session.execute("kept['b'][-1] + kept['a']")
            except SandboxCrashed as exc:  # the node died in the call's way: restored, typed, then usable
                assert exc.restored
                reply = session.execute("kept['b'][-1] + kept['a']")
            assert reply.return_value == "4"
            assert node_of(orch, session) != lost
            assert time.monotonic() - started < 60
        finally:
            swarm_cluster.start(swarm_cluster.by_hostname(lost))
    finally:
        session.close()


def test_relays_restarted_under_running_sessions(orch: Orchestrator, swarm_cluster) -> None:  # type: ignore[no-untyped-def]
    sessions = [pinned(orch, host) for host in hostnames(swarm_cluster)]
    try:
        for i, session in enumerate(sessions):
            session.execute(f"v = {i} * 10")
        swarm_cluster.manager_client().services.get(f"orch-relay-{orch.store.store_id}").force_update()
        time.sleep(3)
        assert [s.execute("v + 1").return_value for s in sessions] == ["1", "11", "21"]
    finally:
        for session in sessions:
            session.close()


@pytest.mark.parametrize("how", ["plaintext", "tls without a certificate"])
def test_a_relay_refuses_a_connection_without_credentials(orch: Orchestrator, swarm_cluster, how: str) -> None:  # type: ignore[no-untyped-def]
    session = orch.create_session()
    try:
        address = swarm_cluster.node_address(swarm_cluster.by_hostname(node_of(orch, session)))
        request = b'{"op": "list"}\n'
        with socket.create_connection((address, RELAY_PORT), timeout=10) as raw:
            raw.settimeout(10)
            if how == "plaintext":
                raw.sendall(request)
                answer = _read_all(raw)
            else:
                context = ssl.create_default_context()
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
                try:
                    with context.wrap_socket(raw, server_hostname="orchestrator-relay") as tls:
                        tls.sendall(request)
                        answer = _read_all(tls)
                except OSError:  # the handshake failed (ssl.SSLError is one)
                    answer = b""
        assert b"ok" not in answer and b"sb-" not in answer, answer[:200]
    finally:
        session.close()


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except OSError:  # a reset, a TLS alert or the timeout: what came before it is the answer
        pass
    return data


LISTEN = """
import socket, threading
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(('0.0.0.0', 8080))
listener.listen(8)
threading.Thread(target=lambda: [listener.accept()[0].close() for _ in iter(int, 1)], daemon=True).start()
# its own address on its network: the last line of /etc/hosts that Docker wrote for it
open('/etc/hosts').read().split()[-2]
"""

NETWORK_PROBE = """
import socket
with open('/proc/net/route') as f:
    v4 = f.read().splitlines()[1:]
default4 = [r for r in v4 if r.split()[1] == '00000000']
try:
    with open('/proc/net/ipv6_route') as f:
        v6 = f.read().splitlines()
except OSError:
    v6 = []
# ::/0 routes, minus the kernel's reject routes on lo (flag RTF_REJECT, 0x200): those lead nowhere
default6 = [
    r for r in v6
    if r.split()[0] == '0' * 32 and r.split()[1] == '00' and not int(r.split()[8], 16) & 0x200 and r.split()[9] != 'lo'
]
def reaches(host, port):
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, port))
        return True
    except OSError:
        return False
    finally:
        s.close()
try:
    socket.getaddrinfo('orchestrator-relay', 80)
    resolves = True
except OSError:
    resolves = False
(len(default4), len(default6), [reaches(h, p) for h, p in TARGETS], resolves)
"""


def test_a_sandbox_has_no_network_on_any_node(orch: Orchestrator, swarm_cluster) -> None:  # type: ignore[no-untyped-def]
    """No default route (v4, v6); the nodes' relay and Swarm ports, another sandbox's listener and DNS are out of
    reach; the sandbox's own listener answers (the probe works)."""
    nodes = [
        (swarm_cluster.node_address(name), port) for name in swarm_cluster.node_names for port in (RELAY_PORT, 2377)
    ]
    sessions = [pinned(orch, host) for host in hostnames(swarm_cluster)]
    try:
        addresses = [ast.literal_eval(s.execute(LISTEN).return_value) for s in sessions]  # repr of an address
        for i, session in enumerate(sessions):
            others = [(a, 8080) for j, a in enumerate(addresses) if j != i]
            probe = f"TARGETS = {[*nodes, *others, (addresses[i], 8080)]!r}\n{NETWORK_PROBE}"
            expected = (0, 0, [False] * (len(nodes) + len(others)) + [True], False)
            assert session.execute(probe).return_value == repr(expected), (session.id, node_of(orch, session))
    finally:
        for session in sessions:
            session.close()


IDENTITY_PROBE = (
    "import os\n"
    + ATTEMPT_SOURCE
    + """\
caps = [line.split()[1] for line in open('/proc/self/status') if line.startswith(('CapEff', 'CapBnd'))]
(os.getuid(), os.getgid(), os.getgroups(), caps, attempt(lambda: os.kill(os.getppid(), 10)),
 attempt(lambda: open('/run/orchestrator/secret').read()))
"""
)


def test_each_sandbox_runs_its_cells_as_a_uid_of_its_own_out_of_the_supervisors_reach(
    orch: Orchestrator, swarm_cluster
) -> None:  # type: ignore[no-untyped-def]
    """The service spec has the local container's identities (docs/identity.md): root with four capabilities for
    the supervisor, the cells as the sandbox's labelled uid with none; a cell can neither signal the supervisor
    nor read the secret."""
    sessions = [pinned(orch, host) for host in hostnames(swarm_cluster)[:2]]
    try:
        uids = []
        for session in sessions:
            (container,) = [c for c in orch.containers(session.id) if c.id == session.container_id]
            uid = int(container.labels[WORKER_UID])
            uids.append(uid)
            outcome = ast.literal_eval(session.execute(IDENTITY_PROBE).return_value or "None")
            assert outcome == (uid, uid, [], ["0" * 16] * 2, "PermissionError", "PermissionError"), outcome
        assert uids[0] != uids[1]
        manager = swarm_cluster.manager_client()
        try:
            spec = manager.services.get(sessions[0].container_id).attrs["Spec"]
        finally:
            manager.close()
        container_spec = spec["TaskTemplate"]["ContainerSpec"]
        assert container_spec["User"] == "0:0"
        assert sorted(container_spec["CapabilityAdd"]) == sorted(SUPERVISOR_CAPABILITIES)
        assert container_spec["CapabilityDrop"] == ["ALL"]
    finally:
        for session in sessions:
            session.close()
