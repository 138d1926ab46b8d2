"""A node relay as a real subprocess on 127.0.0.1, for the relay's unit tests and the relay endpoint's integration
tests (importable as ``relay_support``: pytest puts ``tests/`` on sys.path for its conftest)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.backends.swarm.relay_client import RelayClient
from orchestrator.backends.swarm.tls import Credentials, client_context

_LISTENING = re.compile(rb"listening on 127\.0\.0\.1:(\d+)")


class RelayProcess:
    """``python3 -m orchestrator.agent.node_relay`` serving ``node_dir`` with ``credentials``; logs go to a file."""

    def __init__(self, node_dir: Path, credentials: Credentials, log: Path, **environment: str) -> None:
        self.node_dir = node_dir
        self.credentials = credentials
        self.log_path = log
        self.environment = environment
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 15.0) -> None:
        """Start it (on the port it had, after the first start) and wait until it listens."""
        env = dict(
            os.environ,
            ORCH_RELAY_LISTEN=f"127.0.0.1:{self.port}",
            ORCH_RELAY_DIR=str(self.node_dir),
            ORCH_RELAY_CERT=str(self.credentials.relay_cert),
            ORCH_RELAY_KEY=str(self.credentials.relay_key),
            ORCH_RELAY_CA=str(self.credentials.ca_cert),
            **self.environment,
        )
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "orchestrator.agent.node_relay"], env=env, stdout=log, stderr=log
            )
        ends = time.monotonic() + timeout
        while time.monotonic() < ends:
            found = _LISTENING.search(self.log_path.read_bytes()[offset:])
            if found:
                self.port = int(found.group(1))
                return
            if self.process.poll() is not None:
                raise AssertionError(f"the relay exited with {self.process.returncode}:\n{self.log()}")
            time.sleep(0.02)
        raise AssertionError(f"the relay did not listen within {timeout} s:\n{self.log()}")

    def kill(self) -> None:
        """SIGKILL: a crash, nothing cleaned up."""
        self._end(signal.SIGKILL)

    def stop(self) -> None:
        self._end(signal.SIGTERM)

    def _end(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)
            self.process.wait(timeout=15)
        self.process = None

    def client(self, timeout: float = 5.0) -> RelayClient:
        return RelayClient("127.0.0.1", self.port, client_context(self.credentials), timeout=timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def connect_agent(path: Path, timeout: float = 10.0) -> socket.socket:
    """Connect to a sandbox's ``channel.sock`` as an agent does: retry until something listens there."""
    ends = time.monotonic() + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(path))
            return sock
        except OSError:
            sock.close()
            if time.monotonic() >= ends:
                raise
            time.sleep(0.01)
