"""Eval accounting against the real engine: the figures of known workloads, the signal that ended a run, --runs.

One module-scoped evaluation grades workloads whose cost is known: a busy loop of about a second of CPU, a
sleep of a second (wall, no CPU), 200 MiB allocated and touched, a SIGSEGV, a kill of the grading harness, an
out-of-memory kill, and hostile submissions that print fake figures and try to reset the cgroup's counters or
signal the supervisor. The figures are measurements: the ranges are wide (they check the source, not our speed).
A coin flip graded 16 times through the CLI is flaky (both verdicts turn up but once in 2**15 runs of this test).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from support import cli_env

from orchestrator import Orchestrator, Settings
from orchestrator.evaluation import EvalOptions, EvalReport, EvalResult, Status

pytestmark = pytest.mark.docker

MIB = 1 << 20
TOUCH_200_MIB = "block = bytearray(200 * 2**20)\nblock[::4096] = b'x' * len(block[::4096])\n"
BUSY_1_S = "import time\nstarted = time.process_time()\nwhile time.process_time() - started < 1.0:\n    pass\n"
FAKE_FIGURES = "print({'cpu_seconds': 0, 'wall_seconds': 0, 'peak_memory': 0, 'signal': 'SIGSEGV'})\n"
RESET_COUNTERS = """
import os, signal
written = []
for path in ('/sys/fs/cgroup/memory/memory.max_usage_in_bytes', '/sys/fs/cgroup/memory.peak',
             '/sys/fs/cgroup/memory/memory.usage_in_bytes', '/sys/fs/cgroup/cpuacct/cpuacct.usage',
             '/sys/fs/cgroup/cpu.stat'):
    try:
        with open(path, 'w') as handle:
            handle.write('0')
        written.append(path)
    except OSError:
        pass
for target in (1,):  # the supervisor (another uid)
    try:
        os.kill(target, signal.SIGSTOP)
        written.append(f'stopped {target}')
    except OSError:
        pass
print('WRITTEN', written)
"""

WORKLOADS: list[dict[str, Any]] = [
    {"id": "trivial", "code": "x = 1", "tests": "assert x == 1"},
    {"id": "busy", "code": BUSY_1_S},
    {"id": "sleeps", "code": "import time\ntime.sleep(1.0)"},
    {"id": "200mib", "code": TOUCH_200_MIB, "memory": "512m"},
    {"id": "segv", "code": "import ctypes\nctypes.string_at(0)"},
    {"id": "segv-self", "code": "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)"},
    {"id": "kills-harness", "code": "import os, signal, time\nos.kill(os.getppid(), signal.SIGKILL)\ntime.sleep(5)"},
    {"id": "oom", "code": TOUCH_200_MIB, "memory": "64m"},
    {"id": "spins", "code": "while True:\n    pass", "timeout": 2},
    {"id": "raises", "code": "raise ValueError('no')"},
    {"id": "fakes-figures", "code": BUSY_1_S + FAKE_FIGURES},
    {"id": "resets-counters", "code": TOUCH_200_MIB + "del block\n" + RESET_COUNTERS + FAKE_FIGURES, "memory": "512m"},
]


class Figures:
    def __init__(self, report: EvalReport, out: Path, junit: Path) -> None:
        self.report = report
        self.out = out
        self.junit = junit

    def __getitem__(self, key: str) -> EvalResult:
        (found,) = [result for result in self.report.results if result.id == key]
        return found


@pytest.fixture(scope="module")
def figures(orch: Orchestrator, tmp_path_factory: pytest.TempPathFactory) -> Figures:
    folder = tmp_path_factory.mktemp("eval-figures")
    out, junit = folder / "results.jsonl", folder / "report.xml"
    report = orch.evaluate(WORKLOADS, out=out, junit=junit, options=EvalOptions(jobs=2, timeout=20))
    return Figures(report, out, junit)


def test_every_workload_has_its_outcome(figures: Figures) -> None:
    statuses = {result.id: result.status for result in figures.report.results}
    assert statuses == {
        "trivial": Status.PASSED,
        "busy": Status.PASSED,
        "sleeps": Status.PASSED,
        "200mib": Status.PASSED,
        "segv": Status.CRASHED,
        "segv-self": Status.CRASHED,
        "kills-harness": Status.CRASHED,
        "oom": Status.OOM,
        "spins": Status.TIMEOUT,
        "raises": Status.ERROR,
        "fakes-figures": Status.PASSED,
        "resets-counters": Status.PASSED,
    }, [(r.id, r.message) for r in figures.report.results]


def test_a_busy_second_is_about_a_second_of_cpu(figures: Figures) -> None:
    busy, trivial = figures["busy"], figures["trivial"]
    assert busy.cpu_seconds is not None and 0.9 <= busy.cpu_seconds <= 3.0, busy.cpu_seconds
    assert trivial.cpu_seconds is not None and trivial.cpu_seconds < 0.5, trivial.cpu_seconds
    assert busy.wall_seconds is not None and busy.wall_seconds >= 0.9


def test_a_sleeping_second_is_wall_time_not_cpu(figures: Figures) -> None:
    sleeps = figures["sleeps"]
    assert sleeps.wall_seconds is not None and sleeps.wall_seconds >= 1.0, sleeps.wall_seconds
    assert sleeps.cpu_seconds is not None and sleeps.cpu_seconds < 0.5, sleeps.cpu_seconds


def test_200_mib_touched_is_a_peak_of_at_least_200_mib(figures: Figures) -> None:
    allocated, trivial = figures["200mib"].peak_memory, figures["trivial"].peak_memory
    assert allocated is not None and allocated >= 200 * MIB, allocated
    assert trivial is not None and 0 < trivial < 100 * MIB, trivial  # the idle agent's share of any peak


def test_a_segfault_is_crashed_by_sigsegv(figures: Figures) -> None:
    for key in ("segv", "segv-self"):
        result = figures[key]
        assert result.signal == "SIGSEGV", (key, result.signal, result.message)
        assert "SIGSEGV" in result.message
        assert result.cpu_seconds is not None and result.peak_memory is not None


def test_a_killed_harness_is_the_signal_its_supervisor_saw(figures: Figures) -> None:
    result = figures["kills-harness"]
    assert result.signal == "SIGKILL", result.message


def test_an_out_of_memory_kill_is_oom_by_sigkill(figures: Figures) -> None:
    result = figures["oom"]
    assert result.signal == "SIGKILL", result.message
    assert result.peak_memory is not None and 32 * MIB <= result.peak_memory <= 64 * MIB, result.peak_memory


def test_no_signal_where_none_ended_the_submission(figures: Figures) -> None:
    for key in ("trivial", "busy", "raises", "spins", "fakes-figures"):
        assert figures[key].signal is None, key  # the harness's own kill at the timeout is not the submission's


def test_what_a_submission_prints_is_not_its_figures(figures: Figures) -> None:
    liar = figures["fakes-figures"]
    assert "'cpu_seconds': 0" in liar.stdout
    assert liar.cpu_seconds is not None and liar.cpu_seconds >= 0.9, liar.cpu_seconds
    assert liar.peak_memory is not None and liar.peak_memory > 0 and liar.signal is None


def test_a_submission_cannot_reset_its_counters_or_stop_its_supervisor(figures: Figures) -> None:
    hostile = figures["resets-counters"]
    assert "WRITTEN []" in hostile.stdout, hostile.stdout  # every write and signal was refused by the kernel
    assert hostile.peak_memory is not None and hostile.peak_memory >= 200 * MIB, hostile.peak_memory
    assert hostile.signal is None


def test_the_results_file_and_junit_carry_the_figures(figures: Figures) -> None:
    records = {record["id"]: record for record in map(json.loads, figures.out.read_text().splitlines())}
    busy = records["busy"]
    assert busy["cpu_seconds"] == figures["busy"].cpu_seconds and busy["peak_memory"] > 0
    assert busy["flaky"] is False and busy["runs"] == [] and records["segv"]["signal"] == "SIGSEGV"
    suite = ElementTree.parse(figures.junit).getroot()
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    properties = {p.get("name"): p.get("value") for p in cases["segv"].iter("property")}
    assert properties["signal"] == "SIGSEGV" and properties["status"] == "crashed"
    assert float(properties["cpu_seconds"]) >= 0 and int(properties["peak_memory"]) > 0
    assert float(properties["wall_seconds"]) > 0
    holder = suite.find("properties")
    assert holder is not None
    totals = {p.get("name"): p.get("value") for p in holder}
    assert totals["total_runs"] == str(len(WORKLOADS)) and float(totals["total_cpu_seconds"]) >= 2.0


def run_cli(store: Settings, *argv: str, stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *argv],
        input=stdin,
        capture_output=True,
        text=True,
        env=cli_env(store),
        timeout=300,
        check=False,
    )


def test_a_coin_flip_graded_16_times_is_flaky(settings_for: Callable[..., Settings], tmp_path: Path) -> None:
    coin = {"id": "coin", "code": "import os", "tests": "assert os.urandom(1)[0] < 128, 'tails'"}
    out, junit = tmp_path / "out.jsonl", tmp_path / "junit.xml"
    done = run_cli(
        settings_for(),
        *("eval", "-", "--out", str(out), "--junit", str(junit), "--runs", "16", "--jobs", "2"),
        stdin=json.dumps(coin) + "\n",
    )
    assert done.returncode == 1, done.stderr  # a flaky submission never counts as passed
    (record,) = map(json.loads, out.read_text().splitlines())
    verdicts = [run["status"] for run in record["runs"]]
    assert len(verdicts) == 16 and set(verdicts) == {"passed", "failed"}, verdicts
    assert record["flaky"] is True and record["status"] == "failed" and "tails" in record["message"]
    assert all(run["cpu_seconds"] is not None and run["wall_seconds"] > 0 for run in record["runs"])
    assert len({run["sandbox_id"] for run in record["runs"]}) == 16  # a fresh sandbox each run
    properties = {p.get("name"): p.get("value") for p in ElementTree.parse(junit).getroot().iter("property")}
    assert properties["flaky"] == "true" and properties["runs"] == "16"
    assert sorted(properties["verdicts"].split(",")) == sorted(verdicts)
    summary = {line.split()[0]: line.split()[-1] for line in done.stdout.splitlines() if line.split()}
    assert summary["flaky"] == "1" and summary["failed"] == "1", done.stdout
    assert "16 runs: CPU" in done.stdout and "slowest" in done.stdout, done.stdout
    passes = verdicts.count("passed")
    assert f"coin: failed (flaky: passed {passes} of 16 runs): assertion failed" in done.stderr, done.stderr
