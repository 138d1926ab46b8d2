"""The pure parts of the fork and rewind benchmark (``bench/fork.py``, ``bench/run.py --only``, the ``x`` unit)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> dict[str, ModuleType]:
    """bench/'s modules, which import each other as siblings (as ``python bench/run.py`` runs them)."""
    monkeypatch.syspath_prepend(str(BENCH))
    import fork
    import rows
    import run

    return {"fork": fork, "rows": rows, "run": run}


def test_disk_bytes_counts_a_hard_linked_file_once_and_a_copy_twice(
    bench: dict[str, ModuleType], tmp_path: Path
) -> None:
    disk_bytes: Any = bench["fork"].disk_bytes
    source, linked, copied = (tmp_path / name for name in ("source", "linked", "copied"))
    for folder in (source, linked, copied):
        folder.mkdir()
    (source / "blob").write_bytes(os.urandom(1 << 20))
    os.link(source / "blob", linked / "blob")
    (copied / "blob").write_bytes((source / "blob").read_bytes())
    one = disk_bytes([source])
    assert one >= 1 << 20
    assert disk_bytes([source, linked]) == one + os.lstat(linked).st_blocks * 512  # the directory, not the blob
    assert disk_bytes([source, copied]) == 2 * one


def test_disk_bytes_of_a_missing_directory_is_zero(bench: dict[str, ModuleType], tmp_path: Path) -> None:
    assert bench["fork"].disk_bytes([tmp_path / "gone"]) == 0


def test_only_picks_metrics_by_a_word_of_their_name(bench: dict[str, ModuleType]) -> None:
    plan = bench["rows"].metrics(sys.modules["measures"].QUICK)
    chosen = bench["run"].chosen
    assert chosen(plan, []) == plan
    assert [m.name for m in chosen(plan, ["FORK", "rewind", "restore"])] == ["restore", "fork", "rewind"]


def test_only_with_a_word_that_matches_nothing_names_the_metrics(bench: dict[str, ModuleType]) -> None:
    plan = bench["rows"].metrics(sys.modules["measures"].QUICK)
    with pytest.raises(ValueError, match=r"--only forks matches no metric; the metrics are .*'fork'"):
        bench["run"].chosen(plan, ["fork", "forks"])


def test_a_row_in_copies_is_judged_against_its_target_and_has_no_peer_ratio(bench: dict[str, ModuleType]) -> None:
    rows: Any = bench["rows"]
    row = next(r for m in rows.metrics(sys.modules["measures"].QUICK) for r in m.rows if r.key == "fork_copies")
    result = rows.RowResult(row, rows.Side([1.0, 1.02]), rows.Side([9.0]))
    result.judge({})
    assert (result.passed, result.ratio, rows.fmt(1.01, "x"), row.target()) == (True, None, "1.01x", "ours < 1.10x")
    over = rows.RowResult(row, rows.Side([1.5]), rows.Side([9.0]))
    over.judge({})
    assert over.passed is False and over.failures == ["ours 1.50x >= 1.10x"]
