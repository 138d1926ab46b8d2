"""A controller killed in the middle of ``orchestrator eval`` leaves containers; prune and the next run remove them,
and the results it had written are intact for ``--resume``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator import Orchestrator, Settings
from orchestrator.evaluation import EvalOptions, Status
from orchestrator.state.controllers import CONTROLLER_PID, ROLE

pytestmark = pytest.mark.docker


def _settings_env(settings: Settings) -> dict[str, str]:
    return {
        **os.environ,
        "ORCH_STATE_DIR": str(settings.state_dir),
        "ORCH_RUNTIME_DIR": str(settings.runtime_dir),
        "ORCH_BASE_IMAGE": settings.base_image,
    }


def _wait_for(predicate: object, seconds: float) -> None:
    ends = time.monotonic() + seconds
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < ends, "timed out waiting"
        time.sleep(0.1)


def test_a_killed_run_leaves_nothing_after_prune_and_resumes(orch: Orchestrator, tmp_path: Path) -> None:
    submissions = tmp_path / "subs.jsonl"
    lines = [{"id": "quick", "code": "x = 1"}] + [
        {"id": f"sleeper-{n}", "code": "import time; time.sleep(600)"} for n in range(2)
    ]
    submissions.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "results.jsonl"
    command = [
        sys.executable,
        "-m",
        "orchestrator",
        "eval",
        str(submissions),
        "--out",
        str(out),
        "--jobs",
        "3",
        "-q",
        "--timeout",
        "300",
    ]
    process = subprocess.Popen(command, env=_settings_env(orch.settings), stdout=subprocess.DEVNULL)
    try:
        labels = {ROLE: "eval", CONTROLLER_PID: str(process.pid)}
        _wait_for(lambda: out.exists() and "quick" in out.read_text(), 60)
        assert orch.backend.find(labels), "the sleepers' sandboxes run"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    removed = []
    for _ in range(20):  # a container the engine was still creating at the kill shows up a moment later
        removed += [a for a in orch.prune().actions if a.action == "remove-orphan-container"]
        if not orch.backend.find(labels):
            break
        time.sleep(0.5)
    assert removed and orch.backend.find(labels) == []
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [record["id"] for record in records] == ["quick"]

    seen: list[str] = []
    again = orch.evaluate(
        submissions, out=out, resume=True, options=EvalOptions(timeout=1), on_result=lambda r: seen.append(r.id)
    )
    assert sorted(seen) == ["sleeper-0", "sleeper-1"]
    assert [r.id for r in again.results] == ["quick", "sleeper-0", "sleeper-1"] and again.resumed == 1
    assert {r.status for r in again.results} == {Status.PASSED, Status.TIMEOUT}
