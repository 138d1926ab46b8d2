"""The results of a run: the results file (appended, resumed, strict JSON) and the JUnit report."""

from __future__ import annotations

import json
import os
from pathlib import Path
from xml.etree import ElementTree

import pytest

from orchestrator.errors import ConfigError
from orchestrator.evaluation import (
    EvalResult,
    InvalidLine,
    ResultsFile,
    Status,
    write_junit,
)


def _result(key: str, status: Status = Status.PASSED, **fields: object) -> EvalResult:
    return EvalResult(id=key, status=status, message=str(status), durations={"total": 0.5}, **fields)  # type: ignore[arg-type]


def test_results_file_appends_and_resumes(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    results = ResultsFile(path, resume=False)
    results.append(_result("a"))
    results.append(_result("b", Status.INFRA_ERROR))
    assert len(path.read_text().splitlines()) == 2  # on disk before close
    results.close()
    with path.open("a") as handle:
        handle.write('{"id": "c", "stat')  # a crash mid-line
    resumed = ResultsFile(path, resume=True)
    assert resumed.finished() == {"a"}  # an infra error runs again
    assert set(resumed.previous) == {"a", "b"}
    resumed.append(_result("b"))
    resumed.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["id"] for line in lines] == ["a", "b", "b"]
    with ResultsFile(path, resume=True) as again:
        assert again.previous["b"].status is Status.PASSED  # the last record counts


def test_a_new_run_empties_the_file_and_a_foreign_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text('{"id": "a", "status": "passed", "message": ""}\n')
    ResultsFile(path, resume=False).close()  # a run that never began (no image, no engine) leaves it
    assert path.read_text() != ""
    with ResultsFile(path, resume=False) as results:
        results.begin()
        assert path.read_text() == ""
        results.append(_result("b"))
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == ["b"]
    path.write_text("hello\n")
    with pytest.raises(ConfigError, match="line 1 is not a result record"):
        ResultsFile(path, resume=True)


def test_a_record_round_trips() -> None:
    result = _result("x", Status.FAILED, stdout="out", error={"type": "AssertionError"}, limits={"memory": 1})
    assert EvalResult.from_json(json.loads(json.dumps(result.to_json()))) == result


def test_junit_counts_and_sanitizes(tmp_path: Path) -> None:
    path = tmp_path / "report.xml"
    results = [
        _result("ok", stdout="fine"),
        _result("bad", Status.FAILED, diff="-1\n+2"),
        _result("slow", Status.TIMEOUT, stdout="partial \x00 \udcff"),
        _result("nul\x00id", Status.ERROR, error={"traceback": "Traceback ...\x1b[31m"}),
    ]
    write_junit(path, results, [InvalidLine(4, None, "not valid JSON")], name="orchestrator eval", seconds=1.5)
    suite = ElementTree.parse(path).getroot()
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("5", "1", "3")
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    assert cases["bad"].find("failure") is not None and cases["bad"].find("failure").text == "-1\n+2"  # type: ignore[union-attr]
    assert cases["slow"].find("error").get("type") == "timeout"  # type: ignore[union-attr]
    assert "line 4" in cases and cases["line 4"].find("error").get("type") == "invalid_input"  # type: ignore[union-attr]


def test_junit_shows_control_characters_as_escapes(tmp_path: Path) -> None:
    path = tmp_path / "report.xml"
    forged = "\x1b[2K\x1b[1Gok: passed\r\n\x9b31m"
    result = EvalResult(id="x", status=Status.ERROR, message=forged, stdout=forged)
    write_junit(path, [result], [], name="eval", seconds=0)
    raw = path.read_text(encoding="utf-8")
    assert "\x1b" not in raw and "\x9b" not in raw and "\r" not in raw.replace("&#13;", "")
    (case,) = ElementTree.parse(path).getroot().iter("testcase")
    assert case.find("error").get("message") == "\\x1b[2K\\x1b[1Gok: passed\\r\\n\\x9b31m"  # type: ignore[union-attr]
    assert case.find("system-out").text == "\\x1b[2K\\x1b[1Gok: passed\\r\n\\x9b31m"  # type: ignore[union-attr]


def test_the_results_file_holds_strict_json_only(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    with ResultsFile(path, resume=False, fsync=False) as results, pytest.raises(ValueError):
        results.append(EvalResult(id="nan", status=Status.PASSED, message="m", durations={"total": float("nan")}))
    path.write_text('{"id": "a", "status": "passed", "durations": {"total": NaN}}\n')
    with pytest.raises(ConfigError, match="not a result record"):
        ResultsFile(path, resume=True)


def test_a_lone_surrogate_from_a_sandbox_does_not_stop_the_results_file(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    with ResultsFile(path, resume=False, fsync=False) as results:
        results.append(EvalResult(id="s", status=Status.FAILED, message="m", stdout="half \ud800 of a pair"))
    assert json.loads(path.read_text(encoding="utf-8"))["stdout"] == "half ? of a pair"


def test_a_results_file_on_dev_null_is_fine() -> None:
    with ResultsFile(Path(os.devnull), resume=False) as results:
        results.append(_result("x"))
