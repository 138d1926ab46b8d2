"""The CLI without an engine: parsing, rendering, exit statuses and the shell's input, on a fake Orchestrator."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import orchestrator.cli as cli
from orchestrator import (
    ConfigError,
    EngineUnavailable,
    ExecError,
    ExecResult,
    ExecutionTimeout,
    Generation,
    GenerationNotFound,
    ImageMissing,
    SandboxCrashed,
    SessionAttachedElsewhere,
    SessionBusy,
    SessionHeld,
    SessionNotFound,
    Settings,
    units,
)
from orchestrator.api.events import OutputEvent
from orchestrator.api.session import SessionState
from orchestrator.cli import commands, output, parser, render, shell
from orchestrator.cli import logs as session_logs
from orchestrator.cli.output import Exit
from orchestrator.config import defaults_path
from orchestrator.errors import CapacityExceeded, CheckpointError, ProtocolError
from orchestrator.ops.prune import PruneAction, PruneReport
from orchestrator.ops.survey import SessionInfo, SessionStatus

NOW = 1_700_000_000.0


def info(session_id: str = "s1", **changes: object) -> SessionInfo:
    fields: dict[str, object] = dict(
        id=session_id,
        status=SessionStatus.RUNNING,
        image="orchestrator-sandbox:abc",
        created_at=NOW - 192,
        last_active_at=NOW - 40,
        age_seconds=192.0,
        idle_seconds=40.0,
        generation=3,
        variables=2,
        checkpoint_bytes=int(4.2 * 1024 * 1024),
        epoch=1,
        sandbox_id="sb-0123456789ab",
        container_id="c" * 64,
        container_status="running",
        memory_bytes=18 << 20,
        cpu_percent=12.5,
        cpu_seconds=3.25,
        hibernated_at=None,
        problem=None,
        labels={"orchestrator.test.x": "1"},
    )
    fields.update(changes)
    return SessionInfo(**fields)  # type: ignore[arg-type]


class FakeSession:
    def __init__(self, session_id: str, results: list[object]) -> None:
        self.id = session_id
        self.results = results
        self.state = SessionState.READY
        self.generation = 3
        self.variables = ["x"]
        self.codes: list[tuple[str, float | None]] = []
        self.detach_error: Exception | None = None
        self.forked_from: tuple[str, int] | None = None

    def execute(self, code: str, timeout: float | None = None, *, on_output: object = None) -> ExecResult:
        """Streams the result's stdout and stderr (or a timeout's) through ``on_output`` first, as the agent does."""
        self.codes.append((code, timeout))
        outcome = self.results.pop(0) if self.results else ExecResult()
        if callable(on_output):
            for stream in ("stdout", "stderr"):
                text = getattr(outcome, stream, "")
                if isinstance(text, str) and text:
                    on_output(OutputEvent(stream, text, text.encode()))
        if isinstance(outcome, BaseException):
            raise outcome
        assert isinstance(outcome, ExecResult)
        return outcome

    def interrupt(self) -> bool:
        return False

    def close(self) -> None:
        self.state = SessionState.CLOSED

    def detach(self) -> None:
        if self.detach_error is not None:
            raise self.detach_error
        self.state = SessionState.DETACHED


class FakeBackend:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class FakeOrchestrator:
    """Just the surface the CLI uses; ``errors`` maps (method, id) to what it raises."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.backend = FakeBackend()
        self.infos = [info("s1"), info("s2", status=SessionStatus.HIBERNATED, memory_bytes=None, container_id=None)]
        self.errors: dict[tuple[str, str], Exception] = {}
        self.results: list[object] = []
        self.sessions: list[FakeSession] = []
        self.calls: list[tuple[str, object]] = []
        self.closed = False
        self.report = PruneReport([], dry_run=False)
        self.log = "agent started\n"
        self.generations = [
            Generation(2, NOW - 192, ("data",), 1, 100, False),
            Generation(3, NOW - 40, ("data", "extra"), 2, 5 << 20, True),
        ]

    def _check(self, method: str, session_id: str, force: bool = False) -> None:
        self.calls.append((method, session_id))
        if force:
            self.calls.append(("force", session_id))
        if (method, session_id) in self.errors:
            raise self.errors[(method, session_id)]

    def list_sessions(self, *, now: float | None = None) -> list[SessionInfo]:
        return list(self.infos)

    def describe(self, session_id: str, *, now: float | None = None) -> SessionInfo:
        self._check("describe", session_id)
        for i in self.infos:
            if i.id == session_id:
                return i
        raise SessionNotFound(f"no session {session_id!r} in /state/sessions")

    def hibernate(self, session_id: str) -> bool:
        self._check("hibernate", session_id)
        return session_id != "s2"

    def resume(self, session_id: str, *, force: bool = False) -> bool:
        self._check("resume", session_id, force)
        return self.describe(session_id).status is not SessionStatus.RUNNING

    def remove(self, session_id: str, *, force: bool = False) -> None:
        self._check("remove", session_id, force)

    def logs(self, session_id: str, tail: int | None = 200) -> str:
        self._check("logs", session_id)
        self.calls.append(("tail", tail))
        return self.log

    def prune(self, **kwargs: object) -> PruneReport:
        self.calls.append(("prune", kwargs))
        return self.report

    def attach(self, session_id: str, *, force: bool = False) -> FakeSession:
        self._check("attach", session_id, force)
        session = FakeSession(session_id, self.results)
        self.sessions.append(session)
        return session

    default_image = "orchestrator-sandbox:0123"

    def create_session(
        self, *, session_id: str | None = None, image: str | None = None, labels: dict[str, str] | None = None
    ) -> FakeSession:
        self.calls.append(("create", (session_id, image, labels)))
        session = FakeSession(session_id or "s0123456789ab", self.results)
        self.sessions.append(session)
        return session

    def fork(
        self,
        session_id: str,
        count: int = 1,
        *,
        at: int | None = None,
        labels: dict[str, str] | None = None,
        session_ids: list[str] | None = None,
    ) -> list[FakeSession]:
        self._check("fork", session_id)
        self.calls.append(("fork", (count, at, labels)))
        forks = [FakeSession(name, self.results) for name in session_ids or [f"f{n}" for n in range(count)]]
        for session in forks:
            session.forked_from = (session_id, 3 if at is None else at)
        self.sessions.extend(forks)
        return forks

    def history(self, session_id: str) -> list[Generation]:
        self._check("history", session_id)
        return list(self.generations)

    def rewind(self, session_id: str, generation: int, *, force: bool = False) -> Generation:
        self._check("rewind", session_id, force)
        self.calls.append(("rewind", generation))
        return Generation(9, NOW, ("data", "extra"), 2, 120, True, rewound_from=generation)

    def build_image(self, *, rebuild: bool = False) -> str:
        self.calls.append(("build", rebuild))
        return "orchestrator-sandbox:0123"

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeOrchestrator:
    for name in ("ORCH_BASE_IMAGE", "ORCH_IMAGE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ORCH_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("ORCH_RUNTIME_DIR", str(tmp_path / "run"))
    made: list[FakeOrchestrator] = []
    orch = FakeOrchestrator(Settings.from_env())
    (tmp_path / "state" / "sessions" / "web-1").mkdir(mode=0o700, parents=True)  # stored: `ls` connects
    (tmp_path / "state").chmod(0o700)

    def construct(settings: Settings) -> FakeOrchestrator:
        orch.settings = settings
        made.append(orch)
        return orch

    monkeypatch.setattr(cli, "connect", construct)
    return orch


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ---------------------------------------------------------------------------- parsing


def test_durations_tail_and_flags_parse():
    args = cli.build_parser().parse_args(["prune", "--idle", "30m", "--older-than", "1d", "--dry-run"])
    assert (args.idle, args.older_than, args.dry_run, args.hibernate_only) == (1800.0, 86400.0, True, False)
    assert cli.build_parser().parse_args(["logs", "s1", "--tail", "all"]).tail is None
    assert cli.build_parser().parse_args(["logs", "s1"]).tail == 200
    assert cli.build_parser().parse_args(["exec", "s1", "x", "--timeout", "2m"]).timeout == 120.0


@pytest.mark.parametrize("argv", [["ls", "--json"], ["--json", "ls"], ["list", "--json"]])
def test_json_is_accepted_before_or_after_the_command(argv):
    args = cli.build_parser().parse_args(argv)
    assert args.json is True and args.func.target() is commands.ls


def test_verbose_after_the_command_and_defaults():
    assert cli.build_parser().parse_args(["ls", "-v"]).verbose is True
    args = cli.build_parser().parse_args(["ls"])
    assert args.verbose is False and args.json is False


@pytest.mark.parametrize(
    ("argv", "as_json"),
    [
        (["ls"], False),
        (["--log-json", "ls"], True),
        (["ls", "--log-json"], True),
        (["--log-json", "janitor"], True),
        (["janitor", "--log-json", "--metrics", "9464"], True),
        (["janitor"], False),
    ],
)
def test_log_json_before_or_after_the_command(argv, as_json):
    args = cli.build_parser().parse_args(argv)
    assert args.log_json is as_json
    if argv[-1] == "9464":
        assert args.metrics == "9464"


@pytest.mark.parametrize(
    "argv",
    [
        ["prune", "--idle", "5x"],
        ["logs", "s1", "--tail", "0"],
        ["exec", "s1", "x", "--timeout", "0"],
        ["exec", "s1"],
        ["hibernate"],
        ["frobnicate"],
    ],
)
def test_usage_errors_are_one_line_and_exit_2(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == Exit.USAGE == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("orchestrator: UsageError: ")


def test_help_lists_the_exit_statuses_and_every_command(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for line in ("0    success", "1    exec/run: the code raised", "3    partial failure", "9    exec/run: output"):
        assert line in out
    commands = ("ls", "inspect", "exec", "create", "run", "shell", "hibernate", "resume", "rm", "logs", "prune")
    for name in (*commands, "fork", "history", "rewind", "janitor", "image"):
        assert f"\n    {name}" in out
    code, out, _ = run(capsys, "exec", "--help")
    assert code == 0 and "exit status:" in out and "'-' reads it from standard input" in out


@pytest.mark.parametrize(
    ("argv", "usage"), [([], "usage: orchestrator [-h]"), (["image"], "usage: orchestrator image")]
)
def test_a_bare_command_prints_its_help(capsys, argv, usage):
    code, out, err = run(capsys, *argv)
    assert (code, err) == (0, "") and out.startswith(usage) and "COMMAND" in out


def test_a_missing_session_says_how_to_list_them(fake, capsys):
    fake.errors[("attach", "nope")] = SessionNotFound("no session 'nope' in /state/sessions")
    assert run(capsys, "exec", "nope", "1")[2] == (
        "orchestrator: SessionNotFound: no session 'nope' in /state/sessions; `orchestrator ls` lists the sessions\n"
    )


def test_janitor_is_registered_from_its_module():
    args = cli.build_parser().parse_args(["janitor", "--once"])
    assert args.func is parser._janitor and args.needs_orchestrator is False and args.once is True


# ---------------------------------------------------------------------------- rendering


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (None, "-"),
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (int(4.2 * (1 << 20)), "4.2 MiB"),
        (3 << 30, "3.0 GiB"),
    ],
)
def test_human_bytes(size, text):
    assert units.describe_bytes(size) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (0.4, "0s"),
        (40, "40s"),
        (60, "1m"),
        (192, "3m 12s"),
        (7500, "2h 5m"),
        (3 * 86400 + 4 * 3600, "3d 4h"),
    ],
)
def test_human_duration(seconds, text):
    assert units.describe_duration(seconds) == text


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ConfigError("x"), 2),
        (SessionNotFound("x"), 4),
        (GenerationNotFound("x"), 4),
        (SessionBusy("x"), 5),
        (SessionAttachedElsewhere("x"), 5),
        (CapacityExceeded("x"), 5),
        (EngineUnavailable("x"), 6),
        (ImageMissing("x"), 6),
        (ExecutionTimeout("x"), 7),
        (SandboxCrashed("x"), 7),
        (ProtocolError("x"), 7),
        (CheckpointError("x"), 8),
        (RuntimeError("x"), 8),
        (KeyboardInterrupt(), 130),
    ],
)
def test_every_error_has_its_exit_status(error, code):
    assert output.exit_code(error) == code


def test_an_error_is_one_line():
    line = output.error_line(EngineUnavailable("no engine\n  start one with:\n\tscripts/setup-engine"))
    assert line == "orchestrator: EngineUnavailable: no engine start one with: scripts/setup-engine"


def table_lines(infos: list[SessionInfo], width: int | None) -> list[str]:
    return render.plain_table(render.fit_columns(render.session_columns(infos), width)).splitlines()


def test_sessions_table_shows_human_units_one_field_per_cell():
    busy = info("s2", status=SessionStatus.BUSY, memory_bytes=None, cpu_percent=None)
    lines = table_lines([info("s1"), busy], None)
    assert lines[0].split() == ["ID", "STATE", "IMAGE", "AGE", "IDLE", "CPU", "MEMORY", "CHECKPOINT"]
    assert lines[1].split() == [
        "s1",
        "running",
        "orchestrator-sandbox:abc",
        "3m12s",
        "40s",
        "12.5%",
        "18.0MiB",
        "4.2MiB",
    ]
    assert lines[2].split() == ["s2", "busy", "orchestrator-sandbox:abc", "3m12s", "-", "-", "-", "4.2MiB"]
    assert len(lines) == 3 and all(line == line.rstrip() and "─" not in line for line in lines)  # no rules


LONG_ID = "a-session-id-of-the-longest-kind-sixty-three-characters-long-xyz"


@pytest.mark.parametrize("session_id", ["s0123456789ab", "build-cache-worker-17", LONG_ID])
def test_sessions_table_fits_80_columns_with_whole_ids(session_id):
    image = "registry.invalid/team/orchestrator-sandbox:e046d1fcaaddf11c"  # text in a table, never pulled
    infos = [info(session_id, image=image, node="worker-node-03"), info("s2", status=SessionStatus.HIBERNATED)]
    lines = table_lines(infos, 80)
    assert lines[1].split()[0] == session_id and lines[2].split()[0] == "s2"
    assert all(len(line) <= 80 for line in lines) or lines[0].split() == ["ID"]
    assert (lines[0].split()[:2] == ["ID", "STATE"] and "IMAGE" in lines[0]) or len(session_id) > 40
    assert table_lines(infos, None)[0].split()[-1] == "CHECKPOINT"  # a pipe: everything
    assert table_lines(infos, 30)[1].split()[0] == session_id  # never cut, even when it alone does not fit


def test_a_table_on_a_terminal_shortens_the_image_before_dropping_columns():
    infos = [info("s0123456789ab", image="orchestrator-sandbox:e046d1fcaaddf11c")]
    header, row = table_lines(infos, 90)
    assert header.split() == ["ID", "STATE", "IMAGE", "AGE", "IDLE", "CPU", "MEMORY", "CHECKPOINT"]
    assert len(row) <= 90 and "…" in row.split()[2] and row.split()[2].endswith("f11c")
    # 80 columns: the checkpoint's size goes first, the live CPU and memory stay
    assert table_lines(infos, 80)[0].split() == ["ID", "STATE", "IMAGE", "AGE", "IDLE", "CPU", "MEMORY"]
    assert table_lines(infos, 60)[0].split() == ["ID", "STATE", "IMAGE", "AGE", "IDLE"]


# ---------------------------------------------------------------------------- commands


def test_ls_table_and_json(fake, capsys):
    code, out, err = run(capsys, "ls")
    assert code == 0 and err == ""
    assert "s1" in out and "hibernated" in out and "4.2MiB" in out and "3m12s" in out
    code, out, _ = run(capsys, "ls", "--json")
    rows = json.loads(out)
    assert code == 0 and [r["id"] for r in rows] == ["s1", "s2"]
    assert rows[1]["status"] == "hibernated" and rows[0]["checkpoint_bytes"] == int(4.2 * 1024 * 1024)
    assert set(rows[0]) == set(SessionInfo.__dataclass_fields__)
    assert fake.closed


def test_ls_names_broken_sessions_problems_and_says_when_there_are_none(fake, capsys):
    fake.infos = [info("s3", status=SessionStatus.BROKEN, problem="its container is gone")]
    code, out, err = run(capsys, "ls")
    assert out.splitlines()[1].split()[:2] == ["s3", "broken"] and err == "orchestrator: s3: its container is gone\n"
    fake.infos = []
    code, out, err = run(capsys, "ls")
    assert code == 0 and out == "" and err.startswith("orchestrator: no sessions")
    assert run(capsys, "ls", "--json")[1].strip() == "[]"
    assert run(capsys, "ls", "-q") == (0, "", "")


def test_ls_quiet_filter_and_format(fake, capsys):
    fake.infos = [
        info("web-1", labels={"orchestrator.me.app": "web"}),
        info("web-2", status=SessionStatus.HIBERNATED, labels={"orchestrator.me.app": "web"}),
        info("db-1", image="other:1", labels={"orchestrator.me.app": "db"}),
    ]
    assert run(capsys, "ls", "-q") == (0, "web-1\nweb-2\ndb-1\n", "")
    assert run(capsys, "ls", "-q", "--filter", "status=running")[1] == "web-1\ndb-1\n"
    assert run(capsys, "ls", "-q", "-f", "state=running", "-f", "id=web-*")[1] == "web-1\n"
    assert run(capsys, "ls", "-q", "-f", "id=db-*", "-f", "id=web-2")[1] == "web-2\ndb-1\n"  # one key: any
    assert run(capsys, "ls", "-q", "-f", "label=orchestrator.me.app=db")[1] == "db-1\n"
    assert run(capsys, "ls", "-q", "-f", "label=orchestrator.me.app", "-f", "image=other:*")[1] == "db-1\n"
    assert run(capsys, "ls", "-q", "-f", "node=*")[1] == ""  # no node on the docker backend
    for argv in (("--format", "json"), ("--json",), ("--format=json", "-f", "status=hibernated")):
        code, out, _ = run(capsys, "ls", *argv)
        assert code == 0 and {row["id"] for row in json.loads(out)} <= {"web-1", "web-2", "db-1"}
    assert [row["id"] for row in json.loads(run(capsys, "ls", "--json", "-f", "status=hibernated")[1])] == ["web-2"]
    code, out, _ = run(capsys, "ls", "-f", "status=hibernated")
    assert out.splitlines()[1].split()[0] == "web-2" and len(out.splitlines()) == 2


@pytest.mark.parametrize("bad", ["status=sleepy", "colour=red", "status", "id="])
def test_ls_refuses_a_filter_it_does_not_know_in_one_line(capsys, bad):
    code, out, err = run(capsys, "ls", "--filter", bad)
    assert code == 2 and out == "" and err.count("\n") == 1 and "UsageError" in err


def test_inspect_shows_everything_and_json(fake, capsys):
    code, out, _ = run(capsys, "inspect", "s1")
    assert code == 0
    for key in ("id", "state", "image", "created", "last active", "generation", "checkpoint", "container", "labels"):
        assert any(line.startswith(key + " ") for line in out.splitlines()), key
    assert "orchestrator.test.x=1" in out
    code, out, _ = run(capsys, "inspect", "s2", "--json")
    assert json.loads(out) == {
        **info("s2", status=SessionStatus.HIBERNATED, memory_bytes=None, container_id=None).to_json(),
        "unsaved": {},
    }


LS_HINT = "`orchestrator ls` lists the sessions\n"


def test_inspect_missing_session_is_one_line_and_exit_4(fake, capsys):
    code, out, err = run(capsys, "inspect", "nope")
    assert code == Exit.NOT_FOUND == 4 and out == ""
    assert err == "orchestrator: SessionNotFound: no session 'nope' in /state/sessions; " + LS_HINT
    code, out, err = run(capsys, "inspect", "nope", "--json")
    assert code == 4 and json.loads(out) == {
        "error": {"type": "SessionNotFound", "message": "no session 'nope' in /state/sessions", "exit_code": 4}
    }


def test_exec_prints_output_and_value_then_detaches(fake, capsys):
    fake.results.append(ExecResult(stdout="hello", stderr="warned\n", return_value="42"))
    code, out, err = run(capsys, "exec", "s1", "print('hello', end=''); 42", "--timeout", "5")
    assert code == 0 and out == "hello\n42\n" and err == "warned\n"
    (session,) = fake.sessions
    assert session.codes == [("print('hello', end=''); 42", 5.0)]
    assert session.state is SessionState.DETACHED and fake.closed


def test_exec_exits_1_with_the_traceback_when_the_code_raised(fake, capsys):
    tb = 'Traceback (most recent call last):\n  File "<cell-1>", line 1\nZeroDivisionError: division by zero\n'
    error = ExecError("ZeroDivisionError", "division by zero", 1, "1/0", tb)
    fake.results.append(
        ExecResult(stdout="before\n", error=error, unsaved={"g": "generator"}, newly_unsaved={"g": "generator"})
    )
    code, out, err = run(capsys, "exec", "s1", "print('before'); 1/0")
    assert code == Exit.CODE_RAISED == 1 and out == "before\n"
    assert err.startswith(tb) and "not saved (lost if the sandbox restarts): g: generator" in err
    assert fake.sessions[0].state is SessionState.DETACHED


def test_exec_json_has_every_result_field(fake, capsys):
    fake.results.append(ExecResult(stdout="x\n", return_value="1", generation=4))
    code, out, _ = run(capsys, "exec", "s1", "1", "--json")
    document = json.loads(out)
    assert code == 0 and document["id"] == "s1" and document["ok"] is True
    assert document["return_value"] == "1" and document["generation"] == 4 and document["error"] is None
    assert set(document) >= {
        "stdout",
        "stderr",
        "unsaved",
        "newly_unsaved",
        "restore_failures",
        "duration",
        "checkpoint_duration",
    }


def test_exec_reads_code_from_stdin(fake, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("x = 1\nx\n"))
    fake.results.append(ExecResult(return_value="1"))
    assert run(capsys, "exec", "s1", "-")[0] == 0
    assert fake.sessions[0].codes == [("x = 1\nx\n", None)]


def test_exec_timeout_shows_partial_output_and_exits_7(fake, capsys):
    fake.results.append(ExecutionTimeout("the cell ran past its 1 s timeout", stdout="partial\n"))
    code, out, err = run(capsys, "exec", "s1", "loop()")
    assert code == Exit.SANDBOX == 7 and out == "partial\n"
    assert err == "orchestrator: ExecutionTimeout: the cell ran past its 1 s timeout\n"
    assert fake.sessions[0].state is SessionState.DETACHED
    fake.results.append(ExecutionTimeout("late", stdout="partial\n"))
    code, out, _ = run(capsys, "exec", "s1", "loop()", "--json")
    assert code == 7 and json.loads(out)["error"]["stdout"] == "partial\n"


def test_exec_interrupted_detaches_and_exits_130(fake, capsys):
    fake.results.append(KeyboardInterrupt())
    code, _, err = run(capsys, "exec", "s1", "sleep()")
    assert code == Exit.INTERRUPTED == 130 and err.endswith("orchestrator: KeyboardInterrupt: interrupted\n")
    assert fake.sessions[0].state is SessionState.DETACHED and fake.closed


def test_exec_on_a_missing_session(fake, capsys):
    fake.errors[("attach", "nope")] = SessionNotFound("no session 'nope'")
    assert run(capsys, "exec", "nope", "1")[:2] == (4, "")


def test_a_session_that_could_not_be_detached_is_never_closed(fake, capsys):
    """Orchestrator.close() removes the sessions it holds: after a failed detach only the engine client closes."""
    original = fake.attach

    def attach(session_id: str, *, force: bool = False) -> FakeSession:
        session = original(session_id, force=force)
        session.detach_error = SessionBusy("store lock held")
        return session

    fake.attach = attach  # type: ignore[method-assign]
    fake.results.append(ExecResult(return_value="1"))
    code, _, err = run(capsys, "exec", "s1", "1")
    assert code == Exit.UNAVAILABLE and "SessionBusy" in err
    assert not fake.closed and fake.backend.closed


def test_hibernate_resume_rm_report_each_id(fake, capsys):
    code, out, _ = run(capsys, "hibernate", "s1", "s2", "s1")
    assert code == 0 and out == "s1: hibernated\ns2: already hibernated\n"
    assert run(capsys, "resume", "s2", "s1")[:2] == (0, "s2: running\ns1: already running\n")
    assert ("resume", "s2") in fake.calls and ("resume", "s1") in fake.calls
    assert run(capsys, "rm", "s1", "s2")[:2] == (0, "s1: removed\ns2: removed\n")


def test_many_ids_partial_failure_exits_3_with_json_per_id(fake, capsys):
    fake.errors[("remove", "nope")] = SessionNotFound("no session 'nope'")
    code, out, err = run(capsys, "rm", "s1", "nope", "--json")
    assert code == Exit.PARTIAL == 3
    assert json.loads(out) == [
        {"id": "s1", "ok": True, "result": "removed", "error": None},
        {
            "id": "nope",
            "ok": False,
            "result": None,
            "error": {"type": "SessionNotFound", "message": "no session 'nope'", "exit_code": 4},
        },
    ]
    assert err == "orchestrator: nope: SessionNotFound: no session 'nope'; " + LS_HINT


def test_many_ids_all_failing_alike_exit_with_that_status(fake, capsys):
    fake.errors[("hibernate", "a1")] = SessionBusy("in a call")
    fake.errors[("hibernate", "a2")] = SessionBusy("in a call")
    assert run(capsys, "hibernate", "a1", "a2")[0] == Exit.UNAVAILABLE
    fake.errors[("hibernate", "a2")] = SessionNotFound("gone")
    assert run(capsys, "hibernate", "a1", "a2")[0] == Exit.PARTIAL


def test_logs(fake, capsys):
    fake.log = "line 1\norchestrator agent: connection ended: the peer closed the connection\nline 2"
    assert run(capsys, "logs", "s1", "--tail", "2")[:2] == (0, "line 1\nline 2\n")  # the agent's lines left out
    assert ("tail", None) in fake.calls  # then the last 2 lines taken
    assert run(capsys, "logs", "s1", "--tail", "2", "--agent")[:2] == (
        0,
        "[sandbox] orchestrator agent: connection ended: the peer closed the connection\nline 2\n",
    )
    assert ("tail", 2) in fake.calls
    fake.log = "line 1\nline 2"
    code, out, _ = run(capsys, "logs", "s1", "--json", "--tail", "all")
    assert code == 0 and json.loads(out) == {"id": "s1", "tail": None, "log": "line 1\nline 2"}
    fake.errors[("logs", "s2")] = ConfigError("session s2 has no container now")
    code, out, err = run(capsys, "logs", "s2")
    assert (
        code == 2
        and out == ""
        and err
        == (
            "orchestrator: ConfigError: session s2 has no container now; `orchestrator resume s2` starts one, "
            "`orchestrator logs -f s2` waits for it\n"
        )
    )


def test_logs_follow_prints_whole_new_lines_and_notes_each_new_container(fake, capsys, monkeypatch):
    monkeypatch.setattr(session_logs, "POLL_SECONDS", 0)
    polls: list[object] = [
        "a\nb\nc\n",
        "a\nb\nc\nd",  # "d" is not a whole line yet
        "a\nb\nc\nd\n",
        ConfigError("no container now"),
        ConfigError("no container now"),
        "fresh\n",
        "other\n",  # a restart without a gap
        SessionNotFound("gone"),
    ]

    def logs(session_id: str, tail: int | None = 200) -> str:
        assert tail is None
        outcome = polls.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return str(outcome)

    fake.logs = logs  # type: ignore[method-assign]
    code, out, err = run(capsys, "logs", "s1", "-f", "--tail", "2")
    assert (code, out) == (0, "b\nc\nd\nfresh\nother\n")
    assert err.splitlines() == [
        "orchestrator: session s1 has no container now; waiting for one",
        "orchestrator: session s1 runs in a new container; its log follows",
        "orchestrator: session s1 runs in a new container; its log follows",
        "orchestrator: session s1 was removed; nothing more to follow",
    ]
    assert run(capsys, "logs", "s1", "-f", "--json")[0] == Exit.USAGE


def test_prune_prints_each_action_and_a_summary(fake, capsys):
    fake.report = PruneReport(
        [
            PruneAction("remove", "s1", "idle 2h", freed_bytes=2048),
            PruneAction("skip", "s2", "in a call now"),
            PruneAction("remove-orphan-container", "orch-x-sb-1", "no record"),
        ],
        dry_run=True,
    )
    code, out, err = run(capsys, "prune", "--idle", "30m", "--older-than", "24h", "--dry-run")  # no --yes needed
    assert code == 0 and err == ""
    assert out.splitlines() == [
        "would remove s1 (idle 2h)",
        "would skip s2 (in a call now)",
        "would remove orphan container orch-x-sb-1 (no record)",
        "dry run, would do: 1 remove, 1 skip, 1 remove orphan container; 2.0 KiB to free; 0 failed",
    ]
    assert ("prune", {"idle_for": 1800.0, "older_than": 86400.0, "hibernate_only": False, "dry_run": True}) in (
        fake.calls
    )


def test_prune_partial_failure_exits_3(fake, capsys):
    fake.report = PruneReport(
        [
            PruneAction("remove", "s1", "idle 2h"),
            PruneAction("remove", "s2", "idle 3h", ok=False, error="engine said no"),
        ],
        dry_run=False,
    )
    code, out, err = run(capsys, "prune", "--idle", "1h", "--yes")
    assert code == Exit.PARTIAL
    assert "remove s2 (idle 3h): FAILED: engine said no" in out and out.endswith("1 remove; 0 B freed; 1 failed\n")
    assert err == "orchestrator: PartialFailure: 1 of 2 prune actions failed\n"
    code, out, _ = run(capsys, "prune", "--idle", "1h", "--json", "-y")
    assert code == 3 and json.loads(out) == fake.report.to_json()


def test_prune_needs_a_criterion_and_yes_without_a_terminal(fake, capsys):
    code, out, err = run(capsys, "prune")
    assert (code, out) == (2, "") and err.startswith("orchestrator: UsageError: prune needs a criterion: --idle")
    code, out, err = run(capsys, "prune", "--idle", "0")
    assert (code, out) == (2, "") and err.count("\n") == 1 and "only with --yes" in err
    assert not [call for call in fake.calls if call[0] == "prune"]
    assert run(capsys, "prune", "--orphans", "--yes")[0] == 0
    assert ("prune", {"idle_for": None, "older_than": None, "hibernate_only": False, "dry_run": False}) in fake.calls


@pytest.mark.parametrize(("answer", "pruned"), [("y\n", True), ("yes\n", True), ("\n", False), ("", False)])
def test_prune_on_a_terminal_shows_what_it_would_do_and_asks(fake, capsys, monkeypatch, answer, pruned):
    monkeypatch.setattr(output, "_isatty", lambda stream: True)
    monkeypatch.setattr("sys.stdin", io.StringIO(answer))
    fake.report = PruneReport([PruneAction("remove", "s1", "idle 2h")], dry_run=False)
    code, out, err = run(capsys, "prune", "--idle", "0")
    prunes = [call[1]["dry_run"] for call in fake.calls if call[0] == "prune"]  # type: ignore[index]
    assert code == 0 and "would remove s1 (idle 2h)\n" in err and "[y/N]" in err
    assert prunes == ([True, False] if pruned else [True])
    assert ("remove s1 (idle 2h)\n" in out) is pruned and ("prune cancelled" in err) is not pruned


def test_image_build_make_default_records_the_base(fake, capsys):
    code, out, err = run(capsys, "image", "build", "--base", "orchestrator-base:bookworm", "--make-default")
    assert code == 0 and out == "orchestrator-sandbox:0123\n"
    recorded = defaults_path()
    assert json.loads(recorded.read_text()) == {"base_image": "orchestrator-base:bookworm"}
    assert "default base image is now orchestrator-base:bookworm" in err
    assert Settings.from_env({"ORCH_STATE_DIR": str(fake.settings.state_dir)}).base_image == (
        "orchestrator-base:bookworm"
    )
    code, out, _ = run(capsys, "image", "build", "--rebuild", "--json")
    assert code == 0 and json.loads(out) == {
        "image": "orchestrator-sandbox:0123",
        "base_image": "orchestrator-base:bookworm",
        "default_recorded": None,
    }
    assert ("build", True) in fake.calls


def test_no_engine_is_one_line_and_exit_6(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("ORCH_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("ORCH_RUNTIME_DIR", str(tmp_path / "run"))

    def no_engine(settings: Settings) -> None:
        raise EngineUnavailable("no Docker engine answers at unix:///x;\nstart one with scripts/setup-engine")

    monkeypatch.setattr(cli, "connect", no_engine)
    code, out, err = run(capsys, "inspect", "s1")
    assert code == Exit.ENGINE == 6 and out == ""
    assert err == (
        "orchestrator: EngineUnavailable: no Docker engine answers at unix:///x; start one with scripts/setup-engine\n"
    )


def test_ls_of_an_empty_store_needs_no_engine(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("ORCH_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("ORCH_RUNTIME_DIR", str(tmp_path / "run"))

    def no_engine(settings: Settings) -> None:
        raise AssertionError("ls of an empty store connected to the engine")

    monkeypatch.setattr(cli, "connect", no_engine)
    code, out, err = run(capsys, "ls")
    assert (code, out) == (0, "") and err.startswith("orchestrator: no sessions (state dir ")
    assert run(capsys, "ls", "--json") == (0, "[]\n", "")
    assert run(capsys, "ls", "-q", "--filter", "status=running") == (0, "", "")


def test_a_bad_setting_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setenv("ORCH_EXEC_TIMEOUT", "soon")
    code, _, err = run(capsys, "ls")
    assert code == 2 and err.startswith("orchestrator: ConfigError: ORCH_EXEC_TIMEOUT")


def test_an_unexpected_error_is_still_one_line(fake, capsys):
    fake.list_sessions = lambda **_: 1 / 0  # type: ignore[assignment,method-assign,misc]
    code, out, err = run(capsys, "ls")
    assert code == Exit.FAILED and out == ""
    assert err == "orchestrator: ZeroDivisionError: division by zero (unexpected: run with -v for the traceback)\n"


# ---------------------------------------------------------------------------- the shell's input


def feed(lines: list[str], *, blank_ends_block: bool = True) -> list[str]:
    sent: list[str] = []
    buffer = shell.InputBuffer(sent.append, blank_ends_block=blank_ends_block)
    for line in lines:
        buffer.push(line)
    buffer.flush()
    return sent


def test_is_complete_follows_the_repl():
    assert shell.is_complete("x = 1") is True
    assert shell.is_complete("def f():") is None
    assert shell.is_complete("x = (1,") is None
    assert shell.is_complete("a b") is False


def test_input_is_sent_block_by_block_like_the_repl():
    assert feed(["x = 1", "def f():", "    return x", "", "f()"]) == ["x = 1", "def f():\n    return x\n", "f()"]


def test_a_blank_line_inside_brackets_does_not_end_the_input():
    assert feed(["x = (1,", "", "2)"]) == ["x = (1,\n\n2)"]


def test_a_new_statement_after_a_block_ends_it_without_a_blank_line():
    assert feed(["for i in range(2):", "    y = i", "z = 1"]) == ["for i in range(2):\n    y = i", "z = 1"]


def test_from_a_pipe_blank_lines_stay_inside_a_block():
    lines = ["def f(a):", "    b = a + 1", "", "    return b", "print(f(1))"]
    assert feed(lines, blank_ends_block=False) == ["def f(a):\n    b = a + 1\n\n    return b", "print(f(1))"]
    assert feed(lines) == ["def f(a):\n    b = a + 1\n", "    return b", "print(f(1))"]


def test_invalid_and_unfinished_input_is_sent_for_the_sandbox_to_report():
    assert feed(["1 +"]) == ["1 +"]
    assert feed(["if x:", "  y = (1,"]) == ["if x:\n  y = (1,"]
    assert feed(["", "   ", "# just a comment"]) == ["# just a comment"]


def make_shell(fake: FakeOrchestrator, stdin: str) -> tuple[shell.Shell, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    ctx = commands.Context(fake.settings, output.Output(out, err), lambda settings: fake)  # type: ignore[arg-type,return-value]
    return shell.Shell(ctx, "s1", timeout=None, stdin=io.StringIO(stdin)), out, err


def test_shell_from_a_pipe_runs_each_block_without_prompts(fake):
    fake.results += [ExecResult(), ExecResult(stdout="2\n"), ExecResult(return_value="3")]
    sh, out, err = make_shell(fake, "x = 1\nfor i in range(2):\n    print(i)\n\nx + 2\n")
    assert sh.main() == 0
    assert fake.sessions[0].codes == [("x = 1", None), ("for i in range(2):\n    print(i)\n", None), ("x + 2", None)]
    assert out.getvalue() == "2\n3\n" and err.getvalue() == ""
    assert fake.sessions[0].state is SessionState.DETACHED


def test_shell_shows_errors_and_goes_on(fake):
    error = ExecError("NameError", "name 'y' is not defined", 1, "y", "Traceback ...\nNameError: name 'y'\n")
    fake.results += [ExecResult(error=error), SandboxCrashed("worker died; restored"), ExecResult(return_value="1")]
    sh, out, err = make_shell(fake, "y\nimport os; os._exit(1)\n1\n")
    assert sh.main() == 0
    assert err.getvalue() == "Traceback ...\nNameError: name 'y'\norchestrator: SandboxCrashed: worker died; restored\n"
    assert out.getvalue() == "1\n"


def test_shell_ends_when_the_session_is_taken_over(fake):
    fake.results.append(SessionAttachedElsewhere("attached by another controller"))
    sh, _, _ = make_shell(fake, "1\n2\n")
    with pytest.raises(SessionAttachedElsewhere):
        sh.main()
    assert len(fake.sessions[0].codes) == 1


def test_shell_ctrl_c_drops_the_input_being_typed(fake):
    sh, _, err = make_shell(fake, "")
    sh.session = fake.attach("s1")
    typed: list[object] = ["def f():", KeyboardInterrupt(), "x = 1", EOFError()]

    def read(prompt: str) -> str:
        item = typed.pop(0)
        if isinstance(item, BaseException):
            raise item
        assert isinstance(item, str)
        return item

    sh.loop(read)
    assert fake.sessions[0].codes == [("x = 1", None)]
    assert "KeyboardInterrupt" in err.getvalue()


def test_shell_ctrl_c_during_a_call_abandons_it_and_attaches_again(fake):
    fake.results += [KeyboardInterrupt(), ExecResult(return_value="41")]
    sh, out, err = make_shell(fake, "import time; time.sleep(60)\nx\n")
    assert sh.main() == 0
    first, second = fake.sessions
    assert first.state is SessionState.DETACHED and second.state is SessionState.DETACHED
    assert second.codes == [("x", None)] and out.getvalue().endswith("41\n")
    assert "the call was abandoned" in err.getvalue()


def test_exec_json_of_an_error_result():
    error = ExecError("ValueError", "bad", 2, "raise ValueError('bad')", "Traceback ...\n")
    document = render.exec_json("s1", replace(ExecResult(), error=error))
    assert document["ok"] is False and document["error"]["type"] == "ValueError" and document["error"]["line"] == 2


# ---------------------------------------------------------------------------- text from the sandbox

CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4=\x07"  # OSC 52: set the clipboard
CLEAR = "\x1b[2J\x1b[H"
FORGED = "\rorchestrator: all good, nothing to see\n"  # a carriage return to overwrite the line, then ours
BIDI = "evil\u202etxt.exe"
HOSTILE = f"out{CLIPBOARD}{CLEAR}\n{FORGED}orchestrator: InfoLeak: fake note\n{BIDI}\n"


def no_control(text: str) -> bool:
    """Nothing a terminal would act on: only printable characters, newlines and tabs."""
    return all(c.isprintable() or c in "\n\t" for c in text)


def test_exec_output_on_a_terminal_or_with_escape_shows_control_characters_escaped(fake, capsys):
    name = f"x{CLEAR}\norchestrator: saved"
    fake.results.append(
        ExecResult(stdout=HOSTILE, stderr=HOSTILE, return_value=repr(BIDI), newly_unsaved={name: f"gen{CLIPBOARD}\r!"})
    )
    code, out, err = run(capsys, "exec", "s1", "1", "--escape")
    assert code == 0 and no_control(out) and no_control(err)
    assert "\\x1b]52;c;cm0gLXJmIH4=\\x07" in out and "\\x1b[2J" in out and "\\u202e" in out
    for stream in (out, err):  # no line the sandbox wrote passes for ours
        forged = [line for line in stream.splitlines() if line.startswith("orchestrator")]
        assert forged == [line for line in forged if line.startswith("orchestrator: not saved")]
    assert "[sandbox] orchestrator: InfoLeak: fake note" in out
    assert "\\rorchestrator: all good" in out, "a carriage return cannot take a line back"
    (note,) = [line for line in err.splitlines() if line.startswith("orchestrator: not saved")]
    assert note == (
        "orchestrator: not saved (lost if the sandbox restarts): x\\x1b[2J\\x1b[H\\norchestrator: saved: "
        "gen\\x1b]52;c;cm0gLXJmIH4=\\x07\\r!"
    )


def test_exec_output_to_a_pipe_is_the_programs_own_bytes_and_raw_passes_them(fake, capsys):
    fake.results.append(ExecResult(stdout=HOSTILE, newly_unsaved={f"n{CLEAR}": "r"}))
    _code, out, err = run(capsys, "exec", "s1", "1")  # captured: not a terminal
    assert out == HOSTILE
    assert err == "orchestrator: not saved (lost if the sandbox restarts): n\\x1b[2J\\x1b[H: r\n", "notes: escaped"
    fake.results.append(ExecResult(stdout=HOSTILE))
    assert run(capsys, "exec", "s1", "1", "--raw")[1] == HOSTILE


def test_exec_on_a_terminal_escapes_and_raw_does_not(fake):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for mode, expected_raw in (("auto", False), ("raw", True)):
        out, err = Terminal(), Terminal()
        fake.results.append(ExecResult(stdout=HOSTILE, stderr=HOSTILE))
        render.write_exec_result(output.Output(out, err, sandbox_text=mode), fake.attach("s1").execute("1"))
        assert (out.getvalue() == HOSTILE) is expected_raw and (err.getvalue() == HOSTILE) is expected_raw
        assert no_control(out.getvalue()) is not expected_raw


def test_logs_are_escaped_even_to_a_pipe_unless_raw(fake, capsys):
    fake.log = HOSTILE
    code, out, _ = run(capsys, "logs", "s1")
    assert code == 0 and no_control(out) and "[sandbox] orchestrator: InfoLeak" in out
    assert run(capsys, "logs", "s1", "--raw")[1] == HOSTILE
    code, out, _ = run(capsys, "logs", "s1", "--json")
    assert no_control(out) and json.loads(out)["log"] == HOSTILE


def test_raw_and_escape_exclude_each_other(capsys):
    code, _, err = run(capsys, "exec", "s1", "1", "--raw", "--escape")
    assert code == Exit.USAGE and "not allowed with" in err


def test_errors_tables_and_prune_lines_show_sandbox_text_on_one_line(fake, capsys):
    fake.errors[("attach", "s1")] = ProtocolError(f"the agent said {CLEAR}\rorchestrator: fine{BIDI}")
    code, _, err = run(capsys, "exec", "s1", "1")
    assert code == Exit.SANDBOX and err.count("\n") == 1 and no_control(err)
    fake.infos = [info("s1", status=SessionStatus.BROKEN, image=f"img{CLIPBOARD}", problem=f"bad name {FORGED}")]
    for argv in (("ls",), ("inspect", "s1")):
        code, out, _ = run(capsys, *argv)
        assert code == 0 and no_control(out), argv
        assert not any(line.startswith("orchestrator") for line in out.splitlines()), argv
    fake.report = PruneReport([PruneAction("quarantine-record", "s1", f"unreadable: {FORGED}{CLIPBOARD}")], False)
    code, out, _ = run(capsys, "prune", "--orphans", "--yes")
    assert code == 0 and no_control(out) and len(out.splitlines()) == 2


def test_shell_notes_start_like_ours_and_its_output_follows_the_same_rules(fake):
    fake.results += [ExecResult(stdout=HOSTILE, return_value=repr(CLEAR))]
    sh, out, _err = make_shell(fake, "1\n")
    sh.out.sandbox_text = "escape"
    assert sh.main() == 0
    assert no_control(out.getvalue()) and "[sandbox] orchestrator: InfoLeak" in out.getvalue()


def test_log_records_quoting_the_sandbox_cannot_start_a_line(capsys):
    import logging

    from orchestrator.safe_text import VisibleFormatter

    record = logging.LogRecord("orchestrator.x", logging.INFO, __file__, 1, "got %s", (FORGED + CLEAR,), None)
    text = VisibleFormatter("%(levelname)s %(name)s: %(message)s").format(record)
    assert no_control(text)
    assert all(line.startswith("    ") for line in text.splitlines()[1:])


# ---------------------------------------------------------------------------- ownership


HELD = SessionHeld(
    "session s1 is held by a live controller (pid 4242 on host h, since 2026-11-26 09:00:00 UTC, renewed 0.5 s ago); "
    "nothing was changed. Wait until it detaches or closes the session, or take it over with --force",
    host="h",
    pid=4242,
    since=0.0,
)


@pytest.mark.parametrize(("argv", "method"), [(["exec", "s2", "1"], "attach"), (["rm", "s2"], "remove"),
                                              (["resume", "s2"], "resume"), (["shell", "s2"], "attach"),
                                              (["rewind", "s2", "2"], "rewind")])  # fmt: skip
def test_a_session_a_live_controller_holds_is_refused_in_one_line_and_taken_with_force(
    fake, capsys, monkeypatch, argv, method
):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    fake.errors[(method, "s2")] = HELD
    code, out, err = run(capsys, *argv)
    assert (code, out) == (Exit.UNAVAILABLE, "") and ("force", "s2") not in fake.calls
    assert err.count("\n") == 1 and "SessionHeld" in err and "pid 4242 on host h" in err and "--force" in err
    del fake.errors[(method, "s2")]
    fake.results.append(ExecResult(return_value="1"))
    assert run(capsys, *argv, "--force")[0] == Exit.OK
    assert ("force", "s2") in fake.calls


def test_log_json_writes_json_lines_on_stderr(tmp_path):
    env = {
        **os.environ,
        "ORCH_STATE_DIR": str(tmp_path / "state"),
        "ORCH_RUNTIME_DIR": str(tmp_path / "run"),
        "ORCH_UNKNOWN": "1",  # warned about, in the log
        "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock",  # no engine needed: the warning comes first
    }
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "--log-json", "ls"], capture_output=True, text=True, env=env, timeout=60
    )
    logged = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert [r["logger"] for r in logged] == ["orchestrator.config"] and "ORCH_UNKNOWN" in logged[0]["message"]
    assert logged[0]["level"] == "WARNING"
