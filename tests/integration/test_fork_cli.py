"""``orchestrator fork``, ``history`` and ``rewind`` end to end: ``python -m orchestrator`` on a private store."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pytest
from support import cli_env

from orchestrator import Orchestrator, Session, Settings

pytestmark = pytest.mark.docker


@pytest.fixture
def store(settings_for: Callable[..., Settings], image: str) -> Settings:
    """A store of its own, swept at the end (the forks the CLI makes included)."""
    return settings_for()


@pytest.fixture
def cli(store: Settings) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "orchestrator", *argv],
            capture_output=True,
            text=True,
            env=cli_env(store),
            timeout=120,
        )

    return run


@pytest.fixture
def source(
    store: Settings, make_orch: Callable[[Settings], Orchestrator], new_session: Callable[..., Session]
) -> Session:
    """A session of the store, held by a live controller (this test's orchestrator), with two generations."""
    session = new_session(make_orch(store))
    session.execute("data = {'a': [1, 2, 3]}\nbig = 'x' * (4 << 20)")
    session.execute("def total():\n    return sum(data['a'])")
    return session


def test_fork_exec_history_rewind_from_the_command_line(cli, source: Session) -> None:
    made = cli("fork", source.id, "-n", "2", "--label", "orchestrator.test.branch=b")
    assert made.returncode == 0, made.stderr
    forks = made.stdout.split()  # one id a line: $(orchestrator fork ID) works
    assert len(forks) == 2 and all(fork != source.id for fork in forks)

    # Each fork was left detached and running: exec attaches it without --force, its state is the source's.
    used = cli("exec", forks[0], "data['a'].append(4)\ntotal(), len(big)")
    assert (used.returncode, used.stdout) == (0, f"(10, {4 << 20})\n"), used.stderr
    assert cli("exec", forks[1], "total()").stdout == "6\n"
    assert source.execute("total()").return_value == "6"  # the source is untouched

    shown = json.loads(cli("inspect", forks[1], "--json").stdout)
    assert shown["forked_from"] == {"session_id": source.id, "generation": source.generation}
    assert shown["labels"]["orchestrator.test.branch"] == "b" and shown["shared_bytes"] >= 4 << 20
    assert shown["history_bytes"] >= shown["checkpoint_bytes"] and shown["generations_kept"] >= 1
    text = cli("inspect", forks[1]).stdout
    assert f"forked from         {source.id} at generation {source.generation}" in text
    assert json.loads(cli("ls", "--json").stdout)[0]["shared_bytes"] is None  # ls stats no blob

    # history: the fork's first generation is the source's, then the exec's.
    table = cli("history", forks[0])
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split()[:5] == ["GENERATION", "COMMITTED", "NAMES", "SIZE", "CURRENT"]
    assert rows[-1].split()[4] == "*" and all(row.split()[4] == "-" for row in rows[:-1])
    generations = json.loads(cli("history", forks[0], "--json").stdout)
    assert [g["current"] for g in generations][-1] is True and "data" in generations[-1]["changed"]
    before = generations[-2]["generation"]

    # rewind the fork to before its exec: a new generation, the append undone.
    back = cli("rewind", forks[0], str(before))
    assert back.returncode == 0, back.stderr
    assert int(back.stdout) == generations[-1]["generation"] + 1 and f"generation {before}'s state" in back.stderr
    assert cli("exec", forks[0], "total()").stdout == "6\n"
    again = json.loads(cli("rewind", forks[0], str(before), "--json").stdout)
    assert again["id"] == forks[0] and again["rewound_from"] == before and again["current"] is True


def test_rewind_refuses_a_live_owner_and_a_generation_not_kept(cli, source: Session) -> None:
    first = source.history()[-2].generation  # data and big, before total
    held = cli("rewind", source.id, str(first))
    assert held.returncode == 5 and held.stdout == "" and "SessionHeld" in held.stderr
    assert source.execute("total()").return_value == "6"  # nothing changed

    forced = cli("rewind", source.id, str(first), "--force")
    assert forced.returncode == 0, forced.stderr
    assert cli("exec", source.id, "'total' in globals(), data['a']").stdout == "(False, [1, 2, 3])\n"

    missing = cli("rewind", source.id, "999")  # detached by the last command: no force needed
    assert missing.returncode == 4 and missing.stdout == "" and missing.stderr.count("\n") == 1
    assert missing.stderr.startswith(f"orchestrator: GenerationNotFound: session {source.id} keeps no generation 999")
    kept = missing.stderr.partition("it keeps generation ")[2].partition(" (")[0]
    assert str(first) in kept.split(", ")
    fork_at = cli("fork", source.id, "--at", "999", "--json")
    assert fork_at.returncode == 4 and json.loads(fork_at.stdout)["error"]["type"] == "GenerationNotFound"
