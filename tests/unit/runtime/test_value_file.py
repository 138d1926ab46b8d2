"""One hop's value file (docs/design/one-hop.md, "Value files"): the controller attaches a read-only descriptor of a
sealed copy of the staged blob to the ``set_value`` on the worker's data channel, never the stored file's own."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from orchestrator.config import Settings
from orchestrator.runtime.sandbox import Sandbox, ValueFile


class _LocalSandbox(Sandbox):
    """Only what ``_open_value_file`` reads: nothing (no engine, no channel)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings


def _value(path: Path | None) -> ValueFile:
    return ValueFile(lambda: path, "h" + "0" * 32, b"raw")


def _staged(tmp_path: Path, mode: int = 0o600) -> Path:
    path = tmp_path / ".tmp-staged"
    path.write_bytes(b"blob")
    path.chmod(mode)
    return path


def test_a_staged_blob_goes_as_a_sealed_copy_whatever_its_mode(tmp_path: Path) -> None:
    for mode in (0o600, 0o644):
        staged = _staged(tmp_path, mode)
        fd = _LocalSandbox(Settings())._open_value_file(_value(staged))
        assert fd is not None
        try:
            found = os.fstat(fd)
            assert os.read(fd, 10) == b"blob"
            assert (found.st_dev, found.st_ino) != (staged.stat().st_dev, staged.stat().st_ino)
            assert found.st_nlink == 0 and str(tmp_path) not in os.readlink(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)


def test_no_descriptor_for_what_is_not_a_regular_file(tmp_path: Path) -> None:
    sandbox = _LocalSandbox(Settings())
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert sandbox._open_value_file(_value(fifo)) is None  # opened without waiting for a writer, then refused
    link = tmp_path / "link"
    link.symlink_to(_staged(tmp_path))
    assert sandbox._open_value_file(_value(link)) is None
    assert sandbox._open_value_file(_value(None)) is None  # staging failed
