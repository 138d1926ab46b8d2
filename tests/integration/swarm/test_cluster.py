"""The local test swarm works: nodes Ready, pinned one-shot services run, drain stops them, a stopped node goes Down."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import docker.errors
import docker.types
import pytest
from docker.models.services import Service

from .cluster import SwarmCluster, wait_for

pytestmark = pytest.mark.docker

SLEEP = ["python3", "-c", "import time; time.sleep(60)"]
TASK_TIMEOUT = 30.0
"""Seconds for a task to start or stop; a worker that tries a registry pull first loses ~20 s per task."""


@pytest.fixture
def pinned_service(swarm_cluster: SwarmCluster, image: str) -> Iterator[Callable[[str], Service]]:
    """Factory: a one-replica service of the sandbox image on the named node, never restarted; removed after."""
    made: list[Service] = []

    def create(node: str) -> Service:
        made.append(
            swarm_cluster.manager_client().services.create(
                image,
                command=SLEEP,
                name=f"orch-smoke-{secrets.token_hex(4)}",
                labels={"orchestrator.test": "swarm"},
                init=True,  # a Python PID 1 ignores SIGTERM: without init every removal waits 10 s
                constraints=[f"node.id=={swarm_cluster.node_id(node)}"],
                restart_policy=docker.types.RestartPolicy(condition="none"),
                endpoint_spec=docker.types.EndpointSpec(mode="dnsrr"),  # no IPVS for a virtual IP here
            )
        )
        return made[-1]

    try:
        yield create
    finally:
        for service in made:
            with contextlib.suppress(docker.errors.NotFound):
                service.remove()


def _tasks(service: Service) -> list[dict[str, Any]]:
    return list(service.tasks())


def _running_node(service: Service) -> str | None:
    """The node id of the service's running task, or None."""
    running = [t["NodeID"] for t in _tasks(service) if t["Status"]["State"] == "running"]
    return running[0] if running else None


def _wait_running(service: Service) -> str:
    """Wait until the service's task runs; return its node id."""
    wait_for(f"a task of {service.name} running", lambda: _running_node(service) is not None, TASK_TIMEOUT)
    return str(_running_node(service))


def test_all_nodes_are_ready_with_one_manager(swarm_cluster: SwarmCluster) -> None:
    nodes = {n.id: n.attrs for n in swarm_cluster.manager_client().nodes.list()}
    assert set(nodes) == {swarm_cluster.node_id(name) for name in swarm_cluster.node_names}
    assert len(nodes) == 3
    assert {a["Status"]["State"] for a in nodes.values()} == {"ready"}
    assert [a["Spec"]["Role"] for a in nodes.values()].count("manager") == 1
    for name in swarm_cluster.node_names:
        assert nodes[swarm_cluster.node_id(name)]["Status"]["Addr"] == swarm_cluster.node_address(name)


def test_a_pinned_service_runs_on_each_node(
    swarm_cluster: SwarmCluster, pinned_service: Callable[[str], Service]
) -> None:
    for name in swarm_cluster.node_names:
        assert _wait_running(pinned_service(name)) == swarm_cluster.node_id(name)


def test_draining_a_node_shuts_its_task_down_for_good(
    swarm_cluster: SwarmCluster, pinned_service: Callable[[str], Service]
) -> None:
    name = swarm_cluster.node_names[1]
    service = pinned_service(name)
    assert _wait_running(service) == swarm_cluster.node_id(name)
    swarm_cluster.drain(name)
    try:
        wait_for("the task shut down", lambda: _tasks(service)[0]["Status"]["State"] == "shutdown", TASK_TIMEOUT)
    finally:
        swarm_cluster.activate(name)
    time.sleep(2)  # a replacement would be scheduled within about a second
    tasks = _tasks(service)
    assert len(tasks) == 1, tasks
    assert tasks[0]["DesiredState"] == "shutdown"


def test_a_stopped_node_goes_down_and_comes_back_ready(swarm_cluster: SwarmCluster) -> None:
    name = swarm_cluster.node_names[-1]
    address = swarm_cluster.node_address(name)
    swarm_cluster.stop(name)
    try:
        wait_for(f"{name} down", lambda: swarm_cluster.node_state(name) == "down", 60)
    finally:
        swarm_cluster.start(name)
    assert swarm_cluster.node_state(name) == "ready"
    assert swarm_cluster.node_client(name).ping()
    assert swarm_cluster.node_address(name) == address
