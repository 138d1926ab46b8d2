"""What a new user types first, run as they would (``python -m orchestrator ...``): a mistyped command or choice
names the closest one, and ``--help`` is plain text (issue 38, Why 12). No engine is needed: parsing fails first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def orchestrator(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *argv], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


@pytest.mark.parametrize(
    ("argv", "meant"),
    [
        (["exc", "s1", "x"], "exec"),
        (["lst"], "list"),
        (["image", "biuld"], "build"),
        (["ls", "--format", "jsn"], "json"),
    ],
)
def test_a_mistyped_command_or_choice_names_the_closest(argv: list[str], meant: str) -> None:
    done = orchestrator(*argv)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("orchestrator: UsageError: ")
    assert f"(did you mean {meant}?)" in done.stderr, done.stderr


def test_a_word_like_no_command_gets_no_guess() -> None:
    done = orchestrator("zzzzzz")
    assert done.returncode == 2 and "did you mean" not in done.stderr and "choose from ls, list" in done.stderr


def test_help_is_plain_text_without_rest_markup() -> None:
    for argv in ([], ["exec"], ["logs"], ["eval"]):
        shown = orchestrator(*argv, "--help")
        assert shown.returncode == 0 and "``" not in shown.stdout, argv
    assert "The orchestrator command: create, list" in orchestrator("--help").stdout
