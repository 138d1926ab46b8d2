"""``fork``, ``history`` and ``rewind`` on a fake Orchestrator, and what ``inspect`` says of forks and history."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from orchestrator import Generation, GenerationNotFound
from orchestrator.api.session import SessionState
from orchestrator.cli import render
from orchestrator.cli.output import Exit

from . import test_cli

fake = test_cli.fake  # the fake Orchestrator fixture of the CLI's unit tests
run = test_cli.run
info = test_cli.info
NOW = test_cli.NOW

NOT_KEPT = GenerationNotFound(
    "session s1 keeps no generation 99; it keeps generation 2, 3 (Settings.limits.history_generations keeps more)"
)


# ---------------------------------------------------------------------------- fork


def test_fork_prints_one_id_a_line_and_leaves_the_forks_running(fake, capsys):
    code, out, err = run(capsys, "fork", "s1", "-n", "3", "--label", "orchestrator.me.branch=b")
    assert (code, out) == (0, "f0\nf1\nf2\n")
    assert err.count("\n") == 1 and "forked s1 at generation 3 into 3" in err and "orchestrator exec f0 CODE" in err
    assert ("fork", (3, None, {"orchestrator.me.branch": "b"})) in fake.calls
    assert all(s.state is SessionState.DETACHED for s in fake.sessions) and fake.closed  # attachable later
    assert run(capsys, "fork", "s1", "-q") == (0, "f0\n", "")


def test_fork_names_its_forks_one_name_each(fake, capsys):
    assert run(capsys, "fork", "s1", "--name", "try-1", "--name", "try-2", "-q") == (0, "try-1\ntry-2\n", "")
    assert ("fork", (2, None, {})) in fake.calls
    assert run(capsys, "fork", "s1", "--name", "try-3", "-n", "1", "-q")[1] == "try-3\n"
    code, out, err = run(capsys, "fork", "s1", "--name", "try-1", "-n", "2")
    assert (code, out) == (Exit.USAGE, "") and err.startswith("orchestrator: UsageError: -n 2 with 1 --name")


def test_fork_json_and_at(fake, capsys):
    code, out, err = run(capsys, "fork", "s1", "--at", "2", "-n", "2", "--json")
    assert (code, err) == (0, "") and ("fork", (2, 2, {})) in fake.calls
    assert json.loads(out) == [
        {"id": "f0", "forked_from": {"session_id": "s1", "generation": 2}, "generation": 3},
        {"id": "f1", "forked_from": {"session_id": "s1", "generation": 2}, "generation": 3},
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["fork"],
        ["fork", "s1", "-n", "0"],
        ["fork", "s1", "-n", "two"],
        ["fork", "s1", "--at", "-1"],
        ["fork", "s1", "--label", "nokey"],
        ["rewind", "s1"],
        ["rewind", "s1", "x"],
        ["history"],
    ],
)
def test_usage_errors_are_one_line_and_exit_2(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert (code, out) == (Exit.USAGE, "") and err.count("\n") == 1 and err.startswith("orchestrator: UsageError: ")


def test_a_generation_not_kept_is_one_line_naming_the_kept_ones_exit_4(fake, capsys):
    fake.errors[("fork", "s1")] = NOT_KEPT
    code, out, err = run(capsys, "fork", "s1", "--at", "99")
    assert (code, out) == (Exit.NOT_FOUND, "") and err == f"orchestrator: GenerationNotFound: {NOT_KEPT}\n"
    fake.errors[("rewind", "s1")] = NOT_KEPT
    code, out, err = run(capsys, "rewind", "s1", "99", "--json")
    assert code == 4 and err.count("\n") == 1 and "it keeps generation 2, 3" in err
    assert json.loads(out)["error"] == {"type": "GenerationNotFound", "message": str(NOT_KEPT), "exit_code": 4}


def test_fork_of_a_missing_session_exits_4_with_the_ls_hint(fake, capsys):
    fake.errors[("fork", "nope")] = test_cli.SessionNotFound("no session 'nope' in /state/sessions")
    code, out, err = run(capsys, "fork", "nope")
    assert (code, out) == (4, "") and err.endswith(test_cli.LS_HINT)


# ---------------------------------------------------------------------------- history


def test_history_table_one_field_per_cell_oldest_first(fake, capsys):
    now = time.time()
    fake.generations = [replace(g, at=now - (192.5 if g.generation == 2 else 40.5)) for g in fake.generations]
    code, out, err = run(capsys, "history", "s1")
    assert (code, err) == (0, "")
    header, first, current = out.splitlines()
    assert header.split() == ["GENERATION", "COMMITTED", "NAMES", "SIZE", "CURRENT", "REWOUND-FROM", "CHANGED"]
    assert first.split()[:5] == ["2", "3m12s", "1", "100B", "-"] and first.split()[-1] == "data"
    assert current.split()[2:] == ["2", "5.0MiB", "*", "-", "data,extra"]


def test_history_json_is_every_generation_field(fake, capsys):
    fake.generations = [Generation(4, NOW, ("x",), 1, 10, True, rewound_from=2, unsaved={"sock": "cannot pickle"})]
    code, out, _ = run(capsys, "history", "s1", "--json")
    assert code == 0 and json.loads(out) == [
        {
            "generation": 4,
            "at": NOW,
            "changed": ["x"],
            "names": 1,
            "size": 10,
            "current": True,
            "rewound_from": 2,
            "unsaved": {"sock": "cannot pickle"},
        }
    ]


def test_history_shows_hostile_names_on_one_field_and_fits_the_terminal():
    names = ("a\nb", "\x1b[2Jc", *(f"name_{n}" for n in range(40)))
    generations = [Generation(1, NOW, names, 42, 1, True)]
    columns = render.history_columns(generations, NOW)
    (row,) = render.plain_table(columns).splitlines()[1:]
    assert "\n" not in row and "\x1b" not in row and len(row.split()) == 7
    header, cut = render.plain_table(render.fit_last_column(columns, 80)).splitlines()
    assert len(cut) <= 80 and cut.endswith("…") and header.split()[-1] == "CHANGED"


# ---------------------------------------------------------------------------- rewind


def test_rewind_prints_the_new_generation_and_json(fake, capsys):
    code, out, err = run(capsys, "rewind", "s1", "2")
    assert (code, out) == (0, "9\n") and ("rewind", 2) in fake.calls and ("force", "s1") not in fake.calls
    assert err == "orchestrator: session s1 has generation 2's state again, as generation 9 (changed: data, extra)\n"
    code, out, err = run(capsys, "rewind", "s1", "2", "--json")
    assert (code, err) == (0, "")
    assert json.loads(out) == {
        "id": "s1",
        "generation": 9,
        "at": NOW,
        "changed": ["data", "extra"],
        "names": 2,
        "size": 120,
        "current": True,
        "rewound_from": 2,
        "unsaved": {},
    }


# ---------------------------------------------------------------------------- inspect


def test_inspect_shows_the_origin_the_history_and_what_is_shared(fake, capsys):
    fake.infos = [
        info("f1", forked_from={"session_id": "s1", "generation": 3}, generations_kept=4, history_bytes=5 << 20,
             shared_bytes=4 << 20),
        info("s1"),
    ]  # fmt: skip
    lines = run(capsys, "inspect", "f1")[1].splitlines()
    assert "forked from         s1 at generation 3" in lines and "generations kept    4" in lines
    assert "history             5.0 MiB (5242880 bytes, each blob once)" in lines
    assert any(line.startswith("shared              4.0 MiB (4194304 bytes) with other sessions") for line in lines)
    lines = run(capsys, "inspect", "s1")[1].splitlines()
    assert "forked from         -" in lines and "shared              -" in lines
    document = json.loads(run(capsys, "inspect", "f1", "--json")[1])
    assert document["forked_from"] == {"session_id": "s1", "generation": 3}
    assert (document["generations_kept"], document["history_bytes"], document["shared_bytes"]) == (4, 5 << 20, 4 << 20)
