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
    ("fields", "message"),
    [
        ({"jobs": 0}, "jobs must be an integer from 1 to 256"),
        ({"jobs": True}, "jobs must be an integer"),
        ({"timeout": 0}, "timeout must be more than 0"),
        ({"timeout": -5}, "timeout: a duration must be a finite number of seconds, not negative"),
        ({"timeout": "2d"}, "timeout must be more than 0 and at most a day, got 2d"),
        ({"timeout": float("inf")}, "timeout: a duration must be a finite"),
        ({"output_limit": 10}, "output_limit must be a size from 1 KiB to 1 GiB"),
        ({"output_limit": "lots"}, "output_limit must be a size from 1 KiB to 1 GiB"),
        ({"memory": "x"}, "memory: 'x' is not a size"),
        ({"memory": "10m"}, "memory must be at least 32 MiB: below it the sandbox's agent cannot start, got 10.0 MiB"),
        ({"memory": 0}, "memory must be at least 32 MiB"),
        ({"pool_size": -1}, "pool_size must be a non-negative integer"),
        ({"strict": "yes"}, "strict must be True or False"),
        ({"runs": 0}, "runs must be an integer from 1 to 100"),
        ({"runs": 101}, "runs must be an integer from 1 to 100"),
        ({"runs": True}, "runs must be an integer"),
    ],
)
def test_options_are_checked(fields: dict[str, object], message: str) -> None:
    """Refused when made, before any sandbox starts, naming the option (``orchestrator eval`` exits 2 at once)."""
    with pytest.raises(ConfigError) as caught:
        EvalOptions(**fields)  # type: ignore[arg-type]
    assert message in str(caught.value)


def test_options_take_durations_and_sizes() -> None:
    options = EvalOptions(timeout="1m30s", memory="512MiB", output_limit="64k")  # type: ignore[arg-type]
    assert (options.timeout, options.memory, options.output_limit) == (90.0, 512 << 20, 64 << 10)
