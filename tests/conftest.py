"""Tests marked ``docker`` need a Docker engine: skipped without one, a failed run when ORCH_REQUIRE_DOCKER=1."""

from __future__ import annotations

import gc
import os
import warnings

import pytest


def _engine_problem() -> str | None:
    """None when a Docker engine answers a ping, else why not."""
    # A failed connection leaks docker-py's socket; its ResourceWarning must not fail a later test.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            import docker

            client = docker.from_env(timeout=10)
            try:
                client.ping()
            finally:
                client.close()
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            gc.collect()
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    needs_engine = [item for item in items if item.get_closest_marker("docker") is not None]
    if not needs_engine:
        return
    problem = _engine_problem()
    if problem is None:
        return
    if os.environ.get("ORCH_REQUIRE_DOCKER") == "1":
        raise pytest.UsageError(
            f"ORCH_REQUIRE_DOCKER=1 but no Docker engine answers ({problem}); "
            f"{len(needs_engine)} tests need one. Start it with scripts/setup-engine or check DOCKER_HOST."
        )
    skip = pytest.mark.skip(reason=f"no Docker engine answers ({problem}); set ORCH_REQUIRE_DOCKER=1 to fail instead")
    for item in needs_engine:
        item.add_marker(skip)
