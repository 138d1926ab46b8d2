"""What a container uses, read from its cgroup on the machine it runs on: its memory (now and at its peak) and CPU time.

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
    ("memory/docker/{id}/memory.usage_in_bytes", 1),  # cgroup v1, cgroupfs driver
    ("memory/system.slice/docker-{id}.scope/memory.usage_in_bytes", 1),  # v1, systemd driver
    ("system.slice/docker-{id}.scope/memory.current", 1),  # v2, systemd driver
    ("docker/{id}/memory.current", 1),  # v2, cgroupfs driver
)
"""Where a container's memory cgroup says its usage, in bytes, relative to the cgroup root."""
_PEAK_FILES = (
    ("memory/docker/{id}/memory.max_usage_in_bytes", 1),  # cgroup v1, cgroupfs driver
    ("memory/system.slice/docker-{id}.scope/memory.max_usage_in_bytes", 1),  # v1, systemd driver
    ("system.slice/docker-{id}.scope/memory.peak", 1),  # v2 (kernels from 5.19), systemd driver
    ("docker/{id}/memory.peak", 1),  # v2, cgroupfs driver
)
"""Where its memory cgroup says the most it has used since it started, in bytes."""
_CPU_FILES = (
    ("cpuacct/docker/{id}/cpuacct.usage", 1),  # v1: nanoseconds
    ("cpu,cpuacct/docker/{id}/cpuacct.usage", 1),
    ("cpu,cpuacct/system.slice/docker-{id}.scope/cpuacct.usage", 1),
    ("cpuacct/system.slice/docker-{id}.scope/cpuacct.usage", 1),
    ("system.slice/docker-{id}.scope/cpu.stat", 1000),  # v2: "usage_usec N" among other lines
    ("docker/{id}/cpu.stat", 1000),
)
"""Where its CPU time is, with the factor to nanoseconds."""
_MAX_COUNTER = 1 << 62


def container_usage(container_id: str, root: str = CGROUP_ROOT) -> Tuple[Optional[int], Optional[float]]:
    """``(memory bytes, CPU seconds)`` of a running container from the cgroup files under ``root``; each None when
    no known file has it (another layout, a container on another machine, or not a full container id)."""
    if not CONTAINER_ID.match(container_id):
        return None, None
    cpu = _first_number(_CPU_FILES, container_id, root)
    return _first_number(_MEMORY_FILES, container_id, root), (None if cpu is None else cpu / 1e9)


def cpu_and_peak(container_id: str, root: str = CGROUP_ROOT) -> Tuple[Optional[int], Optional[int]]:
    """``(CPU nanoseconds, peak memory bytes)`` of a container since it started, from its cgroup files (as
    ``container_usage``): what an eval run is charged."""
    if not CONTAINER_ID.match(container_id):
        return None, None
    return _first_number(_CPU_FILES, container_id, root), _first_number(_PEAK_FILES, container_id, root)


def _first_number(files: Tuple[Tuple[str, int], ...], container_id: str, root: str) -> Optional[int]:
    for template, factor in files:
        try:
            with open("%s/%s" % (root, template.format(id=container_id))) as fh:
                text = fh.read(4096)
        except OSError:
            continue
        if template.endswith("cpu.stat"):
            text = next((line.split()[1] for line in text.splitlines() if line.startswith("usage_usec ")), "")
        try:
            value = int(text) * factor
        except ValueError:
            continue
        if 0 <= value < _MAX_COUNTER:
            return value
    return None
