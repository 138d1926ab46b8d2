"""What the sandbox's cgroup says about it: how many of its processes the kernel OOM-killed, and its memory limit.

Standard library only, and nothing else imported: the supervisor reads it for its worker and the grading
harness for the submission's child, so a worker that loads it pays for no more than this file.
"""

from __future__ import annotations

from typing import Optional

_OOM_COUNTERS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")
_MEMORY_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
_NO_LIMIT = 1 << 62  # cgroup v1 says "no limit" with a number near 2**63


def oom_kill_count() -> int:
    """How many processes the kernel OOM-killed in this container's cgroup (cgroup v1 or v2)."""
    for path in _OOM_COUNTERS:
        try:
            with open(path) as fh:
                for line in fh:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return 0


def memory_limit() -> Optional[int]:
    """The container's memory limit in bytes (cgroup v1 or v2); None when there is none or it cannot be read."""
    for path in _MEMORY_LIMITS:
        try:
            with open(path) as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if text == "max":
            return None
        try:
            limit = int(text)
        except ValueError:
            continue
        return None if limit >= _NO_LIMIT else limit
    return None
