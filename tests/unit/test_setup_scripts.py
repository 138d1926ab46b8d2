"""The README's set-up never installs into the system's Python, and installs only what its step needs (issue 38).

A new user ran ``scripts/demo`` with their own Python active and got 482 MB of lint and test tools in it. Here
the scripts run in a copy of the checkout with a stub ``python3`` first on ``PATH``: it logs each call (which
interpreter, which arguments) and makes a ``venv`` as asked, so the test sees where pip would install what,
without the network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_STUB = """#!/usr/bin/env bash
echo "$0 $*" >> "$STUB_LOG"
if [ "$1 $2" = "-m venv" ]; then
  mkdir -p "$3/bin" && cp "$0" "$3/bin/python3"
fi
cat > /dev/null  # a script on stdin (the old name's check) is read and ignored
"""


def _checkout(tmp_path: Path) -> Path:
    """A copy of the scripts and a stub ``python3`` (in ``tmp_path/bin``) that logs its calls."""
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "scripts", checkout / "scripts")
    stub = tmp_path / "bin" / "python3"
    stub.parent.mkdir()
    stub.write_text(_STUB)
    stub.chmod(0o755)
    return checkout


def _install(tmp_path: Path, *args: str, venv: str | None = None) -> list[str]:
    """Run ``scripts/install ARGS`` in a fresh copy; the stub's log, one call per line."""
    checkout = _checkout(tmp_path)
    env = {key: value for key, value in os.environ.items() if key != "VIRTUAL_ENV"}
    env.update(PATH=f"{tmp_path / 'bin'}:{env['PATH']}", STUB_LOG=str(tmp_path / "log"))
    if venv is not None:
        env["VIRTUAL_ENV"] = venv
    subprocess.run(["scripts/install", *args], cwd=checkout, env=env, check=True, capture_output=True)
    return (tmp_path / "log").read_text().splitlines()


def test_without_an_active_venv_the_package_goes_into_the_checkouts_own(tmp_path: Path) -> None:
    calls = _install(tmp_path)
    venv_python = str(tmp_path / "checkout" / ".venv" / "bin" / "python3")
    assert calls[0] == f"{tmp_path / 'bin' / 'python3'} -m venv .venv"
    pip = [call for call in calls if " -m pip " in call]
    assert pip == [f"{venv_python} -m pip install -q --disable-pip-version-check -e ."]  # the package alone


def test_the_dev_extra_only_when_asked_and_an_active_venv_is_used_as_it_is(tmp_path: Path) -> None:
    calls = _install(tmp_path, "dev", venv="/opt/their-venv")
    assert not any(" -m venv " in call for call in calls)
    pip = [call for call in calls if " -m pip " in call]
    assert pip == [f"{tmp_path / 'bin' / 'python3'} -m pip install -q --disable-pip-version-check -e .[dev]"]


def test_the_demo_installs_the_package_alone_and_the_tests_the_dev_extra() -> None:
    assert "scripts/install\n" in (ROOT / "scripts" / "demo").read_text()
    assert "scripts/install dev\n" in (ROOT / "scripts" / "test").read_text()
    for script in ("demo", "test", "check", "ensure-image", "rlms-upstream-tests"):
        assert "source scripts/venv.bash" in (ROOT / "scripts" / script).read_text(), script
