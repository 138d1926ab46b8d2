"""The worker's side of host calls: cell code asks the controller for something and waits for the answer.

Standard library only (runs in the sandbox worker). Calls go out as ``host_call`` frames on
the worker's own call link to the supervisor (a socket pair apart from the request link, so
a call never interleaves with a request or a reply); one reader thread hands each
``host_reply`` to the thread that waits for it, so many calls can be in flight at once, from
any thread. Payloads and results are JSON, never pickles. See docs/protocol.md, "Host calls".
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from typing import Any, Callable, ContextManager, Dict, Optional

from . import protocol


class HostCallError(RuntimeError):
    """The host call failed: no handler, the handler raised, it took too long, or the cell ended."""


class _Slot(object):
    __slots__ = ("body", "done", "header")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.header: Dict[str, Any] = {}
        self.body = bytearray()


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

    def call_raw(self, name: str, payload: Any = None, timeout: Optional[float] = None) -> bytearray:
        """``call``, returning the answer's body as it came (a deferred value's blob: ``protocol.BLOB_CALL``)."""
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
        slot = _Slot()
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
                protocol.send_frame(self._sock, {"type": protocol.HOST_CALL, "call": call_id, "name": name}, raw)
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
            protocol.send_frame(self._sock, {"type": protocol.OUTPUT, "stream": stream}, data)

    def close(self) -> None:
        """Shut the link down (one hop's data channel ended): its reader ends, and waiting calls fail."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._fail("the controller closed the link")

    def _read_replies(self) -> None:
        while True:
            try:
                # The supervisor bounds each answer (a deferred value's blob by the request body limit).
                header, body = protocol.recv_frame(self._sock, protocol.MAX_HEADER_BYTES, protocol.MAX_BODY_BYTES)
            except (OSError, protocol.ChannelClosed, protocol.ProtocolViolation) as exc:
                self._fail("the link to the supervisor broke (%s)" % (exc or type(exc).__name__))
                return
            with self._lock:
                slot = self._pending.get(header.get("call"))  # type: ignore[arg-type]
            if slot is not None:
                slot.header, slot.body = header, body
                slot.done.set()

    def _fail(self, reason: str) -> None:
        with self._lock:
            self._broken = reason
            slots = list(self._pending.values())
        for slot in slots:
            slot.header = {"status": protocol.STATUS_ERROR, "error": "host calls are unavailable: %s" % reason}
            slot.done.set()
