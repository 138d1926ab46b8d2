"""One hop's value file (docs/design/one-hop.md, "Value files"): the controller attaches a read-only descriptor of
the staged blob to the ``set_value`` on the worker's data channel, only where the worker cannot change the file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from orchestrator.config import Settings
from orchestrator.runtime.sandbox import Sandbox, ValueFile, _worker_may_run_as


class _LocalSandbox(Sandbox):
    """Only what ``_open_value_file`` reads: the settings (no engine, no channel)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings


def _value(path: Path | None) -> ValueFile:
    return ValueFile(Path("/nonexistent"), lambda: path, "h" + "0" * 32, b"raw")


def _staged(tmp_path: Path, mode: int = 0o600) -> Path:
    path = tmp_path / ".tmp-staged"
    path.write_bytes(b"blob")
    path.chmod(mode)
    return path


def _settings(user: str) -> Settings:
    settings = Settings()
    return settings.replace(confinement=settings.confinement.replace(user=user))


def test_a_staged_blob_goes_as_a_read_only_descriptor(tmp_path: Path) -> None:
    low, high = Settings().confinement.worker_uids
    if low <= os.geteuid() <= high:
        pytest.skip("this controller runs as a uid of the workers' range")
    fd = _LocalSandbox(_settings("0:0"))._open_value_file(_value(_staged(tmp_path)))
    assert fd is not None
    try:
        assert os.read(fd, 10) == b"blob"
        with pytest.raises(OSError):
            os.write(fd, b"x")
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("user", "worker_uids", "uid", "may"),
    [
        ("0:0", (1000, 1010), 1005, True),
        ("0:0", (1000, 1010), 0, False),
        ("1234:1234", (1000, 1010), 1234, True),
        ("1234:1234", (1000, 1010), 1005, False),
    ],
)
def test_the_uids_a_worker_may_run_as(user: str, worker_uids: tuple[int, int], uid: int, may: bool) -> None:
    """A worker running as the file's owner could ``fchmod`` it through the descriptor, or reopen ``/proc/self/fd``
    for writing: then the value goes as the body."""
    settings = Settings()
    settings = settings.replace(confinement=settings.confinement.replace(user=user, worker_uids=worker_uids))
    assert _worker_may_run_as(settings, uid) is may


def test_no_descriptor_when_the_worker_may_run_as_the_controllers_uid(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("a root controller: the container's root starts each worker as a uid of its own")
    settings = _settings(f"{os.geteuid()}:{os.getegid()}")
    assert _LocalSandbox(settings)._open_value_file(_value(_staged(tmp_path))) is None


def test_no_descriptor_for_a_file_others_may_write_or_that_is_not_a_regular_file(tmp_path: Path) -> None:
    sandbox = _LocalSandbox(_settings("0:0"))
    assert sandbox._open_value_file(_value(_staged(tmp_path, 0o622))) is None
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert sandbox._open_value_file(_value(fifo)) is None  # opened without waiting for a writer, then refused
    link = tmp_path / "link"
    link.symlink_to(_staged(tmp_path))
    assert sandbox._open_value_file(_value(link)) is None
    assert sandbox._open_value_file(_value(None)) is None  # staging failed
