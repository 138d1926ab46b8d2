"""Prune and the janitor on the fake engine never delete a blob that a source, a fork or a kept generation still
names; removing the last session that names it frees it."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import FakeBackend, fake_settings

from orchestrator import Orchestrator, Settings
from orchestrator.agent import blob_format
from orchestrator.ops import janitor
from orchestrator.ops.janitor import Janitor

BIG = "x" * 200_000
BIG_BLOB = blob_format.blob_digest(BIG.encode())
HOUR = 3600.0


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return fake_settings(tmp_path, ORCH_HISTORY_GENERATIONS="2")


@pytest.fixture
def orch(settings: Settings) -> Iterator[Orchestrator]:
    with Orchestrator(settings, backend=FakeBackend()) as orch:
        yield orch


@pytest.fixture
def sweep(orch: Orchestrator, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A prune and a janitor pass (on the fake engine) over the store; both must succeed."""
    monkeypatch.setattr(janitor, "connect_engine", lambda settings, store: FakeBackend())
    keeper = Janitor(settings, heartbeat=tmp_path / "heartbeat")

    def run() -> None:
        report = orch.prune()
        assert not report.failed, report.summary()
        assert all(action.ok for action in keeper.run_pass())

    yield run
    keeper.close()


def holders(orch: Orchestrator) -> dict[str, int]:
    """Session id -> inode of its file of the big blob, for every session directory that has one."""
    found = {}
    for directory in orch.store.session_dirs():
        path = directory / "blobs" / BIG_BLOB
        if path.exists():
            found[directory.name] = path.stat().st_ino
    return found


def disk_bytes(state_dir: Path) -> int:
    """Bytes of every file under the state dir, each inode counted once (what the host's disk holds)."""
    seen: dict[int, int] = {}
    for folder, _, names in os.walk(state_dir):
        for name in names:
            info = os.lstat(os.path.join(folder, name))
            seen[info.st_ino] = info.st_size
    return sum(seen.values())


def test_a_shared_blob_outlives_every_session_but_the_last_that_names_it(orch: Orchestrator, sweep) -> None:
    source = orch.create_session()
    source.execute(f"big = {BIG}")
    first, second = orch.fork(source.id, count=2)
    source.execute("big = small")  # the big blob: the source's kept generation, and both forks
    inode = holders(orch)[source.id]
    assert holders(orch) == {source.id: inode, first.id: inode, second.id: inode}
    assert os.stat(orch.store.blob_path(source.id, BIG_BLOB)).st_nlink == 3
    size = len(BIG)
    assert orch.store.shared_bytes(orch.store.load(first.id)) == size

    sweep()
    assert holders(orch) == {source.id: inode, first.id: inode, second.id: inode}  # a kept generation names it

    source.close()
    sweep()
    assert holders(orch) == {first.id: inode, second.id: inode}

    first.close()
    sweep()
    assert holders(orch) == {second.id: inode}
    assert orch.store.shared_bytes(orch.store.load(second.id)) == 0

    second.execute("big = other")  # now only its own kept generation names it
    sweep()
    assert holders(orch) == {second.id: inode}
    second.rewind(second.generation - 1)  # and it is there to come back
    assert orch.store.load(second.id).variables["big"] == BIG_BLOB
    assert second.execute("big = other").ok

    before = disk_bytes(orch.settings.state_dir)
    for n in range(4):  # later generations push the ones naming it out of the history (2 kept), then off the disk
        named = BIG_BLOB in orch.store.load(second.id).named_blobs()
        sweep()
        assert holders(orch) == ({second.id: inode} if named else {})
        if not named:
            break
        second.execute(f"n{n} = {n}")
    assert holders(orch) == {}
    assert disk_bytes(orch.settings.state_dir) < before - size + 1000


def test_removing_the_last_holder_frees_the_bytes(orch: Orchestrator, sweep) -> None:
    source = orch.create_session()
    source.execute(f"big = {BIG}")
    (fork,) = orch.fork(source.id)
    sweep()
    before = disk_bytes(orch.settings.state_dir)
    source.close()
    sweep()
    after_source = disk_bytes(orch.settings.state_dir)
    assert before - after_source < 10_000  # the fork still holds the big blob: only the record and links went
    assert fork.execute("x = 1").ok
    fork.close()
    sweep()
    assert disk_bytes(orch.settings.state_dir) < after_source - len(BIG)
    assert holders(orch) == {}


def test_prune_reports_as_freed_only_the_bytes_no_fork_shares(orch: Orchestrator) -> None:
    source = orch.create_session()
    source.execute(f"big = {BIG}")
    (fork,) = orch.fork(source.id)
    own = "y" * 50_000
    source.execute(f"own = {own}")  # the source's alone
    source.execute("own = z")  # still its alone: a kept generation names it

    def remove(session_id: str) -> int:
        past = time.time() - 2 * HOUR
        os.utime(orch.store.activity_path(session_id), (past, past))
        report = orch.prune(idle_for=HOUR)
        (removed,) = [a for a in report.actions if a.action == "remove"]
        assert removed.ok and removed.target == session_id
        return removed.freed_bytes

    before = disk_bytes(orch.settings.state_dir)
    freed = remove(source.id)
    assert len(own) <= freed < len(own) + 100  # not the big blob: the fork still holds it
    assert before - disk_bytes(orch.settings.state_dir) >= freed
    assert holders(orch) == {fork.id: os.stat(orch.store.blob_path(fork.id, BIG_BLOB)).st_ino}
    assert len(BIG) <= remove(fork.id) < len(BIG) + 100
    assert holders(orch) == {}
