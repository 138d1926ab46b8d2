"""The ``swarm_cluster`` fixture: a local three-node Docker Swarm with the sandbox image on every node.

Brought up once for the tests of this package by scripts/swarm-up (15-25 s with the node image cached, most of it
loading the image into the nodes; building the node image takes a minute more) and removed right after them
(three engines should not idle under the rest of the suite),
unless ``ORCH_KEEP_SWARM=1`` keeps it for the next run (which then takes about a second). Without an
engine the ``docker`` marker skips (tests/conftest.py); without root, or debootstrap where the node image
is missing, this fixture skips. Under ``ORCH_REQUIRE_DOCKER=1`` each of those is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from .cluster import SwarmCluster

NODE_IMAGE = "orchestrator-swarm-node:bookworm"


def _missing() -> str | None:
    """None when this machine can run the test swarm, else why not."""
    if os.geteuid() != 0:
        return "the test swarm needs root (debootstrap, /run/orchestrator-swarm)"
    has_node_image = subprocess.run(["docker", "image", "inspect", NODE_IMAGE], capture_output=True).returncode == 0
    if not has_node_image and shutil.which("debootstrap") is None:
        return f"no {NODE_IMAGE} and no debootstrap to build it (apt-get install debootstrap)"
    return None


@pytest.fixture(scope="package")
def swarm_cluster(image: str) -> Iterator[SwarmCluster]:
    """The running swarm; ``image`` (the sandbox image) is loaded on every node."""
    problem = _missing()
    if problem is not None:
        if os.environ.get("ORCH_REQUIRE_DOCKER") == "1":
            pytest.fail(f"ORCH_REQUIRE_DOCKER=1 but {problem}")
        pytest.skip(problem)
    cluster = SwarmCluster.up([image])
    try:
        yield cluster
    finally:
        if os.environ.get("ORCH_KEEP_SWARM") == "1":
            cluster.close()
        else:
            cluster.down()
