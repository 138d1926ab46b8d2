"""The channel to the controller: its socket file, and the connection being served, as a request sees it.

``Channel``: a new controller (a takeover) binds a new socket file at the channel path and then
signals the supervisor (SIGUSR1), which drops its connection and connects to the new file. The
signal is stale when the supervisor already reconnected to that very file on its own (the old
controller had let go): the file it connected to is remembered by its inode.

``ControllerLink``: during a request the supervisor reads the controller only while a cell runs
(it may be interrupted) or host calls wait for answers, never a request's bytes: ``watching``
says so, and the busy selector follows before its next wait (``sync_watch``). A connection that
broke in the middle of a request is marked ``lost``: the request finishes without it.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import time
from typing import Any, Dict, Optional

from . import framing
from .frames import CHUNK_BYTES, Inbox


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


class ControllerLink(object):
    """The connection being served (none between connections), its inbox, and whether the busy selector watches it."""

    def __init__(self, busy: selectors.BaseSelector) -> None:
        self.busy = busy  # the selector that waits for the worker during a request
        self.conn: Optional[socket.socket] = None  # the controller connection being served
        self.inbox: Optional[Inbox] = None  # frames from ``conn``
        self.lost = False  # the controller's connection broke during the request being served
        self.watching = False  # the controller's connection should be in the busy selector (sync_watch)
        self.registered = False  # it is there (kept between requests, so a run of cells registers it once)

    def attach(self, conn: socket.socket) -> Inbox:
        """Serve ``conn`` from now on; returns its inbox."""
        self.conn = conn
        inbox = self.inbox = Inbox(conn)
        self.lost = False
        return inbox

    def detach(self) -> None:
        """The connection is no longer served: out of the busy selector too."""
        self.watch(False)
        self.sync_watch()
        self.conn = None
        self.inbox = None

    def usable(self) -> bool:
        """Whether something can still be sent to the controller during this request."""
        return self.conn is not None and not self.lost

    def send(self, header: Dict[str, Any], body: Any = b"") -> None:
        assert self.conn is not None
        framing.send_frame(self.conn, header, body)  # within the socket's own limits (limit_each_io)

    def tell(self, header: Dict[str, Any]) -> None:
        """A notice during a request (the controller moves its deadline); a lost controller shows up later."""
        if self.conn is not None:
            with contextlib.suppress(OSError):
                framing.send_frame(self.conn, header)

    def watch(self, on: bool) -> None:
        """Read the controller during a request only while a cell runs (it may be interrupted) or host calls wait
        for answers (never a request's bytes). The busy selector follows before its next wait (``sync_watch``)."""
        if self.conn is not None:
            self.watching = on

    def sync_watch(self) -> None:
        """Make the busy selector watch the controller's connection, or not, as ``watching`` says.

        Between requests only the idle selector waits, so the connection may stay registered here: a run of
        cells registers it once, not twice per cell.
        """
        if self.watching == self.registered or self.conn is None:
            return
        if self.watching:
            self.busy.register(self.conn, selectors.EVENT_READ)
        else:
            with contextlib.suppress(KeyError, ValueError):
                self.busy.unregister(self.conn)
        self.registered = self.watching

    def discard(self, size: int) -> None:
        """Read and drop a request body from the controller."""
        inbox = self.inbox
        assert inbox is not None
        size -= len(inbox.take(size))
        if not size:
            return
        buf = bytearray(min(size, CHUNK_BYTES))
        view = memoryview(buf)
        while size:
            got = inbox.sock.recv_into(view[: min(size, CHUNK_BYTES)])
            if not got:
                raise framing.ChannelClosed("the controller closed the connection in the middle of a frame")
            size -= got
