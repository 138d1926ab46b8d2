"""The state dir's base (``state/private.py``): made 0700, or an existing one checked; an old one of ours closed."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from orchestrator.errors import ConfigError
from orchestrator.state.private import ensure_state_dir
from orchestrator.state.store import SessionStore


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_missing_base_is_made_private_with_its_missing_parents(tmp_path: Path) -> None:
    base = tmp_path / "a" / "b" / "state"
    SessionStore(base)
    assert [mode(p) for p in (base, base.parent, base.parent.parent)] == [0o700] * 3
    assert mode(tmp_path) == 0o700 and (base / "store-id").is_file()


def test_an_open_base_is_refused_naming_it_and_what_to_do(tmp_path: Path) -> None:
    base = tmp_path / "state"
    base.mkdir(mode=0o755)
    os.chmod(base, 0o755)
    with pytest.raises(ConfigError, match=r"has mode 0755.*chmod 700 .*state.*ORCH_STATE_DIR"):
        SessionStore(base)
    assert mode(base) == 0o755 and os.listdir(base) == []  # not ours to change, nothing written


def test_a_base_an_earlier_version_made_0755_is_closed(tmp_path: Path) -> None:
    base = tmp_path / "state"
    store_id = SessionStore(base).store_id
    os.chmod(base, 0o755)
    assert SessionStore(base).store_id == store_id and mode(base) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user takes root")
def test_another_users_base_is_refused_even_with_a_store_id(tmp_path: Path) -> None:
    base = tmp_path / "state"
    SessionStore(base)
    os.chown(base, 4321, 4321)
    os.chmod(base, 0o755)
    with pytest.raises(ConfigError, match="belongs to uid 4321"):
        SessionStore(base)
    assert mode(base) == 0o755


def test_a_symlink_or_a_file_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(ConfigError, match="symbolic link"):
        ensure_state_dir(tmp_path / "link")
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="not a directory"):
        ensure_state_dir(tmp_path / "file")
