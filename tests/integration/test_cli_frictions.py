"""The small frictions a new user met (issue 38, Why 12), each tried as they tried it: the CLI as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_ops_cli import cli, cli_env, make, one_line, store

__all__ = ["cli", "make", "store"]  # the fixtures of the ops CLI's tests, used here

pytestmark = pytest.mark.docker


def test_create_with_a_taken_name_says_the_cli_way(cli, make):
    sid = make()
    for argv in (["create", "--name", sid], ["run", "--name", sid, "x"], ["fork", sid, "--name", sid]):
        taken = cli(*argv)
        assert taken.returncode == 2 and taken.stdout == ""
        one_line(taken.stderr, "ConfigError")
        assert "Orchestrator.attach" not in taken.stderr
        assert f"`orchestrator exec {sid} CODE` uses it" in taken.stderr and "--name" in taken.stderr


def test_a_mistyped_eval_field_names_the_closest(cli, tmp_path: Path):
    submissions = tmp_path / "subs.jsonl"
    submissions.write_text(json.dumps({"id": "a", "code": "x = 1", "test": "assert x == 1"}) + "\n")
    done = cli("eval", str(submissions), "--out", str(tmp_path / "out.jsonl"))
    assert done.returncode == 1
    assert "unknown field(s) test (did you mean tests?)" in done.stderr, done.stderr


def test_the_eval_summary_has_no_rules_and_speaks_of_runs_and_sizes_as_people_do(cli, tmp_path: Path):
    submissions = tmp_path / "subs.jsonl"
    lines = [{"id": "loud", "code": "print('y' * 3_000_000)", "tests": "pass"}]
    submissions.write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = cli("eval", str(submissions), "--out", str(tmp_path / "out.jsonl"), "--max-output", "1m")
    assert done.returncode == 1, done.stderr
    assert "─" not in done.stdout and all(line == line.rstrip() for line in done.stdout.splitlines())
    assert done.stdout.splitlines()[0].split() == ["STATUS", "COUNT"]
    assert "\n1 run: CPU" in done.stdout, done.stdout
    assert "printed more than 1.0 MiB and was stopped" in done.stderr and "1048576" not in done.stderr, done.stderr


def test_labels_as_docker_takes_them(cli):
    made = cli("create", "-q", "--name", "lab-1", "--label", "team=a", "--label", "orchestrator.test.x=1")
    assert made.returncode == 0, made.stderr
    assert cli("ls", "-q", "--filter", "label=team=a").stdout == "lab-1\n"
    assert cli("ls", "-q", "--filter", "label=team").stdout == "lab-1\n"
    assert cli("ls", "-q", "--filter", "label=team=b").stdout == ""
    assert "labels              orchestrator.test.x=1, team=a\n" in cli("inspect", "lab-1").stdout
    forked = cli("fork", "lab-1", "-q", "--name", "lab-2", "--label", "team=b")
    assert forked.returncode == 0, forked.stderr
    assert cli("ls", "-q", "--filter", "label=team=b").stdout == "lab-2\n"
    stored = json.loads(cli("inspect", "lab-2", "--json").stdout)["labels"]
    assert stored["orchestrator.label.team"] == "b"  # under our prefix for the API and the engine


def test_a_second_exec_waits_its_turn_and_no_wait_fails_at_once(cli, make, store):
    sid = make("x = 41")
    first = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "exec", sid, "import time; time.sleep(4); x += 1"],
        env=cli_env(store),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_until_held(cli, sid)  # --no-wait, the behaviour before: exit 5 (SessionHeld) at once
        bounded = cli("exec", sid, "x", "--wait", "1s")
        assert bounded.returncode == 5 and "waited 1s" in bounded.stderr, bounded.stderr
        second = cli("exec", sid, "x")  # as two terminals on one REPL: the second runs after the first
        assert second.returncode == 0, second.stderr
        assert second.stdout == "42\n"
        assert "is busy" in second.stderr and "waiting for its turn" in second.stderr
    finally:
        out, err = first.communicate(timeout=60)
    assert first.returncode == 0 and out == "", err


def _wait_until_held(cli, sid: str) -> None:
    """Until the first command holds the session: ``--no-wait`` is refused (before, the probe's own cell runs)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if cli("exec", sid, "None", "--no-wait").returncode == 5:
            return
        time.sleep(0.1)
    raise AssertionError(f"session {sid} was never held")
