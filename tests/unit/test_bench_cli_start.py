"""The pure part of ``bench/cli_start.py``: the table and the verdict on issue 38's target (no timing is asserted)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_report_measures_against_the_interpreter_and_docker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import cli_start

    samples = {
        "python -c pass": [0.05, 0.06, 0.07],
        "orchestrator --version": [0.10, 0.12, 0.30],
        "orchestrator ls (empty store)": [0.2, 0.2, 0.2],
        "docker version": [0.03, 0.03, 0.03],
    }
    lines = cli_start.report(samples)
    version = next(line for line in lines if line.startswith("orchestrator --version"))
    assert version.split()[2:] == ["120", "100-300", "60", "2.00x", "4.00x"]
    assert lines[-1] == "target: --version within 150 ms of python -c pass: 60 ms, PASS"
    samples["orchestrator --version"] = [0.5]
    assert cli_start.report(samples)[-1].endswith(": 440 ms, MISSED")
    del samples["docker version"]
    assert cli_start.report(samples)[1].endswith("1.00x         -")
    assert set(cli_start.commands(None)) == set(samples) and "docker version" in cli_start.commands("/bin/docker")
    assert sys.executable in cli_start.commands(None)["python -c pass"]
