"""The soak of issue 34, small: one hostile session beside ordinary ones costs them no data and the controller
no more than bounded descriptors, threads and memory; the hostile one stays within its quota on disk.

``bench/soak.py`` is the whole soak (7 ordinary sessions, a minute a phase, and the latency verdict, which a test
must not make); this runs its ``run_soak`` with two ordinary sessions and checks every verdict but the timing one.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from orchestrator import Settings

pytestmark = pytest.mark.docker

_BENCH = Path(__file__).resolve().parents[2] / "bench" / "soak.py"
_spec = importlib.util.spec_from_file_location("soak", _BENCH)
assert _spec is not None and _spec.loader is not None
soak = importlib.util.module_from_spec(_spec)
sys.modules["soak"] = soak
_spec.loader.exec_module(soak)

QUOTA = 16 << 20


def test_a_hostile_session_costs_its_neighbours_nothing(settings: Settings, image: str) -> None:
    base, attacked = soak.run_soak(settings, count=2, seconds=40, quota=QUOTA)
    verdicts = soak.verdicts(base, attacked, QUOTA)
    del verdicts["ordinary cells' p99 within 2x"]  # a timing: bench/soak.py's verdict, not a test's
    assert all(verdicts.values()), (verdicts, base, attacked)
    assert set(attacked.hostile_steps) == {name for name, _, _ in soak.HOSTILE_STEPS}, attacked.hostile_steps
    assert attacked.cells and attacked.loads
