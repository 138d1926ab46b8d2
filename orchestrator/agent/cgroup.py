"""What the sandbox's cgroup says about it: how many of its processes the kernel OOM-killed.

Standard library only, and nothing else imported: the supervisor reads it for its worker and the grading
harness for the submission's child, so a worker that loads it pays for no more than this file.
"""

from __future__ import annotations

_OOM_COUNTERS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


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
