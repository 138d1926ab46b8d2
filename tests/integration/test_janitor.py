"""The janitor service of compose/, brought up with pytest-docker: it prunes a stale session, keeps a busy one,
logs one line per action, and stops cleanly on SIGTERM.

The compose file and the Dockerfile are copied into a temporary directory with the generated packages
(``write_janitor_context``), so a test run never writes into the checkout. The janitor prunes a private
store (its own state and runtime dirs) every second, with an idle limit of 4 s.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest
from pytest_docker.plugin import DockerComposeExecutor, Services, get_docker_services

from orchestrator import ExecResult, Orchestrator, Session, Settings
from orchestrator.ops.images import write_janitor_context
from orchestrator.ops.janitor import compose_environment

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
INTERVAL = 1.0
IDLE = 4.0
BUSY = 20.0
"""Seconds session B spends in one call: well past IDLE plus several passes."""


@pytest.fixture(scope="module")
def janitor_settings(settings_for: Callable[..., Settings]) -> Settings:
    """A private store for the janitor to prune (fresh 0700 state and runtime dirs, swept at the end)."""
    return settings_for()


@pytest.fixture(scope="module")
def janitor_environment(janitor_settings: Settings, image: str) -> Iterator[None]:
    """The variables the compose file reads, set while the service is up (compose runs in this environment).

    ``image`` first: the sandbox image on ORCH_BASE_IMAGE exists, so its base is local and no build pulls.
    """
    env = compose_environment(janitor_settings) | {
        "ORCH_JANITOR_INTERVAL": f"{INTERVAL:g}s",
        "ORCH_JANITOR_IDLE": f"{IDLE:g}s",
        "ORCH_JANITOR_OLDER_THAN": "",
        "ORCH_HIBERNATE_AFTER": "",
        "ORCH_JANITOR_HEALTH_INTERVAL": "1s",
    }
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        yield


@pytest.fixture(scope="module")
def docker_compose_command() -> str:
    """Debian's docker-compose 1.29 where it is installed, else the compose v2 plugin."""
    return "docker-compose" if shutil.which("docker-compose") else "docker compose"


@pytest.fixture(scope="module")
def docker_compose_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A copy of compose/ with the janitor's packages written into its build context."""
    directory = tmp_path_factory.mktemp("compose") / "compose"
    shutil.copytree(REPO / "compose", directory, ignore=shutil.ignore_patterns("site", ".site.new"))
    write_janitor_context(directory / "janitor")
    return str(directory / "docker-compose.yml")


@pytest.fixture(scope="module")
def compose(
    docker_compose_command: str, docker_compose_file: str, docker_compose_project_name: str
) -> DockerComposeExecutor:
    """Runs ``<compose> -f FILE -p PROJECT <subcommand>`` (pytest-docker's executor) and returns its output."""
    return DockerComposeExecutor(docker_compose_command, docker_compose_file, docker_compose_project_name)


@pytest.fixture(scope="module")
def docker_services(
    janitor_environment: None,
    docker_compose_command: str,
    docker_compose_file: str,
    docker_compose_project_name: str,
) -> Iterator[Services]:
    """The janitor up for this module only (pytest-docker's own fixture lives for the whole session).

    ``up -d --build``, not pytest-docker's default ``up --build --wait``: docker-compose 1.29 has no ``--wait``.
    """
    with get_docker_services(
        docker_compose_command, docker_compose_file, docker_compose_project_name, ["up -d --build"], ["down -v"]
    ) as services:
        yield services


@pytest.fixture(scope="module")
def janitor_container(
    docker_services: Services, docker_compose_project_name: str
) -> Iterator[docker.models.containers.Container]:
    """The janitor's container, once its healthcheck says healthy (a pass went through)."""
    client = docker.from_env()
    try:
        labels = [f"com.docker.compose.project={docker_compose_project_name}", "com.docker.compose.service=janitor"]
        (container,) = client.containers.list(all=True, filters={"label": labels})

        def healthy() -> bool:
            container.reload()
            status: str = container.attrs["State"].get("Health", {}).get("Status", "")
            return status == "healthy"

        docker_services.wait_until_responsive(check=healthy, timeout=60.0, pause=0.25)
        yield container
    finally:
        client.close()


def _gone(orch: Orchestrator, session_id: str) -> bool:
    return session_id not in orch.sessions() and not orch.containers(session_id)


def test_janitor_prunes_the_stale_session_and_keeps_the_busy_one(
    janitor_container: docker.models.containers.Container,
    compose: DockerComposeExecutor,
    janitor_settings: Settings,
    make_orch: Callable[[Settings], Orchestrator],
    new_session: Callable[..., Session],
) -> None:
    orch = make_orch(janitor_settings)
    busy = new_session(orch)
    busy.execute("y = 2")
    results: list[ExecResult] = []
    call = threading.Thread(target=lambda: results.append(busy.execute(f"import time; time.sleep({BUSY})")))
    call.start()
    try:
        stale = new_session(orch)
        stale.execute("x = 1")
        stale_id, stale_container = stale.id, stale.container_id
        stale.detach()  # its container keeps running: only the janitor can clean it up now
        assert orch.containers(stale_id)

        ends = time.monotonic() + 30.0
        while not _gone(orch, stale_id) and time.monotonic() < ends:
            time.sleep(0.2)
        assert _gone(orch, stale_id), "the janitor did not remove the stale session within 30 s"
        assert orch.backend.inspect(stale_container or "") is None
        assert call.is_alive(), "the busy call ended before the stale session went: the test proved nothing"
        assert busy.id in orch.sessions()
        assert [c.running for c in orch.containers(busy.id)] == [True]
    finally:
        call.join(BUSY + 30.0)

    assert len(results) == 1 and results[0].error is None
    assert busy.execute("y").return_value == "2"
    assert busy.id in orch.sessions()

    lines = compose.execute("logs --no-color janitor").decode().splitlines()
    removed = [line for line in lines if f"removed {stale_id} " in line]
    assert len(removed) == 1, lines
    assert "idle" in removed[0]
    assert not [line for line in lines if busy.id in line and "skipped" not in line], lines
    assert not [line for line in lines if " WARNING " in line or " ERROR " in line], lines


def test_janitor_stops_cleanly_on_sigterm(
    janitor_container: docker.models.containers.Container, compose: DockerComposeExecutor
) -> None:
    """``stop`` sends the image's STOPSIGNAL (SIGTERM); the pass under way ends and the process exits 0."""
    janitor_container.reload()
    assert janitor_container.status == "running"
    started = time.monotonic()
    compose.execute("stop -t 30 janitor")
    elapsed = time.monotonic() - started
    janitor_container.reload()
    assert janitor_container.status == "exited"
    assert janitor_container.attrs["State"]["ExitCode"] == 0  # 137 would mean it was killed at the timeout
    assert elapsed < 5.0
    lines = compose.execute("logs --no-color janitor").decode().splitlines()
    assert lines[-1].endswith("janitor stopped (SIGTERM)"), lines
