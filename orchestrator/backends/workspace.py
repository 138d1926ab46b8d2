"""What holds each local sandbox's ``/workspace``: an ext4 image where this host allows one, else a tmpfs.

``Settings.confinement.workspace_mount`` decides: "image" (``workspace_image``: not counted in the
sandbox's memory; starting fails where none can be made), "tmpfs" (counted in its memory), or
"auto": the image where it can be made, else the tmpfs. Whether a runtime dir can hold images is
found out once per process and remembered: the controller must be root, with ``mkfs.ext4``,
``mount`` and ``umount``, the runtime dir on a disk (an image on a tmpfs would be memory all the
same), and its first image must mount. Either way the kernel bounds the bytes
(``workspace_bytes``) and the entries (``workspace_files``).

An image goes with its container (``DockerBackend.remove`` finds it among the container's mounts);
one whose container went otherwise (``docker rm``, a crash between the two) is swept by the next
controller that starts or removes a sandbox with that runtime dir, once its sandbox is gone.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..agent.confinement import DEFAULT_WORKER_UID
from ..agent.rendezvous import SANDBOX_ID as SANDBOX_NAME
from ..config import WORKSPACE, ResourceLimits, Settings, Timeouts
from ..errors import OrchestratorError
from ..wire.endpoint import leftover_dir_grace
from . import workspace_image
from .base import SANDBOX_ID, WORKER_UID, SandboxSpec
from .workspace_image import WorkspaceMountFailed

logger = logging.getLogger(__name__)

_TMPFS_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})
_MOUNTINFO = "/proc/self/mountinfo"
_OCTAL = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class WorkspaceMount:
    """How one container gets its ``/workspace``: a bind mount of an image's mount point, or a tmpfs (or nothing:
    a container that is no sandbox, such as a network slot's holder)."""

    volumes: Mapping[str, dict[str, str]] = field(default_factory=dict)
    """For docker-py's ``volumes``: host path -> ``{"bind": ..., "mode": "rw"}``."""
    tmpfs: Mapping[str, str] = field(default_factory=dict)
    """For docker-py's ``tmpfs``: container path -> options."""
    directory: Path | None = None
    """The image's directory on the host, released with the container."""


def worker_uid(spec: SandboxSpec, settings: Settings) -> int:
    """The uid the sandbox's worker runs as, who owns its workspace: its label, else the container's user (a
    non-root one runs the worker itself), else the agent's own default."""
    label = spec.labels.get(WORKER_UID)
    if label is not None and label.isdigit():
        return int(label)
    uid, _ = settings.confinement.sandbox_uid_gid
    return DEFAULT_WORKER_UID if uid is None or uid == 0 else uid


def tmpfs_options(limits: ResourceLimits, owner: int | None) -> str:
    """Docker's options of a tmpfs workspace: its bounds, mode 0700, executable (cells run scripts they wrote) and,
    where the engine takes it, the worker's uid and gid."""
    options = [
        f"size={limits.workspace_bytes}",
        f"nr_inodes={limits.workspace_files + 1}",  # its root directory is one
        "mode=0700" if owner is not None else "mode=1777",
        "exec",
    ]
    if owner is not None:
        options += [f"uid={owner}", f"gid={owner}"]
    return ",".join(options)


def filesystem_type(path: Path, mountinfo: str = _MOUNTINFO) -> str | None:
    """The type of the file system that holds ``path`` (symbolic links resolved), from ``/proc/self/mountinfo``;
    None when it cannot be told."""
    target = os.path.realpath(path)
    best: tuple[int, str] | None = None
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as lines:
            for line in lines:
                fields = line.split()
                if "-" not in fields[6:]:
                    continue
                point = _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), fields[4])  # \040 for a space, as in fstab
                kind = fields[fields.index("-", 6) + 1]
                inside = target == point or target.startswith(point.rstrip("/") + "/")
                if inside and (best is None or len(point) >= best[0]):  # a later mount on the same point covers it
                    best = (len(point), kind)
    except (OSError, IndexError, UnicodeError):
        return None
    return None if best is None else best[1]


def images_refused(root: Path) -> str | None:
    """Why no workspace image can be made under ``root`` on this host, or None when nothing says so yet."""
    if os.geteuid() != 0:
        return "the controller is not root (mounting an image needs root)"
    path = workspace_image.SEARCH_PATH
    missing = [tool for tool in (workspace_image.MKFS, "mount", "umount") if shutil.which(tool, path=path) is None]
    if missing:
        return f"{', '.join(missing)} not found (e2fsprogs, util-linux)"
    kind = filesystem_type(root)
    if kind in _TMPFS_FILESYSTEMS:
        return f"{root} is on a {kind}, in memory (set ORCH_RUNTIME_DIR to a directory on a disk)"
    return None


class Workspaces:
    """The workspaces of one local engine's sandboxes: what each container mounts at ``/workspace``, and their
    images' removal. Thread-safe."""

    def __init__(self, refused: Callable[[Path], str | None] = images_refused) -> None:
        self._refused_by = refused
        self._lock = threading.Lock()
        self._refused: dict[Path, str | None] = {}
        """Per images dir: why images cannot be made there (None: they can, as far as is known)."""
        self._mounted: set[Path] = set()
        """Images dirs where an image was mounted: a later failure there is that sandbox's, not the host's."""
        self._grace = leftover_dir_grace(Timeouts().start)

    def prepare(self, spec: SandboxSpec, settings: Settings, live: Callable[[], set[str]]) -> WorkspaceMount:
        """The ``/workspace`` of the container ``spec`` describes, an image made and mounted if one is.

        Raises:
            WorkspaceMountFailed: ``workspace_mount`` is "image" and none can be made (the reason, and what to set).
        """
        sandbox_id = spec.labels.get(SANDBOX_ID)
        if sandbox_id is None:
            return WorkspaceMount()
        owner = worker_uid(spec, settings)
        tmpfs = WorkspaceMount(tmpfs={WORKSPACE: tmpfs_options(settings.limits, owner)})
        choice = settings.confinement.workspace_mount
        if choice == "tmpfs":
            return tmpfs
        root = workspace_image.images_dir(settings.runtime_dir)
        self._grace = leftover_dir_grace(settings.timeouts.start)
        refused = self._check(root, live)
        if refused is None:
            directory = workspace_image.image_dir(settings.runtime_dir, sandbox_id)
            try:
                mount_point = workspace_image.make(
                    directory, owner, settings.limits.workspace_bytes, settings.limits.workspace_files
                )
            except WorkspaceMountFailed as exc:
                refused = self._failed(root, str(exc))
            else:
                with self._lock:
                    self._mounted.add(root)
                bind = {str(mount_point): {"bind": WORKSPACE, "mode": "rw"}}
                return WorkspaceMount(volumes=bind, directory=directory)
        if choice == "image":
            raise WorkspaceMountFailed(
                f"sandbox {sandbox_id}: no workspace image: {refused}; ORCH_WORKSPACE_MOUNT=tmpfs (or auto) keeps "
                "/workspace in a tmpfs counted in the sandbox's memory instead"
            )
        return tmpfs

    def _check(self, root: Path, live: Callable[[], set[str]]) -> str | None:
        """Why images cannot be made in ``root``, found out the first time (when leftovers there are swept too)."""
        with self._lock:
            if root in self._refused:
                return self._refused[root]
        refused = self._refused_by(root)
        if refused is None:
            self.sweep(root, live)
        else:  # what this host is (a rootless controller): docs/files.md says what it means, no need to warn each time
            logger.info("sandbox workspaces are tmpfs, counted in each sandbox's memory: %s", refused)
        with self._lock:
            return self._refused.setdefault(root, refused)

    def _failed(self, root: Path, reason: str) -> str:
        """An image that could not be made: this host cannot, unless one was mounted here before (then only this
        sandbox's workspace is a tmpfs)."""
        with self._lock:
            if root not in self._mounted:
                self._refused[root] = reason
        logger.warning("a sandbox workspace is a tmpfs, counted in its memory: %s", reason)
        return reason

    def release(self, mount: WorkspaceMount) -> None:
        """Unmount and delete the image of a container that was never started (the mount ``prepare`` gave)."""
        if mount.directory is not None:
            workspace_image.release(mount.directory)

    def release_mounted(self, mounts: Iterable[Mapping[str, Any]], live: Callable[[], set[str]]) -> None:
        """Release the image a removed container mounted at ``/workspace`` (its inspected ``Mounts``), then sweep
        what others left beside it."""
        for mount in mounts:
            if mount.get("Destination") != WORKSPACE or mount.get("Type") != "bind":
                continue
            directory = workspace_image.directory_of_mount(str(mount.get("Source", "")))
            if directory is not None:
                workspace_image.release(directory)
                self.sweep(directory.parent, live)

    def sweep(self, root: Path, live: Callable[[], set[str]]) -> None:
        """Release the images in ``root`` older than the start grace whose sandbox has no container (``live``: the
        sandbox ids the engine has, asked only when there is such an image)."""
        try:
            entries = [entry for entry in os.scandir(root) if SANDBOX_NAME.fullmatch(entry.name)]
            now = time.time()
            old = [e for e in entries if now - e.stat(follow_symlinks=False).st_mtime >= self._grace]
        except OSError:
            return
        if not old:
            return
        try:
            alive = live()
        except OrchestratorError as exc:  # clean-up: the next sweep tries again
            logger.warning("workspace images in %s not swept: %s", root, exc)
            return
        for entry in old:
            if entry.name not in alive and entry.is_dir(follow_symlinks=False):
                logger.info("sandbox %s is gone: releasing its workspace image", entry.name)
                workspace_image.release(Path(entry.path))
