"""A Swarm task's state read as a container's: a task on its way to running has not ended (no engine)."""

from __future__ import annotations

import pytest

from orchestrator.backends.swarm.backend import _state


def task(state: str, exit_code: int = 0) -> dict[str, object]:
    return {"Status": {"State": state, "ContainerStatus": {"ExitCode": exit_code}}, "DesiredState": "running"}


@pytest.mark.parametrize("state", ["new", "pending", "assigned", "accepted", "preparing", "ready", "starting"])
def test_a_task_that_has_not_run_yet_has_not_ended_though_it_reports_exit_code_0(state: str) -> None:
    found = _state({"ID": "x", "Spec": {"Name": "n"}}, task(state), {})
    assert found.exit_code is None and not found.ended and not found.running


@pytest.mark.parametrize(("state", "code"), [("complete", 0), ("failed", 3), ("shutdown", 143)])
def test_a_task_that_ran_and_stopped_has_ended_with_its_exit_code(state: str, code: int) -> None:
    found = _state({"ID": "x", "Spec": {"Name": "n"}}, task(state, code), {})
    assert found.exit_code == code and found.ended
