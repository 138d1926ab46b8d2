"""A sandbox's ``/workspace`` as an ext4 image on the host's disk: made, loop-mounted, and released again.

Measured (../shared/design/ENGINE-AND-IMAGES.md, "Where a workspace's bytes can live"): a tmpfs is
charged to the container's memory, while a sparse ext4 image, loop-mounted ``nosuid,nodev`` on
the host and bind-mounted into the container, costs about 20 ms and is charged to nothing: the
kernel bounds its bytes (the image's size) and its entries (its inodes). Each lives in
``<runtime_dir>/workspaces/<sandbox_id>/`` as ``image`` and its mount point ``mnt``, a sibling
of the sandbox's channel directory (which is mounted into the container, and removed with
``rmtree``: nothing mounted may ever be under it).

Releasing never deletes into a mounted file system: it unmounts (lazily when the mount is busy),
then removes the mount point with ``rmdir`` (which refuses a mount point or a non-empty
directory), the image with ``unlink`` and the directory with ``rmdir``; whatever refuses is
left as it is and logged. ``mkfs.ext4``, ``mount`` and ``umount`` (util-linux) run as
subprocesses, each with a timeout.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from pathlib import Path

from ..agent.rendezvous import SANDBOX_ID
from ..errors import EngineError
from ..safe_text import last_lines

logger = logging.getLogger(__name__)

IMAGES_DIR = "workspaces"
"""The directory of workspace images in a runtime dir: ``<runtime_dir>/workspaces/<sandbox_id>/``."""
IMAGE = "image"
MOUNT_POINT = "mnt"
MKFS = "mkfs.ext4"
BLOCK_BYTES = 4096
INODE_BYTES = 256
GROUP_BYTES = BLOCK_BYTES * BLOCK_BYTES * 8
"""Bytes per ext4 block group (one block's bitmap of blocks): each rounds its inode count to whole table blocks."""
RESERVED_INODES = 16
"""Inodes beyond ``workspace_files`` for the file system's own (ext4 reserves ten, the root among them)."""
MOUNT_OPTIONS = "loop,nosuid,nodev,noinit_itable"
"""``exec`` stays (cells run scripts they wrote); ``noinit_itable``: a fresh, disposable image needs no background
zeroing of its inode tables."""
COMMAND_SECONDS = 30.0
SEARCH_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
"""Where the tools are looked for: the system's directories, never the caller's ``PATH`` (they run as root)."""
_ENVIRONMENT = {"PATH": SEARCH_PATH, "LC_ALL": "C"}


class WorkspaceMountFailed(EngineError):
    """A sandbox's workspace image could not be made or mounted on this host; the message says which step and why."""


def inode_count(entries: int, size: int) -> int:
    """Inodes to ask ``mkfs.ext4`` for so that ``entries`` are free after its own: it rounds each block group's count
    to whole inode table blocks, down as well as up, so every group gets one block more."""
    groups = -(-size // GROUP_BYTES)
    return entries + RESERVED_INODES + groups * (BLOCK_BYTES // INODE_BYTES)


def images_dir(runtime_dir: Path) -> Path:
    return Path(runtime_dir) / IMAGES_DIR


def image_dir(runtime_dir: Path, sandbox_id: str) -> Path:
    """``<runtime_dir>/workspaces/<sandbox_id>``."""
    if not SANDBOX_ID.fullmatch(sandbox_id):
        raise ValueError(f"not a sandbox id: {sandbox_id!r}")
    return images_dir(runtime_dir) / sandbox_id


def directory_of_mount(source: str) -> Path | None:
    """The image directory whose mount point is ``source`` (a bind mount's source the engine reports), or None when
    ``source`` is not one: ``<anything>/workspaces/<sandbox id>/mnt``, absolute, without ``..``."""
    path = Path(source)
    parts = path.parts
    if not path.is_absolute() or ".." in parts or len(parts) < 4:
        return None
    if parts[-1] != MOUNT_POINT or parts[-3] != IMAGES_DIR or not SANDBOX_ID.fullmatch(parts[-2]):
        return None
    return path.parent


def make(directory: Path, owner: int, size: int, entries: int) -> Path:
    """Make a sparse ext4 image of ``size`` bytes with room for ``entries`` in ``directory`` (created 0700, must not
    exist), mount it ``nosuid,nodev`` and hand its root to ``owner`` (uid and gid), mode 0700; return the mount point.

    Raises:
        WorkspaceMountFailed: a step failed (what was made is released again).
    """
    try:
        directory.parent.mkdir(mode=0o700, exist_ok=True)
        directory.mkdir(mode=0o700)
    except OSError as exc:
        raise WorkspaceMountFailed(f"cannot make the workspace directory {directory}: {exc}") from None
    try:
        return _make_in(directory, owner, size, entries)
    except BaseException:
        release(directory)
        raise


def _make_in(directory: Path, owner: int, size: int, entries: int) -> Path:
    image, mount_point = directory / IMAGE, directory / MOUNT_POINT
    try:
        fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, size)  # sparse: the disk holds only what is written
        finally:
            os.close(fd)
        mount_point.mkdir(mode=0o700)
    except OSError as exc:
        raise WorkspaceMountFailed(f"cannot make the workspace image {image}: {exc}") from None
    inodes = str(inode_count(entries, size))
    lazy = "lazy_itable_init=1,lazy_journal_init=1"
    sizes = ["-b", str(BLOCK_BYTES), "-I", str(INODE_BYTES), "-m", "0", "-N", inodes]
    _run([MKFS, "-q", "-F", *sizes, "-E", lazy, "-O", "^has_journal", str(image)], "formatting the workspace image")
    _run(["mount", "-t", "ext4", "-o", MOUNT_OPTIONS, str(image), str(mount_point)], "mounting the workspace image")
    try:
        os.rmdir(mount_point / "lost+found")  # fsck's, never run here: it would be a cell's first, foreign entry
        os.chown(mount_point, owner, owner)
        os.chmod(mount_point, 0o700)
    except OSError as exc:
        raise WorkspaceMountFailed(f"cannot hand the workspace {mount_point} to uid {owner}: {exc}") from None
    return mount_point


def release(directory: Path) -> bool:
    """Unmount and delete a workspace image's directory (each step only if needed); True when it is gone.

    A busy mount is unmounted lazily (it goes when its last user does). Nothing is deleted while the mount point is
    still a mount point, and only with ``rmdir`` and ``unlink``: what cannot go stays, logged, for a later sweep.
    """
    mount_point = directory / MOUNT_POINT
    if os.path.ismount(mount_point) and not _unmount(mount_point):
        return False
    try:
        for remove, path in ((os.rmdir, mount_point), (os.unlink, directory / IMAGE)):
            with contextlib.suppress(FileNotFoundError):
                remove(path)
        os.rmdir(directory)
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("workspace %s stays (a later sweep tries again): %s", directory, exc)
        return False
    return True


def _unmount(mount_point: Path) -> bool:
    """``umount``, else ``umount --lazy``; True when ``mount_point`` is no longer a mount point."""
    for lazy in ([], ["--lazy"]):
        try:
            _run(["umount", *lazy, str(mount_point)], "unmounting the workspace image")
        except WorkspaceMountFailed as exc:
            logger.info("%s", exc)
        if not os.path.ismount(mount_point):
            return True
    logger.warning("workspace %s stays mounted (a later sweep tries again)", mount_point)
    return False


def _run(command: list[str], doing: str) -> None:
    """Run ``command``; raises WorkspaceMountFailed naming ``doing`` with the last lines it wrote, when it fails."""
    try:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=_ENVIRONMENT,
            timeout=COMMAND_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise WorkspaceMountFailed(f"{doing}: `{command[0]}` did not finish in {COMMAND_SECONDS:g} s") from None
    except OSError as exc:
        raise WorkspaceMountFailed(f"{doing}: cannot run `{command[0]}`: {exc}") from None
    if done.returncode != 0:
        said = " ".join(last_lines(done.stderr.decode("utf-8", "replace") or done.stdout.decode("utf-8", "replace"), 3))
        raise WorkspaceMountFailed(f"{doing}: `{' '.join(command)}` exited with {done.returncode}: {said}")
