"""Helpers shared by the integration tests (importable as ``support``: pytest puts this directory on sys.path)."""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors

from orchestrator import Orchestrator, Session, SessionAttachedElsewhere, SessionClosed, Settings


def close_quietly(session: Session) -> None:
    """Close a session at teardown; a handle another controller took over (or that is closed) is left alone."""
    with contextlib.suppress(SessionAttachedElsewhere, SessionClosed):
        session.close()


def passes_descriptors(session: Session) -> bool:
    """Whether descriptors reach the session's worker (the descriptors carrier, not the relayed one)."""
    sandbox = session._sandbox.sandbox
    return sandbox is not None and sandbox.connection.passes_descriptors


def tree_snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` (relative path -> (size, mtime_ns)), to show that nothing changed there.

    The activity file is left out: any attempt at a call (a stale handle's too) marks it used; so is the lease,
    which its holder renews every second (check whose it is with ``LeaseFile.read``).
    """
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in ("activity", "lease", "lease.lock")
    }


def tree_bytes(root: Path) -> int:
    """Bytes of every file under ``root``."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def wait_gone(orch: Orchestrator, container_id: str, timeout: float = 15.0) -> None:
    """Wait until the container has stopped running (or no longer exists)."""
    ends = time.monotonic() + timeout
    while time.monotonic() < ends:
        state = orch.backend.inspect(container_id)
        if state is None or not state.running:
            return
        time.sleep(0.05)
    raise AssertionError(f"container {container_id[:12]} still running after {timeout} s")


def kill_and_wait(orch: Orchestrator, container_id: str | None) -> None:
    """SIGKILL a container (any session's: the engine is shared) and wait until the engine sees it dead."""
    assert container_id is not None
    orch.backend.kill(container_id)
    wait_gone(orch, container_id)


ATTEMPT_SOURCE = """\
def attempt(action, *args):
    try:
        action(*args)
        return 'allowed'
    except OSError as exc:
        return type(exc).__name__
"""
"""Source for a cell (or a probe) of ``attempt(action, *args)``: 'allowed', or the name of the OSError it raised."""

CONNECT_SOURCE = """\
import socket
def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    finally:
        s.close()
"""
"""Source for a cell (or a probe) of ``connect(path)``: connect to the Unix socket at ``path``, then close it."""


PORT = 8080

LISTENER = (
    "import socket\n"
    "s = socket.socket()\n"
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    f"s.bind(('0.0.0.0', {PORT}))\n"
    "s.listen(16)\n"
    "print('listening', flush=True)\n"
    "while True:\n"
    "    c, peer = s.accept()\n"
    "    print('peer', peer[0], flush=True)\n"
    "    c.sendall(b'hi')\n"
    "    c.close()\n"
)
"""A TCP server that answers 'hi' and logs every peer."""

CONTROL = (
    "import socket, sys, time\n"
    "for _ in range(100):\n"
    "    try:\n"
    f"        c = socket.create_connection((sys.argv[1], {PORT}), timeout=3)\n"
    "        break\n"
    "    except OSError:\n"
    "        time.sleep(0.1)\n"
    "print('got', c.recv(16).decode(), 'from', c.getsockname()[0])\n"
)
"""A client that retries until the listener is up (the positive control)."""


@contextlib.contextmanager
def listener_on_a_bridge(client: docker.DockerClient, image: str, run_id: str) -> Iterator[dict[str, Any]]:
    """A user-defined bridge network with a listener on it, proven to answer a container on that network."""
    labels = {"orchestrator.test.run": run_id}
    network = client.networks.create(f"orch-eval-test-{run_id}-{secrets.token_hex(3)}", driver="bridge", labels=labels)
    started: list[Any] = []
    try:
        listener = client.containers.run(
            image,
            ["python3", "-u", "-c", LISTENER],
            detach=True,
            network=network.name,
            labels=labels,
            user="65534:65534",
        )
        started.append(listener)
        listener.reload()
        address = listener.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
        assert address, "the listener got an address on the bridge"
        control = client.containers.run(
            image, ["python3", "-c", CONTROL, address], detach=True, network=network.name, labels=labels
        )
        started.append(control)
        status = control.wait(timeout=60)
        logs = control.logs().decode(errors="replace")
        assert status["StatusCode"] == 0 and "got hi" in logs, f"the positive control failed: {status} {logs}"
        control_ip = logs.split()[-1]
        yield {"ip": address, "listener": listener, "control_ip": control_ip}
    finally:
        for container in started:
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True, v=True)
        with contextlib.suppress(docker.errors.APIError):
            network.remove()


@contextlib.contextmanager
def closing_orch(orch: Orchestrator) -> Iterator[Orchestrator]:
    """Close the orchestrator's sessions and its Docker client (an unclosed client warns, and warnings fail)."""
    try:
        yield orch
    finally:
        try:
            orch.close()
        finally:
            orch.backend.client.close()  # type: ignore[attr-defined]


def cli_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The test's environment plus the ORCH_* variables that make the subprocess use the tests' settings."""
    env = dict(os.environ)
    env.update(
        ORCH_STATE_DIR=str(settings.state_dir),
        ORCH_RUNTIME_DIR=str(settings.runtime_dir),
        ORCH_BASE_IMAGE=settings.base_image,
        COLUMNS="200",
    )
    if settings.image:
        env["ORCH_IMAGE"] = settings.image
    env.update(extra)
    return env
