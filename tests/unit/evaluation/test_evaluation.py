"""The pure parts of ``orchestrator eval``: reading submissions, grading cells, the results file and JUnit."""

from __future__ import annotations

import json
import os
from pathlib import Path
from xml.etree import ElementTree

import pytest
import reply_support

from orchestrator.api.results import ExecError
from orchestrator.config import Settings
from orchestrator.errors import ConfigError
from orchestrator.evaluation import (
    EvalResult,
    InvalidLine,
    ResultsFile,
    Status,
    Submission,
    read_submissions,
    submissions_from,
    write_junit,
)
from orchestrator.evaluation.evaluator import EvalOptions, EvalReport
from orchestrator.evaluation.grading import CellRun, grade, stdout_diff, stdout_matches
from orchestrator.evaluation.runner import HeadRecorder, SubmissionRunner


def _lines(*records: object) -> list[str]:
    return [record if isinstance(record, str) else json.dumps(record) for record in records]


# ---------------------------------------------------------------- submissions


def test_reads_every_field_and_numbers_lines() -> None:
    items = list(
        read_submissions(
            _lines(
                {"id": "a", "code": "x = 1"},
                "",
                {
                    "id": 7,
                    "code": "print(input())",
                    "tests": "assert x",
                    "stdin": "hi\n",
                    "expected_stdout": "hi",
                    "timeout": 2,
                    "memory": "256m",
                    "files": {"data/in.txt": "text"},
                },
            )
        )
    )
    assert [type(item) for item in items] == [Submission, Submission]
    first, second = items
    assert isinstance(first, Submission) and isinstance(second, Submission)
    assert (first.id, first.line, first.tests, first.timeout, first.memory) == ("a", 1, None, None, None)
    assert (second.id, second.line, second.timeout, second.memory) == ("7", 3, 2.0, 256 << 20)
    assert second.files == {"data/in.txt": "text"} and second.stdin == "hi\n"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "a JSON object, not list"),
        (json.dumps({"code": "x"}), "missing 'id'"),
        (json.dumps({"id": "a"}), "missing 'code'"),
        (json.dumps({"id": True, "code": ""}), "'id' must be a string or an integer"),
        (json.dumps({"id": "a", "code": 3}), "'code' must be a string"),
        (json.dumps({"id": "a", "code": "", "timeout": 0}), "'timeout' must be more than 0"),
        (json.dumps({"id": "a", "code": "", "timeout": "5"}), "'timeout' must be a number"),
        (json.dumps({"id": "a", "code": "", "memory": "lots"}), "is not a size"),
        (json.dumps({"id": "a", "code": "", "memory": "1m"}), "at least 32 MiB"),
        (json.dumps({"id": "a", "code": "", "files": {"../x": ""}}), "relative path inside the workspace"),
        (json.dumps({"id": "a", "code": "", "files": {"/etc/x": ""}}), "relative path inside the workspace"),
        (json.dumps({"id": "a", "code": "", "files": {"x": 1}}), "must be a string"),
        (json.dumps({"id": "a", "code": "", "files": ["x"]}), "'files' must be an object"),
        (json.dumps({"id": "a", "code": "", "test": "typo"}), "unknown field(s) test"),
        (json.dumps({"id": "", "code": ""}), "non-empty"),
        (json.dumps({"id": "a\nb", "code": ""}), "printable"),
        ('{"id": "a", "code": "\\ud800"}', "lone surrogate"),
    ],
)
def test_an_invalid_line_says_where_and_what(line: str, expected: str) -> None:
    items = list(read_submissions([json.dumps({"id": "first", "code": ""}), line, json.dumps({"id": "z", "code": ""})]))
    assert [type(item) for item in items] == [Submission, InvalidLine, Submission]
    invalid = items[1]
    assert isinstance(invalid, InvalidLine) and invalid.line == 2
    assert expected in invalid.message, invalid.message
    assert invalid.describe().startswith("line 2")


def test_a_duplicate_id_is_invalid_and_the_first_one_runs() -> None:
    items = list(read_submissions(_lines({"id": "a", "code": "1"}, {"id": "b", "code": ""}, {"id": "a", "code": "2"})))
    assert isinstance(items[0], Submission) and items[0].code == "1"
    duplicate = items[2]
    assert isinstance(duplicate, InvalidLine)
    assert (duplicate.line, duplicate.id) == (3, "a") and "line 1 has it already" in duplicate.message


def test_submissions_from_python_objects() -> None:
    items = list(submissions_from([Submission(id="a", code=""), {"id": "b", "code": ""}, {"code": ""}, 42]))  # type: ignore[list-item]
    assert [type(item).__name__ for item in items] == ["Submission", "Submission", "InvalidLine", "InvalidLine"]
    assert isinstance(items[3], InvalidLine) and items[3].line == 4 and "not int" in items[3].message


def test_a_submission_checks_itself() -> None:
    with pytest.raises(ConfigError, match="'timeout'"):
        Submission(id="a", code="", timeout=-1)


# ---------------------------------------------------------------- grading

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


# ---------------------------------------------------------------- records


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
    ResultsFile(path, resume=False).close()
    assert path.read_text() == ""
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


def test_a_graded_stream_is_kept_in_memory_up_to_its_limit(tmp_path: Path) -> None:
    recorder = HeadRecorder(tmp_path, "stdout", 10)
    for _ in range(1000):
        recorder.write(b"0123456789abc")
    assert recorder.text() == "0123456789" and recorder.received == 13000
    assert not recorder.spilled and list(tmp_path.iterdir()) == []


def test_the_grading_mode_is_a_field_of_its_own() -> None:
    items = list(read_submissions(_lines({"id": "s", "code": "", "grading": "strict"}, {"id": "d", "code": ""})))
    assert [item.grading for item in items if isinstance(item, Submission)] == ["strict", None]
    (bad,) = read_submissions(_lines({"id": "x", "code": "", "grading": "lenient"}))
    assert isinstance(bad, InvalidLine) and "'grading' must be one of 'default', 'strict'" in bad.message
    assert EvalOptions(strict=True).strict and not EvalOptions().strict


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


# ---------------------------------------------------------------- replies that lie (a fake sandbox)


class LyingSandbox:
    """Answers every request with the next crafted reply: what a broken or hostile agent could send."""

    def __init__(self, *replies: dict[str, object]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, object]] = []

    def request(self, header: dict[str, object], **_: object) -> tuple[dict[str, object], bytearray]:
        self.requests.append(header)
        return self.replies.pop(0), bytearray()


def exec_reply(**fields: object) -> dict[str, object]:
    """A well-formed reply to a harness cell (its value: a report that the phase ended ``ok``), ``fields`` changed."""
    return reply_support.exec_reply(**{"return_value": '{"ended": "ok", "reason": "", "error": null}', **fields})


def graded(*replies: dict[str, object], tests: str | None = "assert f()") -> tuple[object, ...]:
    runner = SubmissionRunner(Settings(), output_limit=1 << 20)
    sandbox = LyingSandbox(*replies)
    verdict, code, tests_run = runner.run(sandbox, Submission(id="x", code="f = 1", tests=tests), 5.0)  # type: ignore[arg-type]
    return verdict, code, tests_run, sandbox


def test_the_tests_budget_and_the_durations_are_the_hosts_own() -> None:
    verdict, code, tests_run, sandbox = graded(exec_reply(duration=9e6), exec_reply(duration=9e6))  # in bounds, lies
    assert verdict.status is Status.PASSED  # type: ignore[attr-defined]
    assert 0 <= code.duration < 5 and 0 <= tests_run.duration < 5  # type: ignore[attr-defined]
    budget = sandbox.requests[1]["timeout"]  # type: ignore[attr-defined]
    assert isinstance(budget, float) and 4.0 <= budget <= 5.0 + 1.0, "the tests' budget is not the host's"


@pytest.mark.parametrize(
    "reply",
    [
        exec_reply(duration=10**400),
        exec_reply(duration="soon"),
        exec_reply(return_value=None),
        exec_reply(return_value='{"ended": "passed", "reason": "", "error": null}'),
        exec_reply(return_value='{"ended": "ok", "reason": NaN, "error": null}'),
        exec_reply(return_value='{"ended": "ok", "reason": "", "error": {"ename": "E"}}'),
        exec_reply(status="error", error={"ename": "KeyboardInterrupt", "evalue": "", "snippet": "", "traceback": ""}),
        exec_reply(status="error", error={"ename": 1}),
        exec_reply(checkpoint=None),
        {"type": "exec_reply", "status": "mystery"},
    ],
)
def test_a_reply_that_lies_is_the_submissions_crash_never_a_pass_or_the_runs_error(reply: dict[str, object]) -> None:
    verdict, code, _, _ = graded(reply)
    assert verdict.status is Status.CRASHED, (verdict, code)  # type: ignore[attr-defined]
    assert verdict.phase == "code"  # type: ignore[attr-defined]
