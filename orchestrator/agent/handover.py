"""The handover of the worker's data channel: a frame that carries socket descriptors (SCM_RIGHTS).

The controller (docs/design/one-hop.md) makes two socket pairs, one for requests and
replies and one for host calls, and sends one end of each to the supervisor in a ``data_channel``
frame on its connection; the supervisor checks them and passes them on to its worker in the same
way, keeping no copy, and the worker serves the controller on them directly. Such a frame has no
body; its descriptors come with its first bytes. Standard library only (Python 3.9 has
``socket.send_fds`` and ``socket.recv_fds``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from typing import List, Sequence, Tuple

from . import framing

_CONTROL_HEADER_BYTES = 4096  # a control frame is a type and a few small fields


def send_with_fds(sock: socket.socket, header: framing.Message, fds: Sequence[int]) -> None:
    """Write a frame without a body, ``fds`` attached to its first bytes."""
    data = framing.frame_head(header, 0)
    sent = socket.send_fds(sock, [data], list(fds))
    if sent < len(data):
        sock.sendall(data[sent:])


def pass_fds(sock: socket.socket, fds: Sequence[int]) -> None:
    """Pass ``fds`` to the worker on its link, after a ``data_channel`` frame: one byte carries them, so the worker
    reads its link with plain reads except right after that frame (``take_fds``)."""
    socket.send_fds(sock, [b"\0"], list(fds))


def take_fds(sock: socket.socket, count: int) -> List[socket.socket]:
    """The worker's side of ``pass_fds``: the sockets that came with the byte after a ``data_channel`` frame.

    Raises:
        ProtocolViolation: not ``count`` Unix stream sockets.
        ChannelClosed: the link closed.
    """
    data, fds, flags, _ = socket.recv_fds(sock, 1, count, socket.MSG_CMSG_CLOEXEC)
    if not data:
        close_fds(fds)
        raise framing.ChannelClosed("the supervisor closed the link")
    if flags & socket.MSG_CTRUNC:
        close_fds(fds)
        raise framing.ProtocolViolation("more than %d descriptors came" % count)
    return stream_sockets(fds, count)


def rights(ancillary: Sequence[Tuple[int, int, bytes]]) -> List[int]:
    """The descriptors in what ``recvmsg`` returned as ancillary data (SCM_RIGHTS), now the caller's to close."""
    return [
        int.from_bytes(data[i : i + 4], sys.byteorder)
        for level, kind, data in ancillary
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
        for i in range(0, len(data) - len(data) % 4, 4)
    ]


def close_fds(fds: Sequence[int]) -> None:
    """Close descriptors that came with a frame and are not used."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def recv_with_fds(sock: socket.socket, max_fds: int, max_body: int = 0) -> Tuple[framing.Header, List[int], bytes]:
    """One frame, its body of at most ``max_body`` bytes (a relay frame's) and the descriptors that came with it (at
    most ``max_fds``; they are close-on-exec).

    Raises:
        ProtocolViolation: more descriptors than ``max_fds`` came (the kernel closed the rest; those that came are
            closed too), or the frame is invalid or its body too long.
        ChannelClosed: the peer closed the connection.
    """
    prefix = bytearray()
    fds: List[int] = []
    try:
        while len(prefix) < framing.PREFIX.size:
            data, got, flags, _ = socket.recv_fds(
                sock, framing.PREFIX.size - len(prefix), max_fds, socket.MSG_CMSG_CLOEXEC
            )
            fds.extend(got)
            if flags & socket.MSG_CTRUNC or len(fds) > max_fds:
                raise framing.ProtocolViolation("a frame came with more than %d descriptors" % max_fds)
            if not data:
                raise framing.ChannelClosed("the peer closed the connection")
            prefix += data
        head_len, body_len = framing.parse_prefix(prefix, _CONTROL_HEADER_BYTES, max_body)
        header = framing.decode_header(framing.recv_exactly(sock, head_len))
        body = bytes(framing.recv_exactly(sock, body_len)) if body_len else b""
    except BaseException:
        close_fds(fds)
        raise
    return header, fds, body


def stream_sockets(fds: Sequence[int], count: int) -> List[socket.socket]:
    """``fds`` as sockets, if they are exactly ``count`` connected Unix stream sockets; else close them all.

    Raises:
        ProtocolViolation: another count, or a descriptor that is not a Unix stream socket.
    """
    sockets: List[socket.socket] = []
    try:
        if len(fds) != count:
            raise framing.ProtocolViolation("a data channel needs %d descriptors, got %d" % (count, len(fds)))
        for fd in fds:
            sock = socket.socket(fileno=fd)  # OSError (ENOTSOCK) for a file or a pipe
            sockets.append(sock)
            if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
                raise framing.ProtocolViolation("a data channel's descriptor is not a Unix stream socket")
    except OSError as exc:
        for sock in sockets:
            sock.close()
        close_fds(fds[len(sockets) :])
        raise framing.ProtocolViolation("a data channel's descriptor is not a socket (%s)" % exc) from None
    except framing.ProtocolViolation:
        for sock in sockets:
            sock.close()
        close_fds(fds[len(sockets) :])
        raise
    return sockets
