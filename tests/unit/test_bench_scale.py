"""The pure helpers of bench/scale.py: its steps, summaries and /proc parsers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _scale() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("bench_scale", BENCH / "scale.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


scale = _scale()


def test_steps_run_from_zero_to_the_target_without_repeats() -> None:
    assert scale.steps(500) == [0, 50, 100, 200, 350, 500]
    assert scale.steps(50) == [0, 5, 10, 20, 35, 50]
    assert scale.steps(2) == [0, 1, 2]
    assert scale.steps(0) == [0]


def test_steps_refuse_a_negative_target() -> None:
    with pytest.raises(ValueError, match="0 or more"):
        scale.steps(-1)


def test_summary_of_samples_and_of_none() -> None:
    assert scale.summary([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0}
    assert scale.summary([]) is None


def test_status_field_reads_kilobytes_and_counts() -> None:
    text = "Name:\tpython\nVmRSS:\t  4096 kB\nThreads:\t7\n"
    assert scale.status_field(text, "VmRSS") == 4096 * 1024
    assert scale.status_field(text, "Threads") == 7
    assert scale.status_field(text, "VmSwap") is None


def test_rollup_pss_reads_the_pss_line_only() -> None:
    text = "55d0-7ffd ---p 00000000 00:00 0 [rollup]\nRss:  2048 kB\nPss:  1024 kB\nPss_Anon:  512 kB\n"
    assert scale.rollup_pss(text) == 1024 * 1024
    assert scale.rollup_pss("Rss: 1 kB\n") is None


def test_process_facts_of_this_process_and_of_a_gone_one() -> None:
    facts = scale.process_facts("self")
    assert facts["rss"] > 0 and facts["fds"] > 0 and facts["threads"] >= 1
    assert scale.process_facts(2**31) == {"rss": None, "threads": None, "fds": None}


def test_verdicts_compare_the_last_step_with_the_empty_machine() -> None:
    live = {
        "steps": [
            {"open": 0, "create_s": 0.3, "first_call_s": 0.001},
            {"open": 500, "create_s": 0.5, "first_call_s": 0.003},
        ]
    }
    found = scale.verdicts(live, None)
    assert found["first_call_ratio"]["value"] == pytest.approx(3.0)
    assert found["first_call_ratio"]["met"] is False
    assert found["new_session_ratio"]["value"] == pytest.approx(0.503 / 0.301)
    assert found["new_session_ratio"]["met"] is True
