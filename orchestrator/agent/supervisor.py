"""The sandbox supervisor: owns the channel to the controller, the timers and the worker's life.

Standard library only; it never runs user code and never unpickles. It connects to the
controller's Unix socket (and reconnects whenever the connection drops, so a restarted
controller can reattach to a live session), relays each request to the worker process,
and enforces the timeout ladder: SIGINT into the cell, then after a grace period a kill
of the worker's process group and a fresh, empty worker that the controller restores.
SIGUSR1 asks it to drop the current connection and connect again (controller takeover).
"""

from __future__ import annotations

import contextlib
import os
import platform
import select
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Dict, Optional, Tuple

from . import protocol

_OOM_COUNTERS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


def oom_kill_count() -> int:
    """How many processes the kernel OOM-killed in this container's cgroup (cgroup v1 or v2)."""
    for path in _OOM_COUNTERS:
        try:
            with open(path) as fh:
                for line in fh:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return 0


_WORKER_START_SECONDS = 60.0


class Config:
    """Settings the controller passes through the container environment."""

    def __init__(self, environ: Dict[str, str]) -> None:
        self.channel = environ.get("ORCH_CHANNEL", "/run/orchestrator/channel.sock")
        self.session_id = environ.get("ORCH_SESSION_ID", "")
        self.output_limit = int(environ.get("ORCH_OUTPUT_LIMIT", str(1 << 20)))
        self.grace = float(environ.get("ORCH_INTERRUPT_GRACE", "2.0"))
        self.max_body = int(environ.get("ORCH_MAX_BODY", str(protocol.MAX_BODY_BYTES)))
        # A frame the worker started must keep flowing: a stall this long mid-frame is treated as a forgery.
        self.frame_timeout = float(environ.get("ORCH_FRAME_TIMEOUT", "10"))


class WorkerProcess:
    """One worker process and our end of its socket."""

    def __init__(self, config: Config) -> None:
        ours, theirs = socket.socketpair()
        self.sock = ours
        self.oom_baseline = oom_kill_count()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from %s.worker import main; main()" % __package__,
                str(theirs.fileno()),
                str(config.output_limit),
            ],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=sys.stderr,
            start_new_session=True,
        )
        theirs.close()
        self.sock.settimeout(_WORKER_START_SECONDS)
        hello, _ = protocol.recv_frame(self.sock)
        self.sock.settimeout(config.frame_timeout)
        self.python = hello.get("python", "")
        self.dill = hello.get("dill", "")

    def interrupt(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGINT)

    def wrote_out_of_turn(self) -> bool:
        """True when unread bytes wait on the worker's socket (rather than the EOF of its death)."""
        try:
            return self.sock.recv(1, socket.MSG_PEEK) != b""
        except OSError:
            return False

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.sock.close()

    def death(self) -> Dict[str, Any]:
        """Reap the dead worker and say why it died."""
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        self.sock.close()
        oom = oom_kill_count() > self.oom_baseline
        info: Dict[str, Any] = {"exit_code": code, "oom": oom}
        if code is not None and code < 0:
            info["signal"] = signal.Signals(-code).name
        if oom:
            info["reason"] = "the worker was killed by the kernel's out-of-memory killer"
        elif code is not None and code < 0:
            info["reason"] = "the worker was killed by %s" % info["signal"]
        else:
            info["reason"] = "the worker exited with status %s" % code
        return info


_MAX_CACHED_BODY = 16 << 20


def _resendable(reply: dict, body: Any) -> Tuple[dict, Any]:
    """What to answer if the same request comes again: the reply itself, unless its body is big.

    Keeping a 100 MB checkpoint delta alive for a resend that almost never comes would double
    the sandbox's memory, so a big reply is remembered only as "ran, but lost": the controller
    then restores from its last stored checkpoint instead of running the code again.
    """
    if len(body) <= _MAX_CACHED_BODY:
        return reply, body
    lost = {
        "type": reply.get("type"),
        "status": protocol.STATUS_PROTOCOL_ERROR,
        "ran": True,
        "reason": "the reply to this request was lost and is too large to send again; restore instead",
    }
    return lost, b""


class Supervisor:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.worker = WorkerProcess(config)
        self.generation = 0
        self.worker_lost: Optional[Dict[str, Any]] = None
        self.last_reply: Optional[Tuple[Any, dict, bytes]] = None
        self.takeover_requested = False
        self.channel_inode: Optional[int] = None
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGUSR1, self._on_takeover)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    def _on_takeover(self, signum: int, frame: Any) -> None:
        self.takeover_requested = True

    def _respawn(self) -> None:
        self.worker = WorkerProcess(self.config)
        self.generation = 0

    def connect(self) -> socket.socket:
        """Connect to the controller, retrying until one listens; remember which socket file it was."""
        delay = 0.01
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                inode = os.stat(self.config.channel).st_ino
                sock.connect(self.config.channel)
                if os.stat(self.config.channel).st_ino == inode:
                    self.channel_inode = inode
                    return sock
            except OSError:
                pass
            sock.close()
            time.sleep(delay)
            delay = min(delay * 2, 0.25)

    def channel_replaced(self) -> bool:
        """True when a controller other than ours now listens on the channel path (a takeover).

        A new controller binds a new socket file and then signals us; if we already reconnected
        to that very file on our own (the old controller had let go), the signal is stale.
        """
        try:
            return os.stat(self.config.channel).st_ino != self.channel_inode
        except OSError:
            return True

    def run(self) -> None:
        while True:
            conn = self.connect()
            self.takeover_requested = False
            try:
                self.serve(conn)
            except (protocol.ChannelClosed, OSError, protocol.ProtocolViolation) as exc:
                print("supervisor: connection ended: %s" % exc, file=sys.stderr)
            finally:
                conn.close()

    def hello(self) -> dict:
        return {
            "type": protocol.HELLO,
            "protocol": protocol.PROTOCOL_VERSION,
            "python": platform.python_version(),
            "dill": self.worker.dill,
            "session_id": self.config.session_id,
            "generation": self.generation,
            "agent_pid": os.getpid(),
            "worker_pid": self.worker.proc.pid,
        }

    def serve(self, conn: socket.socket) -> None:
        protocol.send_frame(conn, self.hello())
        while True:
            readable, _, _ = select.select([conn, self.worker.sock, self.wake_r], [], [])
            if self.wake_r in readable:
                os.read(self.wake_r, 512)
            if self.takeover_requested:
                self.takeover_requested = False
                if self.channel_replaced():
                    protocol.send_frame(conn, {"type": protocol.GOODBYE, "reason": "takeover"})
                    return
            if self.worker.sock in readable:
                # The worker died, or cell code wrote on its socket, while no request was running.
                # Replace it before relaying anything (a request that came in meanwhile has not run yet).
                if self.worker.wrote_out_of_turn():
                    self.worker.kill()
                    self.worker_lost = {"reason": "the worker wrote out of turn; it was killed", "oom": False}
                else:
                    self.worker_lost = self.worker.death()
                    self.worker.kill()
                self._respawn()
                continue
            if conn in readable:
                header, body = protocol.recv_frame(conn, max_body=self.config.max_body)
                reply, reply_body = self.answer(header, body)
                reply["id"] = header.get("id")
                del body
                self.last_reply = (header.get("id"), *_resendable(reply, reply_body))
                protocol.send_frame(conn, reply, reply_body)
                del reply, reply_body

    def answer(self, header: dict, body: bytearray) -> Tuple[dict, Any]:
        kind = header["type"]
        if self.last_reply is not None and header.get("id") is not None and header.get("id") == self.last_reply[0]:
            return self.last_reply[1], self.last_reply[2]  # a resent request never runs twice
        if kind == protocol.PING:
            return {"type": protocol.PONG, "generation": self.generation}, b""
        if self.worker_lost is not None and kind != protocol.RESTORE:
            lost, self.worker_lost = self.worker_lost, None
            lost.update(type=protocol.EXEC_REPLY, status=protocol.STATUS_CRASHED, ran=False)
            return lost, b""
        self.worker_lost = None
        timeout = header.get("timeout") if kind == protocol.EXEC else None
        return self.relay(header, body, timeout)

    def relay(self, header: dict, body: bytearray, timeout: Optional[float]) -> Tuple[dict, Any]:
        """Send a request to the worker and wait for its reply, climbing the timeout ladder."""
        with contextlib.suppress(OSError):  # a dead worker: reading below reports how it died
            protocol.send_frame(self.worker.sock, header, body)
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        interrupted = False
        while True:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([self.worker.sock], [], [], wait)
            if readable:
                return self._worker_reply(header.get("id"), interrupted)
            if not interrupted:
                self.worker.interrupt()
                interrupted = True
                deadline = time.monotonic() + self.config.grace
                continue
            self.worker.kill()
            self._respawn()
            return {
                "type": protocol.EXEC_REPLY,
                "status": protocol.STATUS_TIMEOUT,
                "ran": True,
                "worker_restarted": True,
                "reason": "the cell ignored the interrupt for %.1f s; the worker was killed" % self.config.grace,
            }, b""

    def _worker_reply(self, request_id: Any, interrupted: bool) -> Tuple[dict, Any]:
        try:
            reply, reply_body = protocol.recv_frame(self.worker.sock, max_body=self.config.max_body)
            if reply.get("id") != request_id:
                # Cell code can write frames on the worker's socket. A reply that does not echo the
                # request id is forged or stale, and relaying it would put every later reply out of step.
                raise protocol.ProtocolViolation("a reply that does not answer request %r" % (request_id,))
        except socket.timeout:
            return self._worker_misbehaved(
                "the worker stopped for %.0f s in the middle of a frame" % self.config.frame_timeout
            )
        except (protocol.ChannelClosed, OSError):
            lost = self.worker.death()
            self._respawn()
            lost.update(type=protocol.EXEC_REPLY, status=protocol.STATUS_CRASHED, ran=True)
            return lost, b""
        except protocol.ProtocolViolation as exc:
            return self._worker_misbehaved("the worker sent an invalid frame (%s)" % exc)
        checkpoint = reply.get("checkpoint")
        if isinstance(checkpoint, dict) and isinstance(checkpoint.get("generation"), int):
            self.generation = checkpoint["generation"]
        if isinstance(reply.get("generation"), int):
            self.generation = reply["generation"]
        if interrupted and reply.get("status") == protocol.STATUS_ERROR:
            # The interrupt stopped the cell (a cell that finished just at the deadline stays a success).
            reply["status"] = protocol.STATUS_TIMEOUT
            reply["worker_restarted"] = False
        return reply, reply_body

    def _worker_misbehaved(self, why: str) -> Tuple[dict, Any]:
        self.worker.kill()
        self._respawn()
        return {
            "type": protocol.EXEC_REPLY,
            "status": protocol.STATUS_PROTOCOL_ERROR,
            "ran": True,
            "reason": "%s; it was killed" % why,
        }, b""


def main() -> None:
    """Entry point of the container: ``python3 -m orchestrator_agent.supervisor``."""
    Supervisor(Config(dict(os.environ))).run()


if __name__ == "__main__":
    main()
