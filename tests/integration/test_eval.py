"""``orchestrator eval`` end to end against the real engine: ``Orchestrator.evaluate`` and the CLI.

One module-scoped evaluation grades a submission for every outcome (passed, failed by an
assertion and by a stdout mismatch, error, timeout, oom, output_limit, crashed) plus stdin,
files and per-submission limits; most tests assert on its report, its results file and its
JUnit report. The others cover resuming (new ids only, a torn last line repaired), invalid
input lines, the CLI's summary and exit statuses (0 / 1 / 2), a CLI run killed with SIGKILL
and what the runs after it clean up, and inputs at the size limits of the submission format.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import docker
import pytest
from support import cli_env

from orchestrator import Orchestrator, Settings
from orchestrator.evaluation import EvalOptions, EvalReport, EvalResult, Status

pytestmark = pytest.mark.docker

OUTPUT_LIMIT = 64 << 10
HUNDRED_MB = "block = bytearray(100 * 2**20)\nblock[::4096] = b'x' * len(block[::4096])\nprint('allocated', len(block))"

HELPER = "def double(n):\n    return n * 2\n"
OUTCOMES: list[dict[str, Any]] = [
    {
        "id": "passed",
        "code": "def add(a, b):\n    return a + b\nprint(add(1, 2))",
        "tests": "assert add(2, 2) == 4\nassert add(-1, 1) == 0",
        "expected_stdout": "3\n",
    },
    {
        "id": "failed-assert",
        "code": "def add(a, b):\n    return a - b",
        "tests": "assert add(0, 0) == 0\nassert add(2, 2) == 4, 'two and two'\n",
    },
    {
        "id": "failed-stdout",
        "code": "for word in ('alpha', 'beta', 'gamma'):\n    print(word)",
        "expected_stdout": "alpha\nBETA\ngamma\n",
    },
    {
        "id": "error",
        "code": (
            "def ratio(a, b):\n    return a / b\n\n"
            "def mean(xs):\n    return ratio(sum(xs), len(xs))\n\n"
            "print('computing')\nmean([])"
        ),
    },
    {"id": "error-in-tests", "code": "x = 1", "tests": "assert undefined_name == x"},
    {
        "id": "timeout",
        "code": "import time\nprint('partial line', flush=True)\ntime.sleep(0.3)\nwhile True:\n    pass",
        "timeout": 1.5,
    },
    {"id": "100mb-in-64m", "code": HUNDRED_MB, "memory": "64m"},
    {"id": "100mb-default", "code": HUNDRED_MB},
    {"id": "output-limit", "code": "while True:\n    print('z' * 999)"},
    {"id": "crashed", "code": "import os\nos.kill(os.getpid(), 9)"},
    {
        "id": "stdin",
        "code": (
            "name = input()\nage = int(input('age? '))\nimport sys\nrest = sys.stdin.read()\n"
            "print(name, 'is', age)\nprint(rest.split())"
        ),
        "stdin": "ada\n36\nx y\nz\n",
    },
    {
        "id": "files",
        "code": (
            "import json, os\n"
            "import helper\n"  # a module it placed: the workspace is on the submission's import path
            "config = json.load(open('conf/deep/settings.json'))\n"
            "print(helper.double(config['n']), open('notes.txt').read().strip(), os.getcwd())"
        ),
        "files": {"conf/deep/settings.json": '{"n": 21}', "notes.txt": "hello\n", "helper.py": HELPER},
        "tests": (
            "import os\nimport helper\nassert sorted(os.listdir('conf')) == ['deep']\n"
            "assert os.path.isfile('notes.txt') and helper.double(2) == 4"
        ),
    },
]

EXPECTED = {
    "passed": Status.PASSED,
    "failed-assert": Status.FAILED,
    "failed-stdout": Status.FAILED,
    "error": Status.ERROR,
    "error-in-tests": Status.ERROR,
    "timeout": Status.TIMEOUT,
    "100mb-in-64m": Status.OOM,
    "100mb-default": Status.PASSED,
    "output-limit": Status.OUTPUT_LIMIT,
    "crashed": Status.CRASHED,
    "stdin": Status.PASSED,
    "files": Status.PASSED,
}


def complete_records(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a results file, parsed (a line being written now is left out)."""
    return [json.loads(line) for line in path.read_bytes().split(b"\n")[:-1] if line.strip()]


@dataclass
class Run:
    report: EvalReport
    out: Path
    junit: Path
    in_file_when_reported: dict[str, bool] = field(default_factory=dict)
    reported: list[str] = field(default_factory=list)
    callback_errors: list[BaseException] = field(default_factory=list)

    def result(self, key: str) -> EvalResult:
        (found,) = [r for r in self.report.results if r.id == key]
        return found


@pytest.fixture(scope="module")
def outcomes(orch: Orchestrator, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One evaluation of every outcome case, jobs=2, with a results file and a JUnit report."""
    folder = tmp_path_factory.mktemp("eval-outcomes")
    out, junit = folder / "results.jsonl", folder / "report.xml"
    run = Run(report=EvalReport(), out=out, junit=junit)
    lock = threading.Lock()

    def on_result(result: EvalResult) -> None:
        try:
            ids = [record["id"] for record in complete_records(out)]
            with lock:
                run.reported.append(result.id)
                run.in_file_when_reported[result.id] = result.id in ids
        except BaseException as exc:  # a raising callback would stop the run: keep it for the test
            run.callback_errors.append(exc)

    run.report = orch.evaluate(
        OUTCOMES,
        out=out,
        junit=junit,
        on_result=on_result,
        options=EvalOptions(jobs=2, timeout=10, output_limit=OUTPUT_LIMIT),
    )
    return run


def test_every_outcome(outcomes: Run, orch: Orchestrator) -> None:
    report = outcomes.report
    assert [r.id for r in report.results] == [s["id"] for s in OUTCOMES], "results come in input order"
    assert {r.id: r.status for r in report.results} == EXPECTED, {r.id: r.message for r in report.results}
    assert report.invalid == [] and report.resumed == 0
    assert report.image == orch.default_image
    assert {(r.image, r.image_id) for r in report.results} == {
        (orch.default_image, orch.backend.image_id(report.image))
    }
    assert report.exit_code == 1
    assert [r.line for r in report.results] == list(range(1, len(OUTCOMES) + 1))


def test_passed_runs_code_tests_and_compares_stdout(outcomes: Run) -> None:
    result = outcomes.result("passed")
    assert result.passed and result.stdout == "3\n" and result.error is None and result.diff is None
    assert set(result.durations) >= {"total", "sandbox", "code", "tests"}


def test_a_failed_assertion_names_its_line(outcomes: Run) -> None:
    result = outcomes.result("failed-assert")
    assert result.phase == "tests"
    assert "line 2" in result.message and "assert add(2, 2) == 4" in result.message, result.message
    assert "two and two" in result.message, result.message
    assert result.error is not None and result.error["type"] == "AssertionError" and result.error["line"] == 2


def test_a_stdout_mismatch_has_a_diff(outcomes: Run) -> None:
    result = outcomes.result("failed-stdout")
    assert result.phase == "code" and result.stdout == "alpha\nbeta\ngamma\n"
    assert result.diff is not None
    assert "-BETA" in result.diff.splitlines() and "+beta" in result.diff.splitlines(), result.diff
    assert result.error is None


def test_an_error_has_the_traceback_of_the_users_frames(outcomes: Run) -> None:
    result = outcomes.result("error")
    assert result.phase == "code" and result.stdout == "computing\n"
    error = result.error
    assert error is not None and error["type"] == "ZeroDivisionError" and error["line"] == 2
    assert "ZeroDivisionError" in result.message
    traceback = error["traceback"]
    frames = [line.strip() for line in traceback.splitlines() if line.strip().startswith("File ")]
    assert frames == [
        'File "<cell-1>", line 8, in <module>',
        'File "<cell-1>", line 5, in mean',
        'File "<cell-1>", line 2, in ratio',
    ], traceback
    assert "orchestrator" not in traceback, "frames of the agent leaked into the user's traceback"

    in_tests = outcomes.result("error-in-tests")
    assert in_tests.phase == "tests" and in_tests.error is not None and in_tests.error["type"] == "NameError"


def test_a_timeout_keeps_the_output_printed_before_it(outcomes: Run) -> None:
    result = outcomes.result("timeout")
    assert result.stdout.startswith("partial line\n"), result.stdout
    assert result.limits["timeout"] == 1.5 and outcomes.result("passed").limits["timeout"] == 10
    assert 1.5 * 0.9 <= result.durations["code"] < 1.5 + 5, result.durations
    low, high = (int(uid) for uid in result.limits["worker_uids"].split("-"))  # the submission ran as its own uid
    assert 0 < low <= high and result.limits["user"] == "0:0"


def test_memory_is_per_submission(outcomes: Run) -> None:
    small, default = outcomes.result("100mb-in-64m"), outcomes.result("100mb-default")
    assert small.status is Status.OOM and small.limits["memory"] == 64 << 20
    assert default.status is Status.PASSED and default.stdout == f"allocated {100 * 2**20}\n"
    assert default.limits["memory"] > 100 << 20


def test_output_limit_stops_the_submission_and_keeps_the_head(outcomes: Run) -> None:
    result = outcomes.result("output-limit")
    assert result.output_truncated is True
    assert 0 < len(result.stdout.encode()) <= OUTPUT_LIMIT + 1024
    assert result.stdout.startswith("z" * 999 + "\n")
    assert result.durations["code"] < 5, "stopped at the cap, not at the timeout"


def test_a_killed_interpreter_is_crashed(outcomes: Run) -> None:
    result = outcomes.result("crashed")
    assert result.phase == "code" and "SIGKILL" in result.message, result.message


def test_stdin_feeds_input_and_sys_stdin(outcomes: Run) -> None:
    result = outcomes.result("stdin")
    assert result.stdout == "age? ada is 36\n['x', 'y', 'z']\n"


def test_files_are_placed_in_the_workspace(outcomes: Run) -> None:
    result = outcomes.result("files")
    assert result.stdout == "42 hello /workspace\n"


def test_the_results_file_has_one_flushed_line_per_submission(outcomes: Run) -> None:
    assert outcomes.callback_errors == []
    records = complete_records(outcomes.out)
    assert outcomes.out.read_bytes().endswith(b"\n")
    assert sorted(r["id"] for r in records) == sorted(EXPECTED)
    assert {r["id"]: r["status"] for r in records} == {k: v.value for k, v in EXPECTED.items()}
    assert sorted(outcomes.reported) == sorted(EXPECTED)
    assert outcomes.in_file_when_reported == dict.fromkeys(EXPECTED, True), "a record was not written before on_result"
    for record in records:
        again = EvalResult.from_json(record)
        assert again == outcomes.result(record["id"])


def test_the_junit_report_counts_failures_and_errors(outcomes: Run) -> None:
    suite = ElementTree.parse(outcomes.junit).getroot()
    assert suite.tag == "testsuite"
    not_failed = {Status.PASSED, Status.FAILED}
    errors = sum(1 for status in EXPECTED.values() if status not in not_failed)
    assert suite.get("tests") == str(len(EXPECTED))
    assert suite.get("failures") == "2" and suite.get("errors") == str(errors) and errors == 6
    kinds: dict[str, tuple[str, str | None] | None] = {}
    for case in suite.findall("testcase"):
        marks = [child for child in case if child.tag in ("failure", "error")]
        kinds[case.get("name", "")] = (marks[0].tag, marks[0].get("type")) if marks else None
    assert kinds == {
        "passed": None,
        "failed-assert": ("failure", "failed"),
        "failed-stdout": ("failure", "failed"),
        "error": ("error", "error"),
        "error-in-tests": ("error", "error"),
        "timeout": ("error", "timeout"),
        "100mb-in-64m": ("error", "oom"),
        "100mb-default": None,
        "output-limit": ("error", "output_limit"),
        "crashed": ("error", "crashed"),
        "stdin": None,
        "files": None,
    }
    (diffed,) = [c for c in suite.findall("testcase") if c.get("name") == "failed-stdout"]
    failure = diffed.find("failure")
    assert failure is not None and "+beta" in (failure.text or "")


def submission(key: str, code: str = "print('ok')", **extra: Any) -> dict[str, Any]:
    return {"id": key, "code": code, **extra}


def test_resume_runs_only_the_new_ids(orch: Orchestrator, tmp_path: Path) -> None:
    out, junit = tmp_path / "results.jsonl", tmp_path / "report.xml"
    first_items = [submission("a", "print('A')"), submission("b", "print('B')")]
    first = orch.evaluate(first_items, out=out)
    assert first.exit_code == 0 and [r.status for r in first.results] == [Status.PASSED] * 2
    # An earlier run's infrastructure error is not a result: resume runs that id again.
    gave_up = {"id": "d", "status": "infra_error", "message": "no sandbox could be started: EngineError: test"}
    with out.open("a") as handle:
        handle.write(json.dumps(gave_up) + "\n")

    ran: list[str] = []
    second = orch.evaluate(
        [*first_items, submission("c", "print('C')"), submission("d", "print('D')")],
        out=out,
        junit=junit,
        resume=True,
        on_result=lambda r: ran.append(r.id),
    )
    assert sorted(ran) == ["c", "d"], "an id the results file holds ran again, or an infra_error did not"
    assert [r.id for r in second.results] == ["a", "b", "c", "d"] and second.resumed == 2
    assert [r.stdout for r in second.results] == ["A\n", "B\n", "C\n", "D\n"]
    assert second.results[:2] == first.results, "the resumed results are the earlier run's records"
    assert second.exit_code == 0
    records = complete_records(out)
    # The first run's two records come in the order they finished (they run at once), then the infra_error.
    assert sorted(r["id"] for r in records[:2]) == ["a", "b"] and records[2]["id"] == "d"
    assert sorted(r["id"] for r in records[3:]) == ["c", "d"]
    assert ElementTree.parse(junit).getroot().get("tests") == "4"


def test_resume_repairs_a_torn_last_line(orch: Orchestrator, tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    items = [submission("first", "print(1)"), submission("second", "print(2)"), submission("third", "print(3)")]
    orch.evaluate(items[:2], options=EvalOptions(jobs=1), out=out)
    raw = out.read_bytes()
    first_line, second_line = raw.split(b"\n")[:2]
    torn_record = json.loads(second_line)["id"]
    out.write_bytes(first_line + b"\n" + second_line[: len(second_line) // 2])  # a crash in the middle of a write

    ran: list[str] = []
    report = orch.evaluate(items, out=out, resume=True, on_result=lambda r: ran.append(r.id))
    kept = json.loads(first_line)["id"]
    assert sorted(ran) == sorted(key["id"] for key in items if key["id"] != kept)
    assert torn_record in ran, "the record cut short counts as not finished"
    assert report.resumed == 1 and [r.id for r in report.results] == ["first", "second", "third"]
    assert all(r.passed for r in report.results)
    data = out.read_bytes()
    assert data.endswith(b"\n") and data.startswith(first_line + b"\n")
    assert sorted(r["id"] for r in complete_records(out)) == ["first", "second", "third"]


def test_invalid_lines_are_reported_with_their_numbers_and_the_rest_runs(orch: Orchestrator, tmp_path: Path) -> None:
    source = tmp_path / "submissions.jsonl"
    lines = [
        json.dumps(submission("ok-1", "print('first')")),
        '{"id": "broken", "code": ',
        json.dumps({"code": "print(1)"}),
        "",
        json.dumps(submission("ok-1", "print('again')")),
        json.dumps(submission("ok-2", "print('second')")),
        json.dumps(submission("typo", expected="x")),
    ]
    source.write_text("\n".join(lines) + "\n")
    junit = tmp_path / "report.xml"
    report = orch.evaluate(source, junit=junit)

    assert [(r.id, r.status, r.stdout, r.line) for r in report.results] == [
        ("ok-1", Status.PASSED, "first\n", 1),
        ("ok-2", Status.PASSED, "second\n", 6),
    ]
    assert [(i.line, i.id) for i in report.invalid] == [(2, None), (3, None), (5, "ok-1"), (7, "typo")]
    messages = [i.message for i in report.invalid]
    assert "not valid JSON" in messages[0] and "missing 'id'" in messages[1], messages
    assert "duplicate id" in messages[2] and "line 1" in messages[2], messages
    assert "expected" in messages[3], messages
    assert report.exit_code == 1, "an invalid line makes the run not all-passed"
    suite = ElementTree.parse(junit).getroot()
    assert suite.get("tests") == "6" and suite.get("errors") == "4" and suite.get("failures") == "0"
    invalid_cases = [c.get("name") for c in suite.findall("testcase") if c.find("error") is not None]
    assert invalid_cases == ["line 2", "line 3", "line 5", "line 7"]


# The CLI, in a subprocess with the tests' settings.


@dataclass
class CliRun:
    returncode: int
    stdout: str
    stderr: str
    pid: int


def run_cli(store: Settings, *argv: str, stdin: str = "", **env: str) -> CliRun:
    """``python -m orchestrator ARGV`` with the test's environment on ``store``."""
    with subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(store, **env),
    ) as process:
        stdout, stderr = process.communicate(stdin, timeout=180)
    return CliRun(process.returncode, stdout, stderr, process.pid)


def eval_containers(pid: int) -> list[str]:
    """Ids of the containers (running or not) of the evaluations of process ``pid``."""
    client = docker.from_env()
    try:
        labels = ["orchestrator.role=eval", f"orchestrator.controller-pid={pid}"]
        return [c.id for c in client.containers.list(all=True, filters={"label": labels}, sparse=True)]
    finally:
        client.close()


@pytest.fixture
def cli(settings_for: Callable[..., Settings], image: str) -> Iterator[Callable[..., CliRun]]:
    """The CLI on a store of the test's own; afterwards no eval container of it is left."""
    store = settings_for()
    pids: list[int] = []

    def run(*argv: str, stdin: str = "", **env: str) -> CliRun:
        done = run_cli(store, *argv, stdin=stdin, **env)
        pids.append(done.pid)
        return done

    yield run
    for pid in pids:
        assert eval_containers(pid) == [], f"the CLI (pid {pid}) left containers"


def write_jsonl(path: Path, items: list[dict[str, Any] | str]) -> Path:
    path.write_text("".join((item if isinstance(item, str) else json.dumps(item)) + "\n" for item in items))
    return path


def test_cli_grades_a_file_prints_a_summary_and_exits_1(
    cli: Callable[..., CliRun], orch: Orchestrator, tmp_path: Path
) -> None:
    source = write_jsonl(
        tmp_path / "in.jsonl",
        [
            submission("good", "print(6 * 7)", expected_stdout="42"),
            submission("wrong", "x = 1", tests="assert x == 1\nassert x == 2"),
            submission("raises", "int('nope')"),
            "not json",
        ],
    )
    out, junit = tmp_path / "out.jsonl", tmp_path / "junit.xml"
    done = cli("eval", str(source), "--out", str(out), "--junit", str(junit), "--jobs", "2")
    assert done.returncode == 1, done.stderr
    assert "1 of 3 passed" in done.stdout and f"image {orch.default_image}" in done.stdout, done.stdout
    table = {line.split()[0]: line.split()[-1] for line in done.stdout.splitlines() if line.split()}
    assert table["passed"] == "1" and table["failed"] == "1" and table["error"] == "1", done.stdout
    assert "invalid input: line 4" in done.stderr and "not valid JSON" in done.stderr, done.stderr
    assert "wrong: failed: assertion failed at line 2" in done.stderr, done.stderr
    assert "raises: error:" in done.stderr and "ValueError" in done.stderr, done.stderr
    assert {r["id"]: r["status"] for r in complete_records(out)} == {
        "good": "passed",
        "wrong": "failed",
        "raises": "error",
    }
    suite = ElementTree.parse(junit).getroot()
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("4", "1", "2")

    again = cli("eval", str(source), "--out", str(out), "--resume", "--quiet")
    assert again.returncode == 1, again.stderr
    assert "1 of 3 passed (3 from the earlier run)" in again.stdout, again.stdout
    assert len(complete_records(out)) == 3, "--resume ran an id again"


def test_cli_exits_0_when_everything_passed(cli: Callable[..., CliRun], tmp_path: Path) -> None:
    piped = "".join(json.dumps(s) + "\n" for s in [submission("one"), submission("two", "print(input())", stdin="hi")])
    out = tmp_path / "out.jsonl"
    done = cli("eval", "-", "--out", str(out), "--jobs", "2", "--json", stdin=piped)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["exit_code"] == 0 and summary["total"] == 2 and summary["counts"]["passed"] == 2
    assert [r["stdout"] for r in complete_records(out)] in (["ok\n", "hi\n"], ["hi\n", "ok\n"])


def test_cli_exits_2_on_an_infrastructure_error_or_bad_arguments(cli: Callable[..., CliRun], tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [submission("one")])
    out = tmp_path / "out.jsonl"

    out.write_text("kept\n")
    missing = cli("eval", str(source), "--out", str(out), ORCH_IMAGE="does-not-exist:latest")
    assert missing.returncode == 2, (missing.stdout, missing.stderr)
    assert missing.stderr.startswith("orchestrator: ImageMissing: ") and "does-not-exist:latest" in missing.stderr
    assert missing.stderr.count("\n") == 1 and missing.stdout == ""
    assert out.read_text() == "kept\n", "a run that could not start must not empty the results of the one before"

    for argv in (
        ["eval", str(source), "--out", str(out), "--jobs", "0"],
        ["eval", str(source)],
        ["eval", str(source), "--out", str(out), "--max-output", "lots"],
    ):
        usage = cli(*argv)
        assert usage.returncode == 2, (argv, usage.stderr)
        assert usage.stderr.startswith("orchestrator: UsageError: "), usage.stderr

    for argv, env, message in (
        (
            ["--memory", "10m"],
            {},
            "ConfigError: memory must be at least 32 MiB: below it the sandbox's agent cannot start, got 10.0 MiB",
        ),
        (["--timeout", "2d"], {}, "ConfigError: timeout must be more than 0 and at most a day, got 2d"),
        ([], {"ORCH_MEM_LIMIT": "10m"}, "ResourceLimits.memory must be at least 32 MiB, got '10m'"),
        ([], {"ORCH_EXEC_TIMEOUT": "soon"}, "ORCH_EXEC_TIMEOUT='soon': 'soon' is not a duration"),
    ):
        refused = cli("eval", str(source), "--out", str(out), *argv, **env)  # no sandbox starts: the fixture checks
        assert refused.returncode == 2 and message in refused.stderr, (argv, env, refused.stderr)
        assert refused.stderr.count("\n") == 1 and refused.stdout == ""
    assert out.read_text() == "kept\n", "a refused run must not empty its results file"

    unreadable = cli("eval", str(tmp_path / "nothing-here.jsonl"), "--out", str(out))
    assert unreadable.returncode == 2 and "cannot read the submissions file" in unreadable.stderr, unreadable.stderr


@dataclass
class KilledRun:
    pid: int
    records: int
    containers: list[str]
    sandbox_dirs: list[str]
    scratch_dirs: list[str]
    next_runs: list[CliRun]
    runtime_dir: Path
    tmpdir: Path


@pytest.fixture(scope="module")
def killed_run(
    settings_for: Callable[..., Settings], image: str, tmp_path_factory: pytest.TempPathFactory
) -> KilledRun:
    """An eval CLI killed with SIGKILL while its sandboxes run, then two more eval runs on this host.

    The kill comes at a quiet moment (a second after the first result, with the other submissions
    sleeping in their sandboxes), not while a sandbox is being started or removed. The first run
    after it has another runtime dir (as another user's or another project's run on the same host
    would, or any other run on a shared engine); the second has the dead run's own runtime dir.
    """
    store, other_store = settings_for(), settings_for()
    folder = tmp_path_factory.mktemp("killed-run")
    tmpdir = folder / "tmp"  # TMPDIR of all the runs: their scratch directories land here, apart from other runs'
    tmpdir.mkdir()
    slow = [submission(f"slow-{n}", "import time\ntime.sleep(60)", timeout=120) for n in range(3)]
    source = write_jsonl(folder / "in.jsonl", [submission("quick"), *slow])
    out = folder / "out.jsonl"
    argv = [sys.executable, "-m", "orchestrator", "eval", str(source), "--out", str(out), "--jobs", "2", "-q"]
    env = cli_env(store, TMPDIR=str(tmpdir))
    with subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env) as process:
        try:
            ends = time.monotonic() + 120
            while not (out.exists() and out.read_bytes().count(b"\n") >= 1):
                assert process.poll() is None and time.monotonic() < ends, "the run ended or never got going"
                time.sleep(0.05)
            time.sleep(1.5)
        finally:
            process.send_signal(signal.SIGKILL)
    killed = KilledRun(
        pid=process.pid,
        records=len(complete_records(out)),
        containers=eval_containers(process.pid),
        sandbox_dirs=sorted(p.name for p in store.runtime_dir.iterdir() if p.name.startswith("sb-")),
        scratch_dirs=sorted(p.name for p in tmpdir.glob("orchestrator-eval-*")),
        next_runs=[],
        runtime_dir=store.runtime_dir,
        tmpdir=tmpdir,
    )
    after = write_jsonl(folder / "after.jsonl", [submission("after")])
    for n, settings in enumerate((other_store, store)):
        argv = ["eval", str(after), "--out", str(folder / f"after-{n}.jsonl")]
        killed.next_runs.append(run_cli(settings, *argv, TMPDIR=str(tmpdir)))
    return killed


def test_a_killed_run_loses_no_result_and_the_next_run_removes_its_containers(killed_run: KilledRun) -> None:
    assert killed_run.records == 1, "the result finished before the kill is in the results file"
    assert len(killed_run.containers) >= 2 and len(killed_run.sandbox_dirs) >= 2, "nothing to sweep: a weak test"
    assert [run.returncode for run in killed_run.next_runs] == [0, 0], [run.stderr for run in killed_run.next_runs]
    assert eval_containers(killed_run.pid) == [], "the next runs did not remove the dead run's containers"
    assert [eval_containers(run.pid) for run in killed_run.next_runs] == [[], []]


def test_a_killed_run_leaves_no_sandbox_directory_after_the_next_runs(killed_run: KilledRun) -> None:
    """The first run after the kill has another runtime dir (as another user's run on a shared engine would):
    it removes the dead run's containers and their channel directories (secret and socket) in the dead
    run's runtime dir, which each container names in a label."""
    left = sorted(p.name for p in killed_run.runtime_dir.iterdir() if p.name.startswith("sb-"))
    assert left == [], f"sandbox directories of the dead run are left: {left}"


def test_a_run_makes_no_scratch_directory(killed_run: KilledRun) -> None:
    """Nothing of a run lives in the temp dir (a graded cell's output is kept in memory, bounded), so a killed
    run cannot leave a file there."""
    assert killed_run.scratch_dirs == []
    assert sorted(p.name for p in killed_run.tmpdir.iterdir()) == []


# Inputs the submission format accepts must reach the sandbox.

TABS = 6 << 20
"""Bytes of a file of tabs: 12 MiB as JSON, past what a field may take (submissions.MAX_FIELD_BYTES): refused."""


@pytest.fixture(scope="module")
def large_inputs(orch: Orchestrator) -> EvalReport:
    return orch.evaluate(
        [
            submission("tabs", "print(len(open('data.tsv').read()))", files={"data.tsv": "\t" * TABS}),
            submission("big-stdin", "import sys\nprint(len(sys.stdin.read()))", stdin="x" * (17 << 20)),
            submission("plain"),
        ],
    )


def reached_the_code_or_refused(report: EvalReport, key: str, field_name: str, printed: str) -> None:
    """The submission ran and saw its whole input, or it is an invalid line naming the field; never graded."""
    results = [r for r in report.results if r.id == key]
    invalid = [i for i in report.invalid if i.id == key]
    if invalid:
        assert results == [] and field_name in invalid[0].message, invalid
        return
    (result,) = results
    assert (result.status, result.stdout) == (Status.PASSED, printed), (result.status, result.message)


def test_files_within_the_files_limit_are_placed(large_inputs: EvalReport) -> None:
    """Files too big to travel (6 MiB of tabs, 12 MiB as JSON) are an invalid line naming 'files', never graded
    ``crashed`` as if the submission broke the sandbox."""
    assert [r.id for r in large_inputs.results if r.id == "plain" and r.passed] == ["plain"], "the run went on"
    reached_the_code_or_refused(large_inputs, "tabs", "files", f"{TABS}\n")


def test_an_oversized_stdin_is_not_graded_as_a_crash(large_inputs: EvalReport) -> None:
    """A stdin too big to travel is an invalid line naming 'stdin', never graded ``crashed``."""
    reached_the_code_or_refused(large_inputs, "big-stdin", "stdin", f"{17 << 20}\n")
