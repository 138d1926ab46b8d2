"""A local multi-node Docker Swarm for tests: Docker-in-Docker nodes that ``scripts/swarm-up`` makes.

Node 1 is the only manager. Each node's engine answers the host on a Unix socket under
``/run/orchestrator-swarm``; the host engine owns the node containers (stop/start them to fail a node).
"""

from __future__ import annotations

import gc
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests

REPO = Path(__file__).resolve().parents[3]
RUN_DIR = Path("/run/orchestrator-swarm")
NETWORK = "orch-swarm-test"
NODE_PREFIX = "orch-swarm-node"
READY_TIMEOUT = 60.0


def wait_for(what: str, check: Callable[[], bool], timeout: float, interval: float = 0.2) -> None:
    """Poll ``check`` until it is true; AssertionError naming ``what`` after ``timeout`` seconds."""
    ends = time.monotonic() + timeout
    while not check():
        if time.monotonic() > ends:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(interval)


def _engine_client(url: str) -> docker.DockerClient | None:
    """A client of the engine at ``url`` if it answers, else None (a node that is starting or stopped)."""
    # A refused connection leaks docker-py's socket; its ResourceWarning must not fail a later test.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            client = docker.DockerClient(base_url=url, timeout=30)
            client.ping()
            return client
        except (docker.errors.DockerException, requests.RequestException):
            return None
        finally:
            gc.collect()


class SwarmCluster:
    """Handles on a running test swarm: its nodes' engines, swarm node ids, addresses and failures."""

    def __init__(self, node_names: list[str]) -> None:
        self.node_names = node_names
        self._host = docker.from_env()
        self._clients: dict[str, docker.DockerClient] = {}
        self._ids: dict[str, str] = {}

    @classmethod
    def up(cls, images: list[str], nodes: int = 3) -> SwarmCluster:
        """Bring the swarm up (or reuse it) with ``images`` loaded on every node.

        Raises:
            subprocess.CalledProcessError: scripts/swarm-up failed (its log went to stderr).
        """
        args = [str(REPO / "scripts" / "swarm-up"), "--nodes", str(nodes)]
        for tag in images:
            args += ["--image", tag]
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
        return cls([f"{NODE_PREFIX}{i}" for i in range(1, nodes + 1)])

    def close(self) -> None:
        """Close our engine clients; the swarm keeps running."""
        for client in [*self._clients.values(), self._host]:
            client.close()
        self._clients.clear()

    def down(self) -> None:
        """Close the clients and remove the whole swarm (scripts/swarm-down)."""
        self.close()
        subprocess.run([str(REPO / "scripts" / "swarm-down")], check=True)

    @property
    def manager_url(self) -> str:
        """DOCKER_HOST of the manager's engine."""
        return self.node_url(self.node_names[0])

    def node_url(self, name: str) -> str:
        """DOCKER_HOST of node ``name``'s engine."""
        return f"unix://{RUN_DIR / name / 'docker.sock'}"

    def node_client(self, name: str) -> docker.DockerClient:
        """A client of node ``name``'s engine (kept until the node stops)."""
        if name not in self._clients:
            client = _engine_client(self.node_url(name))
            if client is None:
                raise AssertionError(f"the engine of {name} does not answer (docker logs {name})")
            self._clients[name] = client
        return self._clients[name]

    def manager_client(self) -> docker.DockerClient:
        """A client of the manager's engine: services, nodes and networks of the swarm."""
        return self.node_client(self.node_names[0])

    def node_id(self, name: str) -> str:
        """The swarm node id of ``name`` (it stays the same across a stop and start)."""
        if name not in self._ids:
            self._ids[name] = self.node_client(name).info()["Swarm"]["NodeID"]
        return self._ids[name]

    def node_address(self, name: str) -> str:
        """The node's IP on the private network (fixed: it survives a stop and start)."""
        attrs: dict[str, Any] = self._host.containers.get(name).attrs
        return str(attrs["NetworkSettings"]["Networks"][NETWORK]["IPAddress"])

    def hostname(self, name: str) -> str:
        """The node's hostname in the swarm (what ``node.hostname==`` constraints match)."""
        return str(self.manager_client().nodes.get(self.node_id(name)).attrs["Description"]["Hostname"])

    def by_hostname(self, hostname: str) -> str:
        """The container name of the node with swarm hostname ``hostname``."""
        (name,) = [name for name in self.node_names if self.hostname(name) == hostname]
        return name

    def node_state(self, name: str) -> str:
        """The node's state as the manager sees it: "ready", "down", "unknown" or "disconnected"."""
        return str(self.manager_client().nodes.get(self.node_id(name)).attrs["Status"]["State"])

    def drain(self, name: str) -> None:
        """Set the node's availability to drain: the manager shuts its tasks down."""
        self._set_availability(name, "drain")

    def activate(self, name: str) -> None:
        """Set the node's availability back to active."""
        self._set_availability(name, "active")

    def _set_availability(self, name: str, availability: str) -> None:
        node = self.manager_client().nodes.get(self.node_id(name))
        node.update({**node.attrs["Spec"], "Availability": availability})

    def stop(self, name: str, timeout: int = 10) -> None:
        """``docker stop`` the node container; the manager marks it down about 15 s later."""
        self.node_id(name)  # known while the node still answers
        client = self._clients.pop(name, None)
        if client is not None:
            client.close()
        self._host.containers.get(name).stop(timeout=timeout)

    def start(self, name: str, timeout: float = READY_TIMEOUT) -> None:
        """``docker start`` the node container; return once its engine answers and the manager sees it ready."""
        self._host.containers.get(name).start()
        wait_for(f"the engine of {name} answers", lambda: self._reconnect(name), timeout)
        wait_for(f"{name} is back in the swarm", lambda: self._swarm_state(name) == "active", timeout)
        wait_for(f"{name} is ready", lambda: self.node_state(name) == "ready", timeout)

    def _reconnect(self, name: str) -> bool:
        client = _engine_client(self.node_url(name))
        if client is not None:
            self._clients[name] = client
        return client is not None

    def _swarm_state(self, name: str) -> str:
        return str(self.node_client(name).info()["Swarm"]["LocalNodeState"])

    def load_image(self, tag: str) -> None:
        """Load the host's image ``tag`` into every node that lacks that image id (``docker save | load``)."""
        image = self._host.images.get(tag)
        lacking = [name for name in self.node_names if self._image_id(name, tag) != image.id]
        if not lacking:
            return
        with tempfile.TemporaryFile() as tarball:
            for chunk in image.save(named=True):
                tarball.write(chunk)
            for name in lacking:
                tarball.seek(0)
                self.node_client(name).images.load(tarball)

    def _image_id(self, name: str, tag: str) -> str | None:
        try:
            return str(self.node_client(name).images.get(tag).id)
        except docker.errors.ImageNotFound:
            return None
