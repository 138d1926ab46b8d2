"""``/metrics`` attacked by a local user: hundreds of idle connections against a controller in a process of its own
(its threads and descriptors counted in ``/proc``), and scrapes without the token it was given."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from support import cli_env

from orchestrator import Settings
from orchestrator.metrics_http import MAX_CONNECTIONS

pytestmark = pytest.mark.docker

TOKEN = "m-" + "0123456789abcdef" * 2
IDLE = 500
CONTROLLER = """
import sys
from orchestrator import Orchestrator, Settings
with Orchestrator(Settings.from_env().replace(metrics_address="127.0.0.1:0")) as orch:
    print(orch.metrics_address, flush=True)
    sys.stdin.read()  # until the test closes the pipe
"""

Controller = tuple[str, subprocess.Popen[str]]


@pytest.fixture
def controller(settings_for: Callable[..., Settings], image: str) -> Iterator[Callable[..., Controller]]:
    """Start a controller serving metrics on a free loopback port: (its address, its process)."""
    started: list[subprocess.Popen[str]] = []

    def start(**env: str) -> Controller:
        process = subprocess.Popen(
            [sys.executable, "-c", CONTROLLER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=cli_env(settings_for(), **env),
        )
        started.append(process)
        assert process.stdout is not None
        address = process.stdout.readline().strip()
        assert address.startswith("127.0.0.1:"), address
        return address, process

    yield start
    for process in started:
        process.communicate(timeout=60)  # closes its stdin: it closes its orchestrator and exits


def held(pid: int) -> tuple[int, int]:
    """The threads and descriptors of process ``pid`` now."""
    with open(f"/proc/{pid}/status") as status:
        threads = next(int(line.split()[1]) for line in status if line.startswith("Threads:"))
    return threads, len(os.listdir(f"/proc/{pid}/fd"))


def scrape(address: str, authorization: str | None = None) -> tuple[int, str]:
    headers = {} if authorization is None else {"Authorization": authorization}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(f"http://{address}/metrics", headers=headers), timeout=30
        ) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


def until(done: Callable[[], bool], what: str, seconds: float = 60.0) -> None:
    """Wait for ``done`` (a bound on a hang, not a timing claim)."""
    ends = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < ends, what
        time.sleep(0.1)


def test_hundreds_of_idle_connections_hold_no_more_than_the_cap_and_a_scrape_still_answers(
    controller: Callable[..., Controller],
) -> None:
    address, process = controller()
    host, port = address.rsplit(":", 1)
    assert scrape(address)[0] == 200
    threads, descriptors = held(process.pid)
    idle = []
    try:
        for _ in range(IDLE):  # a local user's connections that never send a request
            connection = socket.create_connection((host, int(port)), timeout=30)
            idle.append(connection)
        status, text = scrape(address)  # a scraper's request, in the middle of the flood
        assert status == 200 and "orchestrator_sessions" in text
        flooded = held(process.pid)
        # Handler threads and their sockets: at most twice the cap (those being shut down included).
        assert flooded[0] <= threads + 2 * MAX_CONNECTIONS and flooded[1] <= descriptors + 2 * MAX_CONNECTIONS, (
            (threads, descriptors),
            flooded,
        )
        for connection in idle:  # every one is closed by the server: at once past the cap, else at its deadline
            connection.settimeout(60)
            with contextlib.suppress(ConnectionResetError):
                assert connection.recv(1) == b""
    finally:
        for connection in idle:
            connection.close()
    until(lambda: held(process.pid)[0] <= threads, "the handler threads did not end")
    assert scrape(address)[0] == 200


def test_with_a_token_a_scrape_without_it_is_refused(controller: Callable[..., Controller]) -> None:
    address, _ = controller(ORCH_METRICS_TOKEN=TOKEN)
    for authorization in (None, "Bearer wrong-token-of-the-same-size-xx", TOKEN, f"Basic {TOKEN}", f"Bearer {TOKEN}x"):
        status, text = scrape(address, authorization)
        assert status == 401 and "orchestrator_" not in text, (authorization, status)
    status, text = scrape(address, f"Bearer {TOKEN}")
    assert status == 200 and "orchestrator_sessions" in text
