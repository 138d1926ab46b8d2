"""Workspace images on this host: bounded, the owner's alone, and released without deleting into a mount."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.backends import workspace_image
from orchestrator.backends.workspace import images_refused
from orchestrator.backends.workspace_image import (
    WorkspaceMountFailed,
    directory_of_mount,
    image_dir,
    inode_count,
    make,
    release,
)

OWNER = 2_000_000_123
needs_images = pytest.mark.skipif(images_refused(Path("/tmp")) is not None, reason="no workspace images on this host")


@pytest.fixture
def images(tmp_path: Path) -> Path:
    return tmp_path / workspace_image.IMAGES_DIR


@pytest.mark.parametrize(("entries", "size"), [(1, 1 << 20), (100, 16 << 20), (10_000, 1 << 30), (100_000, 8 << 30)])
def test_every_block_group_gets_a_table_block_more(entries, size):
    groups = -(-size // workspace_image.GROUP_BYTES)
    assert inode_count(entries, size) == entries + workspace_image.RESERVED_INODES + 16 * groups


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("/tmp/or-1/workspaces/sb-0123456789ab/mnt", "/tmp/or-1/workspaces/sb-0123456789ab"),
        ("/tmp/or-1/workspaces/sb-0123456789ab/image", None),
        ("/tmp/or-1/other/sb-0123456789ab/mnt", None),
        ("/tmp/or-1/workspaces/../mnt", None),
        ("/tmp/or-1/workspaces/..x/../mnt", None),
        ("relative/workspaces/sb-1/mnt", None),
        ("/workspaces/sb-1/mnt", "/workspaces/sb-1"),
        ("/tmp/or-1/sb-0123456789ab", None),
    ],
)
def test_only_an_image_mount_point_names_an_image_directory(source, expected):
    found = directory_of_mount(source)
    assert (None if found is None else str(found)) == expected


def test_an_image_directory_is_named_by_a_plain_sandbox_id(tmp_path):
    assert image_dir(tmp_path, "sb-1") == tmp_path / "workspaces" / "sb-1"
    with pytest.raises(ValueError, match="sandbox id"):
        image_dir(tmp_path, "../x")


@needs_images
def test_an_image_is_bounded_and_its_owners_alone(images):
    mount_point = make(images / "sb-a", OWNER, 4 << 20, 100)
    try:
        st, fs = os.stat(mount_point), os.statvfs(mount_point)
        assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (OWNER, OWNER, 0o700)
        assert os.listdir(mount_point) == []  # no lost+found
        assert 100 <= fs.f_ffree <= 150 and 3 << 20 < fs.f_bavail * fs.f_frsize <= 4 << 20
        mounts = Path("/proc/mounts").read_text().splitlines()
        options = next(line.split()[3] for line in mounts if line.split()[1] == str(mount_point))
        assert {"nosuid", "nodev"} <= set(options.split(",")) and "noexec" not in options
        assert os.stat(images / "sb-a" / "image").st_blocks * 512 < 1 << 20  # sparse
    finally:
        assert release(images / "sb-a")
    assert list(images.iterdir()) == []


@needs_images
def test_a_busy_mount_is_unmounted_lazily(images):
    mount_point = make(images / "sb-b", OWNER, 1 << 20, 10)
    with open(mount_point / "held", "w") as held:
        os.chdir(mount_point)  # busy: our cwd is in it
        try:
            assert release(images / "sb-b")
        finally:
            os.chdir("/")
        held.write("still writable by its holder")
    assert not (images / "sb-b").exists()


@needs_images
def test_nothing_is_deleted_while_the_mount_stays(images, monkeypatch):
    mount_point = make(images / "sb-c", OWNER, 1 << 20, 10)
    (mount_point / "kept").write_text("x")
    real_run = workspace_image._run

    def no_umount(command, doing):
        if command[0] == "umount":
            raise WorkspaceMountFailed("umount refused")
        real_run(command, doing)

    monkeypatch.setattr(workspace_image, "_run", no_umount)
    assert not release(images / "sb-c")
    assert (mount_point / "kept").read_text() == "x" and (images / "sb-c" / "image").exists()
    monkeypatch.undo()
    assert release(images / "sb-c")


@needs_images
def test_a_failed_step_releases_what_it_made_and_says_which(images, monkeypatch):
    monkeypatch.setattr(workspace_image, "MOUNT_OPTIONS", "loop,no-such-option")
    with pytest.raises(WorkspaceMountFailed, match=r"mounting the workspace image: `mount .*` exited with"):
        make(images / "sb-d", OWNER, 1 << 20, 10)
    assert list(images.iterdir()) == []


def test_a_tool_that_hangs_or_is_missing_is_a_typed_error(monkeypatch):
    monkeypatch.setattr(workspace_image, "COMMAND_SECONDS", 0.05)
    with pytest.raises(WorkspaceMountFailed, match=r"`sleep` did not finish in 0\.05 s"):
        workspace_image._run(["sleep", "5"], "waiting")
    with pytest.raises(WorkspaceMountFailed, match="cannot run `no-such-tool`"):
        workspace_image._run(["no-such-tool"], "trying")


def test_releasing_what_is_not_there_is_fine(images):
    assert release(images / "sb-gone")


def test_the_tools_run_with_the_systems_path_only(monkeypatch):
    seen = {}
    monkeypatch.setattr(subprocess, "run", lambda command, **kw: seen.update(kw) or subprocess.CompletedProcess([], 0))
    workspace_image._run(["true"], "nothing")
    assert seen["env"]["PATH"] == workspace_image.SEARCH_PATH and seen["timeout"] == workspace_image.COMMAND_SECONDS
