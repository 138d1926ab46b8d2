"""Files written whole (orchestrator.files): one rename, no part ever visible, no temp file left."""

from __future__ import annotations

import os
import stat

import pytest

from orchestrator.files import TEMP_PREFIX, fsync_dir, replace_file, write_temp


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path, follow_symlinks=False).st_mode)


def test_replace_file_creates_then_replaces_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "meta.json"
    replace_file(target, b"one")
    replace_file(target, b"t", bytearray(b"w"), memoryview(b"o"), fsync=True)
    assert target.read_bytes() == b"two"
    assert os.listdir(tmp_path) == ["meta.json"]


def test_the_mode_is_exact_when_given_and_as_open_gives_otherwise(tmp_path):
    old = os.umask(0o077)
    try:
        replace_file(tmp_path / "cert.pem", b"x", mode=0o644)  # the umask would take 0o044 off
        replace_file(tmp_path / "plain", b"x")
        with open(tmp_path / "opened", "wb"):
            pass
    finally:
        os.umask(old)
    assert _mode(tmp_path / "cert.pem") == 0o644
    assert _mode(tmp_path / "plain") == _mode(tmp_path / "opened") == 0o600


def test_a_link_in_the_targets_place_is_replaced_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "target").symlink_to(outside)
    replace_file(tmp_path / "dir" / "target", b"new")
    assert outside.read_bytes() == b"keep"
    assert not (tmp_path / "dir" / "target").is_symlink() and (tmp_path / "dir" / "target").read_bytes() == b"new"


def test_a_failed_write_removes_its_temporary_file_and_keeps_the_old_one(tmp_path):
    target = tmp_path / "blob"
    target.write_bytes(b"old")
    with pytest.raises(TypeError):
        replace_file(target, b"part", "not bytes")  # type: ignore[arg-type]
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["blob"]
    with pytest.raises(FileNotFoundError):
        replace_file(tmp_path / "absent" / "blob", b"x")


def test_write_temp_makes_a_new_complete_file_named_for_cleanup(tmp_path):
    first = write_temp(tmp_path, b"a", b"b", fsync=True, mode=0o600)
    second = write_temp(tmp_path, b"c")
    assert first != second and first.parent == tmp_path
    assert first.name.startswith(TEMP_PREFIX) and second.name.startswith(TEMP_PREFIX)
    assert first.read_bytes() == b"ab" and _mode(first) == 0o600
    fsync_dir(tmp_path)
