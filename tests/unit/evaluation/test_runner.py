"""Running one submission on a sandbox: the graded output kept in memory, replies that lie (a fake sandbox), and the
harness's report as the host reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import reply_support

from orchestrator.config import Settings
from orchestrator.errors import ProtocolError
from orchestrator.evaluation import (
    Status,
    Submission,
)
from orchestrator.evaluation.runner import HeadRecorder, SubmissionRunner, harness_report


def test_a_graded_stream_is_kept_in_memory_up_to_its_limit(tmp_path: Path) -> None:
    recorder = HeadRecorder(tmp_path, "stdout", 10)
    for _ in range(1000):
        recorder.write(b"0123456789abc")
    assert recorder.text() == "0123456789" and recorder.received == 13000
    assert not recorder.spilled and list(tmp_path.iterdir()) == []


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


# -- the harness's report, as the host reads it


def report(**fields: object) -> str:
    return json.dumps({"ended": "ok", "reason": "", "error": None, **fields})


def test_a_report_is_read_field_by_field() -> None:
    assert harness_report(report()) == ("ok", "", None, None)
    error = {"ename": "ValueError", "evalue": "v", "snippet": "s", "traceback": "t", "line": 3, "column": -1}
    ended, _, parsed, _ = harness_report(report(ended="error", error=error))
    assert ended == "error" and parsed is not None and parsed.line == 3 and parsed.column is None
    assert harness_report(report(ended="crashed", signal="SIGSEGV"))[3] == "SIGSEGV"
    assert harness_report(report(ended="oom", signal="SIGKILL"))[3] == "SIGKILL"
    assert harness_report(report(ended="crashed", signal=None))[3] is None


@pytest.mark.parametrize(
    "value",
    [
        None,
        "not json",
        '{"ended": "ok", "reason": "", "error": null, "x": NaN}',
        '{"ended": "ok", "reason": "", "error": null, "x": Infinity}',
        json.dumps([]),
        report(ended="passed"),
        report(reason=1),
        report(ended="error"),
        report(error={"ename": "E", "evalue": "", "snippet": "", "traceback": ""}),
        report(ended="error", error={"ename": 1}),
        report(ended="error", error={"ename": "", "evalue": "", "snippet": "", "traceback": ""}),
        report(signal="SIGSEGV"),  # a signal for a phase that ended well
        report(ended="crashed", signal="segfault"),
        report(ended="crashed", signal="SIGSEGV\x1b[2J"),
        report(ended="crashed", signal=11),
        report(ended="crashed", signal="SIG" + "X" * 100),
        "[" * 100000,
        report(reason="x" * (1 << 18)),
    ],
)
def test_anything_else_is_a_protocol_error(value: str | None) -> None:
    with pytest.raises(ProtocolError):
        harness_report(value)
