"""The figures of a result: where they come from, how runs combine, the totals and the report's properties."""

from __future__ import annotations

import functools
import io
import json
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from orchestrator.agent import usage
from orchestrator.backends import docker as docker_backend
from orchestrator.backends.base import ContainerUsage
from orchestrator.cli.evaluate import _summary
from orchestrator.cli.output import Output
from orchestrator.errors import EngineError
from orchestrator.evaluation import EvalReport, EvalResult, Status, write_junit
from orchestrator.evaluation.accounting import (
    combine_runs,
    cpu_seconds,
    read_usage,
    slowest,
    totals,
)
from orchestrator.wire.replies import is_signal_name


def _result(key: str, status: Status = Status.PASSED, **fields: Any) -> EvalResult:
    return EvalResult(id=key, status=status, message=str(status), **fields)


@pytest.mark.parametrize("name", ["SIGSEGV", "SIGKILL", "SIG40"])
def test_a_signal_name_is_one(name: str) -> None:
    assert is_signal_name(name)


@pytest.mark.parametrize("name", [None, 11, "", "SEGV", "sigsegv", "SIGSEGV\n", "SIG\x1b[2J", "SIG" + "X" * 13])
def test_anything_else_is_not(name: object) -> None:
    assert not is_signal_name(name)


def test_cpu_seconds_is_the_difference_of_two_readings_or_nothing() -> None:
    before, after = (
        ContainerUsage(cpu_ns=500_000_000, peak_memory=1),
        ContainerUsage(cpu_ns=1_750_000_000, peak_memory=2),
    )
    assert cpu_seconds(before, after) == 1.25
    assert cpu_seconds(None, after) is None and cpu_seconds(before, None) is None
    assert cpu_seconds(ContainerUsage(None, 1), after) is None
    assert cpu_seconds(after, before) is None  # a counter that went back is not a figure


class _Refusing:
    def usage(self, container_id: str) -> ContainerUsage | None:
        raise EngineError("the engine refused")


def test_an_engine_that_cannot_tell_gives_no_figure_and_stops_nothing() -> None:
    assert read_usage(_Refusing(), "c" * 64) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("stats", "cpu", "peak"),
    [
        ({"cpu_stats": {"cpu_usage": {"total_usage": 5}}, "memory_stats": {"max_usage": 7}}, 5, 7),
        ({"cpu_stats": {"cpu_usage": {"total_usage": -1}}, "memory_stats": {"max_usage": 1 << 63}}, None, None),
        ({"cpu_stats": {"cpu_usage": {"total_usage": 1.5}}, "memory_stats": {"max_usage": True}}, None, None),
        ({"cpu_stats": {"cpu_usage": "x"}, "memory_stats": []}, None, None),
        ({}, None, None),
    ],
)
def test_the_engines_counters_are_checked(stats: dict[str, Any], cpu: int | None, peak: int | None) -> None:
    assert docker_backend._counter(stats, "cpu_stats", "cpu_usage", "total_usage") == cpu
    assert docker_backend._counter(stats, "memory_stats", "max_usage") == peak


def test_runs_that_agree_are_not_flaky() -> None:
    runs = [_result("a", cpu_seconds=1.0), _result("a", cpu_seconds=2.0)]
    combined = combine_runs(runs)
    assert not combined.flaky and combined.passed and combined.cpu_seconds == 1.0
    assert [run["cpu_seconds"] for run in combined.runs] == [1.0, 2.0]


def test_runs_that_differ_are_flaky_and_never_passed() -> None:
    runs = [
        _result("a"),
        _result("a", Status.FAILED, signal=None),
        _result("a", Status.CRASHED, signal="SIGSEGV"),
    ]
    combined = combine_runs(runs)
    assert combined.flaky and combined.status is Status.FAILED  # the first run that did not pass decides
    assert [run["status"] for run in combined.runs] == ["passed", "failed", "crashed"]
    assert combined.runs[2]["signal"] == "SIGSEGV"


def test_an_infrastructure_error_in_any_run_is_the_record_and_not_flaky() -> None:
    combined = combine_runs([_result("a"), _result("a", Status.INFRA_ERROR)])
    assert combined.status is Status.INFRA_ERROR and not combined.flaky  # it runs again on --resume


def test_totals_cover_every_run_and_survive_old_or_edited_records() -> None:
    flaky = combine_runs(
        [_result("f", cpu_seconds=1.0, wall_seconds=2.0, peak_memory=100), _result("f", Status.FAILED)]
    )
    old = EvalResult.from_json(
        {"id": "old", "status": "passed", "message": "passed"}
    )  # a record of a version without figures
    edited = EvalResult.from_json(
        {
            "id": "e",
            "status": "passed",
            "message": "",
            "cpu_seconds": "x",
            "peak_memory": -1,
            "runs": [1],
            "flaky": "yes",
        }
    )
    assert (edited.cpu_seconds, edited.peak_memory, edited.runs, edited.flaky) == (None, None, [], False)
    got = totals([flaky, old, edited, _result("p", cpu_seconds=0.5, wall_seconds=1.0, peak_memory=300)])
    assert (got.runs, got.measured, got.flaky, got.peak_memory) == (5, 2, 1, 300)
    assert got.cpu_seconds == 1.5 and got.wall_seconds == 3.0


def test_the_slowest_are_by_wall_seconds() -> None:
    results = [_result(str(n), wall_seconds=float(n)) for n in range(8)] + [_result("untimed")]
    assert [result.id for result in slowest(results)] == ["7", "6", "5", "4", "3"]


def test_junit_has_the_figures_as_properties(tmp_path: Path) -> None:
    crashed = _result("c", Status.CRASHED, cpu_seconds=0.25, wall_seconds=0.5, peak_memory=1 << 20, signal="SIGSEGV")
    flaky = combine_runs([_result("f"), _result("f", Status.FAILED)])
    path = tmp_path / "report.xml"
    write_junit(path, [crashed, flaky, _result("p")], [], name="eval", seconds=1.0, properties={"total_runs": "4"})
    suite = ElementTree.parse(path).getroot()
    assert [(p.get("name"), p.get("value")) for p in suite.findall("properties/property")] == [("total_runs", "4")]
    cases = {case.get("name"): case for case in suite.findall("testcase")}
    assert cases["c"][0].tag == "properties"  # before failure and output, as the schema orders them
    props = {name: {p.get("name"): p.get("value") for p in case.iter("property")} for name, case in cases.items()}
    assert props["c"] == {
        "cpu_seconds": "0.250",
        "wall_seconds": "0.500",
        "peak_memory": "1048576",
        "signal": "SIGSEGV",
        "status": "crashed",
    }
    assert props["f"] == {"status": "failed", "runs": "2", "verdicts": "passed,failed", "flaky": "true"}
    assert props["p"] == {"status": "passed"}  # a figure not known is left out


def _report() -> EvalReport:
    return EvalReport(
        results=[
            combine_runs(
                [
                    _result("coin", cpu_seconds=0.5, wall_seconds=1.0, peak_memory=20 << 20),
                    _result("coin", Status.FAILED, cpu_seconds=0.5, wall_seconds=3.0, peak_memory=30 << 20),
                ]
            ),
            _result("[bold]slow\x1b[2J", cpu_seconds=2.0, wall_seconds=2.0, peak_memory=10 << 20),
        ],
        seconds=4.0,
        image="img",
    )


def test_the_summary_shows_totals_flaky_and_the_slowest() -> None:
    stdout, stderr = io.StringIO(), io.StringIO()
    _summary(Output(stdout, stderr), _report())
    text = stdout.getvalue()
    assert "flaky" in text and "slowest" in text, text
    assert "3 runs: CPU 3.00 s, wall 6.00 s, largest peak memory 30.0 MiB" in text, text
    assert "[bold]slow\\x1b[2J" in text, text  # a sandbox-made id is shown as text, never markup or escapes
    rows = [line.split() for line in text.splitlines()]
    assert rows.index(["coin", "failed", "3.00", "s", "0.50", "s", "30.0", "MiB"]) < rows.index(
        ["[bold]slow\\x1b[2J", "passed", "2.00", "s", "2.00", "s", "10.0", "MiB"]
    ), text


def test_the_json_summary_has_totals_and_the_slowest() -> None:
    stdout = io.StringIO()
    _summary(Output(stdout, io.StringIO(), json_mode=True), _report())
    summary = json.loads(stdout.getvalue())
    assert summary["flaky"] == 1
    assert summary["totals"] == {
        "runs": 3,
        "cpu_seconds": 3.0,
        "wall_seconds": 6.0,
        "peak_memory": 30 << 20,
        "measured": 3,
        "flaky": 1,
    }
    assert [entry["id"] for entry in summary["slowest"]] == ["coin", "[bold]slow\x1b[2J"]


class _Api:
    def __init__(self, stats: Any) -> None:
        self.stats_given = stats
        self.asked = 0

    def stats(self, container_id: str, **options: Any) -> Any:
        self.asked += 1
        assert options == {"stream": False, "one_shot": True}
        return self.stats_given


class _Client:
    def __init__(self, stats: Any) -> None:
        self.api = _Api(stats)

    def ping(self) -> bool:
        return True


LOCAL, REMOTE = "c1" * 32, "e2" * 32


def _backend(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, stats: Any) -> docker_backend.DockerBackend:
    monkeypatch.setattr(docker_backend, "cpu_and_peak", functools.partial(usage.cpu_and_peak, root=str(tmp_path)))
    return docker_backend.DockerBackend(_Client(stats))  # type: ignore[arg-type]


def test_the_cgroup_on_this_host_is_read_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    backend = _backend(monkeypatch, tmp_path, {})
    (tmp_path / "cpuacct" / "docker" / LOCAL).mkdir(parents=True)
    (tmp_path / "cpuacct" / "docker" / LOCAL / "cpuacct.usage").write_text("1500000000\n")
    (tmp_path / "memory" / "docker" / LOCAL).mkdir(parents=True)
    (tmp_path / "memory" / "docker" / LOCAL / "memory.max_usage_in_bytes").write_text("20971520\n")
    assert backend.usage(LOCAL) == ContainerUsage(cpu_ns=1_500_000_000, peak_memory=20 << 20)
    assert backend.client.api.asked == 0  # type: ignore[attr-defined]


def test_else_the_engines_stats_checked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    stats = {"cpu_stats": {"cpu_usage": {"total_usage": 9}}, "memory_stats": {"max_usage": 11}}
    assert _backend(monkeypatch, tmp_path, stats).usage(REMOTE) == ContainerUsage(9, 11)
    assert _backend(monkeypatch, tmp_path, {"cpu_stats": {}, "memory_stats": {}}).usage(REMOTE) is None
    assert _backend(monkeypatch, tmp_path, "not a dict").usage(REMOTE) is None
