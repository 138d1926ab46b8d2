"""What holds each local sandbox's /workspace: the choice, the fallback, and the sweep of leftovers."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from orchestrator.backends import workspace_image
from orchestrator.backends.base import SANDBOX_ID, WORKER_UID, SandboxSpec
from orchestrator.backends.workspace import Workspaces, filesystem_type, tmpfs_options, worker_uid
from orchestrator.backends.workspace_image import WorkspaceMountFailed
from orchestrator.config import Confinement, ResourceLimits, Settings
from orchestrator.errors import EngineUnavailable

LIMITS = ResourceLimits(workspace_bytes=16 << 20, workspace_files=100)


def spec(**labels: str) -> SandboxSpec:
    return SandboxSpec(name="orch-x", image="img", labels={SANDBOX_ID: "sb-1", WORKER_UID: "2000000007", **labels})


def settings(tmp_path: Path, mount: str = "auto") -> Settings:
    return Settings(runtime_dir=tmp_path, limits=LIMITS, confinement=Confinement(workspace_mount=mount))


def no_live() -> set[str]:
    raise AssertionError("the engine was asked")


def engine_down() -> set[str]:
    raise EngineUnavailable("no engine")


@pytest.fixture
def made(monkeypatch) -> list[Path]:
    """``workspace_image.make`` recorded instead of run; ``made`` holds the directories asked for."""
    calls: list[Path] = []

    def fake_make(directory: Path, owner: int, size: int, entries: int) -> Path:
        calls.append(directory)
        return directory / "mnt"

    monkeypatch.setattr(workspace_image, "make", fake_make)
    return calls


def test_the_worker_owns_the_workspace():
    assert worker_uid(spec(), Settings()) == 2000000007
    bare = SandboxSpec(name="x", image="i", labels={SANDBOX_ID: "sb-1"})
    assert worker_uid(bare, Settings(confinement=Confinement(user="1000:1000"))) == 1000  # it runs the worker itself
    assert worker_uid(bare, Settings()) == 65534  # the agent's own default under a root supervisor


def test_tmpfs_options_bound_bytes_and_entries():
    assert tmpfs_options(LIMITS, 7) == "size=16777216,nr_inodes=101,mode=0700,exec,uid=7,gid=7"
    assert tmpfs_options(LIMITS, None) == "size=16777216,nr_inodes=101,mode=1777,exec"


def test_an_image_where_the_host_allows_one(tmp_path, made):
    mount = Workspaces(refused=lambda root: None).prepare(spec(), settings(tmp_path), set)
    assert made == [tmp_path / "workspaces" / "sb-1"]
    assert mount.volumes == {str(made[0] / "mnt"): {"bind": "/workspace", "mode": "rw"}} and not mount.tmpfs


def test_a_tmpfs_where_it_does_not_and_the_reason_is_remembered(tmp_path, made):
    asked: list[Path] = []
    workspaces = Workspaces(refused=lambda root: asked.append(root) or "not root")
    for _ in range(2):
        mount = workspaces.prepare(spec(), settings(tmp_path), no_live)
        assert mount.tmpfs == {"/workspace": tmpfs_options(LIMITS, 2000000007)} and not mount.volumes
    assert asked == [tmp_path / "workspaces"] and made == []
    with pytest.raises(WorkspaceMountFailed, match="not root; ORCH_WORKSPACE_MOUNT=tmpfs"):
        workspaces.prepare(spec(), settings(tmp_path, "image"), no_live)


def test_tmpfs_when_asked_and_nothing_for_a_container_that_is_no_sandbox(tmp_path, made):
    workspaces = Workspaces(refused=lambda root: None)
    assert workspaces.prepare(spec(), settings(tmp_path, "tmpfs"), no_live).tmpfs
    holder = SandboxSpec(name="net", image="i", labels={})
    assert workspaces.prepare(holder, settings(tmp_path), no_live).tmpfs == {} and made == []


def test_a_first_image_that_fails_turns_images_off_a_later_one_only_its_own(tmp_path, monkeypatch):
    outcomes = iter([WorkspaceMountFailed("no loop device"), None, WorkspaceMountFailed("busy"), None])

    def fake_make(directory: Path, owner: int, size: int, entries: int) -> Path:
        failure = next(outcomes)
        if failure:
            raise failure
        return directory / "mnt"

    monkeypatch.setattr(workspace_image, "make", fake_make)
    first, later = Workspaces(refused=lambda root: None), Workspaces(refused=lambda root: None)
    assert first.prepare(spec(), settings(tmp_path), set).tmpfs and first.prepare(spec(), settings(tmp_path), set).tmpfs
    assert later.prepare(spec(), settings(tmp_path), set).volumes  # the second outcome
    assert later.prepare(spec(), settings(tmp_path), set).tmpfs  # "busy": this one only
    assert later.prepare(spec(), settings(tmp_path), set).volumes


def age(path: Path, seconds: float) -> Path:
    path.mkdir(parents=True)
    then = time.time() - seconds
    os.utime(path, (then, then))
    return path


def test_the_sweep_releases_old_images_of_gone_sandboxes_only(tmp_path, monkeypatch):
    released: list[str] = []
    monkeypatch.setattr(workspace_image, "release", lambda directory: released.append(directory.name))
    root = tmp_path / "workspaces"
    for name in ("sb-gone", "sb-live"):
        age(root / name, 3600)
    age(root / "sb-new", 0)
    age(root / ".probe", 3600)
    Workspaces().sweep(root, lambda: {"sb-live"})
    assert released == ["sb-gone"]
    released.clear()
    Workspaces().sweep(tmp_path / "none", no_live)
    Workspaces().sweep(root, engine_down)  # logged: the next sweep tries again
    Workspaces().sweep(root, lambda: {"sb-live", "sb-gone"})
    assert released == []


def test_a_removed_containers_image_is_released_by_its_mount(tmp_path, monkeypatch):
    released: list[Path] = []
    monkeypatch.setattr(workspace_image, "release", released.append)
    source = tmp_path / "workspaces" / "sb-1" / "mnt"
    mounts = [
        {"Type": "bind", "Source": "/tmp/or/sb-1", "Destination": "/run/orchestrator"},
        {"Type": "bind", "Source": "/etc", "Destination": "/workspace"},
        {"Type": "tmpfs", "Source": "", "Destination": "/workspace"},
        {"Type": "bind", "Source": str(source), "Destination": "/workspace"},
    ]
    Workspaces().release_mounted(mounts, set)
    assert released == [source.parent]


def test_the_file_system_of_a_path_is_its_longest_mount(tmp_path):
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 8:1 / / rw - ext4 /dev/vda rw\n"
        "23 22 0:5 / /run rw shared:2 - tmpfs tmpfs rw\n"
        "24 22 0:6 / /srv/my\\040dir rw - ramfs none rw\n"
        "25 22 0:7 / /runx rw - xfs /dev/b rw\n"
    )
    assert filesystem_type(Path("/run/orchestrator"), str(info)) == "tmpfs"
    assert filesystem_type(Path("/runx/a"), str(info)) == "xfs"
    assert filesystem_type(Path("/srv/my dir/x"), str(info)) == "ramfs"
    assert filesystem_type(Path("/var"), str(info)) == "ext4"
    assert filesystem_type(Path("/var"), str(tmp_path / "missing")) is None
