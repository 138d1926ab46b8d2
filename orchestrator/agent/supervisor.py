"""The sandbox supervisor: owns the channel to the controller, serves its requests, and the worker's life.

Standard library only; it never runs user code and never unpickles. It connects to the
controller's Unix socket (and reconnects whenever the connection drops, so a restarted
controller can reattach to a live session), proves it knows the sandbox's secret, relays
each request to the worker process (worker_process.py) and waits for its reply under the
request's time limits (ladder.py): an interrupt, then after a grace period a kill of the
worker and every process of its uid, and a fresh, empty worker that the controller restores. SIGUSR1 plus a
new socket file at the channel path is a takeover: the supervisor drops the old connection
(interrupting what runs) and connects to the new one (channel.py).

Bodies are never held whole here: they move from socket to socket (frames.py). The
supervisor-worker link uses the controller's frames plus one private message: the worker's
``cell_done`` when a cell finished (the checkpoint's clock starts). Host calls and a cell's
output come on a second link (host_call_relay.py). See docs/protocol.md.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import socket
import sys
import time
from typing import Any, Dict, List, Optional, Set

from . import blob_format, confinement, framing, handover, handshake, protocol, request_table
from . import control as control_frames
from .channel import Channel, ControllerLink
from .config import Config, ConfigError, read_secret
from .frames import CHUNK_BYTES, Copier, Movers
from .host_call_relay import HostCallRelay
from .ladder import ABANDON, Ladder
from .log import log
from .sealed import sealed_copy_of
from .worker_process import WorkerProcess, start_worker

_HANDSHAKE_HEADER_BYTES = 64 << 10
_SETTLE_TICK = 0.05  # one hop: how often a worker whose controller left is interrupted until it is idle
# A \uD800-\uDFFF escape in a header (a surrogate, perhaps a lone one): such a header is decoded and encoded
# again (framing.encode_header replaces lone surrogates), never relayed as it came. False positives only cost that.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abAB]")
_PLAIN_ID = re.compile(r"[0-9A-Za-z_-]{1,64}\Z")  # a request id whose JSON form is itself in quotes
_CHECKPOINT_MEMBER = b',"checkpoint":'


# --- An exec reply at a glance ------------------------------------------------------------------------------


def _glance(raw: memoryview, reply_type: str, request_id: Any) -> Optional[Dict[str, Any]]:
    """What the supervisor needs of an exec reply, read from its bytes without decoding the rest (a cell's output
    may make it large): None unless it is ``{"type":<reply_type>, ..., "checkpoint":{...}, "id":<request_id>}``.

    The header is relayed as it came, and the controller decodes it strictly (a key twice is refused). In JSON
    that is valid, an unescaped ``"`` never occurs inside a string, so these bytes at the start and the end are
    the first and the last member of the top-level object, and the checkpoint (decoded here) the one before the
    last; a header that is not valid JSON fails at the controller. Anything else is decoded in full by the caller.
    """
    if not isinstance(request_id, str) or not _PLAIN_ID.match(request_id):
        return None
    data = bytes(raw)
    head = b'{"type":"%s",' % reply_type.encode("ascii")
    tail = b',"id":"%s"}' % request_id.encode("ascii")
    if not (data.startswith(head) and data.endswith(tail)) or _SURROGATE_ESCAPE.search(data):
        return None
    start = data.rfind(_CHECKPOINT_MEMBER + b'{"generation":', len(head) - 1, len(data) - len(tail))
    if start < 0:
        return None
    try:
        checkpoint = framing.decode_json(data[start + len(_CHECKPOINT_MEMBER) : len(data) - len(tail)], "checkpoint")
    except framing.ProtocolViolation:
        return None  # not the whole member: another one comes after it
    return {"type": reply_type, "id": request_id, "checkpoint": checkpoint}


# --- Outcomes of one request -------------------------------------------------------------------------------


class _Frame:
    """The worker's reply header; its body (``body_len`` bytes) still waits in the worker's inbox and socket.

    ``edited`` once the supervisor changed the header: then it is encoded again, not relayed as it came.
    """

    def __init__(self, header: Dict[str, Any], body_len: int, head_size: int) -> None:
        self.header = header
        self.body_len = body_len
        self.head_size = head_size
        self.edited = False


class _Takeover(Exception):
    """A new controller took the channel while a request ran; the request was abandoned."""

    def __init__(self, request_id: Any) -> None:
        super().__init__("takeover")
        self.request_id = request_id


class ConnectionLost(Exception):
    """The controller's connection broke (or had to be broken) in the middle of a frame."""


class Supervisor:
    """Serves one controller connection at a time with one worker at a time, replacing the worker when it dies or
    must be killed."""

    def __init__(self, config: Config, secret: bytes) -> None:
        self.config = config
        self._secret = secret
        self.generation = 0
        self.worker_lost: Optional[Dict[str, Any]] = None
        self.one_hop = False  # the connection being served took one hop (handshake)
        self.relayed = False  # ... on the relayed carrier: the data channel's bytes go on the connection
        self.relay_ends: Dict[str, socket.socket] = {}  # relayed: our ends of the worker's D and K
        self.relay_number: Any = None  # relayed: the number of the data channel they are
        # One hop: data channels handed to the worker that it has not reported leaving (``idle``) yet; one closed
        # and the next handed at once may overtake the idle of the first.
        self.channels_held = 0
        self.channel = Channel(config.channel, config.frame_timeout)
        self.movers = Movers()
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGUSR1, self._on_takeover)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # interrupts are for the worker (it installs its own handler)
        self.idle = selectors.DefaultSelector()  # controller + worker + wake-up, between requests
        self.busy = selectors.DefaultSelector()  # worker + wake-up, while a request runs
        for sel in (self.idle, self.busy):
            sel.register(self.wake_r, selectors.EVENT_READ)
        self.controller = ControllerLink(self.busy)
        self.host_calls = HostCallRelay(
            config, self.controller, lambda: self.worker, (self.idle, self.busy), self.movers
        )
        self.worker = self._spawn()

    # -- worker lifecycle

    def _spawn(self) -> WorkerProcess:
        """Start a worker (or exit: start_worker) and watch its sockets and process."""
        worker = start_worker(self.config)
        for sel in (self.idle, self.busy):
            for fd in worker.fds():
                sel.register(fd, selectors.EVENT_READ)
            if worker.calls is not None:
                sel.register(worker.calls, selectors.EVENT_READ)
        return worker

    def _forget(self, worker: WorkerProcess) -> None:
        self.host_calls.worker_gone()
        for sel in (self.idle, self.busy):
            for fd in worker.fds():
                with contextlib.suppress(KeyError, ValueError):
                    sel.unregister(fd)
            if worker.calls is not None:
                with contextlib.suppress(KeyError, ValueError):
                    sel.unregister(worker.calls)

    def _replace_worker(self, died: bool = False) -> Optional[Dict[str, Any]]:
        """Kill (or reap, when ``died``) the worker and start a fresh one; return how it died."""
        old = self.worker
        self._forget(old)
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
                    if self.one_hop:
                        self.serve_one_hop(conn)
                    else:
                        self.serve(conn)
            except (framing.ChannelClosed, framing.ProtocolViolation, ConnectionLost, OSError) as exc:
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
            "capabilities": [protocol.ONE_HOP, protocol.BLOB_FILES, protocol.RELAYED],
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
        self.one_hop = header.get(protocol.ONE_HOP) is True
        self.relayed = self.one_hop and header.get(protocol.RELAYED) is True
        return True

    def _send(self, conn: socket.socket, header: Dict[str, Any], body: Any = b"") -> None:
        framing.send_frame(conn, header, body)  # within the socket's own limits (limit_each_io)

    # -- serving requests

    def serve(self, conn: socket.socket) -> None:
        self.idle.register(conn, selectors.EVENT_READ)
        inbox = self.controller.attach(conn)
        conn_fd = conn.fileno()
        try:
            while True:
                if self.channel.takeover_due():
                    self._send(conn, {"type": protocol.GOODBYE, "reason": "takeover", "in_flight": None})
                    return
                worker = self.worker
                if worker.inbox.buffered():  # it wrote past its last reply (read with it): out of turn
                    self._worker_between_requests()
                    continue
                if inbox.buffered():  # the controller's next frame came with its last one: nothing to wait for
                    ready = {key.fd for key, _ in self.idle.select(0)}
                    ready.add(conn_fd)
                else:
                    ready = {key.fd for key, _ in self.idle.select()}
                if self.wake_r in ready:
                    self._drain_wakeups()
                    continue  # check for a takeover before anything else
                if worker.sock.fileno() in ready or worker.pidfd in ready:
                    self._worker_between_requests()
                    continue  # a request that came meanwhile has not run yet: read it next round
                if self.host_calls.link_fd() in ready:
                    self.host_calls.take_call(None, protocol.CALL_NO_CELL)
                    continue
                if conn_fd in ready:
                    header, body_len, _ = inbox.head(
                        framing.MAX_HEADER_BYTES, self.config.max_body, self.config.frame_timeout
                    )
                    try:
                        self.handle(conn, header, body_len)
                    except _Takeover as takeover:
                        self._send(
                            conn, {"type": protocol.GOODBYE, "reason": "takeover", "in_flight": takeover.request_id}
                        )
                        return
        finally:
            self.controller.detach()
            self.idle.unregister(conn)

    # -- one hop (docs/design/one-hop.md): the worker serves the controller on a data channel the controller made

    def serve_one_hop(self, conn: socket.socket) -> None:
        """Serve the control frames of a connection that took one hop: the data channel's handover and ``ping``;
        tell the controller when its worker is lost. Requests never come here: they go to the worker directly."""
        self.idle.register(conn, selectors.EVENT_READ)
        conn_fd = conn.fileno()
        try:
            while True:
                if self.channel.takeover_due():
                    self._send(conn, {"type": protocol.GOODBYE, "reason": "takeover", "in_flight": None})
                    return
                ready = {key.fd for key, _ in self.idle.select()}
                if self.wake_r in ready:
                    self._drain_wakeups()
                    continue  # check for a takeover before anything else
                worker = self.worker
                if worker.sock.fileno() in ready or worker.pidfd in ready:
                    self._worker_aside(conn)
                    continue
                if self.host_calls.link_fd() in ready:  # the worker's calls go on the data channel's own link
                    self.host_calls.take_call(None, "in one hop, host calls go to the controller directly")
                    continue
                for stream, end in list(self.relay_ends.items()):
                    if end.fileno() in ready:
                        self._relay_out(conn, stream, end)
                if conn_fd in ready:
                    max_body = protocol.RELAY_CHUNK if self.relayed else 0
                    header, fds, body = handover.recv_with_fds(conn, protocol.DATA_CHANNEL_FDS, max_body)
                    self._control(conn, header, fds, body)
        finally:
            self._drop_relay()  # the worker sees its data channel end and goes idle
            self.idle.unregister(conn)

    def _control(self, conn: socket.socket, header: Dict[str, Any], fds: List[int], body: bytes) -> None:
        """One control frame of a one-hop connection (with the descriptors and the body that came with it)."""
        kind = header["type"]
        if kind == protocol.RELAY and self.relayed:
            self._relay_in(conn, header, body)
            return
        if body:
            raise framing.ProtocolViolation("a %r frame with a body on a one-hop connection" % kind)
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
        raise framing.ProtocolViolation("a %r frame on a one-hop connection" % kind)

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
            self.idle.register(ours, selectors.EVENT_READ)
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
        self.idle.unregister(end)
        end.close()

    def _drop_relay(self) -> None:
        """Close our ends of the relayed data channel (its worker was replaced, or the connection ended)."""
        for stream in list(self.relay_ends):
            self._drop_relay_end(stream)

    def _worker_aside(self, conn: socket.socket) -> None:
        """One hop: the worker's link or process woke us. ``idle`` (its data channel closed) is the one frame it may
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
            header, body_len, _ = self.worker.inbox.head(_HANDSHAKE_HEADER_BYTES, 0, self.config.frame_timeout)
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
        """A one-hop connection ended while the worker held its data channel: before another controller gets the
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
                if not (worker.inbox.buffered() or waiter.select(0)):
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

    def _worker_between_requests(self) -> None:
        """The worker's socket or process woke us while no request ran: it died or wrote out of turn."""
        pending = self.worker.pending()
        if pending:
            self._replace_worker()
            self.worker_lost = {"reason": "the worker wrote out of turn; it was killed", "oom": False}
            return
        if pending is None and self.worker.proc.poll() is None:
            return  # a spurious wake-up
        self.worker_lost = self._replace_worker(died=True)

    def handle(self, conn: socket.socket, header: Dict[str, Any], body_len: int) -> None:
        kind = header["type"]
        request_id = header.get("id")
        if kind in (protocol.HOST_REPLY, protocol.INTERRUPT):  # for a cell that ended meanwhile: too late
            self.controller.discard(body_len)
            return
        if kind == request_table.PING:
            self.controller.discard(body_len)
            self._send(conn, {"type": request_table.PONG, "id": request_id, "generation": self.generation})
            return
        row = request_table.REQUESTS.get(kind)
        if row is None:
            self.controller.discard(body_len)
            reply = {"status": protocol.STATUS_PROTOCOL_ERROR, "ran": False, "reason": "unknown request %r" % kind}
            self._send(conn, {"type": protocol.ERROR, "id": request_id, **reply})
            return
        reply_type = row.reply
        if row.fresh_worker_ok:
            self.worker_lost = None
        if self.worker_lost is not None:
            self.controller.discard(body_len)
            lost, self.worker_lost = self.worker_lost, None
            lost.update(type=reply_type, id=request_id, status=protocol.STATUS_CRASHED, ran=False)
            self._send(conn, lost)
            return
        value_fd = self._open_value_file(header) if row.value_file else None
        try:
            forwarded = self._forward(body_len, value_fd)
        finally:
            if value_fd is not None:
                os.close(value_fd)
        if not forwarded:
            # The worker was gone before it got the request; a fresh one stands by.
            lost, self.worker_lost = self.worker_lost, None
            if row.fresh_worker_ok:
                self._send(conn, {"type": reply_type, "id": request_id, "status": protocol.STATUS_OK})
                return
            assert lost is not None
            lost.update(type=reply_type, id=request_id, status=protocol.STATUS_CRASHED, ran=False)
            self._send(conn, lost)
            return
        try:
            outcome = self._await_reply(header, reply_type)
        finally:
            self.host_calls.end_calls(protocol.CALL_ENDED)
        if isinstance(outcome, _Frame):
            self._deliver(conn, outcome, request_id)
        else:
            outcome.update(type=reply_type, id=request_id)
            self._send(conn, outcome)

    # -- moving bytes

    def _open_value_file(self, header: Dict[str, Any]) -> Optional[int]:
        """A read-only descriptor of a sealed copy of the value file a local ``set_value`` names (docs/protocol.md,
        "Value files"); None without one, or when it cannot be opened or copied (the worker then answers that it did
        not arrive). Never the file's own: it is the host's stored blob, which a cell that kept its descriptor would
        keep allocated on the host's disk after the host deleted it (sealed.py); the copy is the sandbox's memory."""
        name = header.get("file")
        if not isinstance(name, str) or blob_format.VALUE_FILE.fullmatch(name) is None:
            return None
        try:
            return sealed_copy_of(os.path.join(os.path.dirname(self.config.channel), name))
        except OSError as exc:
            log("cannot copy the value file %s: %s" % (name, exc))
            return None

    def _forward(self, body_len: int, value_fd: Optional[int] = None) -> bool:
        """Send the request whose head the controller's inbox just read to the worker: the head as it came (with
        ``value_fd`` attached), then the body (spliced or copied).

        Returns False when the worker turned out dead or stuck before it had the whole request
        (it was replaced; ``worker_lost`` says how). A controller that stops in the middle of
        the body leaves the worker with half a frame: the worker is replaced and ConnectionLost raised.
        """
        worker = self.worker
        inbox = self.controller.inbox
        assert inbox is not None
        remaining = body_len
        try:
            remaining -= len(inbox.take(body_len))  # the body bytes that came with the head go out with it
            head = inbox.raw()
            if value_fd is not None:
                rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, value_fd.to_bytes(4, sys.byteorder))]
                head = head[worker.sock.sendmsg([head], rights) :]
            worker.sock.sendall(head)
            if remaining:
                mover = self.movers.mover(remaining)
                while remaining:
                    try:
                        got = mover.fill(inbox.sock, remaining)
                        if not got:
                            raise framing.ChannelClosed("the controller closed the connection in the middle of a frame")
                    except (OSError, framing.ChannelClosed) as exc:
                        self._replace_worker()
                        raise ConnectionLost("reading a request body: %s" % (exc or type(exc).__name__)) from None
                    remaining -= got
                    mover.drain(worker.sock, got)
        except (socket.timeout, BlockingIOError):  # BlockingIOError: the kernel's limit (limit_each_io)
            self._replace_worker()
            self.worker_lost = {"reason": "the worker stopped reading its request; it was killed", "oom": False}
        except OSError:
            self.worker_lost = self._replace_worker(died=True)
        else:
            return True
        self.controller.discard(remaining)
        return False

    def _deliver(self, conn: socket.socket, frame: _Frame, request_id: Any) -> None:
        """Send the worker's reply to the controller: its head as it came (unless it must be encoded again), then
        its body; one of at most CHUNK_BYTES is read whole first, a larger one is spliced or copied through."""
        worker = self.worker
        inbox = worker.inbox
        size = frame.body_len
        first = inbox.take(size)  # the body bytes that came with the head
        raw_head = inbox.view[inbox.mark : inbox.mark + frame.head_size]
        if frame.edited or not isinstance(request_id, str) or _SURROGATE_ESCAPE.search(raw_head):
            frame.header["id"] = request_id
            parts: List[Any] = [framing.frame_head(frame.header, size), first]
        else:  # the worker echoed the id (_read_worker_frame): the head it sent is the one we would encode
            parts = [inbox.raw()]
        if size <= CHUNK_BYTES:
            if len(first) < size:
                try:
                    parts.append(framing.recv_exactly(worker.sock, size - len(first)))
                except (OSError, framing.ChannelClosed) as exc:
                    reply = self._worker_failed(exc)
                    reply.update(type=frame.header.get("type"), id=request_id)
                    self._send(conn, reply)
                    return
            for part in parts:
                if part:
                    conn.sendall(part)
            return
        controller_error: Optional[Exception] = None
        try:
            for part in parts:
                if part:
                    conn.sendall(part)
        except OSError as exc:
            controller_error = exc
        remaining = size - len(first)
        mover = self.movers.mover(remaining)
        while remaining:
            try:
                got = mover.fill(worker.sock, remaining)
                if not got:
                    raise framing.ChannelClosed("the worker closed its socket in the middle of a frame")
            except (OSError, framing.ChannelClosed) as exc:
                # Half a frame went out: the controller cannot be answered on this connection any more.
                self.worker_lost = self._worker_failed(exc)
                raise ConnectionLost("the worker's reply broke off: %s" % self.worker_lost["reason"]) from None
            remaining -= got
            if controller_error is None:
                try:
                    mover.drain(conn, got)
                except OSError as exc:
                    controller_error = exc  # keep reading: the worker's socket must stay in step
                    mover = Copier(remaining)  # (a pipe closed itself, and the bytes in it went with it)
        if controller_error is not None:
            raise ConnectionLost("sending a reply: %s" % (controller_error or type(controller_error).__name__))

    def _worker_failed(self, exc: BaseException) -> Dict[str, Any]:
        """The worker stalled or vanished in the middle of a frame: replace it; return the reply fields."""
        if isinstance(exc, (socket.timeout, BlockingIOError)):
            return self._worker_misbehaved(
                "the worker stopped for %.0f s in the middle of a frame" % self.config.frame_timeout
            )
        info = self._replace_worker(died=True) or {}
        info.update(status=protocol.STATUS_CRASHED, ran=True)
        return info

    def _worker_misbehaved(self, why: str) -> Dict[str, Any]:
        self._replace_worker()
        return {"status": protocol.STATUS_PROTOCOL_ERROR, "ran": True, "reason": "%s; it was killed" % why}

    # -- waiting for the worker: the two clocks and the ladder

    def _await_reply(self, request: Dict[str, Any], reply_type: str) -> Any:
        """Wait for the worker's reply to ``request`` under its time limits (the ladder).

        Returns the reply as a _Frame (its body still to be copied), or the fields of a reply
        the supervisor makes up itself (timeout, crashed, protocol_error). Raises _Takeover.
        """
        kind = request["type"]
        request_id = request.get("id")
        ladder = Ladder.for_request(request, self.config.grace, self._interrupt_worker)
        if kind == request_table.EXEC:
            self.host_calls.start_cell(request.get("input") is True)
        while True:
            if not ladder.taken_over and self.channel.takeover_due():
                ladder.take_over()
            ladder.follow_input(self.host_calls.waiting_for_input())
            ready = self._wait_busy(ladder.wait_seconds())
            if self.wake_r in ready:
                self._drain_wakeups()
            link_ready = self.host_calls.link_fd() in ready
            if link_ready:
                if ladder.relays_calls:
                    self.host_calls.take_call(request_id, None)
                else:
                    self.host_calls.take_call(None, protocol.CALL_ENDED)
            controller = self.controller
            if (
                controller.watching
                and controller.conn is not None
                and controller.conn.fileno() in ready
                and self.host_calls.take_reply(request_id)
            ):
                ladder.cancel()  # the controller cancelled the cell: the ladder
            worker = self.worker
            if worker.sock.fileno() in ready or (worker.pidfd in ready and worker.pending() is not None):
                outcome = self._worker_spoke(ladder, kind, request_id, reply_type, link_ready)
                if outcome is None:  # the cell is done: its checkpoint runs
                    continue
                return outcome
            if worker.pidfd is not None and worker.pidfd in ready:
                info = self._replace_worker(died=True) or {}
                if ladder.taken_over:
                    raise _Takeover(request_id)
                info.update(status=protocol.STATUS_CRASHED, ran=True, phase=ladder.phase)
                return info
            if ladder.notice_due():
                # The checkpoint takes a while: the controller moves its deadline to the checkpoint's.
                self.controller.tell({"type": protocol.CHECKPOINTING, "id": request_id})
            step = ladder.expired()
            if step is None:
                continue
            self._replace_worker()
            if step == ABANDON:
                raise _Takeover(request_id)
            return ladder.killed_reply()

    def _interrupt_worker(self, phase: str) -> None:
        self.worker.interrupt(phase)

    def _wait_busy(self, timeout: Optional[float]) -> Set[int]:
        """Wait up to ``timeout`` seconds (None: no limit) for the worker, its host-call link, a signal or (when
        watched) the controller; the descriptors ready, those with a frame read already among them."""
        controller = self.controller
        if controller.watching != controller.registered:
            controller.sync_watch()
        worker = self.worker
        ahead = worker.inbox.buffered()  # a frame that came with the last one: nothing to wait for
        inbox = controller.inbox
        conn_ahead = controller.watching and inbox is not None and inbox.buffered()
        if ahead or conn_ahead:
            timeout = 0.0
        ready = {key.fd for key, _ in self.busy.select(timeout)}
        if ahead:
            ready.add(worker.sock.fileno())
        if conn_ahead:
            assert inbox is not None
            ready.add(inbox.sock.fileno())
        return ready

    def _worker_spoke(self, ladder: Ladder, kind: str, request_id: Any, reply_type: str, link_ready: bool) -> Any:
        """The worker's socket has a frame (or EOF) during a request: its reply as a _Frame, the fields of a reply
        the supervisor makes up, or None when the frame was ``cell_done`` (the checkpoint's clock starts).
        ``link_ready``: the host-call link was readable in the same wait. Raises _Takeover."""
        if ladder.taken_over:
            self._replace_worker()  # the interrupted request may have changed the namespace
            raise _Takeover(request_id)
        # The status matters only to an interrupted cell (_finish): then the reply is decoded in full.
        glance = (
            reply_type
            if kind == request_table.EXEC and not ladder.interrupted and not ladder.cell_interrupted
            else None
        )
        frame = self._read_worker_frame(request_id, glance)
        if not isinstance(frame, _Frame):
            frame.update(phase=ladder.phase)
            return frame
        if ladder.in_cell and kind == request_table.EXEC and link_ready:
            # The cell's last output went out before this frame: in the link by the wait that saw this frame (its
            # bytes had come, or were read already), so a link that was not readable then holds none of it.
            self.host_calls.drain(request_id)
        if frame.header["type"] == protocol.CELL_DONE and ladder.in_cell and frame.body_len == 0:
            self.host_calls.end_calls(protocol.CALL_ENDED)
            ladder.cell_done()
            return None
        if frame.header["type"] != reply_type:
            return self._misbehaved_in(frame, ladder.phase, "the worker sent %r, not a reply" % frame.header["type"])
        return self._finish(frame, kind, ladder)

    def _read_worker_frame(self, request_id: Any, glance: Optional[str] = None) -> Any:
        """The header of the worker's next frame as a _Frame, or the reply fields if it was invalid or died.

        ``glance``: the reply type of an exec whose reply may be read at a glance (``_glance``)."""
        try:
            raw, body_len, head_size = self.worker.inbox.raw_head(
                framing.MAX_HEADER_BYTES, self.config.max_body, self.config.frame_timeout
            )
            header = _glance(raw, glance, request_id) if glance is not None else None
            if header is None:
                header = framing.decode_header(raw)
        except socket.timeout as exc:
            return self._worker_failed(exc)
        except framing.ProtocolViolation as exc:
            return self._worker_misbehaved("the worker sent an invalid frame (%s)" % exc)
        except (framing.ChannelClosed, OSError) as exc:
            return self._worker_failed(exc)
        if header.get("id") != request_id:
            # Cell code can write frames on the worker's socket. A reply that does not echo the
            # request id is forged or stale, and relaying it would put every later reply out of step.
            return self._worker_misbehaved("the worker sent a frame that does not answer request %r" % (request_id,))
        return _Frame(header, body_len, head_size)

    def _misbehaved_in(self, frame: _Frame, phase: str, why: str) -> Dict[str, Any]:
        reply = self._worker_misbehaved(why)
        reply["phase"] = phase
        return reply

    def _finish(self, frame: _Frame, kind: str, ladder: Ladder) -> _Frame:
        """Adjust the worker's reply for what the supervisor did, and learn the generation from it."""
        reply = frame.header
        status = reply.get("status")
        if ladder.stopped_by_interrupt(status):
            reply["status"] = protocol.STATUS_TIMEOUT
            reply["worker_restarted"] = False
            reply.setdefault("phase", "cell" if kind == request_table.EXEC else "load")
            frame.edited = True
        checkpoint = reply.get("checkpoint")
        if isinstance(checkpoint, dict) and type(checkpoint.get("generation")) is int:
            self.generation = checkpoint["generation"]
        if kind == request_table.RESTORE_BEGIN and status == protocol.STATUS_OK:
            self.generation = 0
        if kind == request_table.RESTORE_END and type(reply.get("generation")) is int:
            self.generation = reply["generation"]
        return frame


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
