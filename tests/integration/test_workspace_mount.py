"""Every sandbox's ``/workspace`` on a real engine: the cells' working directory, the worker's alone, bounded in bytes
and entries, outside the sandbox's memory when an image holds it, and gone with its sandbox."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator import Orchestrator, ResourceLimits, Session, Settings
from orchestrator.backends.base import WORKER_UID
from orchestrator.backends.workspace import images_refused
from orchestrator.backends.workspace_image import WorkspaceMountFailed, images_dir, make, release

pytestmark = pytest.mark.docker

SMALL = {"workspace_bytes": 16 << 20, "workspace_files": 100}
FILL = (
    "import errno, os\n"
    "def fill(make):\n"
    "    made = 0\n"
    "    try:\n"
    "        while True:\n"
    "            make(made)\n"
    "            made += 1\n"
    "    except OSError as exc:\n"
    "        return made, errno.errorcode[exc.errno]\n"
)


def _why_no_images() -> str | None:
    """Why no workspace image can be mounted here (a rootless or unprivileged run), or None: one was."""
    refused = images_refused(Path("/tmp"))
    if refused is not None:
        return refused
    with tempfile.TemporaryDirectory(dir="/tmp") as scratch:
        try:
            make(images_dir(Path(scratch)) / "sb-probe", os.getuid(), 1 << 20, 10)
        except WorkspaceMountFailed as exc:
            return str(exc)
        release(images_dir(Path(scratch)) / "sb-probe")
    return None


NO_IMAGES = _why_no_images()
needs_images = pytest.mark.skipif(NO_IMAGES is not None, reason=f"no workspace image here: {NO_IMAGES}")


def value(session: Session, code: str) -> str:
    result = session.execute(code)
    assert result.error is None, str(result.error)
    assert result.return_value is not None
    return result.return_value


def mounted_under(directory: Path) -> list[str]:
    """The host's mount points under ``directory``."""
    return [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines() if str(directory) in line]


def worker_uid(orch: Orchestrator, session: Session) -> int:
    assert session.container_id
    state = orch.backend.inspect(session.container_id)
    assert state is not None
    return int(state.labels[WORKER_UID])


@pytest.fixture
def small(settings_for: Callable[..., Settings], orch: Orchestrator) -> Callable[..., Settings]:
    """Settings of a store of its own, with a small workspace and the given confinement."""

    def make(workspace_mount: str = "auto", **limits: object) -> Settings:
        base = settings_for()
        return base.replace(
            limits=base.limits.replace(**{**SMALL, **limits}),
            confinement=base.confinement.replace(workspace_mount=workspace_mount),
        )

    return make


def test_a_cell_works_in_its_own_workspace(session: Session, orch: Orchestrator) -> None:
    """The cwd is /workspace, the worker's (0700 on an image, 0755 on a tmpfs): what a cell writes there it reads
    back."""
    uid, mode = worker_uid(orch, session), "0o700" if NO_IMAGES is None else "0o755"
    code = "import os\nopen('notes.txt', 'w').write('kept')\nst = os.stat('.')\n"
    code += "os.getcwd(), open('/workspace/notes.txt').read(), st.st_uid, oct(st.st_mode & 0o777), os.listdir('.')"
    assert value(session, code) == f"('/workspace', 'kept', {uid}, '{mode}', ['notes.txt'])"


@needs_images
def test_the_supervisor_cannot_read_the_workspace(session: Session, orch: Orchestrator) -> None:
    """Root in the container holds no DAC_OVERRIDE: the sandbox's supervisor (and a ``docker exec`` as it) cannot list
    the worker's files."""
    value(session, "open('secret.txt', 'w').write('s')")
    container = orch.backend.client.containers.get(session.container_id)
    code, output = container.exec_run(["ls", "/workspace"], user="0")
    assert code != 0 and b"Permission denied" in output, output


def test_writing_past_the_bytes_bound_fails_with_enospc(small: Callable[..., Settings], make_orch, new_session) -> None:
    session = new_session(make_orch(small()))
    code = FILL + "chunk = b'x' * (1 << 20)\nout = open('big', 'wb', buffering=0)\nfill(lambda n: out.write(chunk))"
    made, error = eval(value(session, code))
    assert error == "ENOSPC" and 14 <= made <= 16, (made, error)  # a short write, then ENOSPC
    assert value(session, "out.close()\nos.remove('big')\nopen('after', 'w').write('room again')") == "10"


def test_more_entries_than_the_files_bound_fail_with_enospc(
    small: Callable[..., Settings], make_orch, new_session
) -> None:
    """At least ``workspace_files`` entries fit, and not many more (the kernel rounds to whole inode tables)."""
    session = new_session(make_orch(small()))
    made, error = eval(value(session, FILL + "fill(lambda n: os.mkdir('d%d' % n))"))
    assert error == "ENOSPC" and 100 <= made <= 150, (made, error)


@needs_images
def test_a_64m_sandbox_writes_200_mb_without_being_killed(
    settings_for: Callable[..., Settings], make_orch, new_session
) -> None:
    """The image is not counted in the sandbox's memory, where a tmpfs would be (OOM-killed at ~65 MB); a file bigger
    than a quarter of that memory is named unsaved, never read whole into it (the checkpoint reads a file whole)."""
    base = settings_for()
    session = new_session(make_orch(base.replace(limits=ResourceLimits(memory="64m"))))
    code = "import os\nwith open('big', 'wb') as out:\n    for _ in range(200):\n        out.write(b'y' * (1 << 20))\n"
    container = session.container_id
    assert value(session, code + "os.path.getsize('big') >> 20") == "200"
    assert session.container_id == container  # not killed, nor restored
    assert "larger than" in session.unsaved.get("/workspace/big", ""), session.unsaved


@needs_images
def test_the_image_goes_with_its_sandbox(
    settings_for: Callable[..., Settings], orch: Orchestrator, make_orch, new_session
) -> None:
    settings = settings_for()
    images = images_dir(settings.runtime_dir)
    session = new_session(make_orch(settings))
    assert value(session, "[l.split()[2] for l in open('/proc/mounts') if l.split()[1] == '/workspace']") == "['ext4']"
    (made,) = list(images.iterdir())
    assert mounted_under(images) == [str(made / "mnt")]
    # On the host too the worker's alone, behind directories only root enters (no other sandbox's uid).
    uid = worker_uid(orch, session)
    assert [(st.st_uid, st.st_mode & 0o777) for st in map(os.stat, (images, made, made / "mnt"))] == [
        (0, 0o700),
        (0, 0o700),
        (uid, 0o700),
    ]
    code = "import os\nst = os.statvfs('.')\nst.f_blocks * st.f_frsize > 1 << 29"  # the 1 GiB default
    assert value(session, code) == "True"
    session.close()
    assert mounted_under(images) == [] and list(images.iterdir()) == []


@needs_images
def test_a_killed_sandbox_gets_a_fresh_image_and_the_old_one_goes(
    settings_for: Callable[..., Settings], make_orch, new_session, kill_container
) -> None:
    settings = settings_for()
    images = images_dir(settings.runtime_dir)
    session = new_session(make_orch(settings))
    value(session, "open('kept.txt', 'w').write('checkpointed')")
    (first,) = list(images.iterdir())
    kill_container(session)
    # A fresh image, into which the restore wrote the stored workspace (test_workspace_files.py).
    assert value(session, "import os\nos.listdir('/workspace'), os.getcwd()") == "(['kept.txt'], '/workspace')"
    (second,) = list(images.iterdir())
    assert second != first and mounted_under(images) == [str(second / "mnt")]


def test_the_tmpfs_workspace_is_bounded_too(small: Callable[..., Settings], make_orch, new_session) -> None:
    """``workspace_mount="tmpfs"`` (ORCH_WORKSPACE_MOUNT): a tmpfs with the same bounds, the worker's."""
    settings = small("tmpfs")
    session = new_session(make_orch(settings))
    line = value(session, "[l.split() for l in open('/proc/mounts') if l.split()[1] == '/workspace'][0]")
    assert "'tmpfs'" in line and "size=16384k" in line and "nr_inodes=101" in line and "noexec" not in line, line
    made, error = eval(value(session, FILL + "fill(lambda n: os.mkdir('d%d' % n))"))
    assert (made, error) == (100, "ENOSPC")
    code = FILL + "chunk = b'x' * (1 << 20)\nout = open('big', 'wb', buffering=0)\nfill(lambda n: out.write(chunk))"
    assert eval(value(session, "[os.rmdir('d%d' % n) for n in range(100)]\n" + code)) == (16, "ENOSPC")
    # The worker's, but 0755: the engine gives a working directory's mode to the tmpfs mounted on it (docs/files.md).
    assert value(session, "os.getcwd(), os.stat('.').st_uid == os.getuid()") == "('/workspace', True)"
    assert not images_dir(settings.runtime_dir).exists()


def test_a_context_runs_under_the_workspace(session: Session) -> None:
    ctx = session.create_context(context_id="c1")
    assert ctx.cwd == "/workspace/contexts/c1"
    assert ctx.execute("import os\nos.getcwd()").return_value == "'/workspace/contexts/c1'"
