"""Fixtures for tests against a real Docker engine: one image build, isolated state, and a final sweep.

Every session the tests create carries the label ``orchestrator.test.run=<RUN_ID>``; when the
test session ends, every container with that label, or with the session id of a session the
tests stored, is removed, so ``docker ps -a`` shows nothing of ours afterwards.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import docker.errors
import pytest
from support import close_quietly, closing_orch, kill_and_wait

from orchestrator import Orchestrator, Session, Settings
from orchestrator.backends.base import MANAGED, SESSION_ID
from orchestrator.backends.workspace_image import images_dir, release
from orchestrator.state.controllers import CONTROLLER_PID

RUN_ID = secrets.token_hex(6)
TEST_LABEL = "orchestrator.test.run"


def _remove_dirs(state_dir: Path, runtime_dir: Path) -> None:
    """Delete a store's directories once its containers are gone, their workspace images unmounted first (``rmtree``
    must never run into a mounted file system)."""
    for directory in images_dir(runtime_dir).glob("*"):
        release(directory)
    shutil.rmtree(state_dir, ignore_errors=True)
    shutil.rmtree(runtime_dir, ignore_errors=True)


def _sweep(state_dir: Path) -> None:
    """Remove every container this test run created, found by run label or by stored session id."""
    client = docker.from_env()
    try:
        session_ids = [p.name for p in (state_dir / "sessions").glob("*")] if state_dir.exists() else []
        filters = [[f"{TEST_LABEL}={RUN_ID}"]] + [[f"{MANAGED}=true", f"{SESSION_ID}={sid}"] for sid in session_ids]
        filters.append([f"{MANAGED}=true", f"{CONTROLLER_PID}={os.getpid()}"])  # evaluations and pools of this run
        for labels in filters:
            for container in client.containers.list(all=True, filters={"label": labels}):
                with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                    container.remove(force=True, v=True)
    finally:
        client.close()


@pytest.fixture(scope="session")
def settings() -> Iterator[Settings]:
    """Settings from the environment with private state and a short runtime dir (socket paths max ~107 B)."""
    state_dir = Path(tempfile.mkdtemp(prefix="orch-state-"))
    runtime_dir = Path(tempfile.mkdtemp(prefix="orch-", dir="/tmp"))
    try:
        yield Settings.from_env().replace(state_dir=state_dir, runtime_dir=runtime_dir)
    finally:
        try:
            _sweep(state_dir)
        finally:
            _remove_dirs(state_dir, runtime_dir)


@pytest.fixture(scope="session")
def settings_for(settings: Settings) -> Iterator[Callable[..., Settings]]:
    """Factory: ``settings`` with ``changes`` and fresh private state and runtime dirs (short /tmp paths, 0700).

    Each call gives a new pair of directories, i.e. a separate store; containers of sessions stored
    there are swept and the directories removed at the end of the test run.
    """
    made: list[tuple[Path, Path]] = []

    def make(**changes: object) -> Settings:
        state_dir = Path(tempfile.mkdtemp(prefix="os-", dir="/tmp"))
        runtime_dir = Path(tempfile.mkdtemp(prefix="or-", dir="/tmp"))
        made.append((state_dir, runtime_dir))
        return settings.replace(state_dir=state_dir, runtime_dir=runtime_dir, **changes)

    try:
        yield make
    finally:
        for state_dir, runtime_dir in made:
            try:
                _sweep(state_dir)
            finally:
                _remove_dirs(state_dir, runtime_dir)


@pytest.fixture(scope="session")
def image(settings: Settings) -> str:
    """The sandbox image on ORCH_BASE_IMAGE, built once per test session (a no-op when it exists)."""
    with closing_orch(Orchestrator(settings)) as orch:
        return orch.build_image()


@pytest.fixture(scope="session")
def orch(settings: Settings, image: str) -> Iterator[Orchestrator]:
    with closing_orch(Orchestrator(settings)) as orchestrator:
        yield orchestrator


@pytest.fixture
def make_orch(image: str) -> Iterator[Callable[[Settings], Orchestrator]]:
    """Another Orchestrator (another controller) on the given settings, closed after the test."""
    with contextlib.ExitStack() as stack:
        yield lambda s: stack.enter_context(closing_orch(Orchestrator(s)))


@pytest.fixture(scope="session")
def run_id() -> str:
    """Distinct for each test run, for names that must not clash with a concurrent run on the same engine."""
    return RUN_ID


def _create(orch: Orchestrator, **kwargs: object) -> Session:
    """A session with this run's label, so the final sweep finds its containers."""
    return orch.create_session(labels={TEST_LABEL: RUN_ID}, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def new_session() -> Iterator[Callable[..., Session]]:
    """Factory of labelled sessions on any orchestrator; each is closed after the test."""
    made: list[Session] = []

    def factory(orchestrator: Orchestrator, **kwargs: object) -> Session:
        made.append(_create(orchestrator, **kwargs))
        return made[-1]

    try:
        yield factory
    finally:
        for s in made:
            close_quietly(s)


@pytest.fixture
def session(orch: Orchestrator) -> Iterator[Session]:
    """A fresh session for one test."""
    s = _create(orch)
    try:
        yield s
    finally:
        close_quietly(s)


@pytest.fixture(scope="module")
def shared_session(orch: Orchestrator) -> Iterator[Session]:
    """One session for a whole module, for tests that leave the state usable."""
    s = _create(orch)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def kill_container(orch: Orchestrator) -> Callable[[Session], None]:
    """SIGKILL a session's container from outside and wait until the engine sees it dead."""

    def kill(s: Session) -> None:
        kill_and_wait(orch, s.container_id)

    return kill
