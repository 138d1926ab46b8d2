"""Sandbox endpoints: private directories, the secret, the socket, takeover and peer credentials."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from orchestrator.agent import framing, handshake
from orchestrator.errors import AgentTimeoutError, ChannelLost, ConfigError
from orchestrator.wire import endpoint as endpoint_module
from orchestrator.wire.endpoint import (
    CHANNEL_MOUNT,
    SECRET_NAME,
    SOCKET_NAME,
    UnixSocketEndpoint,
    discard_sandbox_dir,
    ensure_private_dir,
)

SID = "sb-0123456789ab"
NOBODY = 65534
OTHER = 4242
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="needs root to give files to other uids")


@pytest.fixture
def base():
    """A short private directory (tmp_path can be too long for a socket path)."""
    directory = Path(tempfile.mkdtemp(prefix="orch-t-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def runtime(base):
    return base / "run"


@pytest.fixture
def opened():
    endpoints = []
    yield endpoints
    for endpoint in endpoints:
        endpoint.close()


def create(runtime: Path, opened: list, sandbox_id: str = SID, uid: int | None = None, gid: int | None = None):
    endpoint = UnixSocketEndpoint.create(
        runtime, sandbox_id, sandbox_uid=uid, sandbox_gid=gid, max_header=1 << 20, max_body=1 << 20
    )
    opened.append(endpoint)
    return endpoint


def take_over(runtime: Path, opened: list, sandbox_id: str = SID, uid: int | None = None, gid: int | None = None):
    endpoint = UnixSocketEndpoint.open(
        runtime, sandbox_id, sandbox_uid=uid, sandbox_gid=gid, max_header=1 << 20, max_body=1 << 20
    )
    opened.append(endpoint)
    return endpoint


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def connect(path: Path) -> socket.socket:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(str(path))
    return client


# --- ensure_private_dir ---------------------------------------------------------------------------


def test_ensure_private_dir_creates_it_and_its_parents_0700(base):
    path = base / "a" / "b"
    assert ensure_private_dir(path) == path
    assert mode(base / "a") == mode(path) == 0o700
    assert ensure_private_dir(path) == path  # an existing private directory is fine


def test_ensure_private_dir_is_0700_whatever_the_umask(base):
    old = os.umask(0o277)
    try:
        ensure_private_dir(base / "r")
    finally:
        os.umask(old)
    assert mode(base / "r") == 0o700


@pytest.mark.parametrize("target_exists", [True, False])
def test_ensure_private_dir_refuses_a_symlink(base, target_exists):
    target = base / "real"
    if target_exists:
        target.mkdir(mode=0o700)
    (base / "link").symlink_to(target)
    with pytest.raises(ConfigError, match=r"link is a symbolic link.*ORCH_RUNTIME_DIR"):
        ensure_private_dir(base / "link")
    assert not target_exists or list(target.iterdir()) == []


def test_ensure_private_dir_refuses_a_file(base):
    (base / "f").write_text("")
    with pytest.raises(ConfigError, match="not a directory"):
        ensure_private_dir(base / "f")


@pytest.mark.parametrize("bits", [0o755, 0o711, 0o770, 0o701, 0o720])
def test_ensure_private_dir_refuses_group_or_other_bits(base, bits):
    path = base / "open"
    path.mkdir()
    path.chmod(bits)
    with pytest.raises(ConfigError, match=f"mode {bits:04o}.*chmod 700"):
        ensure_private_dir(path)


@needs_root
def test_ensure_private_dir_refuses_a_directory_of_another_user(base):
    path = base / "theirs"
    path.mkdir(mode=0o700)
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(ConfigError, match=f"belongs to uid {NOBODY}"):
        ensure_private_dir(path)


# --- create ---------------------------------------------------------------------------------------


@needs_root
def test_as_root_the_sandbox_directory_secret_and_socket_belong_to_the_sandbox_user(runtime, opened):
    endpoint = create(runtime, opened, uid=NOBODY, gid=NOBODY)
    assert (mode(runtime), os.lstat(runtime).st_uid) == (0o700, 0)
    directory = runtime / SID
    assert endpoint.directory == directory and endpoint.path == directory / SOCKET_NAME
    for name, expected in [(directory, 0o700), (directory / SECRET_NAME, 0o400), (directory / SOCKET_NAME, 0o600)]:
        st = os.lstat(name)
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (expected, NOBODY, NOBODY), name
    assert stat.S_ISSOCK(os.lstat(endpoint.path).st_mode)
    text = (directory / SECRET_NAME).read_bytes()
    assert len(text) == 64 and handshake.parse_secret(text) == endpoint.secret
    assert len(endpoint.secret) == handshake.SECRET_BYTES
    assert sorted(os.listdir(directory)) == [SOCKET_NAME, SECRET_NAME]


def test_without_root_files_are_our_groups_under_the_private_runtime_dir(base, runtime, opened, monkeypatch):
    real_uid = os.geteuid()
    if ROOT:  # play a non-root controller: our "own" uid is OTHER, and the runtime dir is its
        runtime.mkdir(mode=0o700)
        os.chown(runtime, OTHER, OTHER)
        monkeypatch.setattr(os, "geteuid", lambda: OTHER)
    endpoint = create(runtime, opened, uid=NOBODY, gid=NOBODY)
    directory = endpoint.directory
    assert mode(directory) == 0o710
    assert mode(directory / SECRET_NAME) == 0o440
    assert mode(endpoint.path) == 0o660
    owned = {(os.lstat(p).st_uid, os.lstat(p).st_gid) for p in (directory, directory / SECRET_NAME, endpoint.path)}
    assert owned == {(real_uid, os.getegid())}
    assert endpoint.groups() == [os.getegid()]  # the sandbox's supervisor gets our group; its worker has none
    assert mode(runtime) == 0o700


@needs_root
def test_as_root_with_an_unknown_sandbox_user_files_stay_ours_and_our_groups(runtime, opened):
    endpoint = create(runtime, opened, uid=None)
    assert (mode(endpoint.directory), mode(endpoint.directory / SECRET_NAME), mode(endpoint.path)) == (
        0o710,
        0o440,
        0o660,
    )
    assert (os.lstat(endpoint.path).st_uid, os.lstat(endpoint.path).st_gid) == (0, 0)
    assert endpoint.groups() == []


def test_a_planted_symlink_in_place_of_the_sandbox_directory_is_refused(base, runtime, opened):
    victim = base / "victim"
    victim.mkdir(mode=0o700)
    ensure_private_dir(runtime)
    (runtime / SID).symlink_to(victim)
    with pytest.raises(ConfigError, match="symbolic link"):
        create(runtime, opened)
    assert list(victim.iterdir()) == []
    assert (runtime / SID).is_symlink()


def test_an_existing_sandbox_directory_is_refused(runtime, opened):
    create(runtime, opened)
    with pytest.raises(ConfigError, match="already exists"):
        create(runtime, opened)


def test_a_runtime_dir_open_to_others_is_refused(runtime, opened):
    runtime.mkdir(mode=0o700)
    runtime.chmod(0o755)
    with pytest.raises(ConfigError, match="chmod 700"):
        create(runtime, opened)


@pytest.mark.parametrize("bad", ["", ".", "..", "../x", "a/b", ".hidden", "x" * 65, "sb-\n", "sb 1"])
def test_sandbox_ids_must_be_plain_names(runtime, opened, bad):
    with pytest.raises(ConfigError, match="plain name"):
        create(runtime, opened, sandbox_id=bad)
    with pytest.raises(ConfigError, match="plain name"):
        discard_sandbox_dir(runtime, bad)


def test_a_socket_path_over_the_limit_is_a_config_error_with_advice(base, opened):
    deep = base / ("d" * 60) / ("e" * 30)
    with pytest.raises(ConfigError, match=r"over the 107 bytes.*shorter Settings.runtime_dir"):
        create(deep, opened)
    assert not (deep / SID).exists()


def test_mounts_and_environment(runtime, opened):
    endpoint = create(runtime, opened)
    assert endpoint.mounts() == {str(runtime / SID): CHANNEL_MOUNT}
    assert endpoint.environment() == {
        "ORCH_CHANNEL": "/run/orchestrator/channel.sock",
        "ORCH_SECRET_FILE": "/run/orchestrator/secret",
    }


# --- accept ---------------------------------------------------------------------------------------


def test_accept_returns_a_working_channel(runtime, opened):
    endpoint = create(runtime, opened, uid=os.geteuid())
    client = connect(endpoint.path)
    try:
        channel = endpoint.accept(time.monotonic() + 5)
        try:
            framing.send_frame(client, {"type": "hello"})
            assert channel.recv(deadline=time.monotonic() + 5)[0] == {"type": "hello"}
            assert channel.peer_credentials().pid == os.getpid()
        finally:
            channel.close()
    finally:
        client.close()


def test_accept_times_out_at_the_deadline(runtime, opened):
    endpoint = create(runtime, opened)
    started = time.monotonic()
    with pytest.raises(AgentTimeoutError, match=f"no agent of sandbox {SID} connected"):
        endpoint.accept(started + 0.3)
    assert 0.3 <= time.monotonic() - started < 0.6


_CONNECT_AS_NOBODY = f"""
import os, socket, sys
os.setgroups([])
os.setgid({NOBODY})
os.setuid({NOBODY})
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect("{SOCKET_NAME}")
s.settimeout(10)
print("refused" if s.recv(1) == b"" else "served", flush=True)
"""


@needs_root
def test_a_connection_from_another_uid_is_refused_and_accept_keeps_waiting(runtime, opened, caplog):
    endpoint = create(runtime, opened, uid=os.geteuid(), gid=os.getegid())
    # Let the file permissions through so that only the peer-credential check stands in the way.
    endpoint.directory.chmod(0o711)
    endpoint.path.chmod(0o666)
    # The child starts as root (it can run this Python and enter the directory), then drops to nobody.
    child = subprocess.Popen(
        [sys.executable, "-c", _CONNECT_AS_NOBODY], cwd=endpoint.directory, stdout=subprocess.PIPE, text=True
    )
    clients = []

    output = []

    def then_connect_as_ourselves() -> None:
        output.append(child.communicate(timeout=20)[0])
        clients.append(connect(endpoint.path))

    thread = threading.Thread(target=then_connect_as_ourselves)
    thread.start()
    try:
        with caplog.at_level(logging.WARNING, logger="orchestrator.wire.endpoint"):
            channel = endpoint.accept(time.monotonic() + 20)
        peer = channel.peer_credentials()
        channel.close()
    finally:
        thread.join()
        for client in clients:
            client.close()
        child.kill()
        child.wait()
    assert output == ["refused\n"]
    assert peer is not None and peer.pid == os.getpid()
    assert any(f"uid {NOBODY}" in record.getMessage() for record in caplog.records)


@needs_root
def test_a_connection_from_another_uid_alone_ends_in_a_timeout(runtime, opened):
    endpoint = create(runtime, opened, uid=OTHER, gid=OTHER)
    endpoint.directory.chmod(0o711)
    endpoint.path.chmod(0o666)
    child = subprocess.Popen(
        [sys.executable, "-c", _CONNECT_AS_NOBODY], cwd=endpoint.directory, stdout=subprocess.PIPE, text=True
    )
    try:
        with pytest.raises(AgentTimeoutError):
            endpoint.accept(time.monotonic() + 1)
        assert child.communicate(timeout=20)[0].strip() == "refused"
    finally:
        child.kill()
        child.wait()


# --- open (takeover), close, remove ---------------------------------------------------------------


@pytest.mark.parametrize("uid", [None, pytest.param(NOBODY, marks=needs_root)])
def test_open_replaces_the_socket_file_and_the_old_close_leaves_it(runtime, opened, uid):
    old = create(runtime, opened, uid=uid, gid=uid)
    old_inode = os.lstat(old.path).st_ino
    new = take_over(runtime, opened, uid=uid, gid=uid)
    assert new.secret == old.secret
    assert new.path == old.path
    new_inode = os.lstat(new.path).st_ino
    assert new_inode != old_inode
    assert sorted(os.listdir(new.directory)) == [SOCKET_NAME, SECRET_NAME]  # no temporary left behind
    if uid is not None:
        st = os.lstat(new.path)
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o600, uid)
    if uid is None:  # (a sandbox uid would refuse us as the peer)
        client = connect(new.path)
        try:
            with pytest.raises(ChannelLost, match="another controller"):  # it stops waiting at once
                old.accept(time.monotonic() + 5)
            new.accept(time.monotonic() + 5).close()
        finally:
            client.close()
    old.close()
    assert os.lstat(new.path).st_ino == new_inode
    new.close()
    assert os.lstat(new.path).st_ino == new_inode  # left for the next owner's rename (no check-then-unlink race)
    assert (new.directory / SECRET_NAME).exists()


def test_open_of_a_missing_sandbox_says_it_is_gone(runtime, opened):
    with pytest.raises(ConfigError, match="is gone"):
        take_over(runtime, opened)


def test_open_refuses_a_symlinked_sandbox_directory(base, runtime, opened):
    real = create(runtime, opened, sandbox_id="sb-real")
    (runtime / SID).symlink_to(real.directory)
    with pytest.raises(ConfigError, match="symbolic link"):
        take_over(runtime, opened)


@needs_root
def test_open_refuses_a_sandbox_directory_of_a_stranger(runtime, opened):
    endpoint = create(runtime, opened, uid=NOBODY, gid=NOBODY)
    os.chown(endpoint.directory, OTHER, OTHER)
    with pytest.raises(ConfigError, match=f"belongs to uid {OTHER}"):
        take_over(runtime, opened, uid=NOBODY, gid=NOBODY)


def test_open_refuses_a_sandbox_directory_others_may_write(runtime, opened):
    endpoint = create(runtime, opened)
    endpoint.directory.chmod(0o733)
    with pytest.raises(ConfigError, match="others may write"):
        take_over(runtime, opened)


@pytest.mark.parametrize("plant", ["symlink", "fifo", "garbage", "missing"])
def test_open_refuses_a_bad_secret_without_hanging(base, runtime, opened, plant):
    endpoint = create(runtime, opened)
    secret = endpoint.directory / SECRET_NAME
    secret.unlink()
    if plant == "symlink":
        decoy = base / "decoy"
        decoy.write_bytes(handshake.format_secret(bytes(32)))
        secret.symlink_to(decoy)
    elif plant == "fifo":
        os.mkfifo(secret, 0o400)
    elif plant == "garbage":
        secret.write_bytes(b"not a secret")
    with pytest.raises(ConfigError, match="secret"):
        take_over(runtime, opened)
    assert os.lstat(endpoint.path).st_ino  # the live socket was not touched


def test_close_is_idempotent_and_leaves_the_socket_file(runtime, opened):
    endpoint = create(runtime, opened)
    endpoint.close()
    endpoint.close()
    assert os.path.lexists(endpoint.path)  # for the next owner's rename: no check-then-unlink race
    with pytest.raises(ChannelLost, match="closed"):
        endpoint.accept(time.monotonic() + 1)


def test_remove_deletes_the_sandbox_directory(runtime, opened):
    endpoint = create(runtime, opened)
    endpoint.remove()
    assert not os.path.lexists(endpoint.directory)
    assert mode(runtime) == 0o700
    endpoint.remove()  # again: nothing left to do


@needs_root
def test_remove_deletes_a_directory_given_to_the_sandbox_user(runtime, opened):
    endpoint = create(runtime, opened, uid=NOBODY, gid=NOBODY)
    endpoint.remove()
    assert not os.path.lexists(endpoint.directory)


def test_discard_sandbox_dir(base, runtime, opened):
    discard_sandbox_dir(base / "never-made", SID)  # no runtime dir: nothing to do
    create(runtime, opened).close()
    discard_sandbox_dir(runtime, SID)
    assert not os.path.lexists(runtime / SID)
    discard_sandbox_dir(runtime, SID)  # already gone
    victim = base / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    (runtime / SID).symlink_to(victim)
    discard_sandbox_dir(runtime, SID)
    assert (victim / "keep").exists()  # a link is never followed


def test_endpoint_module_names_match_the_protocol_doc():
    doc = (Path(__file__).resolve().parents[3] / "docs" / "protocol.md").read_text()
    for name in (endpoint_module.SOCKET_NAME, endpoint_module.SECRET_NAME, endpoint_module.CHANNEL_MOUNT):
        assert f"`{name}`" in doc
