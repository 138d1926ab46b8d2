"""Quiet by default (issue 38): a user sees what happened to their code, not the library's inner workings.

The CLI as a user runs it (a subprocess on a private store): a crash or an OOM is one line, the demo
has no log lines, ``logs`` shows what the sandbox printed (the agent's connection lines with ``--agent``),
and "not saved" is said once, when a name first fails, and listed by ``inspect``.
"""

from __future__ import annotations

import json

import pytest
from test_ops_cli import cli, make, one_line, store

__all__ = ["cli", "make", "store"]  # the fixtures of the ops CLI's tests, used here

pytestmark = pytest.mark.docker

NOT_SAVED = "orchestrator: not saved (lost if the sandbox restarts): "


def test_a_crash_and_an_oom_are_one_line_without_the_librarys_warnings(cli, make):
    sid = make()
    crashed = cli("exec", sid, "import os; os._exit(3)")
    assert crashed.returncode == 7
    one_line(crashed.stderr, "SandboxCrashed")
    assert cli("exec", sid, "x").stdout == "41\n"
    starved = cli("run", "-q", "--rm", "b = bytearray(2**30)", ORCH_MEM_LIMIT="256m")
    assert starved.returncode == 7
    one_line(starved.stderr, "SandboxOutOfMemory")


def test_the_demo_prints_no_log_lines(cli):
    demo = cli("demo")
    assert demo.returncode == 0, demo.stderr
    assert "WARNING" not in demo.stdout + demo.stderr and "orchestrator.wire" not in demo.stdout + demo.stderr
    assert "SandboxCrashed" in demo.stdout


def test_logs_shows_what_the_sandbox_printed_and_the_agents_lines_with_agent(cli, make):
    sid = make()
    for _ in range(3):  # each command's connection leaves an agent line in the container log
        assert cli("exec", sid, "x").returncode == 0
    assert cli("exec", sid, "import os; n = os.write(2, b'from fd 2\\n')").returncode == 0
    logs = cli("logs", sid)
    assert (logs.returncode, logs.stdout, logs.stderr) == (0, "from fd 2\n", "")
    assert json.loads(cli("logs", sid, "--json").stdout)["log"] == "from fd 2\n"
    tail = cli("logs", sid, "--tail", "1")  # the last line the user would see, not the last agent line
    assert tail.stdout == "from fd 2\n"
    everything = cli("logs", sid, "--agent", "--tail", "all")
    assert everything.returncode == 0 and "from fd 2\n" in everything.stdout
    assert "[sandbox] orchestrator agent: connection ended" in everything.stdout


def test_not_saved_is_said_once_when_a_name_first_fails_and_inspect_lists_it(cli, make):
    sid = make()
    made = cli("exec", sid, "g = (i for i in range(3))")
    assert made.returncode == 0
    assert made.stderr == NOT_SAVED + "g: TypeError: cannot pickle 'generator' object\n"
    later = cli("exec", sid, "1 + 1")
    assert (later.returncode, later.stdout, later.stderr) == (0, "2\n", "")
    another = cli("exec", sid, "import socket; s = socket.socket()")
    assert another.stderr == NOT_SAVED + "s: TypeError: cannot pickle 'socket' object\n"
    shown = cli("inspect", sid)
    assert "not saved           g, s (lost if the sandbox restarts)\n" in shown.stdout
    assert json.loads(cli("inspect", sid, "--json").stdout)["unsaved"] == {
        "g": "TypeError: cannot pickle 'generator' object",
        "s": "TypeError: cannot pickle 'socket' object",
    }
    assert json.loads(cli("exec", sid, "--json", "2 + 2").stdout)["newly_unsaved"] == {}
    assert cli("exec", sid, "del g, s").stderr == ""
    assert "not saved           -\n" in cli("inspect", sid).stdout
    again = cli("exec", sid, "g = (i for i in range(3))")  # a name that fails anew is said anew
    assert again.stderr == NOT_SAVED + "g: TypeError: cannot pickle 'generator' object\n"


def test_the_api_keeps_listing_every_unsaved_name_and_says_which_are_new(store, make_orch, new_session):
    session = new_session(make_orch(store))
    first = session.execute("g = (i for i in range(3))")
    assert set(first.unsaved) == set(first.newly_unsaved) == {"g"}
    later = session.execute("1 + 1")
    assert set(later.unsaved) == {"g"} and later.newly_unsaved == {}
