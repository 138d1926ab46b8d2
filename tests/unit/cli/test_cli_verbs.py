"""The CLI's docker-like verbs on a fake Orchestrator: create and run, and a cell's output streamed piece by piece."""

from __future__ import annotations

import io
import json

import pytest

from orchestrator import ExecError, ExecResult
from orchestrator.api.session import SessionState
from orchestrator.cli import output, render

from . import test_cli

fake = test_cli.fake  # the fake Orchestrator fixture of the CLI's unit tests
run = test_cli.run


# ---------------------------------------------------------------------------- create and run


def test_create_prints_the_id_and_leaves_the_session_running(fake, capsys):
    code, out, err = run(capsys, "create", "--name", "mine", "--label", "orchestrator.me.team=a", "--image", "img")
    assert (code, out) == (0, "mine\n") and "orchestrator exec mine CODE" in err
    assert ("create", ("mine", "img", {"orchestrator.me.team": "a"})) in fake.calls
    assert fake.sessions[-1].state is SessionState.DETACHED and fake.closed
    assert run(capsys, "create", "-q") == (0, "s0123456789ab\n", "")
    code, out, _ = run(capsys, "create", "--json")
    assert json.loads(out) == {"id": "s0123456789ab", "image": "orchestrator-sandbox:0123", "status": "running"}


def test_run_creates_then_runs_with_the_exit_status_of_the_cell(fake, capsys):
    fake.results.append(ExecResult(stdout="hi\n", return_value="2"))
    code, out, err = run(capsys, "run", "-q", "print('hi')\n1 + 1")
    assert (code, out, err) == (0, "hi\n2\n", "")
    assert fake.sessions[-1].state is SessionState.DETACHED  # it keeps running
    fake.results.append(ExecResult(error=ExecError("ZeroDivisionError", "division by zero", 1, "1 / 0", "Traceback\n")))
    code, out, err = run(capsys, "run", "--rm", "1 / 0")
    assert (code, out, err) == (1, "", "Traceback\n") and fake.sessions[-1].state is SessionState.CLOSED


@pytest.mark.parametrize("argv", [["create", "--label", "nokey"], ["run"], ["create", "--label", "=v"]])
def test_create_and_run_usage_errors(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and "UsageError" in err


# ---------------------------------------------------------------------------- streamed output


@pytest.mark.parametrize(
    ("pieces", "shown"),
    [
        (["a\nor", "ch", "estrator: x\n"], "a\n[sandbox] orchestrator: x\n"),
        (["orc", "\n", "o", "k\n"], "orc\nok\n"),
        (["x orchestrator\n", "orchestrator"], "x orchestrator\n[sandbox] orchestrator"),
        (["\x1b[2J", "or"], "\\x1b[2Jor"),
        (["or"], "or"),  # held back until the end, then written as it is
    ],
)
def test_streamed_pieces_are_marked_and_escaped_as_whole_lines_would_be(pieces, shown):
    stdout = io.StringIO()
    live = render.LiveOutput(output.Output(stdout, io.StringIO(), sandbox_text="escape"))
    for piece in pieces:
        live.write("stdout", piece, piece.encode())
    live.finish()
    assert stdout.getvalue() == shown == output.shown("".join(pieces))


def test_streamed_pieces_pass_raw_to_a_pipe_and_the_value_starts_a_new_line(fake, capsys):
    fake.results.append(ExecResult(stdout="no newline \x1b[1m", return_value="3"))
    assert run(capsys, "exec", "s1", "x")[1] == "no newline \x1b[1m\n3\n"
