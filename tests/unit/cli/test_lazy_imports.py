"""Every ``orchestrator`` command imports ``orchestrator.cli`` first: it imports what parsing needs and no more.

The API, the Docker SDK, rich and the MCP SDK cost most of a second to import (issue 38: ``--version`` took
0.65-1.8 s); they are imported when a command needs them. Checked in a fresh interpreter each time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]  # this checkout: ``python -c`` imports from its working directory
HEAVY = ("docker", "rich", "mcp", "anyio", "orchestrator.api.aio", "orchestrator.api.manager", "orchestrator.config")


def loaded_after(code: str, env: dict[str, str] | None = None) -> set[str]:
    """The heavy modules in ``sys.modules`` after ``code`` ran in a new interpreter."""
    probe = f"import sys\n{code}\nprint(__import__('json').dumps(sorted(set(sys.modules) & set({list(HEAVY)!r}))))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env, check=True, cwd=ROOT
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_importing_the_cli_imports_nothing_heavy() -> None:
    assert loaded_after("import orchestrator.cli") == set()


def test_version_and_help_parse_without_importing_the_api() -> None:
    for argv in (["--version"], ["--help"], ["exec", "--help"], ["ls", "--help"]):
        code = "import contextlib, io, orchestrator.cli\nwith contextlib.redirect_stdout(io.StringIO()):\n"
        code += f"    assert orchestrator.cli.main({argv!r}) == 0"
        assert loaded_after(code) == set(), argv


def test_importing_the_package_or_its_errors_imports_nothing_heavy() -> None:
    assert loaded_after("import orchestrator, orchestrator.errors") == set()
    assert "orchestrator.api.aio" in loaded_after("from orchestrator import AsyncSession")


def test_ls_of_an_empty_store_imports_neither_the_engines_sdk_nor_the_api(tmp_path: Path) -> None:
    env = {**os.environ, "ORCH_STATE_DIR": str(tmp_path / "state"), "ORCH_RUNTIME_DIR": str(tmp_path / "run")}
    code = "import orchestrator.cli\nassert orchestrator.cli.main(['ls']) == 0"
    assert loaded_after(code, env) == {"orchestrator.config"}


@pytest.mark.parametrize("command", ["eval", "janitor"])
def test_a_commands_own_options_are_added_when_it_is_parsed(command: str) -> None:
    code = f"import orchestrator.cli\ntry:\n    orchestrator.cli.build_parser().parse_args([{command!r}, '--help'])\n"
    code += "except SystemExit:\n    pass"
    assert "orchestrator.config" in loaded_after(code)  # the module that defines its options was imported
