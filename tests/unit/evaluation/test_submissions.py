"""Reading submissions: JSON lines or Python objects, each field checked, invalid lines reported where they are."""

from __future__ import annotations

import json

import pytest

from orchestrator.errors import ConfigError
from orchestrator.evaluation import (
    InvalidLine,
    Submission,
    read_submissions,
    submissions_from,
)
from orchestrator.evaluation.evaluator import EvalOptions


def _lines(*records: object) -> list[str]:
    return [record if isinstance(record, str) else json.dumps(record) for record in records]


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


def test_a_submission_takes_durations_and_sizes_as_everywhere_else() -> None:
    """The same grammar as the CLI's flags and the ORCH_* variables (units.py)."""
    (submission,) = read_submissions([json.dumps({"id": "a", "code": "", "timeout": "1m30s", "memory": "1.5g"})])
    assert isinstance(submission, Submission)
    assert (submission.timeout, submission.memory) == (90.0, 3 << 29)
    assert Submission(id="b", code="", timeout="90s", memory="512MiB").memory == 512 << 20  # type: ignore[arg-type]


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
        (json.dumps({"id": "a", "code": "", "timeout": "soon"}), "'timeout': 'soon' is not a duration"),
        (json.dumps({"id": "a", "code": "", "timeout": [5]}), "'timeout' must be a number of seconds or a duration"),
        (json.dumps({"id": "a", "code": "", "timeout": "2d"}), "at most a day, got 2d"),
        (json.dumps({"id": "a", "code": "", "memory": 1.5}), "'memory' must be a size"),
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


def test_the_grading_mode_is_a_field_of_its_own() -> None:
    items = list(read_submissions(_lines({"id": "s", "code": "", "grading": "strict"}, {"id": "d", "code": ""})))
    assert [item.grading for item in items if isinstance(item, Submission)] == ["strict", None]
    (bad,) = read_submissions(_lines({"id": "x", "code": "", "grading": "lenient"}))
    assert isinstance(bad, InvalidLine) and "'grading' must be one of 'default', 'strict'" in bad.message
    assert EvalOptions(strict=True).strict and not EvalOptions().strict
