"""Pytest plugin that runs rlms' own DockerREPL tests against orchestrator.rlm.DockerREPL.

``scripts/rlms-upstream-tests`` extracts the test files of the rlms 0.1.3 sdist into
``upstream/`` here (git-ignored: rlms' test code is not part of this repository) and sets
``ORCH_RLMS_UPSTREAM=1``; ``pytest.ini`` here is rlms' own test configuration, so the files run
as they do in rlms. Only with that variable does this plugin act: it registers our DockerREPL with
rlms, gives the run private state and runtime directories, deselects the tests listed in
``EXCLUDED`` (each with its reason; docs/rlm.md lists them too) and removes every container
of the run at the end. In an ordinary test run the extracted files are not collected.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import docker
import docker.errors
import pytest

ACTIVE = os.environ.get("ORCH_RLMS_UPSTREAM") == "1"
collect_ignore_glob = [] if ACTIVE else ["upstream/*"]

EXCLUDED = {
    "test_docker_repl_persistent.py::TestDockerUpdateHandlerAddress::test_update_handler_address": (
        "reads repl.proxy_server, the peer's HTTP proxy: ours has none, nothing listens on a port "
        "(the handler address it also checks is covered by test_rlm_environment.py)"
    ),
    "test_docker_repl_robustness.py::TestIsolationAndLifecycle::test_two_repls_isolated_state_and_tracking": (
        "compares repl.proxy_port, the port of the peer's HTTP proxy: ours has no port "
        "(isolation and per-environment call tracking are covered by test_rlm_environment.py)"
    ),
    "test_docker_repl_robustness.py::TestIsolationAndLifecycle::test_context_manager_cleans_up": (
        "reads repl.temp_dir, the peer's host workspace directory: ours has none "
        "(removal of the container by the with block is covered by test_rlm_environment.py)"
    ),
    "test_docker_repl_robustness.py::TestStateAndOutput::test_unpicklable_dropped_picklable_survives": (
        "asserts a peer limitation: an unpicklable value vanishes from the namespace after its cell; "
        "ours keeps it in memory and names it in REPLResult.unsaved (covered by test_rlm_environment.py)"
    ),
}

_dirs: list[Path] = []


def pytest_configure(config: pytest.Config) -> None:
    if not ACTIVE:
        return
    from orchestrator.rlm import register

    state_dir = Path(tempfile.mkdtemp(prefix="os-rlms-", dir="/tmp"))
    runtime_dir = Path(tempfile.mkdtemp(prefix="or-", dir="/tmp"))
    _dirs.extend((state_dir, runtime_dir))
    os.environ["ORCH_STATE_DIR"] = str(state_dir)
    os.environ["ORCH_RUNTIME_DIR"] = str(runtime_dir)
    register()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not ACTIVE:
        return
    kept, dropped = [], []
    for item in items:
        key = f"{Path(item.path).name}::{item.nodeid.split('::', 1)[1]}" if "::" in item.nodeid else item.nodeid
        (dropped if key in EXCLUDED else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_unconfigure(config: pytest.Config) -> None:
    if not ACTIVE or not _dirs:
        return
    from orchestrator.rlm import unregister

    unregister()
    state_dir = _dirs[0]
    try:
        _sweep(state_dir)
    finally:
        for path in _dirs:
            shutil.rmtree(path, ignore_errors=True)


def _sweep(state_dir: Path) -> None:
    """Remove the containers of every session stored in this run's state directory (a test that failed left them)."""
    from orchestrator.backends.base import MANAGED, SESSION_ID

    session_ids = [p.name for p in (state_dir / "sessions").glob("*")]
    client = docker.from_env()
    try:
        for session_id in session_ids:
            labels = [f"{MANAGED}=true", f"{SESSION_ID}={session_id}"]
            for container in client.containers.list(all=True, filters={"label": labels}):
                with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                    container.remove(force=True, v=True)
    finally:
        client.close()
