"""Grading one submission's cells: passed, failed, error or stopped, and stdout compared line by line."""

from __future__ import annotations

import pytest

from orchestrator.api.results import ExecError
from orchestrator.evaluation import (
    Status,
)
from orchestrator.evaluation.grading import CellRun, grade, stdout_diff, stdout_matches

_OK = CellRun("ok", stdout="5\n")


def _error(kind: str, message: str = "boom", line: int = 2, snippet: str = "assert add(1, 2) == 3") -> ExecError:
    return ExecError(type=kind, message=message, line=line, snippet=snippet, traceback=f"{kind}: {message}")


def test_grade_passes_when_code_tests_and_stdout_agree() -> None:
    verdict = grade(_OK, CellRun("ok"), "5")
    assert verdict.status is Status.PASSED


def test_an_assertion_in_the_tests_is_a_failure_naming_it() -> None:
    verdict = grade(_OK, CellRun("error", error=_error("AssertionError", "add is wrong")), None)
    assert verdict.status is Status.FAILED and verdict.phase == "tests"
    assert verdict.message == "assertion failed at line 2: assert add(1, 2) == 3 (add is wrong)"


def test_other_exceptions_are_errors_and_memory_errors_oom() -> None:
    assert grade(CellRun("error", error=_error("ZeroDivisionError")), None, None).status is Status.ERROR
    assert grade(CellRun("error", error=_error("AssertionError")), None, None).status is Status.ERROR  # in the code
    assert grade(_OK, CellRun("error", error=_error("KeyError")), None).status is Status.ERROR
    assert grade(CellRun("error", error=_error("MemoryError")), None, None).status is Status.OOM


@pytest.mark.parametrize("ended", ["timeout", "oom", "output_limit", "crashed"])
def test_a_stopped_cell_decides(ended: str) -> None:
    verdict = grade(CellRun(ended, reason="ran too long"), None, "expected")
    assert verdict.status.value == ended and verdict.message == "the code ran too long"
    assert grade(_OK, CellRun(ended, reason="x"), None).phase == "tests"


def test_stdout_is_compared_line_by_line() -> None:
    assert stdout_matches("1\n2\n", "1  \n2\n\n\n")
    assert stdout_matches("a\r\nb", "a\nb\n")
    assert not stdout_matches("1\n2", "1\n3")
    verdict = grade(CellRun("ok", stdout="1\n3\n"), None, "1\n2\n")
    assert verdict.status is Status.FAILED and verdict.diff is not None
    assert "-2" in verdict.diff and "+3" in verdict.diff


def test_a_long_diff_is_cut() -> None:
    diff = stdout_diff("\n".join(map(str, range(500))), "")
    assert len(diff.splitlines()) == 61 and diff.endswith("more diff lines)")
