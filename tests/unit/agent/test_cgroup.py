"""The cgroup's memory limit as the worker reads it (v1 or v2), with "no limit" in both spellings."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.agent import cgroup


@pytest.mark.parametrize(
    ("text", "expected"),
    [("67108864\n", 64 << 20), ("max\n", None), ("9223372036854771712\n", None), ("nonsense\n", None)],
)
def test_the_memory_limit_of_either_cgroup_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, expected: int | None
) -> None:
    limit = tmp_path / "memory.max"
    limit.write_text(text)
    monkeypatch.setattr(cgroup, "_MEMORY_LIMITS", (str(tmp_path / "absent"), str(limit)))
    assert cgroup.memory_limit() == expected
