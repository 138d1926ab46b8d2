"""A run's options are checked, and its report's exit code says how it went."""

from __future__ import annotations

import pytest

from orchestrator.errors import ConfigError
from orchestrator.evaluation import (
    EvalResult,
    InvalidLine,
    Status,
)
from orchestrator.evaluation.evaluator import EvalOptions, EvalReport


def _result(key: str, status: Status = Status.PASSED) -> EvalResult:
    return EvalResult(id=key, status=status, message=str(status))


def test_exit_codes() -> None:
    assert EvalReport(results=[_result("a")]).exit_code == 0
    assert EvalReport(results=[_result("a"), _result("b", Status.TIMEOUT)]).exit_code == 1
    assert EvalReport(results=[_result("a")], invalid=[InvalidLine(1, None, "x")]).exit_code == 1
    assert EvalReport(results=[_result("b", Status.FAILED), _result("c", Status.INFRA_ERROR)]).exit_code == 2


@pytest.mark.parametrize(
    "fields",
    [
        {"jobs": 0},
        {"jobs": True},
        {"timeout": 0},
        {"output_limit": 10},
        {"memory": "x"},
        {"pool_size": -1},
        {"strict": "yes"},
    ],
)
def test_options_are_checked(fields: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        EvalOptions(**fields)  # type: ignore[arg-type]
