"""How the controller reaches one sandbox's agent: a private host directory with a secret and a listening socket.

Each sandbox gets ``<runtime_dir>/<sandbox_id>/`` (docs/protocol.md, "The sandbox directory
and the secret"), which the backend bind-mounts read-only at ``CHANNEL_MOUNT``: the agent can
read the secret and connect to the socket but cannot plant files on the host. Nothing here
follows a symbolic link, and every directory is checked with ``lstat`` before it is used.
The handshake that proves both ends know the secret is the connection's job; an endpoint
hands out connections the OS vouches for (``SO_PEERCRED``) and the secret.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import secrets
import select
import shutil
import socket
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from .agent import protocol
from .errors import AgentTimeoutError, ChannelLost, ConfigError
from .transport import Channel, peer_credentials, wait_for

logger = logging.getLogger(__name__)

CHANNEL_MOUNT = "/run/orchestrator"
"""Where the sandbox directory appears inside the container (read-only)."""
SOCKET_NAME = "channel.sock"
SECRET_NAME = "secret"
MAX_SOCKET_PATH = 107
"""Longest Unix socket path in bytes (``sun_path`` is 108 bytes with its NUL on Linux)."""

_SANDBOX_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_BACKLOG = 8
_REPLACED_CHECK = 0.25  # seconds between checks, while waiting, that no other controller replaced our socket
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_RUNTIME_DIR_ADVICE = "or point Settings.runtime_dir (ORCH_RUNTIME_DIR) at a directory of your own"


class Endpoint(Protocol):
    """Where a controller waits for one sandbox's agent, and what the sandbox needs to find it."""

    secret: bytes
    """The sandbox's shared secret: the key ``protocol.auth_proof`` takes."""

    def accept(self, deadline: float) -> Channel:
        """Wait until ``deadline`` (``time.monotonic()``) for the agent to connect.

        Raises:
            AgentTimeoutError: no acceptable connection by the deadline.
        """
        ...

    def mounts(self) -> dict[str, str]:
        """Host path -> container path, to be mounted read-only into the sandbox."""
        ...

    def environment(self) -> dict[str, str]:
        """Variables that tell the agent where its channel and secret are inside the container."""
        ...

    def close(self) -> None:
        """Stop listening."""
        ...


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) with mode 0700, or check that the existing one is private.

    Returns:
        ``path``.

    Raises:
        ConfigError: it is a symbolic link, not a directory, not owned by this process's
            effective uid, has any group or other permission bit, or cannot be created.
    """
    path = Path(path)
    missing = []
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            break
        missing.append(candidate)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            continue  # created meanwhile; checked below if it is ours to use
        except OSError as exc:
            raise ConfigError(f"cannot create the directory {directory}: {exc}; {_RUNTIME_DIR_ADVICE}") from exc
        if directory == path:
            _set_mode(path, 0o700)  # the umask may have taken bits off
    _check_private(path)
    return path


def discard_sandbox_dir(runtime_dir: Path, sandbox_id: str) -> None:
    """Delete ``<runtime_dir>/<sandbox_id>`` once its sandbox is gone; nothing happens if it does not exist.

    A symbolic link or other non-directory there is left alone (and logged), never followed.
    Failures to delete are logged, not raised: this is clean-up.

    Raises:
        ConfigError: ``sandbox_id`` is not a plain name, or ``runtime_dir`` exists but is not private.
    """
    _check_sandbox_id(sandbox_id)
    runtime_dir = Path(runtime_dir)
    if not os.path.lexists(runtime_dir):
        return
    _check_private(runtime_dir)
    _remove_tree(runtime_dir / sandbox_id)


class UnixSocketEndpoint:
    """A sandbox's directory with its secret and the controller's listening socket in it.

    Layout (docs/protocol.md): ``<runtime_dir>/<sandbox_id>/secret`` and ``.../channel.sock``.
    When the controller runs as root and knows the sandbox's uid, the directory, the secret
    (0400) and the socket (0600) belong to that uid, so only the agent and root can use them.
    A controller that is not root cannot give files away: the directory is then 0711, the
    secret 0444 and the socket 0666, which is still private because ``runtime_dir`` above them
    is 0700 and ours (``ensure_private_dir``), so no other host user can reach them; inside the
    container only this sandbox's directory is mounted, and the secret authenticates both ends.

    Use ``create`` for a new sandbox and ``open`` to take over a live one.

    Attributes:
        sandbox_id: the sandbox's id (a plain file name).
        directory: the sandbox directory on the host.
        path: the socket file on the host.
        secret: the shared secret (``protocol.SECRET_BYTES`` bytes).
        sandbox_uid: the uid the agent runs as, if known; connections from other uids are refused.
    """

    def __init__(
        self,
        directory: Path,
        listener: socket.socket,
        socket_file: tuple[int, int],
        secret: bytes,
        sandbox_uid: int | None,
        max_header: int,
        max_body: int,
    ) -> None:
        """Wrap a listening socket bound at ``directory/SOCKET_NAME`` (``socket_file``: its st_dev, st_ino).

        Use ``create`` or ``open`` rather than this.
        """
        self.sandbox_id = directory.name
        self.directory = directory
        self.path = directory / SOCKET_NAME
        self.secret = secret
        self.sandbox_uid = sandbox_uid
        self._listener = listener
        self._max_header = max_header
        self._max_body = max_body
        self._closed = False
        self._socket_file = socket_file

    @classmethod
    def create(
        cls,
        runtime_dir: Path,
        sandbox_id: str,
        *,
        sandbox_uid: int | None,
        sandbox_gid: int | None,
        max_header: int,
        max_body: int,
    ) -> UnixSocketEndpoint:
        """Make a new sandbox directory with a fresh secret and start listening in it.

        Args:
            runtime_dir: the controller's private directory (created 0700 if missing).
            sandbox_id: the new sandbox's id; ``<runtime_dir>/<sandbox_id>`` must not exist.
            sandbox_uid: the uid the agent will run as, if known (numeric).
            sandbox_gid: its gid, if known.
            max_header: largest frame header accepted from the agent.
            max_body: largest frame body accepted from the agent.

        Raises:
            ConfigError: ``runtime_dir`` is not private, the sandbox directory already exists
                (or is a symbolic link), or the socket path is too long.
        """
        _check_sandbox_id(sandbox_id)
        directory = ensure_private_dir(runtime_dir) / sandbox_id
        _check_socket_path(directory / SOCKET_NAME)
        give_to = _give_to(sandbox_uid, sandbox_gid)
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            if os.path.islink(directory):
                raise ConfigError(f"{directory} is a symbolic link; refusing to follow it (remove it)") from None
            raise ConfigError(
                f"{directory} already exists (a leftover of a dead controller?); a new sandbox needs a fresh "
                "directory: remove it, or take the live sandbox over instead"
            ) from None
        except OSError as exc:
            raise ConfigError(f"cannot create the sandbox directory {directory}: {exc}") from exc
        try:
            dir_fd = os.open(directory, _DIR_FLAGS)
            try:
                os.fchmod(dir_fd, 0o700)  # closed until everything in it is in place
                key = secrets.token_bytes(protocol.SECRET_BYTES)
                _write_secret(dir_fd, protocol.format_secret(key), give_to)
                listener, socket_file = _listen(directory / SOCKET_NAME, give_to)
                try:
                    if give_to is not None:
                        os.fchown(dir_fd, *give_to)
                    else:
                        os.fchmod(dir_fd, 0o711)
                    endpoint = cls(directory, listener, socket_file, key, sandbox_uid, max_header, max_body)
                except BaseException:
                    listener.close()
                    raise
            finally:
                os.close(dir_fd)
        except BaseException:
            _remove_tree(directory)
            raise
        logger.info("sandbox %s: listening at %s", sandbox_id, endpoint.path)
        return endpoint

    @classmethod
    def open(
        cls,
        runtime_dir: Path,
        sandbox_id: str,
        *,
        sandbox_uid: int | None,
        sandbox_gid: int | None,
        max_header: int,
        max_body: int,
    ) -> UnixSocketEndpoint:
        """Take over a live sandbox's directory: read its secret and put a new listening socket in place.

        The new socket is bound under a temporary name in the same directory and renamed over
        ``channel.sock``, so the path flips atomically to a new inode (which is how the agent
        notices a takeover); the previous controller's ``close`` then leaves the file alone.

        Args:
            runtime_dir: the controller's private directory.
            sandbox_id: the live sandbox's id.
            sandbox_uid: the uid the agent runs as, if known (numeric).
            sandbox_gid: its gid, if known.
            max_header: largest frame header accepted from the agent.
            max_body: largest frame body accepted from the agent.

        Raises:
            ConfigError: the directory is missing, is a symbolic link, belongs to someone other
                than root, this process or the sandbox's uid, is writable by others, or its
                secret is missing or malformed; or the socket path is too long.
        """
        _check_sandbox_id(sandbox_id)
        directory = ensure_private_dir(runtime_dir) / sandbox_id
        _check_socket_path(directory / SOCKET_NAME)
        owners = {0, os.geteuid()} | ({sandbox_uid} if sandbox_uid is not None else set())
        try:
            st = os.lstat(directory)
        except FileNotFoundError:
            raise ConfigError(f"no sandbox directory {directory}: the sandbox {sandbox_id} is gone") from None
        _check_entry(directory, st, stat.S_ISDIR, "a directory", owners)
        try:
            dir_fd = os.open(directory, _DIR_FLAGS)
        except OSError as exc:
            raise ConfigError(f"cannot open the sandbox directory {directory}: {exc}") from exc
        try:
            opened = os.fstat(dir_fd)
            if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
                raise ConfigError(f"{directory} was replaced while it was being opened; try again")
            key = _read_secret(dir_fd, directory / SECRET_NAME, owners)
        finally:
            os.close(dir_fd)
        temporary = directory / f".{secrets.token_hex(3)}.sock"  # as long as SOCKET_NAME
        listener, socket_file = _listen(temporary, _give_to(sandbox_uid, sandbox_gid))
        try:
            os.rename(temporary, directory / SOCKET_NAME)
            endpoint = cls(directory, listener, socket_file, key, sandbox_uid, max_header, max_body)
        except BaseException:
            listener.close()
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        logger.info("sandbox %s: took over its channel at %s", sandbox_id, endpoint.path)
        return endpoint

    def accept(self, deadline: float) -> Channel:
        """Wait for the agent to connect; connections from a uid other than the sandbox's are closed and skipped.

        Args:
            deadline: absolute ``time.monotonic()`` value.

        Returns:
            The connection, not yet authenticated (the handshake is the caller's).

        Raises:
            AgentTimeoutError: no acceptable connection by ``deadline``.
            ChannelLost: the endpoint is closed or the listening socket failed.
        """
        if self._closed:
            raise ChannelLost(f"the endpoint of sandbox {self.sandbox_id} is closed")
        what = functools.partial(str, f"no agent of sandbox {self.sandbox_id} connected to {self.path}")
        while True:
            try:
                conn, _ = self._listener.accept()
            except BlockingIOError:
                if not self._still_ours():
                    raise ChannelLost(
                        f"another controller put its socket at {self.path}: the agent will connect there"
                    ) from None
                try:
                    wait_for(self._listener, select.POLLIN, min(deadline, time.monotonic() + _REPLACED_CHECK), what)
                except AgentTimeoutError:
                    if time.monotonic() >= deadline:
                        raise
                continue
            except OSError as exc:
                raise ChannelLost(f"accepting a connection on {self.path} failed: {exc}") from exc
            peer = peer_credentials(conn)
            if self.sandbox_uid is not None and peer is not None and peer.uid != self.sandbox_uid:
                logger.warning(
                    "sandbox %s: refused a connection from pid %d uid %d (the sandbox runs as uid %d)",
                    self.sandbox_id,
                    peer.pid,
                    peer.uid,
                    self.sandbox_uid,
                )
                conn.close()
                continue
            logger.debug("sandbox %s: accepted a connection from %s", self.sandbox_id, peer)
            return Channel(conn, self._max_header, self._max_body)

    def _still_ours(self) -> bool:
        """True while the socket file at ``path`` is the one we listen on (no other controller replaced it)."""
        try:
            st = os.lstat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._socket_file

    def mounts(self) -> dict[str, str]:
        """The sandbox directory -> ``CHANNEL_MOUNT``, to be mounted read-only."""
        return {str(self.directory): CHANNEL_MOUNT}

    def environment(self) -> dict[str, str]:
        """``ORCH_CHANNEL`` and ``ORCH_SECRET_FILE``: the socket and the secret as the container sees them."""
        return {
            "ORCH_CHANNEL": f"{CHANNEL_MOUNT}/{SOCKET_NAME}",
            "ORCH_SECRET_FILE": f"{CHANNEL_MOUNT}/{SECRET_NAME}",
        }

    def close(self) -> None:
        """Stop listening (idempotent). The socket file stays: an agent that dials it is refused.

        Deleting it "if it is still ours" would be a check and then an unlink, and a takeover that
        put its own file there in between would lose it, see its agent not connect and start a new
        container beside the live one. A socket file changes only by an owner's atomic rename
        (``open``) and goes with its sandbox's directory (``remove``).
        """
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()

    def remove(self) -> None:
        """Close, then delete the whole sandbox directory (its sandbox is gone)."""
        self.close()
        _remove_tree(self.directory)


def _check_sandbox_id(sandbox_id: str) -> None:
    if not isinstance(sandbox_id, str) or not _SANDBOX_ID.fullmatch(sandbox_id):
        raise ConfigError(
            f"sandbox id {sandbox_id!r} is not a plain name (letters, digits, '_', '.', '-'; at most 64; "
            "not starting with a dot)"
        )


def _check_socket_path(path: Path) -> None:
    size = len(os.fsencode(path))
    if size > MAX_SOCKET_PATH:
        raise ConfigError(
            f"the socket path {path} is {size} bytes, over the {MAX_SOCKET_PATH} bytes a Unix socket path may have; "
            f"use a shorter Settings.runtime_dir (ORCH_RUNTIME_DIR), such as /tmp/orchestrator-{os.geteuid()}"
        )


def _check_private(path: Path) -> None:
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise ConfigError(f"cannot inspect the directory {path}: {exc}; {_RUNTIME_DIR_ADVICE}") from exc
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(f"{path} is a symbolic link, not a private directory: remove it {_RUNTIME_DIR_ADVICE}")
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{path} is not a directory: remove it {_RUNTIME_DIR_ADVICE}")
    if st.st_uid != os.geteuid():
        raise ConfigError(
            f"{path} belongs to uid {st.st_uid}, not to this process (uid {os.geteuid()}); another user may have "
            f"created it to watch our sockets: do not use it, {_RUNTIME_DIR_ADVICE}"
        )
    if st.st_mode & 0o077:
        raise ConfigError(
            f"{path} has mode {stat.S_IMODE(st.st_mode):04o}, open to other users; run `chmod 700 {path}` "
            f"{_RUNTIME_DIR_ADVICE}"
        )


def _check_entry(path: Path, st: os.stat_result, is_kind: Callable[[int], bool], kind: str, owners: set[int]) -> None:
    """Refuse a sandbox directory or secret that is a link, of the wrong kind, foreign or writable by others."""
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(f"{path} is a symbolic link; refusing to follow it (remove it if it is not yours)")
    if not is_kind(st.st_mode):
        raise ConfigError(f"{path} is not {kind}")
    if st.st_uid not in owners:
        raise ConfigError(f"{path} belongs to uid {st.st_uid}, which is neither root, us nor the sandbox's user")
    if st.st_mode & 0o022:
        raise ConfigError(f"{path} has mode {stat.S_IMODE(st.st_mode):04o}: others may write to it")


def _give_to(sandbox_uid: int | None, sandbox_gid: int | None) -> tuple[int, int] | None:
    """The (uid, gid) to hand the sandbox's files to; None when we cannot (not root) or do not know whom to."""
    if sandbox_uid is None or os.geteuid() != 0:
        return None
    return sandbox_uid, -1 if sandbox_gid is None else sandbox_gid


def _set_mode(path: Path, mode: int) -> None:
    fd = os.open(path, _DIR_FLAGS)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _write_secret(dir_fd: int, text: bytes, give_to: tuple[int, int] | None) -> None:
    mode = 0o400 if give_to is not None else 0o444
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(SECRET_NAME, flags, mode, dir_fd=dir_fd)
    try:
        view = memoryview(text)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)  # the umask may have taken bits off
        if give_to is not None:
            os.fchown(fd, *give_to)
    finally:
        os.close(fd)


def _read_secret(dir_fd: int, path: Path, owners: set[int]) -> bytes:
    try:
        # O_NONBLOCK: a FIFO planted in place of the secret must not hang the open.
        fd = os.open(SECRET_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as exc:
        raise ConfigError(f"cannot open the sandbox secret {path}: {exc}") from exc
    try:
        _check_entry(path, os.fstat(fd), stat.S_ISREG, "a regular file", owners)
        text = os.read(fd, 2 * protocol.SECRET_BYTES + 2)
    finally:
        os.close(fd)
    try:
        return protocol.parse_secret(text)
    except ValueError as exc:
        raise ConfigError(f"the sandbox secret {path} is malformed: {exc}") from None


def _listen(path: Path, give_to: tuple[int, int] | None) -> tuple[socket.socket, tuple[int, int]]:
    """A non-blocking socket bound at ``path`` (which must not exist) and listening, with the sandbox's access.

    Returns:
        The socket and the (st_dev, st_ino) of its file, which a rename keeps.
    """
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(os.fspath(path))
    except OSError as exc:
        listener.close()
        raise ConfigError(f"cannot listen at {path}: {exc}") from exc
    try:
        st = os.lstat(path)
        if give_to is not None:
            os.chown(path, *give_to, follow_symlinks=False)
            os.chmod(path, 0o600)
        else:
            os.chmod(path, 0o666)  # the agent runs as another uid, and connecting needs write permission
        listener.listen(_BACKLOG)
        listener.setblocking(False)
    except BaseException:
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    return listener, (st.st_dev, st.st_ino)


def _remove_tree(directory: Path) -> None:
    """Delete a sandbox directory; a link or other non-directory in its place is left alone."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        logger.warning("%s is not a directory (a symbolic link?); left alone", directory)
        return

    def failed(function: object, path: str, exc: BaseException) -> None:
        if not isinstance(exc, FileNotFoundError):
            logger.warning("could not delete %s: %s", path, exc)

    if sys.version_info >= (3, 12):
        shutil.rmtree(directory, onexc=failed)
    else:
        shutil.rmtree(directory, onerror=lambda function, path, info: failed(function, path, info[1]))
