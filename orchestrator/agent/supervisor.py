"""The sandbox supervisor: owns the connection to the controller and the worker's life; the worker serves the requests.

Standard library only; it never runs user code and never unpickles. It connects to the controller's Unix socket
(and reconnects whenever the connection drops, so a restarted controller can reattach to a live session), proves it
knows the sandbox's secret, and hands its worker (worker_process.py) the data channel the controller sends: the
worker then serves requests, host calls and output on it directly (docs/protocol.md, "One hop";
docs/design/one-hop.md). The connection carries only control frames: the data channel's handover (handover.py),
``ping``, the controller's ``interrupt`` and ``kill`` (its ladder, ladder.py: the signal of the phase, then a kill
of the worker and every process of its uid and a fresh, empty worker the controller restores), and from here
``worker_lost`` when the worker died or wrote out of turn on its link. On the relayed carrier the supervisor makes
the data channel itself and forwards its bytes in ``relay`` frames. SIGUSR1 plus a new socket file at the channel
path is a takeover: the supervisor says goodbye and connects to the new one (channel.py); a worker whose controller
left is interrupted until it is idle, or replaced, before the next controller gets it.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import sys
import time
from typing import Any, Dict, List, Optional

from . import confinement, framing, handover, handshake, protocol, request_table
from . import control as control_frames
from .channel import Channel
from .config import Config, ConfigError, read_secret
from .log import log
from .worker_process import WorkerProcess, start_worker

_HANDSHAKE_HEADER_BYTES = 64 << 10
_SETTLE_TICK = 0.05  # how often a worker whose controller left is interrupted until it is idle


class Supervisor:
    """Serves one controller connection at a time with one worker at a time, replacing the worker when it dies or
    must be killed."""

    def __init__(self, config: Config, secret: bytes) -> None:
        self.config = config
        self._secret = secret
        self.generation = 0  # of the worker's last ``idle`` (0: a fresh worker)
        self.relayed = False  # the connection being served takes the relayed carrier: the data channel's bytes go on it
        self.relay_ends: Dict[str, socket.socket] = {}  # relayed: our ends of the worker's D and K
        self.relay_number: Any = None  # relayed: the number of the data channel they are
        # Data channels handed to the worker that it has not reported leaving (``idle``) yet; one closed and the next
        # handed at once may overtake the idle of the first.
        self.channels_held = 0
        self.channel = Channel(config.channel, config.frame_timeout)
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGUSR1, self._on_takeover)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # interrupts are for the worker (it installs its own handler)
        self.selector = selectors.DefaultSelector()  # the connection, the worker, the relayed ends, the wake-up
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        self.worker = self._spawn()

    # -- worker lifecycle

    def _spawn(self) -> WorkerProcess:
        """Start a worker (or exit: start_worker) and watch its link and process."""
        worker = start_worker(self.config)
        for fd in worker.fds():
            self.selector.register(fd, selectors.EVENT_READ)
        return worker

    def _replace_worker(self, died: bool = False) -> Optional[Dict[str, Any]]:
        """Kill (or reap, when ``died``) the worker and start a fresh one; return how it died."""
        old = self.worker
        for fd in old.fds():
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(fd)
        self._drop_relay()  # the data channel goes with its worker
        info = old.death() if died else None
        if not died:
            old.kill()
        self.worker = self._spawn()
        self.generation = 0
        return info

    # -- takeover

    def _on_takeover(self, signum: int, frame: Any) -> None:
        self.channel.takeover_requested = True

    def _drain_wakeups(self) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while os.read(self.wake_r, 512):
                pass

    # -- connection

    def run(self) -> None:
        failures = 0
        while True:
            conn = self.channel.connect()
            authenticated = False
            try:
                authenticated = self.handshake(conn)
                if authenticated:
                    failures = 0
                    self.serve(conn)
            except (framing.ChannelClosed, framing.ProtocolViolation, OSError) as exc:
                log("connection ended: %s" % (exc or type(exc).__name__))
            except Exception:  # never crash: a fresh connection is the way back
                import traceback  # here only: it is not worth its import at every start

                log("unexpected error, reconnecting:\n%s" % traceback.format_exc())
            finally:
                with contextlib.suppress(OSError):
                    conn.close()
                if self.channels_held:
                    self._settle_worker()
            if not authenticated:
                failures += 1
                time.sleep(min(2.0, 0.05 * 2 ** min(failures, 6)))

    def hello(self, nonce: str) -> Dict[str, Any]:
        return {
            "type": protocol.HELLO,
            "protocol": protocol.PROTOCOL_VERSION,
            "sandbox_id": self.config.sandbox_id,
            "generation": self.generation,
            "python": sys.version.split()[0],  # platform.python_version(), without importing platform
            "dill": self.worker.dill,
            "agent_pid": os.getpid(),
            "worker_pid": self.worker.pid,
            "nonce": nonce,
            "capabilities": [protocol.BLOB_FILES, protocol.RELAYED],
        }

    def handshake(self, conn: socket.socket) -> bool:
        """hello -> auth -> auth_ok (docs/protocol.md); False when the peer does not prove the secret."""
        agent_nonce = handshake.new_nonce()
        framing.send_frame(conn, self.hello(agent_nonce))
        header, _ = framing.recv_head(conn, _HANDSHAKE_HEADER_BYTES, 0, self.config.frame_timeout)
        try:
            controller_nonce = handshake.read_auth(header)["nonce"]
        except protocol.BadRequest:
            log("the controller did not answer the hello with a valid auth frame")
            return False
        expected = handshake.auth_proof(self._secret, "controller", agent_nonce, controller_nonce)
        if not handshake.proof_matches(expected, header.get("proof")):
            log("the controller's proof does not match the sandbox secret; closing")
            return False
        proof = handshake.auth_proof(self._secret, "agent", agent_nonce, controller_nonce)
        framing.send_frame(conn, {"type": protocol.AUTH_OK, "proof": proof})
        self.relayed = header.get(protocol.RELAYED) is True
        return True

    def _send(self, conn: socket.socket, header: Dict[str, Any], body: Any = b"") -> None:
        framing.send_frame(conn, header, body)  # within the socket's own limits (limit_each_io)

    def serve(self, conn: socket.socket) -> None:
        """Serve the control frames of an authenticated connection: the data channel's handover and ``ping``, the
        ladder's ``interrupt`` and ``kill``, relay frames; tell the controller when its worker is lost. Requests
        never come here: they go to the worker directly."""
        self.selector.register(conn, selectors.EVENT_READ)
        conn_fd = conn.fileno()
        try:
            while True:
                if self.channel.takeover_due():
                    self._send(conn, {"type": protocol.GOODBYE, "reason": "takeover", "in_flight": None})
                    return
                ready = {key.fd for key, _ in self.selector.select()}
                if self.wake_r in ready:
                    self._drain_wakeups()
                    continue  # check for a takeover before anything else
                worker = self.worker
                if worker.sock.fileno() in ready or worker.pidfd in ready:
                    self._worker_aside(conn)
                    continue
                for stream in (protocol.RELAY_CALLS, protocol.RELAY_REQUESTS):  # a cell's last output before its reply
                    end = self.relay_ends.get(stream)
                    if end is not None and end.fileno() in ready:
                        self._relay_out(conn, stream, end)
                if conn_fd in ready:
                    max_body = protocol.RELAY_CHUNK if self.relayed else 0
                    header, fds, body = handover.recv_with_fds(conn, protocol.DATA_CHANNEL_FDS, max_body)
                    self._control(conn, header, fds, body)
        finally:
            self._drop_relay()  # the worker sees its data channel end and goes idle
            self.selector.unregister(conn)

    def _control(self, conn: socket.socket, header: Dict[str, Any], fds: List[int], body: bytes) -> None:
        """One control frame of the connection (with the descriptors and the body that came with it)."""
        kind = header["type"]
        if kind == protocol.RELAY and self.relayed:
            self._relay_in(conn, header, body)
            return
        if body:
            raise framing.ProtocolViolation("a %r frame with a body on the connection" % kind)
        if kind == protocol.DATA_CHANNEL:
            if self.relayed:
                handover.close_fds(fds)
                sockets = self._relay_pairs(header.get("channel"))
            else:
                sockets = handover.stream_sockets(fds, protocol.DATA_CHANNEL_FDS)
            try:
                self._send(self.worker.sock, {"type": protocol.DATA_CHANNEL})
                handover.pass_fds(self.worker.sock, [sock.fileno() for sock in sockets])
                self.channels_held += 1
            except OSError:
                self._lose_worker(conn, died=True)
            finally:
                for sock in sockets:  # the supervisor keeps no copy of the data path
                    sock.close()
            return
        handover.close_fds(fds)
        if kind == request_table.PING:
            self._send(conn, {"type": request_table.PONG, "id": header.get("id"), "generation": self.generation})
            return
        if kind == protocol.INTERRUPT and header.get("phase") in protocol.INTERRUPT_PHASES:
            self.worker.interrupt(header["phase"])  # the controller's clock ran out (or its caller cancelled)
            return
        if kind == protocol.KILL:
            # A worker that died before the kill came (its link at EOF: the controller saw its data channel break
            # first) is reaped and its death told, as worker_lost would have.
            info = self._replace_worker(died=self.worker.pending() == b"" or self.worker.proc.poll() is not None) or {}
            self.channels_held = 0
            reason = info.get("reason") or "the worker was killed at the controller's request"
            reply = {"type": protocol.WORKER_REPLACED, "id": header.get("id"), "reason": reason}
            self._send(conn, dict(reply, oom=bool(info.get("oom")), signal=info.get("signal")))
            return
        raise framing.ProtocolViolation("a %r frame on the connection" % kind)

    # -- the relayed carrier (docs/design/one-hop.md, "Carriers"): the data channel's bytes go on the connection

    def _relay_pairs(self, number: Any) -> List[socket.socket]:
        """The worker's ends of a new data channel made here; ours are kept and forwarded (relay frames)."""
        self._drop_relay()
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in protocol.RELAY_STREAMS]
        self.relay_number = number
        for index, stream in enumerate(protocol.RELAY_STREAMS):
            ours = pairs[index][0]
            ours.settimeout(self.config.frame_timeout)
            self.relay_ends[stream] = ours
            self.selector.register(ours, selectors.EVENT_READ)
        return [theirs for _, theirs in pairs]

    def _relay_in(self, conn: socket.socket, header: Dict[str, Any], body: bytes) -> None:
        """The controller's bytes for D or K (none: it closed its end). A worker that does not take them within the
        frame timeout has broken that stream: it is closed, and the controller told."""
        stream = header.get("stream")
        end = self.relay_ends.get(stream) if header.get("channel") == self.relay_number else None
        if end is None:
            return  # a data channel that went with its worker, or a stream closed already
        if not body:
            self._drop_relay_end(stream)
            return
        try:
            end.sendall(body)
        except OSError:
            self._drop_relay_end(stream)
            self._send(conn, control_frames.relay_message(stream, self.relay_number))

    def _relay_out(self, conn: socket.socket, stream: str, end: socket.socket) -> None:
        """What the worker wrote on D or K, to the controller (nothing: it closed its end)."""
        try:
            data = end.recv(protocol.RELAY_CHUNK, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop_relay_end(stream)
        self._send(conn, control_frames.relay_message(stream, self.relay_number), data)

    def _drop_relay_end(self, stream: str) -> None:
        end = self.relay_ends.pop(stream)
        self.selector.unregister(end)
        end.close()

    def _drop_relay(self) -> None:
        """Close our ends of the relayed data channel (its worker was replaced, or the connection ended)."""
        for stream in list(self.relay_ends):
            self._drop_relay_end(stream)

    def _worker_aside(self, conn: socket.socket) -> None:
        """The worker's link or process woke us. ``idle`` (its data channel closed) is the one frame it may
        send; anything else, or its death, replaces it, and the controller is told."""
        worker = self.worker
        pending = worker.pending()
        if pending is None and worker.proc.poll() is None:
            return  # a spurious wake-up
        if pending:
            idle = self._read_idle()
            if idle is not None:
                self.generation, self.channels_held = idle, max(0, self.channels_held - 1)
                return
            self._lose_worker(conn, died=False)
            return
        self._lose_worker(conn, died=True)

    def _read_idle(self) -> Optional[int]:
        """The generation of the worker's ``idle`` frame on its link, or None if the frame is anything else."""
        try:
            header, body_len = framing.recv_head(
                self.worker.sock, _HANDSHAKE_HEADER_BYTES, 0, self.config.frame_timeout
            )
        except (OSError, framing.ChannelClosed, framing.ProtocolViolation):
            return None
        generation = header.get("generation")
        if header["type"] != protocol.WORKER_IDLE or body_len or type(generation) is not int or generation < 0:
            return None
        return generation

    def _lose_worker(self, conn: socket.socket, died: bool) -> None:
        """Replace the worker (it died, or misbehaved: ``died`` False) and tell the controller, whose data channel
        went with it."""
        info = self._replace_worker(died=died) or {}
        if not died:
            info = {"reason": "the worker wrote out of turn on its link; it was killed", "oom": False}
        self.channels_held = 0
        lost = {"type": protocol.WORKER_LOST, "reason": info.get("reason", ""), "oom": bool(info.get("oom"))}
        self._send(conn, dict(lost, signal=info.get("signal")))

    def _settle_worker(self) -> None:
        """A connection ended while the worker held its data channel: before another controller gets the
        worker it must be idle. What it runs is interrupted now (SIGINT and SIGUSR2: each is only noted outside its
        own phase) and an idle worker sent back to its link (SIGHUP: only a worker waiting on its data channel heeds
        it), again every ``_SETTLE_TICK`` (a request that had not started yet gets it too), and the worker is
        replaced if it does not report ``idle`` for every data channel it was handed within the grace."""
        worker = self.worker
        deadline = time.monotonic() + self.config.grace
        waiter = selectors.DefaultSelector()
        try:
            waiter.register(worker.sock, selectors.EVENT_READ)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                if not waiter.select(0):
                    worker.interrupt("cell")
                    worker.interrupt("checkpoint")
                    worker.leave_data_channel()
                    if not waiter.select(min(remaining, _SETTLE_TICK)):
                        continue
                idle = self._read_idle()
                if idle is None:
                    break
                self.generation, self.channels_held = idle, self.channels_held - 1
                if not self.channels_held:
                    return
        finally:
            waiter.close()
        self.channels_held = 0
        self._replace_worker()  # its hello to the next controller says generation 0: that one restores


def main() -> None:
    """Entry point of the container: ``python3 -m orchestrator_agent.supervisor``."""
    try:
        config = Config(dict(os.environ))
        secret = read_secret(config.secret_file)
    except ConfigError as exc:
        log("%s" % exc)
        sys.exit(2)
    confinement.confine_supervisor(config.worker_uid, log)
    supervisor = Supervisor(config, secret)
    del secret
    try:
        supervisor.run()
    finally:
        with contextlib.suppress(Exception):
            supervisor.worker.kill()


if __name__ == "__main__":
    main()
