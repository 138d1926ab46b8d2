"""The sandbox worker: holds the session's globals and runs cells; the supervisor does everything else.

Standard library plus dill. Started by the supervisor as ``python3 -c 'from
orchestrator_agent.worker import main; main()' FD`` with one end of a socket pair on FD.
It answers one request at a time with a reply and the checkpoint delta that the request
caused. It installs the session namespace as ``__main__`` before importing dill, so that
functions defined in cells pickle with a reference to the namespace rather than a copy.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import sys
import time
import types
from typing import Any, Dict, List, Tuple

from . import capture, protocol

_session_module = types.ModuleType("__main__")
sys.modules["__main__"] = _session_module

from . import cells, checkpoint  # noqa: E402  (imports dill, which must see the session module)


def _fresh_namespace(namespace: Dict[str, Any]) -> None:
    namespace.clear()
    namespace.update({"__name__": "__main__", "__builtins__": __builtins__, "__doc__": None})


class Worker:
    """Serves requests from the supervisor over one socket."""

    def __init__(self, sock: socket.socket, output_limit: int) -> None:
        self.sock = sock
        self.output_limit = output_limit
        self.namespace = _session_module.__dict__
        _fresh_namespace(self.namespace)
        self.tracker = checkpoint.Tracker()
        self.cell_number = 0
        self.in_cell = False

    def _on_sigint(self, signum: int, frame: Any) -> None:
        # Only a running cell is interrupted; checkpointing and I/O must finish untouched.
        if self.in_cell:
            raise KeyboardInterrupt

    def serve(self) -> None:
        signal.signal(signal.SIGINT, self._on_sigint)
        protocol.send_frame(
            self.sock,
            {
                "type": protocol.HELLO,
                "python": platform.python_version(),
                "dill": checkpoint.dill.__version__,
                "pid": os.getpid(),
            },
        )
        while True:
            try:
                header, body = protocol.recv_frame(self.sock)
            except protocol.ChannelClosed:
                return
            reply, blobs = self.handle(header, body)
            reply["id"] = header.get("id")
            protocol.send_frame(self.sock, reply, blobs)
            # Restore input and checkpoint output can be hundreds of MB: free them before waiting.
            del body, reply, blobs

    def handle(self, header: Dict[str, Any], body: bytearray) -> Tuple[dict, List[bytes]]:
        kind = header["type"]
        if kind == protocol.EXEC:
            return self.execute(str(header.get("code", "")))
        if kind == protocol.RESTORE:
            return self.restore(header, body)
        if kind == protocol.SET_VALUE:
            return self.set_value(header, body)
        if kind == protocol.RESET:
            _fresh_namespace(self.namespace)
            return self.state_reply()
        return {
            "type": protocol.STATE_REPLY,
            "status": protocol.STATUS_PROTOCOL_ERROR,
            "message": "unknown request type %r" % kind,
        }, []

    def state_reply(self) -> Tuple[dict, List[bytes]]:
        delta, blobs = self.tracker.delta(self.namespace)
        return {"type": protocol.STATE_REPLY, "status": protocol.STATUS_OK, "checkpoint": delta}, blobs

    def execute(self, code: str) -> Tuple[dict, List[bytes]]:
        self.cell_number += 1
        out, out_sink = capture.open_capture(self.output_limit)
        err, err_sink = capture.open_capture(self.output_limit)
        saved_streams = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out, err
        started = time.monotonic()
        self.in_cell = True
        try:
            outcome = cells.run_cell(code, self.namespace, self.cell_number)
        finally:
            self.in_cell = False
            sys.stdout, sys.stderr = saved_streams
        duration = time.monotonic() - started
        delta, blobs = self.tracker.delta(self.namespace)
        reply = {
            "type": protocol.EXEC_REPLY,
            "status": protocol.STATUS_ERROR if outcome["error"] else protocol.STATUS_OK,
            "stdout": out_sink.text(),
            "stderr": err_sink.text(),
            "return_value": outcome["return_value"],
            "error": outcome["error"],
            "duration": duration,
            "checkpoint": delta,
        }
        return reply, blobs

    def restore(self, header: Dict[str, Any], body: bytearray) -> Tuple[dict, List[bytes]]:
        index = header["blobs"]
        parts = protocol.split_body(body, [int(b["size"]) for b in index])
        blobs = {b["digest"]: part for b, part in zip(index, parts, strict=False)}
        _fresh_namespace(self.namespace)
        failed = self.tracker.restore(self.namespace, int(header["generation"]), header["vars"], blobs)
        return {
            "type": protocol.RESTORE_REPLY,
            "status": protocol.STATUS_OK,
            "failed": failed,
            "generation": self.tracker.generation,
        }, []

    def set_value(self, header: Dict[str, Any], body: bytearray) -> Tuple[dict, List[bytes]]:
        kind = header["kind"]
        if kind == "str":
            value: Any = body.decode("utf-8", errors="surrogatepass")  # as the controller encoded it
        elif kind == "bytes":
            value = bytes(body)
        else:
            value = json.loads(body.decode("utf-8"))
        for name in [header["name"], *header.get("aliases", [])]:
            self.namespace[name] = value
        return self.state_reply()


def _make_worker_the_oom_victim() -> None:
    # If the sandbox runs out of memory the kernel should kill the worker, not the supervisor.
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("1000")
    except OSError:
        pass


def main() -> None:
    """Entry point: ``argv[1]`` is the socket fd, ``argv[2]`` the per-stream output limit in bytes."""
    _make_worker_the_oom_victim()
    sock = socket.socket(fileno=int(sys.argv[1]))
    Worker(sock, int(sys.argv[2])).serve()
