"""``agent.usage``: a container's memory and CPU time from its cgroup files, whichever layout the machine has."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.agent.usage import container_usage, cpu_and_peak

ID = "ab" * 32


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative.format(id=ID)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize(
    ("files", "usage"),
    [
        (  # cgroup v1, cgroupfs driver: bytes and nanoseconds
            {
                "memory/docker/{id}/memory.usage_in_bytes": "20971520\n",
                "cpuacct/docker/{id}/cpuacct.usage": "1500000000\n",
            },
            (20 << 20, 1.5),
        ),
        (  # cgroup v1, systemd driver, cpu and cpuacct joined
            {
                "memory/system.slice/docker-{id}.scope/memory.usage_in_bytes": "1024",
                "cpu,cpuacct/system.slice/docker-{id}.scope/cpuacct.usage": "250000000",
            },
            (1024, 0.25),
        ),
        (  # cgroup v2, systemd driver: microseconds among other lines
            {
                "system.slice/docker-{id}.scope/memory.current": "4096\n",
                "system.slice/docker-{id}.scope/cpu.stat": "usage_usec 3000000\nuser_usec 2000000\n",
            },
            (4096, 3.0),
        ),
        ({"docker/{id}/memory.current": "8192"}, (8192, None)),  # v2, cgroupfs: no cpu.stat (controller off)
        ({"docker/{id}/memory.current": "garbage", "docker/{id}/cpu.stat": "nothing here"}, (None, None)),
        ({}, (None, None)),  # another machine's container, or a layout nobody knows
    ],
)
def test_each_layout(tmp_path: Path, files: dict[str, str], usage: tuple[int | None, float | None]) -> None:
    for relative, text in files.items():
        write(tmp_path, relative, text)
    memory, cpu = container_usage(ID, str(tmp_path))
    assert memory == usage[0] and (cpu == pytest.approx(usage[1]) if usage[1] is not None else cpu is None)


@pytest.mark.parametrize("container_id", ["../../etc", "AB" * 32, "ab" * 31, "", "ab" * 32 + "/x"])
def test_only_a_full_container_id_is_looked_up(tmp_path: Path, container_id: str) -> None:
    write(tmp_path, "docker/{id}/memory.current", "1")
    assert container_usage(container_id, str(tmp_path)) == (None, None)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (  # cgroup v1: nanoseconds and the memory cgroup's peak
            {
                "cpuacct/docker/{id}/cpuacct.usage": "1500000000\n",
                "memory/docker/{id}/memory.max_usage_in_bytes": "20971520\n",
            },
            (1_500_000_000, 20 << 20),
        ),
        (  # cgroup v2: microseconds, memory.peak
            {"docker/{id}/cpu.stat": "usage_usec 250\nuser_usec 200\n", "docker/{id}/memory.peak": "7"},
            (250_000, 7),
        ),
        ({"cpuacct/docker/{id}/cpuacct.usage": "-5"}, (None, None)),  # not a counter
    ],
)
def test_cpu_and_peak_for_an_eval_run(
    tmp_path: Path, files: dict[str, str], expected: tuple[int | None, int | None]
) -> None:
    for relative, text in files.items():
        write(tmp_path, relative, text)
    assert cpu_and_peak(ID, str(tmp_path)) == expected
    assert cpu_and_peak("../../etc", str(tmp_path)) == (None, None)
