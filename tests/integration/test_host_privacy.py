"""The host side is private: the runtime dir, each sandbox's dir, secret and socket, and the channel handshake.

- ``runtime_dir`` is ours and 0700; a symlink, a foreign owner or group/other bits make the controller
  refuse it (``ConfigError``) rather than use it; a missing one is created 0700.
- ``<runtime_dir>/<sandbox_id>/`` is 0700 and belongs to the sandbox's supervisor's uid (root; the
  controller is root here); ``secret`` and ``channel.sock`` in it are closed to group and other.
  Another host user can neither connect nor read the secret, and neither can a cell. The secret is not
  in the container's environment.
- A peer that connects to ``channel.sock`` without the secret gets no request and no checkpoint
  byte, including while the controller waits for a new agent, and the session works on.
- From inside one sandbox nothing of another sandbox's directory is visible.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ATTEMPT_SOURCE, CONNECT_SOURCE, kill_and_wait

from orchestrator import ConfigError, Orchestrator, Session, Settings

pytestmark = pytest.mark.docker

TEST_LABEL = "orchestrator.test.run"
REQUEST_TYPES = {"exec", "set_value", "reset", "restore_begin", "load", "restore_end", "ping"}


def sandbox_dir(settings: Settings, session: Session) -> Path:
    assert session.sandbox_id, "the session has a sandbox id"
    return settings.runtime_dir / session.sandbox_id


def sandbox_ids(settings: Settings) -> tuple[int, int]:
    uid, gid = settings.confinement.user.split(":")
    return int(uid), int(gid)


def value(session: Session, code: str) -> str:
    result = session.execute(code)
    assert result.error is None, str(result.error)
    assert result.return_value is not None
    return result.return_value


def test_runtime_and_sandbox_paths_are_private(session: Session, settings: Settings, orch: Orchestrator) -> None:
    """Modes and owners of the runtime dir, the sandbox dir, its secret and its socket; no secret in the env."""
    runtime = os.lstat(settings.runtime_dir)
    assert stat.S_ISDIR(runtime.st_mode), "runtime_dir is a real directory, not a symlink"
    assert runtime.st_uid == os.getuid()
    assert stat.S_IMODE(runtime.st_mode) == 0o700

    uid, gid = sandbox_ids(settings)
    root = os.getuid() == 0
    directory = sandbox_dir(settings, session)
    info = os.lstat(directory)
    assert stat.S_ISDIR(info.st_mode)
    if root:
        assert stat.S_IMODE(info.st_mode) == 0o700
        assert (info.st_uid, info.st_gid) == (uid, gid)
    else:
        assert stat.S_IMODE(info.st_mode) == 0o711
    assert {"secret", "channel.sock"} <= set(os.listdir(directory))

    secret = os.lstat(directory / "secret")
    assert stat.S_ISREG(secret.st_mode)
    assert stat.S_IMODE(secret.st_mode) & 0o077 == 0, oct(secret.st_mode)
    text = (directory / "secret").read_text().strip()
    assert re.fullmatch(r"[0-9a-f]{64}", text), "32 random bytes as hex"

    sock = os.lstat(directory / "channel.sock")
    assert stat.S_ISSOCK(sock.st_mode)
    if root:
        assert stat.S_IMODE(sock.st_mode) & 0o077 == 0, oct(sock.st_mode)
        assert sock.st_uid == uid

    # The supervisor reads the secret from the mount; a cell (the worker, another uid) can neither list the mount
    # nor read the secret, and the secret is not in its environment or the container's config.
    listing = ATTEMPT_SOURCE + "import os\nattempt(lambda: os.listdir('/run/orchestrator'))"
    assert value(session, listing) == "'PermissionError'"
    assert value(session, "attempt(lambda: open('/run/orchestrator/secret').read())") == "'PermissionError'"
    assert value(session, f"any({text!r} in v for v in os.environ.values())") == "False"
    attrs = orch.backend.client.containers.get(session.container_id).attrs
    assert text not in json.dumps(attrs["Config"]), "the secret is not in the container's configuration"


OTHER_USER = 12345
# The test's own interpreter may live where another user cannot run it (/root/.pyenv/...).
PYTHON_FOR_OTHERS = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
PROBE = (
    "import json, sys\n"
    + ATTEMPT_SOURCE
    + CONNECT_SOURCE
    + """\
print(json.dumps([attempt(lambda: connect(sys.argv[1] + '/channel.sock')),
                  attempt(lambda: open(sys.argv[1] + '/secret').read()),
                  attempt(lambda: __import__('os').listdir(sys.argv[1]))]))
"""
)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a probe as another user")
def test_another_host_user_can_neither_connect_nor_read_the_secret(session: Session, settings: Settings) -> None:
    probe = subprocess.run(
        [PYTHON_FOR_OTHERS, "-c", PROBE, str(sandbox_dir(settings, session))],
        user=OTHER_USER,
        group=OTHER_USER,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
    )
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout) == ["PermissionError", "PermissionError", "PermissionError"]
    assert value(session, "1 + 1") == "2"


def refused(settings: Settings, run_id: str) -> ConfigError:
    """The ConfigError that creating an Orchestrator or a session on ``settings`` raises (whichever checks)."""
    with pytest.raises(ConfigError) as info:
        orch = Orchestrator(settings)
        try:
            orch.create_session(labels={TEST_LABEL: run_id})
        finally:
            orch.close()
            orch.backend.client.close()
    return info.value


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A private scratch directory under /tmp (short paths for sockets)."""
    path = Path(tempfile.mkdtemp(prefix="op-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_symlinked_runtime_dir_is_refused(settings_for, scratch: Path, run_id: str) -> None:
    """A pre-planted symlink at the runtime dir's path is not followed, even to a private directory of ours."""
    target = scratch / "target"
    target.mkdir(mode=0o700)
    link = scratch / "rt"
    link.symlink_to(target)
    exc = refused(settings_for().replace(runtime_dir=link), run_id)
    assert "symlink" in str(exc) or str(link) in str(exc)
    assert list(target.iterdir()) == [], "nothing was created through the link"


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o701])
def test_a_runtime_dir_open_to_others_is_refused(settings_for, scratch: Path, run_id: str, mode: int) -> None:
    runtime = scratch / "rt"
    runtime.mkdir()
    runtime.chmod(mode)
    refused(settings_for().replace(runtime_dir=runtime), run_id)
    assert list(runtime.iterdir()) == []
    assert stat.S_IMODE(runtime.stat().st_mode) == mode, "refused, not silently changed"


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a directory away")
def test_a_runtime_dir_owned_by_someone_else_is_refused(settings_for, scratch: Path, run_id: str) -> None:
    runtime = scratch / "rt"
    runtime.mkdir(mode=0o700)
    os.chown(runtime, OTHER_USER, OTHER_USER)
    refused(settings_for().replace(runtime_dir=runtime), run_id)
    assert list(runtime.iterdir()) == []


def test_a_missing_runtime_dir_is_created_private(settings_for, scratch: Path, make_orch, new_session) -> None:
    runtime = scratch / "fresh"
    settings = settings_for().replace(runtime_dir=runtime)
    s = new_session(make_orch(settings))
    assert s.execute("1 + 1").return_value == "2"
    info = os.lstat(runtime)
    assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()


ROGUE = Path(__file__).with_name("rogue_agent.py")


@pytest.mark.skipif(os.getuid() != 0, reason="the rogue peer needs root to take the sandbox's uid")
def test_a_peer_without_the_secret_gets_nothing(orch: Orchestrator, settings_for, make_orch, run_id: str) -> None:
    """A rogue peer with the sandbox's uid but not its secret hammers every channel socket, and gets nothing.

    ``rogue_agent.py`` (its own process, euid = the sandbox's uid, so it passes an ``SO_PEERCRED``
    check) connects over and over to every ``channel.sock`` while the session is idle, while the
    controller waits for a new container's agent (after a kill) and while a second controller takes
    the live sandbox over. It never receives a request frame or any body (no checkpoint byte), the
    session's sentinel value never crosses to it, and every call of the session works throughout.
    """
    settings = settings_for()
    owner = make_orch(settings)
    s = owner.create_session(labels={TEST_LABEL: run_id})
    sentinel = "SENTINEL-" + secrets.token_hex(8)
    uid, _ = sandbox_ids(settings)
    rogue = subprocess.Popen(
        [sys.executable, str(ROGUE), str(settings.runtime_dir), sentinel, str(uid)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert rogue.stdin is not None and rogue.stdout is not None
    try:
        assert json.loads(rogue.stdout.readline()) == {"ready": True}
        assert s.execute(f"kept = {sentinel!r}\nn = 1").ok
        time.sleep(1.0)  # idle: the rogue knocks on the socket of a session with no call running
        assert value(s, "n += 1\nn") == "2"
        kill_and_wait(orch, s.container_id)  # the controller will wait for a new sandbox's agent
        assert value(s, "n += 1\nkept, n") == f"({sentinel!r}, 3)"
        taker = make_orch(settings).attach(s.id, force=True)  # and for the same sandbox's agent to reconnect
        try:
            assert value(taker, "n += 1\nkept, n") == f"({sentinel!r}, 4)"
            time.sleep(0.5)
            assert value(taker, "n") == "4"
        finally:
            taker.close()
    finally:
        rogue.stdin.close()
        try:
            report = json.loads(rogue.stdout.readline() or "null")
            rogue.wait(timeout=30)
        finally:
            if rogue.poll() is None:
                rogue.kill()
                rogue.wait()
            rogue.stdout.close()
        with contextlib.suppress(Exception):
            s.close()
    assert report is not None, "the rogue reported"
    assert report["euid"] == uid
    assert report["attempts"] > 0 and report["connections"] > 0, report
    print(
        "rogue peer:",
        {k: v for k, v in report.items() if k != "frames"},
        "frames:",
        sorted(set(map(tuple, report["frames"]))),
    )
    frames = [tuple(f) for f in report["frames"]]
    assert not {kind for kind, _ in frames} & REQUEST_TYPES, f"the rogue was sent requests: {frames}"
    assert all(blen == 0 for _, blen in frames), f"the rogue was sent a body: {frames}"
    assert report["sentinel_seen"] is False


def test_one_sandbox_sees_nothing_of_another(orch: Orchestrator, settings: Settings, new_session) -> None:
    """Two sessions: each sandbox's mount holds only its own socket and secret; the other's id appears nowhere."""
    first, second = new_session(orch), new_session(orch)
    first_dir, second_dir = sandbox_dir(settings, first), sandbox_dir(settings, second)
    assert first_dir != second_dir
    assert (first_dir / "secret").read_bytes() != (second_dir / "secret").read_bytes()
    code = (
        "import os\n"
        "try:\n"
        "    seen = sorted(os.listdir('/run/orchestrator'))\n"
        "except OSError as exc:\n"
        "    seen = type(exc).__name__\n"
        "mounts = open('/proc/self/mountinfo').read()\n"
        "def exists(p):\n"
        "    try:\n"
        "        os.stat(p)\n"
        "        return True\n"
        "    except OSError:\n"
        "        return False\n"
    )
    assert second.execute(code).ok
    assert value(second, "seen") == "'PermissionError'"  # not even its own: the mount is the supervisor's
    assert value(second, f"{first.sandbox_id!r} in mounts") == "False"
    other = first.sandbox_id
    probes = [f"/run/orchestrator/../{other}", f"/run/{other}", str(first_dir), f"/{other}"]
    assert value(second, f"[p for p in {probes!r} if exists(p)]") == "[]"
    assert value(second, "[e for e in os.listdir('/run') if e.startswith('sb-') or 'orch' in e]") == "['orchestrator']"
