"""The byte channel between the controller and one agent: a Unix socket the controller listens on.

The controller owns the listening socket in a per-session host directory, which the
container sees through a read-only bind mount, so a sandbox can connect but can never
plant files on the host. Foreign errors (OSError, socket timeouts, bad frames) are
translated here into the ``TransportError`` family.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
from collections.abc import Sequence
from pathlib import Path

from .agent import protocol
from .errors import AgentTimeoutError, ChannelLost, ProtocolError

logger = logging.getLogger(__name__)

SOCKET_NAME = "channel.sock"


class Channel:
    """One open connection to an agent, with the host's frame limits."""

    def __init__(self, sock: socket.socket, max_header: int, max_body: int) -> None:
        self._sock = sock
        self._max_header = max_header
        self._max_body = max_body

    def send(self, header: protocol.Header, body: protocol.Body | Sequence[protocol.Body] = b"") -> None:
        """Send one frame.

        Raises:
            ChannelLost: the agent's end is closed.
        """
        try:
            self._sock.settimeout(None)
            protocol.send_frame(self._sock, header, body)
        except OSError as exc:
            raise ChannelLost(f"sending to the agent failed: {exc}") from exc

    def recv(self, timeout: float | None) -> tuple[protocol.Header, bytearray]:
        """Receive one frame within ``timeout`` seconds (None waits for ever).

        Raises:
            AgentTimeoutError: nothing complete arrived in time.
            ChannelLost: the agent's end closed.
            ProtocolError: the bytes were not a valid frame within the limits.
        """
        try:
            self._sock.settimeout(timeout)
            return protocol.recv_frame(self._sock, self._max_header, self._max_body)
        except TimeoutError as exc:
            raise AgentTimeoutError(f"the agent did not answer within {timeout:.1f} s") from exc
        except protocol.ChannelClosed as exc:
            raise ChannelLost(f"the agent closed the channel ({exc})") from exc
        except protocol.ProtocolViolation as exc:
            raise ProtocolError(f"the agent sent an invalid frame: {exc}") from exc
        except OSError as exc:
            raise ChannelLost(f"reading from the agent failed: {exc}") from exc

    def has_pending(self) -> bool:
        """True when the agent sent something or hung up, without blocking (between calls it should be silent)."""
        try:
            readable, _, _ = select.select([self._sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()


class ChannelListener:
    """The listening socket of one session, at ``<directory>/channel.sock``."""

    def __init__(self, directory: Path, max_header: int, max_body: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o755)
        self.path = directory / SOCKET_NAME
        self._max_header = max_header
        self._max_body = max_body
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a stale socket of a dead controller, or one we take over
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(self.path))
        # The agent runs as another uid (nobody) and needs write permission to connect.
        self.path.chmod(0o666)
        self._inode = self.path.stat().st_ino
        self._sock.listen(8)

    def accept(self, timeout: float) -> Channel:
        """Wait for the agent to connect.

        Raises:
            AgentTimeoutError: no connection within ``timeout`` seconds.
        """
        self._sock.settimeout(timeout)
        try:
            conn, _ = self._sock.accept()
        except TimeoutError as exc:
            raise AgentTimeoutError(f"no agent connected within {timeout:.1f} s") from exc
        return Channel(conn, self._max_header, self._max_body)

    def close(self) -> None:
        """Stop listening; remove the socket file unless another controller has replaced it."""
        with contextlib.suppress(OSError):
            self._sock.close()
        with contextlib.suppress(OSError):
            if self.path.stat().st_ino == self._inode:
                os.unlink(self.path)
