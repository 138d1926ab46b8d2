"""The channel to the controller: its socket file, and which one the supervisor is connected to.

A new controller (a takeover) binds a new socket file at the channel path and then signals the
supervisor (SIGUSR1), which drops its connection and connects to the new file. The signal is
stale when the supervisor already reconnected to that very file on its own (the old controller
had let go): the file it connected to is remembered by its inode.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Optional

from . import framing


class Channel(object):
    """The socket file at ``path`` and which one of them the supervisor is connected to."""

    def __init__(self, path: str, frame_timeout: float) -> None:
        self.path = path
        self.frame_timeout = frame_timeout  # each read and write on a connection (limit_each_io)
        self.inode: Optional[int] = None  # the socket file of the connection, once connected
        self.takeover_requested = False  # a signal came: a new controller may have bound a new socket file

    def connect(self) -> socket.socket:
        """Connect to the controller, retrying until one listens; remember which socket file it was."""
        delay = 0.01
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                inode = os.stat(self.path).st_ino
                sock.connect(self.path)
                if os.stat(self.path).st_ino == inode:
                    self.inode = inode
                    framing.limit_each_io(sock, self.frame_timeout)
                    return sock
            except OSError:
                pass
            sock.close()
            time.sleep(delay)
            delay = min(delay * 2, 0.25)

    def replaced(self) -> bool:
        """True when a controller other than ours now listens on the channel path (a takeover).

        A new controller binds a new socket file and then signals us; if we already reconnected
        to that very file on our own (the old controller had let go), the signal is stale.
        """
        try:
            return os.stat(self.path).st_ino != self.inode
        except OSError:
            return True

    def takeover_due(self) -> bool:
        """Whether a takeover was signalled since the last call, and is real."""
        if not self.takeover_requested:
            return False
        self.takeover_requested = False
        return self.replaced()
