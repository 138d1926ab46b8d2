"""How the controller reaches one sandbox's agent: a private host directory with a secret and a listening socket.

Each sandbox gets ``<runtime_dir>/<sandbox_id>/`` (docs/protocol.md, "The sandbox directory
and the secret"), which the backend bind-mounts read-only at ``CHANNEL_MOUNT``: the agent can
read the secret and connect to the socket but cannot plant files on the host. The directory
work (no symbolic link followed, every directory checked with ``lstat``, owners and modes) is
``orchestrator/agent/rendezvous.py``, which the node relay of a Swarm shares; this module
turns its failures into ``ConfigError``. The handshake that proves both ends know the secret
is the connection's job; an endpoint hands out connections the OS vouches for
(``SO_PEERCRED``) and the secret.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from ..agent import rendezvous
from ..errors import AgentTimeoutError, ChannelLost, ConfigError
from .transport import Channel, peer_credentials, wait_for

logger = logging.getLogger(__name__)

CHANNEL_MOUNT = "/run/orchestrator"
"""Where the sandbox directory appears inside the container (read-only)."""
SOCKET_NAME = rendezvous.SOCKET_NAME
SECRET_NAME = rendezvous.SECRET_NAME
MAX_SOCKET_PATH = rendezvous.MAX_SOCKET_PATH
"""Longest Unix socket path in bytes (``sun_path`` is 108 bytes with its NUL on Linux)."""

_SANDBOX_ID = rendezvous.SANDBOX_ID
_REPLACED_CHECK = 0.25  # seconds between checks, while waiting, that no other controller replaced our socket
_RUNTIME_DIR = "Settings.runtime_dir (ORCH_RUNTIME_DIR)"


class Endpoint(Protocol):
    """Where a controller waits for one sandbox's agent, and what the sandbox needs to find it."""

    sandbox_id: str
    secret: bytes
    """The sandbox's shared secret: the key ``handshake.auth_proof`` takes."""

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

    def constraints(self) -> list[str]:
        """Where the sandbox must run to reach this endpoint, as placement constraints (``node.id==...``); [] is
        anywhere the backend runs containers, as ``mounts`` tells what to mount."""
        ...

    def groups(self) -> list[int]:
        """Supplementary groups the sandbox's supervisor needs to open the mounted secret and socket (and its
        worker, which runs with none, cannot)."""
        ...

    def close(self) -> None:
        """Stop listening."""
        ...

    def remove(self) -> None:
        """Close, then delete what the endpoint made for the sandbox (its sandbox is gone)."""
        ...


@contextlib.contextmanager
def _config_errors() -> Iterator[None]:
    """The rendezvous module's refusals, as the controller's ``ConfigError``."""
    try:
        yield
    except rendezvous.RendezvousError as exc:
        raise ConfigError(str(exc)) from None


def channel_environment() -> dict[str, str]:
    """``ORCH_CHANNEL`` and ``ORCH_SECRET_FILE``: the socket and the secret as the container sees them."""
    return {
        "ORCH_CHANNEL": f"{CHANNEL_MOUNT}/{SOCKET_NAME}",
        "ORCH_SECRET_FILE": f"{CHANNEL_MOUNT}/{SECRET_NAME}",
    }


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) with mode 0700, or check that the existing one is private.

    Returns:
        ``path``.

    Raises:
        ConfigError: it is a symbolic link, not a directory, not owned by this process's
            effective uid, has any group or other permission bit, or cannot be created.
    """
    with _config_errors():
        return rendezvous.ensure_private_dir(Path(path), _RUNTIME_DIR)


def leftover_dir_grace(start_timeout: float) -> float:
    """Seconds from which a sandbox directory that no sandbox uses is a leftover, not one starting now: a directory
    is made just before its container or service, which then has ``start_timeout`` to come up."""
    return 2 * start_timeout


def discard_sandbox_dir(runtime_dir: Path, sandbox_id: str) -> None:
    """Delete ``<runtime_dir>/<sandbox_id>`` once its sandbox is gone; nothing happens if it does not exist.

    A symbolic link or other non-directory there is left alone (and logged), never followed.
    Failures to delete are logged, not raised: this is clean-up.

    Raises:
        ConfigError: ``sandbox_id`` is not a plain name, or ``runtime_dir`` exists but is not private.
    """
    with _config_errors():
        rendezvous.discard(Path(runtime_dir), sandbox_id, _RUNTIME_DIR)


class UnixSocketEndpoint:
    """A sandbox's directory with its secret and the controller's listening socket in it.

    Layout (docs/protocol.md): ``<runtime_dir>/<sandbox_id>/secret`` and ``.../channel.sock``.
    When the controller runs as root and knows the sandbox's uid (its supervisor's: root, by
    default), the directory (0700), the secret (0400) and the socket (0600) belong to that uid.
    A controller that is not root cannot give files away: they stay its own, and its group's
    (0710, 0440, 0660), and the sandbox's supervisor gets that group as a supplementary group
    (``groups``); the worker runs with no group, so it can use neither. ``runtime_dir`` above
    them is 0700 and ours (``ensure_private_dir``), so no other host user can reach them; inside
    the container only this sandbox's directory is mounted, and the secret authenticates both ends.

    Use ``create`` for a new sandbox and ``open`` to take over a live one.

    Attributes:
        sandbox_id: the sandbox's id (a plain file name).
        directory: the sandbox directory on the host.
        path: the socket file on the host.
        secret: the shared secret (``handshake.SECRET_BYTES`` bytes).
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
        with _config_errors():
            made = rendezvous.create(Path(runtime_dir), sandbox_id, sandbox_uid, sandbox_gid, _RUNTIME_DIR)
        endpoint = cls(made.directory, made.listener, made.socket_file, made.secret, sandbox_uid, max_header, max_body)
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
        with _config_errors():
            taken = rendezvous.take_over(Path(runtime_dir), sandbox_id, sandbox_uid, sandbox_gid, _RUNTIME_DIR)
        endpoint = cls(
            taken.directory, taken.listener, taken.socket_file, taken.secret, sandbox_uid, max_header, max_body
        )
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
        return rendezvous.socket_file(self.directory) == self._socket_file

    def mounts(self) -> dict[str, str]:
        """The sandbox directory -> ``CHANNEL_MOUNT``, to be mounted read-only."""
        return {str(self.directory): CHANNEL_MOUNT}

    def environment(self) -> dict[str, str]:
        """``ORCH_CHANNEL`` and ``ORCH_SECRET_FILE``: the socket and the secret as the container sees them."""
        return channel_environment()

    def constraints(self) -> list[str]:
        """None: the sandbox runs beside this controller, on its engine."""
        return []

    def groups(self) -> list[int]:
        """Our group when we are not root: the group that may open the sandbox's secret and socket."""
        return rendezvous.supervisor_groups()

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
        rendezvous.remove_tree(self.directory)
