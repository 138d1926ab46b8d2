"""What a container uses now, read from its cgroup on the machine it runs on: its memory and its CPU time.

Standard library only, Python 3.9: the controller reads it for the local engine's containers
(``backends/docker.py``), and each Swarm node's relay for the sandboxes on its node (``node_relay.py``, with the
node's ``/sys/fs/cgroup`` mounted read-only). A few small files per container; the engine's stats API takes
about a second per container.
"""

from __future__ import annotations

import re
from typing import Optional, Tuple

CGROUP_ROOT = "/sys/fs/cgroup"
MAX_USAGE_IDS = 48
"""Container ids a Swarm node's relay is asked about in one request (its request line stays under 4 KiB)."""
CONTAINER_ID = re.compile(r"^[0-9a-f]{64}$")
"""A container's full id: the only form looked up (it names a directory under the cgroup root)."""

_MEMORY_FILES = (
    ("memory/docker/{id}/memory.usage_in_bytes", 1.0),  # cgroup v1, cgroupfs driver
    ("memory/system.slice/docker-{id}.scope/memory.usage_in_bytes", 1.0),  # v1, systemd driver
    ("system.slice/docker-{id}.scope/memory.current", 1.0),  # v2, systemd driver
    ("docker/{id}/memory.current", 1.0),  # v2, cgroupfs driver
)
"""Where a container's memory cgroup says its usage, in bytes, relative to the cgroup root."""
_CPU_FILES = (
    ("cpuacct/docker/{id}/cpuacct.usage", 1e-9),  # v1: nanoseconds
    ("cpu,cpuacct/docker/{id}/cpuacct.usage", 1e-9),
    ("cpu,cpuacct/system.slice/docker-{id}.scope/cpuacct.usage", 1e-9),
    ("cpuacct/system.slice/docker-{id}.scope/cpuacct.usage", 1e-9),
    ("system.slice/docker-{id}.scope/cpu.stat", 1e-6),  # v2: "usage_usec N" among other lines
    ("docker/{id}/cpu.stat", 1e-6),
)
"""Where its CPU time is, with the factor to seconds."""


def container_usage(container_id: str, root: str = CGROUP_ROOT) -> Tuple[Optional[int], Optional[float]]:
    """``(memory bytes, CPU seconds)`` of a running container from the cgroup files under ``root``; each None when
    no known file has it (another layout, a container on another machine, or not a full container id)."""
    if not CONTAINER_ID.match(container_id):
        return None, None
    memory = _first_number(_MEMORY_FILES, container_id, root)
    cpu = _first_number(_CPU_FILES, container_id, root)
    return (None if memory is None else int(memory)), cpu


def _first_number(files: Tuple[Tuple[str, float], ...], container_id: str, root: str) -> Optional[float]:
    for template, factor in files:
        try:
            with open("%s/%s" % (root, template.format(id=container_id))) as fh:
                text = fh.read(4096)
        except OSError:
            continue
        if template.endswith("cpu.stat"):
            text = next((line.split()[1] for line in text.splitlines() if line.startswith("usage_usec ")), "")
        try:
            value = int(text)
        except ValueError:
            continue
        if value >= 0:
            return value * factor
    return None
