"""The worker's side of host calls: cell code asks the controller for something and waits for the answer.

Standard library only (runs in the sandbox worker). Calls go out as ``host_call`` frames on
the data channel's call link to the controller (K, a socket pair apart from the requests' D, so
a call never interleaves with a request or a reply); one reader thread hands each
``host_reply`` to the thread that waits for it, so many calls can be in flight at once, from
any thread. Payloads and results are JSON, never pickles. See docs/protocol.md, "Host calls".
A deferred value's blob may come as a read-only descriptor of its file (the reply's
``file``, docs/protocol.md "Deferred values"): the reader maps it, and a descriptor any other
frame brings is closed unused.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from typing import Any, Callable, ContextManager, Dict, List, Optional, Tuple

from . import framing, handover, protocol

_FD_SPACE = socket.CMSG_SPACE(2 * 4)  # a reply brings at most one descriptor; room for two to see a second


class HostCallError(RuntimeError):
    """The host call failed: no handler, the handler raised, it took too long, or the cell ended."""


class _Slot(object):
    __slots__ = ("body", "done", "header", "takes_file")

    def __init__(self, takes_file: bool) -> None:
        self.done = threading.Event()
        self.header: Dict[str, Any] = {}
        self.body: Any = bytearray()  # or, for a blob that came as a file, its read-only mapping
        self.takes_file = takes_file


class HostCallClient(object):
    """Sends calls on the call link and matches replies to their callers."""

    def __init__(self, sock: socket.socket, max_bytes: int, shield: Callable[[], ContextManager[None]]) -> None:
        """``shield()`` makes a section safe from the cell's interrupt (a frame is never torn)."""
        self._sock = sock
        self._max_bytes = max_bytes
        self._shield = shield
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._pending: Dict[int, _Slot] = {}
        self._next_id = 0
        self._reader: Optional[threading.Thread] = None
        self._broken: Optional[str] = None

    def call(self, name: str, payload: Any = None, timeout: Optional[float] = None) -> Any:
        """Ask the controller's handler ``name`` with a JSON ``payload``; return its JSON result.

        Raises:
            HostCallError: the call failed (the message says why).
        """
        body = self.call_raw(name, payload, timeout)
        try:
            return json.loads(body.decode("utf-8", "surrogatepass"))
        except ValueError as exc:
            raise HostCallError("the result of host call %r is not valid JSON: %s" % (name, exc)) from None

    def call_raw(self, name: str, payload: Any = None, timeout: Optional[float] = None) -> Any:
        """``call``, returning the answer's body as it came: a bytearray, or for a deferred value's blob
        (``protocol.BLOB_CALL``) that came as a file, its read-only mapping (an ``mmap``, the caller closes it)."""
        if not isinstance(name, str) or not name:
            raise HostCallError("a host call needs a handler name (a non-empty str)")
        try:
            raw = json.dumps(payload, ensure_ascii=False, allow_nan=False).encode("utf-8", "surrogatepass")
        except (TypeError, ValueError) as exc:
            raise HostCallError("the payload of host call %r is not JSON-serializable: %s" % (name, exc)) from None
        if len(raw) > self._max_bytes:
            raise HostCallError(
                "the payload of host call %r is %d bytes of JSON, over the %d-byte limit"
                % (name, len(raw), self._max_bytes)
            )
        slot = _Slot(name == protocol.BLOB_CALL)
        with self._lock:
            if self._broken is not None:
                raise HostCallError("host calls are unavailable: %s" % self._broken)
            self._next_id += 1
            call_id = self._next_id
            self._pending[call_id] = slot
            if self._reader is None:
                self._reader = threading.Thread(target=self._read_replies, name="host-call-replies", daemon=True)
                self._reader.start()
        try:
            with self._shield(), self._send_lock:
                framing.send_frame(self._sock, {"type": protocol.HOST_CALL, "call": call_id, "name": name}, raw)
            if not slot.done.wait(timeout):
                raise HostCallError("host call %r got no answer within %g s" % (name, timeout))
        except OSError as exc:
            raise HostCallError("host call %r could not be sent: %s" % (name, exc)) from None
        finally:
            with self._lock:
                self._pending.pop(call_id, None)
        if slot.header.get("status") != protocol.STATUS_OK:
            raise HostCallError(str(slot.header.get("error") or "host call %r failed" % name))
        return slot.body

    def send_output(self, stream: str, data: bytes) -> None:
        """Send a piece of the running cell's output (one-way: no answer comes). Raises OSError if the link broke."""
        with self._shield(), self._send_lock:
            framing.send_frame(self._sock, {"type": protocol.OUTPUT, "stream": stream}, data)

    def close(self) -> None:
        """Shut the link down (its data channel ended): its reader ends, and waiting calls fail."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._fail("the controller closed the link")

    def _read_replies(self) -> None:
        while True:
            try:
                # The controller bounds each answer (a deferred value's blob by the request body limit).
                header, body, fds = _recv_reply(self._sock)
            except (OSError, framing.ChannelClosed, framing.ProtocolViolation) as exc:
                self._fail("the link to the controller broke (%s)" % (exc or type(exc).__name__))
                return
            with self._lock:
                slot = self._pending.get(header.get("call"))  # type: ignore[arg-type]
            try:
                if slot is not None:
                    slot.header, slot.body = _answer(header, body, fds, slot.takes_file)
            finally:
                handover.close_fds(fds)  # a mapping keeps its own reference; any other descriptor came unasked
            if slot is not None:
                slot.done.set()

    def _fail(self, reason: str) -> None:
        with self._lock:
            self._broken = reason
            slots = list(self._pending.values())
        for slot in slots:
            slot.header = {"status": protocol.STATUS_ERROR, "error": "host calls are unavailable: %s" % reason}
            slot.done.set()


def map_file(fd: int, size: int) -> Any:
    """The file behind ``fd``, mapped read-only (a value file, a deferred value's blob).

    Raises:
        ValueError: it is not ``size`` bytes (or is empty).
        OSError: it cannot be mapped (not a regular file).
    """
    import mmap  # only here: most sandboxes never take a file

    actual = os.fstat(fd).st_size
    if actual != size:
        raise ValueError("the file holds %d bytes, not the %d announced" % (actual, size))
    return mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), prot=mmap.PROT_READ)


def _recv_reply(sock: socket.socket) -> Tuple[Dict[str, Any], bytearray, List[int]]:
    """One frame from the link and the descriptors that came with its prefix (close-on-exec; the caller closes them).

    The prefix is read with ``recvmsg`` asking for no byte past it, so a descriptor it brings belongs to this frame;
    the rest is read with plain reads, which never take a descriptor in (the kernel drops any that comes there).
    """
    prefix = bytearray(framing.PREFIX.size)
    fds: List[int] = []
    got = 0
    try:
        while got < len(prefix):
            count, ancillary, _, _ = sock.recvmsg_into(
                [memoryview(prefix)[got:]], _FD_SPACE, getattr(socket, "MSG_CMSG_CLOEXEC", 0)
            )
            fds.extend(handover.rights(ancillary))
            if not count:
                raise framing.ChannelClosed("connection closed after %d of %d bytes" % (got, len(prefix)))
            got += count
        head_len, body_len = framing.parse_prefix(prefix, framing.MAX_HEADER_BYTES, framing.MAX_BODY_BYTES)
        header = framing.decode_header(framing.recv_exactly(sock, head_len))
        body = framing.recv_exactly(sock, body_len)
    except BaseException:
        handover.close_fds(fds)
        raise
    return header, body, fds


def _answer(header: Dict[str, Any], body: bytearray, fds: List[int], takes_file: bool) -> Tuple[Dict[str, Any], Any]:
    """A reply's header and body for its caller: a blob that came as a file mapped, if the reply says so (``file``,
    its size) and its call may take one; such a reply that is not whole is an error of the call."""
    size = header.get("file")
    if size is None or header.get("status") != protocol.STATUS_OK:
        return header, body  # a descriptor that came with it is closed unused
    problem = None
    if not takes_file:
        problem = "a file came for a call that takes none"
    elif type(size) is not int or size < 0 or body:
        problem = "its file size %r is not valid" % (size,)
    elif len(fds) != 1:
        problem = "%d descriptors came with it, not one" % len(fds)
    if problem is None:
        try:
            return header, map_file(fds[0], size)
        except (OSError, ValueError) as exc:
            problem = "its file cannot be mapped: %s" % exc
    error = "the answer to host call %r: %s" % (header.get("call"), problem)
    return {"status": protocol.STATUS_ERROR, "error": error}, bytearray()
