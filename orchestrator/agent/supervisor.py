"""The sandbox supervisor: owns the channel to the controller, the timers and the worker's life.

Standard library only; it never runs user code and never unpickles. It connects to the
controller's Unix socket (and reconnects whenever the connection drops, so a restarted
controller can reattach to a live session), proves it knows the sandbox's secret, relays
each request to the worker process and enforces the timeout ladder: an interrupt (SIGINT for
a cell or a load, SIGUSR2 for a checkpoint), then after a grace period a kill of the worker's
process group and a fresh, empty worker that the controller restores. SIGUSR1 plus a new
socket file at the channel path is a takeover: the supervisor drops the old connection
(interrupting what runs) and connects to the new one.

Bodies are never held whole here: request bodies (restore blobs, set_value payloads) go from
the controller to the worker, and reply bodies (checkpoint blobs) from the worker to the
controller, through a pipe with ``os.splice`` (Linux, Python >= 3.10: the bytes never enter
this process, which leaves more of the sandbox's CPU to the worker), else in chunks of at most
``CHUNK_BYTES``. Frame heads are relayed as they came, not decoded and encoded again, and each
read takes up to ``READ_AHEAD`` bytes, so a small frame (prefix, header and body) costs one
``recv``. See docs/protocol.md.

The supervisor-worker link uses the same frames plus one private message: the worker's
``cell_done`` when a cell finished (the checkpoint's clock starts). Host calls come from the
worker on a second link of their own; the supervisor relays them to the controller only
while a cell runs, relays the controller's answers back, and answers every call still open
when the cell ends (or any call made outside a cell) with an error itself. A checkpoint that is
still running ``NOTICE_DELAY`` later is announced to the controller (``checkpointing``), which
then gives the call the checkpoint's deadline; a fast one costs no extra frame.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import math
import os
import platform
import re
import selectors
import signal
import socket
import subprocess
import sys
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple, Union

from . import confinement, protocol
from .cgroup import oom_kill_count

CHUNK_BYTES = 1 << 20
READ_AHEAD = 64 << 10  # one read from a socket takes up to this much: a small frame and whatever came after it
PIPE_BYTES = 1 << 20  # the splice pipe's capacity (fs.pipe-max-size allows 1 MiB to anyone by default)
SPLICE_MIN_BYTES = 64 << 10  # a body smaller than this is copied: a splice saves nothing on it
DEFAULT_CHANNEL = "/run/orchestrator/channel.sock"
DEFAULT_SECRET_FILE = "/run/orchestrator/secret"
DEFAULT_STEP_SECONDS = 60.0  # a time limit the request did not give (the checkpoint of set_value and reset)
NOTICE_DELAY = 0.05  # a checkpoint still running after this long is announced to the controller
CONTROL_STEP_SECONDS = 5.0  # restore_begin / restore_end (the controller allows them 10 s plus the grace)
_WORKER_START_SECONDS = 60.0
_WORKER_START_ATTEMPTS = 3
_HANDSHAKE_HEADER_BYTES = 64 << 10
# The worker's first Python code: no entry that is not an absolute path (the working directory, '') stays on its
# import path, before anything is imported from it. ``-s`` (no user site) runs before it.
_WORKER_BOOTSTRAP = (
    "import sys; sys.path[:] = [p for p in sys.path if p.startswith('/')]; from %s.worker import main; main()"
    % __package__
)

_CALL_HEADER_BYTES = 64 << 10  # a host call's header holds its number and handler name
_CALL_SECONDS = 2.0  # a host call frame is at most a few MB over a socket pair: a slower one is trickled
_PEEK_NOW = int(socket.MSG_PEEK | socket.MSG_DONTWAIT)  # an int: or-ing the enum members costs a microsecond a call
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)
# A \uD800-\uDFFF escape in a header (a surrogate, perhaps a lone one): such a header is decoded and encoded
# again (protocol.encode_header replaces lone surrogates), never relayed as it came. False positives only cost that.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abAB]")


def log(message: str) -> None:
    print("orchestrator agent: %s" % message, file=sys.stderr, flush=True)


# --- Time limits in requests -------------------------------------------------------------------------------


def _seconds(value: Any, default: float) -> float:
    """A time limit from a request: a positive finite number, else ``default``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return float(value)
    return default


# --- Configuration -----------------------------------------------------------------------------------------


class ConfigError(Exception):
    """The container environment or the secret file is unusable."""


def _env_number(environ: Dict[str, str], name: str, default: float, integer: bool) -> Any:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        raise ConfigError("%s=%r is not a number" % (name, raw)) from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError("%s=%r must be a non-negative number" % (name, raw))
    return value


class Config:
    """Settings the controller passes through the container environment."""

    def __init__(self, environ: Dict[str, str]) -> None:
        self.channel = environ.get("ORCH_CHANNEL") or DEFAULT_CHANNEL
        self.secret_file = environ.get("ORCH_SECRET_FILE") or DEFAULT_SECRET_FILE
        self.sandbox_id = environ.get("ORCH_SANDBOX_ID", "")
        self.output_limit = _env_number(environ, "ORCH_OUTPUT_LIMIT", 1 << 20, True)
        self.grace = _env_number(environ, "ORCH_INTERRUPT_GRACE", 2.0, False)
        # A frame that started must keep flowing: a stall this long mid-frame is treated as a forgery.
        self.frame_timeout = _env_number(environ, "ORCH_FRAME_TIMEOUT", 10.0, False) or 10.0
        self.max_body = min(
            _env_number(environ, "ORCH_MAX_BODY", protocol.MAX_BODY_BYTES, True), protocol.MAX_BODY_BYTES
        )
        self.checkpoint_quota = _env_number(environ, "ORCH_CHECKPOINT_QUOTA", 0, True)
        self.host_call_max = (
            _env_number(environ, "ORCH_HOST_CALL_MAX_BYTES", protocol.HOST_CALL_MAX_BYTES, True)
            or protocol.HOST_CALL_MAX_BYTES
        )
        uid = _env_number(environ, "ORCH_WORKER_UID", confinement.DEFAULT_WORKER_UID, True)
        if uid > confinement.MAX_WORKER_UID:
            raise ConfigError("ORCH_WORKER_UID=%r must be a uid from 0 to %d" % (uid, confinement.MAX_WORKER_UID))
        # Only root can start the worker as another uid; any other user (Settings.user), or a worker uid that is
        # our own, runs it as the supervisor's user: no boundary between them.
        self.worker_uid: Optional[int] = uid if os.geteuid() == 0 and uid != 0 else None
        self.worker_environ = confinement.worker_environment(environ, self.worker_uid, log)


def read_secret(path: str) -> bytes:
    """The sandbox's shared secret from its file (``protocol.parse_secret``: 64 hex characters, one final newline)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(1024)
    except OSError as exc:
        raise ConfigError("cannot read the secret file %s: %s" % (path, exc.strerror or exc)) from None
    try:
        return protocol.parse_secret(raw)
    except ValueError:
        raise ConfigError("the secret file %s must hold exactly 64 hex characters" % path) from None


# --- Moving bytes ------------------------------------------------------------------------------------------


class _Inbox(object):
    """Frames from one stream socket, read up to READ_AHEAD bytes at a time.

    A small frame's prefix, header and body usually arrive in one ``recv``. Bytes read past
    the frame stay here for the next one, so whoever waits for the socket to become readable
    must look here first (``buffered``). Bodies are read from here first, then from the socket.
    """

    __slots__ = ("buf", "end", "mark", "sock", "start", "view")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray(READ_AHEAD)
        self.view = memoryview(self.buf)
        self.start = 0  # the bytes read and not taken yet are buf[start:end]
        self.end = 0
        self.mark = 0  # where the last frame began (``head``)

    def buffered(self) -> int:
        return self.end - self.start

    def peek(self) -> bytes:
        """The first byte read and not taken yet (b"" when there is none)."""
        return bytes(self.view[self.start : self.start + 1]) if self.end > self.start else b""

    def head(self, max_header: int, max_body: int, timeout: float) -> Tuple[Dict[str, Any], int, int]:
        """The next frame's header, body length and head size (prefix and header), all within about ``timeout``.

        The body is not read. ``raw()`` gives the frame's head as it came until the next ``head``.

        Raises:
            socket.timeout: ``timeout`` passed (or one read ran past the socket's own limit) first.
            ChannelClosed: EOF before the header was complete.
            ProtocolViolation: the prefix or the header breaks the format or a limit.
        """
        if self.start == self.end:
            self.start = self.end = 0
            if len(self.buf) > READ_AHEAD:  # a big header came last time: let it go
                self._replace(READ_AHEAD)
        prefix_size = protocol.PREFIX.size
        want = prefix_size
        head_len = body_len = -1
        deadline = -1.0
        while True:
            have = self.end - self.start
            if head_len < 0 and have >= prefix_size:
                head_len, body_len = protocol.parse_prefix(
                    self.view[self.start : self.start + prefix_size], max_header, max_body
                )
                want = prefix_size + head_len
            if head_len >= 0 and have >= want:
                header = protocol.decode_header(self.view[self.start + prefix_size : self.start + want])
                self.mark = self.start
                self.start += want
                return header, body_len, want
            if deadline < 0:
                deadline = time.monotonic() + timeout
            elif time.monotonic() > deadline:
                raise socket.timeout("timed out after %s" % self._progress(head_len, want))
            if self.end == len(self.buf):  # full: a new buffer, as big as the head needs, grown with what arrived
                self._replace(max(READ_AHEAD, min(want, have + protocol.RECV_CHUNK)))
            try:
                got = self.sock.recv_into(self.view[self.end :])
            except BlockingIOError:  # the socket's own limit (limit_each_io)
                raise socket.timeout("timed out after %s" % self._progress(head_len, want)) from None
            if not got:
                raise protocol.ChannelClosed("connection closed after %s" % self._progress(head_len, want))
            self.end += got

    def _progress(self, head_len: int, want: int) -> str:
        have = self.end - self.start
        if head_len < 0:
            return "%d of %d bytes of the frame prefix" % (have, want)
        return "%d of %d bytes of the frame header" % (have - protocol.PREFIX.size, head_len)

    def _replace(self, size: int) -> None:
        """Move the bytes not taken yet to the front of a new buffer (views of the old one stay valid)."""
        have = self.end - self.start
        buf = bytearray(size)
        buf[:have] = self.view[self.start : self.end]
        self.buf, self.view, self.start, self.end = buf, memoryview(buf), 0, have

    def take(self, size: int) -> memoryview:
        """Up to ``size`` bytes that were read already (no read); valid until the next ``head``."""
        count = min(size, self.end - self.start)
        self.start += count
        return self.view[self.start - count : self.start]

    def raw(self) -> memoryview:
        """The last frame as it came, from its prefix up to what was taken since (valid until the next ``head``)."""
        return self.view[self.mark : self.start]

    def read_exactly(self, size: int) -> bytearray:
        """``size`` bytes: those read already, then from the socket; ChannelClosed on EOF before that."""
        body = bytearray(self.take(size))
        if len(body) < size:
            body += protocol.recv_exactly(self.sock, size - len(body))
        return body


class _Copier(object):
    """Moves a body between sockets through one buffer of this process: a read, then a write of what it got."""

    def __init__(self, size: int) -> None:
        self.view = memoryview(bytearray(min(size, CHUNK_BYTES)))

    def fill(self, src: socket.socket, size: int) -> int:
        """One read of at most ``size`` bytes from ``src`` (0 at EOF)."""
        return src.recv_into(self.view[: min(size, CHUNK_BYTES)])

    def drain(self, dst: socket.socket, count: int) -> None:
        """Write the ``count`` bytes the last ``fill`` got to ``dst``."""
        dst.sendall(self.view[:count])


class _Pipe(object):
    """Moves a body between sockets through a kernel pipe with ``os.splice``: no copy into this process.

    The same interface as _Copier, and the same errors: the sockets' own time limits apply to
    ``os.splice`` as to ``recv`` and ``send``. The pipe is empty between a ``drain`` and the next
    ``fill``; a ``drain`` that fails leaves bytes in it, so it closes the pipe (``closed``).
    """

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        self.closed = False
        try:
            with contextlib.suppress(OSError):  # beyond fs.pipe-max-size or the user's pipe quota: the size it has
                fcntl.fcntl(self.w, _F_SETPIPE_SZ, PIPE_BYTES)
            self.size = fcntl.fcntl(self.w, _F_GETPIPE_SZ)
        except BaseException:
            self.close()
            raise

    def fill(self, src: socket.socket, size: int) -> int:
        return os.splice(src.fileno(), self.w, min(size, self.size))

    def drain(self, dst: socket.socket, count: int) -> None:
        try:
            while count:
                moved = os.splice(self.r, dst.fileno(), count)
                if not moved:
                    raise OSError(errno.EIO, "the splice into the socket moved nothing")
                count -= moved
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.r)
            os.close(self.w)


def _open_pipe() -> Optional[_Pipe]:
    """A splice pipe, if this Python and kernel can splice between Unix sockets (tried once on a socket pair)."""
    if not hasattr(os, "splice"):  # Python < 3.10
        return None
    try:
        pipe = _Pipe()
    except OSError:
        return None
    works = False
    try:
        a, b = socket.socketpair()
        try:
            a.sendall(b"?")
            works = pipe.fill(b, 1) == 1
            pipe.drain(b, 1)
            works = works and a.recv(1) == b"?"
        finally:
            a.close()
            b.close()
    except OSError:
        works = False
    if not works:
        pipe.close()
        return None
    return pipe


# --- The worker process ------------------------------------------------------------------------------------


class WorkerProcess:
    """One worker process (leader of its own process group) and our end of its socket."""

    def __init__(self, config: Config) -> None:
        ours, theirs = socket.socketpair()
        self.sock = ours
        calls_ours, calls_theirs = socket.socketpair()
        self.calls: Optional[socket.socket] = calls_ours  # the host-call link; None once closed
        self.oom_baseline = oom_kill_count()
        try:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-s",
                    "-c",
                    _WORKER_BOOTSTRAP,
                    str(theirs.fileno()),
                    str(config.output_limit),
                    str(config.checkpoint_quota),
                    str(calls_theirs.fileno()),
                    str(config.host_call_max),
                ],
                pass_fds=[theirs.fileno(), calls_theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=sys.stderr,
                env=config.worker_environ,
                start_new_session=True,
                **confinement.worker_identity(config.worker_uid),
            )
        except BaseException:
            ours.close()
            calls_ours.close()
            raise
        finally:
            theirs.close()
            calls_theirs.close()
        self.pid = self.proc.pid
        self.pidfd: Optional[int] = None
        with contextlib.suppress(AttributeError, OSError):  # Linux >= 5.3, Python >= 3.9
            self.pidfd = os.pidfd_open(self.pid)
        try:
            protocol.limit_each_io(self.sock, _WORKER_START_SECONDS)
            hello, _ = protocol.recv_frame(self.sock, max_body=0)
            protocol.limit_each_io(self.sock, config.frame_timeout)
            protocol.limit_each_io(calls_ours, config.frame_timeout)
        except (OSError, protocol.ChannelClosed, protocol.ProtocolViolation) as exc:
            self.kill()
            raise RuntimeError("the worker did not start: %s" % exc) from None
        self.dill = str(hello.get("dill", ""))
        self.inbox = _Inbox(self.sock)

    def fds(self) -> List[int]:
        return [self.sock.fileno()] + ([self.pidfd] if self.pidfd is not None else [])

    def interrupt(self, phase: str) -> None:
        """SIGINT stops a cell or a load; SIGUSR2 a checkpoint, so a late cell interrupt can never cut one short."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGUSR2 if phase == "checkpoint" else signal.SIGINT)

    def pending(self) -> Optional[bytes]:
        """Without blocking: b'' when the socket is at EOF, some bytes when it has data, None when empty."""
        if self.inbox.buffered():  # read with its last frame
            return self.inbox.peek()
        try:
            return self.sock.recv(1, _PEEK_NOW)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            return b""

    def close_calls(self) -> None:
        if self.calls is not None:
            with contextlib.suppress(OSError):
                self.calls.close()
            self.calls = None

    def _close(self) -> None:
        self.close_calls()
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self.proc.wait()
        self._close()

    def death(self) -> Dict[str, Any]:
        """Reap the dead (or dying) worker, kill what is left of its process group, and say why it died."""
        try:
            code = self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:  # it only closed its socket: make it dead
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
            code = self.proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)  # children it left behind
        self._close()
        oom = oom_kill_count() > self.oom_baseline
        info: Dict[str, Any] = {"exit_code": code, "oom": oom}
        if code is not None and code < 0:
            try:
                info["signal"] = signal.Signals(-code).name
            except ValueError:
                info["signal"] = "signal %d" % -code
        if oom:
            info["reason"] = "the worker was killed by the kernel's out-of-memory killer"
        elif code is not None and code < 0:
            info["reason"] = "the worker was killed by %s" % info["signal"]
        else:
            info["reason"] = "the worker exited with status %s" % code
        return info


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
    def __init__(self, config: Config, secret: bytes) -> None:
        self.config = config
        self._secret = secret
        self.generation = 0
        self.worker_lost: Optional[Dict[str, Any]] = None
        self.takeover_requested = False
        self.channel_inode: Optional[int] = None
        self.conn: Optional[socket.socket] = None  # the controller connection being served
        self.inbox: Optional[_Inbox] = None  # frames from ``conn``
        self.pipe: Optional[_Pipe] = None  # the splice pipe, made on first use
        self.can_splice = True  # until a pipe could not be made
        self.open_calls: Dict[int, Any] = {}  # host calls relayed for the running exec: call -> its request id
        self.input_waits: Dict[int, float] = {}  # open calls that are input() of the cell: call -> since when
        self.cell_running = False  # an exec's cell runs: the controller may interrupt it
        self.input_allowed = False  # the running exec lets its cell's input() ask the controller
        self.conn_lost = False  # the controller's connection broke during the request being served
        self.watching_conn = False  # the controller's connection should be in the busy selector (_sync_watch)
        self.conn_registered = False  # it is there (kept between requests, so a run of cells registers it once)
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
        self.worker = self._spawn()

    # -- worker lifecycle

    def _spawn(self) -> WorkerProcess:
        """Start a worker; if none will start (no memory, no pids left), the sandbox is beyond repair: exit."""
        for attempt in range(_WORKER_START_ATTEMPTS):
            try:
                worker = WorkerProcess(self.config)
                break
            except (OSError, RuntimeError) as exc:
                log("starting the worker failed (attempt %d): %s" % (attempt + 1, exc))
                time.sleep(0.5)
        else:
            log("no worker would start; exiting so that the controller replaces the sandbox")
            sys.exit(1)
        for sel in (self.idle, self.busy):
            for fd in worker.fds():
                sel.register(fd, selectors.EVENT_READ)
            if worker.calls is not None:
                sel.register(worker.calls, selectors.EVENT_READ)
        return worker

    def _forget(self, worker: WorkerProcess) -> None:
        self.open_calls.clear()  # the link goes with the worker: its callers are gone
        self._watch_controller(False)
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
        info = old.death() if died else None
        if not died:
            old.kill()
        self.worker = self._spawn()
        self.generation = 0
        return info

    # -- takeover

    def _on_takeover(self, signum: int, frame: Any) -> None:
        self.takeover_requested = True

    def _drain_wakeups(self) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while os.read(self.wake_r, 512):
                pass

    def channel_replaced(self) -> bool:
        """True when a controller other than ours now listens on the channel path (a takeover).

        A new controller binds a new socket file and then signals us; if we already reconnected
        to that very file on our own (the old controller had let go), the signal is stale.
        """
        try:
            return os.stat(self.config.channel).st_ino != self.channel_inode
        except OSError:
            return True

    def _takeover_due(self) -> bool:
        if not self.takeover_requested:
            return False
        self.takeover_requested = False
        return self.channel_replaced()

    # -- connection

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
                    protocol.limit_each_io(sock, self.config.frame_timeout)
                    return sock
            except OSError:
                pass
            sock.close()
            time.sleep(delay)
            delay = min(delay * 2, 0.25)

    def run(self) -> None:
        failures = 0
        while True:
            conn = self.connect()
            authenticated = False
            try:
                authenticated = self.handshake(conn)
                if authenticated:
                    failures = 0
                    self.serve(conn)
            except (protocol.ChannelClosed, protocol.ProtocolViolation, ConnectionLost, OSError) as exc:
                log("connection ended: %s" % (exc or type(exc).__name__))
            except Exception:  # never crash: a fresh connection is the way back
                log("unexpected error, reconnecting:\n%s" % traceback.format_exc())
            finally:
                with contextlib.suppress(OSError):
                    conn.close()
            if not authenticated:
                failures += 1
                time.sleep(min(2.0, 0.05 * 2 ** min(failures, 6)))

    def hello(self, nonce: str) -> Dict[str, Any]:
        return {
            "type": protocol.HELLO,
            "protocol": protocol.PROTOCOL_VERSION,
            "sandbox_id": self.config.sandbox_id,
            "generation": self.generation,
            "python": platform.python_version(),
            "dill": self.worker.dill,
            "agent_pid": os.getpid(),
            "worker_pid": self.worker.pid,
            "nonce": nonce,
        }

    def handshake(self, conn: socket.socket) -> bool:
        """hello -> auth -> auth_ok (docs/protocol.md); False when the peer does not prove the secret."""
        agent_nonce = protocol.new_nonce()
        protocol.send_frame(conn, self.hello(agent_nonce))
        header, _ = protocol.recv_head(conn, _HANDSHAKE_HEADER_BYTES, 0, self.config.frame_timeout)
        try:
            controller_nonce = protocol.read_auth(header)["nonce"]
        except protocol.BadRequest:
            log("the controller did not answer the hello with a valid auth frame")
            return False
        expected = protocol.auth_proof(self._secret, "controller", agent_nonce, controller_nonce)
        if not protocol.proof_matches(expected, header.get("proof")):
            log("the controller's proof does not match the sandbox secret; closing")
            return False
        proof = protocol.auth_proof(self._secret, "agent", agent_nonce, controller_nonce)
        protocol.send_frame(conn, {"type": protocol.AUTH_OK, "proof": proof})
        return True

    def _tell_controller(self, header: Dict[str, Any]) -> None:
        """A notice during a request (the controller moves its deadline); a lost controller shows up later."""
        if self.conn is not None:
            with contextlib.suppress(OSError):
                self._send(self.conn, header)

    def _send(self, conn: socket.socket, header: Dict[str, Any], body: Any = b"") -> None:
        protocol.send_frame(conn, header, body)  # within the socket's own limits (limit_each_io)

    # -- serving requests

    def serve(self, conn: socket.socket) -> None:
        self.idle.register(conn, selectors.EVENT_READ)
        self.conn = conn
        inbox = self.inbox = _Inbox(conn)
        self.conn_lost = False
        conn_fd = conn.fileno()
        try:
            while True:
                if self._takeover_due():
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
                if self._calls_fd() in ready:
                    self._take_call(None, "no cell is running: host calls are answered only while a cell runs")
                    continue
                if conn_fd in ready:
                    header, body_len, _ = inbox.head(
                        protocol.MAX_HEADER_BYTES, self.config.max_body, self.config.frame_timeout
                    )
                    try:
                        self.handle(conn, header, body_len)
                    except _Takeover as takeover:
                        self._send(
                            conn, {"type": protocol.GOODBYE, "reason": "takeover", "in_flight": takeover.request_id}
                        )
                        return
        finally:
            self._watch_controller(False)
            self._sync_watch()
            self.conn = None
            self.inbox = None
            self.idle.unregister(conn)

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
            self._discard(body_len)
            return
        if kind == protocol.PING:
            self._discard(body_len)
            self._send(conn, {"type": protocol.PONG, "id": request_id, "generation": self.generation})
            return
        reply_type = protocol.REPLY_TYPES.get(kind)
        if reply_type is None:
            self._discard(body_len)
            reply = {"status": protocol.STATUS_PROTOCOL_ERROR, "ran": False, "reason": "unknown request %r" % kind}
            self._send(conn, {"type": protocol.ERROR, "id": request_id, **reply})
            return
        if kind == protocol.RESTORE_BEGIN:
            self.worker_lost = None
        if self.worker_lost is not None:
            self._discard(body_len)
            lost, self.worker_lost = self.worker_lost, None
            lost.update(type=reply_type, id=request_id, status=protocol.STATUS_CRASHED, ran=False)
            self._send(conn, lost)
            return
        if not self._forward(body_len):
            # The worker was gone before it got the request; a fresh one stands by.
            lost, self.worker_lost = self.worker_lost, None
            if kind == protocol.RESTORE_BEGIN:
                self._send(conn, {"type": reply_type, "id": request_id, "status": protocol.STATUS_OK})
                return
            assert lost is not None
            lost.update(type=reply_type, id=request_id, status=protocol.STATUS_CRASHED, ran=False)
            self._send(conn, lost)
            return
        try:
            outcome = self._await_reply(header, reply_type)
        finally:
            self._end_calls("the cell that made this host call has ended")
        if isinstance(outcome, _Frame):
            self._deliver(conn, outcome, request_id)
        else:
            outcome.update(type=reply_type, id=request_id)
            self._send(conn, outcome)

    # -- moving bytes

    def _discard(self, size: int) -> None:
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
                raise protocol.ChannelClosed("the controller closed the connection in the middle of a frame")
            size -= got

    def _mover(self, size: int) -> Union[_Pipe, _Copier]:
        """What moves a body of ``size`` bytes from one socket to the other: the splice pipe where it works."""
        if size >= SPLICE_MIN_BYTES and self.can_splice:
            if self.pipe is None or self.pipe.closed:
                self.pipe = _open_pipe()
                self.can_splice = self.pipe is not None
            if self.pipe is not None:
                return self.pipe
        return _Copier(size)

    def _forward(self, body_len: int) -> bool:
        """Send the request whose head the controller's inbox just read to the worker: the head as it came, then
        the body (spliced or copied).

        Returns False when the worker turned out dead or stuck before it had the whole request
        (it was replaced; ``worker_lost`` says how). A controller that stops in the middle of
        the body leaves the worker with half a frame: the worker is replaced and ConnectionLost raised.
        """
        worker = self.worker
        inbox = self.inbox
        assert inbox is not None
        remaining = body_len
        try:
            remaining -= len(inbox.take(body_len))  # the body bytes that came with the head go out with it
            worker.sock.sendall(inbox.raw())
            if remaining:
                mover = self._mover(remaining)
                while remaining:
                    try:
                        got = mover.fill(inbox.sock, remaining)
                        if not got:
                            raise protocol.ChannelClosed(
                                "the controller closed the connection in the middle of a frame"
                            )
                    except (OSError, protocol.ChannelClosed) as exc:
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
        self._discard(remaining)
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
            parts: List[Any] = [protocol.frame_head(frame.header, size), first]
        else:  # the worker echoed the id (_read_worker_frame): the head it sent is the one we would encode
            parts = [inbox.raw()]
        if size <= CHUNK_BYTES:
            if len(first) < size:
                try:
                    parts.append(protocol.recv_exactly(worker.sock, size - len(first)))
                except (OSError, protocol.ChannelClosed) as exc:
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
        mover = self._mover(remaining)
        while remaining:
            try:
                got = mover.fill(worker.sock, remaining)
                if not got:
                    raise protocol.ChannelClosed("the worker closed its socket in the middle of a frame")
            except (OSError, protocol.ChannelClosed) as exc:
                # Half a frame went out: the controller cannot be answered on this connection any more.
                self.worker_lost = self._worker_failed(exc)
                raise ConnectionLost("the worker's reply broke off: %s" % self.worker_lost["reason"]) from None
            remaining -= got
            if controller_error is None:
                try:
                    mover.drain(conn, got)
                except OSError as exc:
                    controller_error = exc  # keep reading: the worker's socket must stay in step
                    mover = _Copier(remaining)  # (a pipe closed itself, and the bytes in it went with it)
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

    # -- host calls

    def _calls_fd(self) -> int:
        calls = self.worker.calls
        return calls.fileno() if calls is not None else -1

    def _take_call(self, request_id: Any, refusal: Optional[str]) -> None:
        """Read one frame from the worker's host-call link: relay a call to the controller for ``request_id``
        (or refuse it), and the cell's output for ``request_id`` (or drop it: no cell of an exec runs)."""
        worker = self.worker
        assert worker.calls is not None
        try:
            header, body = protocol.recv_frame(
                worker.calls,
                _CALL_HEADER_BYTES,
                self.config.host_call_max,
                min(self.config.frame_timeout, _CALL_SECONDS),
            )
            call, name = header.get("call"), header.get("name")
            if header["type"] == protocol.OUTPUT and header.get("stream") in protocol.OUTPUT_STREAMS:
                self._relay_output(request_id, header["stream"], body)
                return
            if header["type"] != protocol.HOST_CALL or type(call) is not int or not isinstance(name, str):
                raise protocol.ProtocolViolation("a %r frame that is not a host call" % header["type"])
        except (OSError, protocol.ChannelClosed, protocol.ProtocolViolation) as exc:
            # Cell code can write on this link too; once it is out of step, no call can be trusted on it.
            log("closed the worker's host-call link: %s" % (exc or type(exc).__name__))
            self._forget_calls(worker)
            return
        if refusal is None and (self.conn is None or self.conn_lost):
            refusal = "the controller is not connected"
        if refusal is None:
            assert self.conn is not None
            try:
                self._send(self.conn, {"type": protocol.HOST_CALL, "id": request_id, "call": call, "name": name}, body)
                self.open_calls[call] = request_id
                if name == protocol.INPUT_CALL and self.input_allowed:  # a forged one does not stop the clock
                    self.input_waits[call] = time.monotonic()
                self._watch_controller(True)
                return
            except OSError:
                self._lose_controller("sending a host call failed")
                refusal = "the controller connection was lost"
        self._answer_worker({"call": call, "status": protocol.STATUS_ERROR, "error": refusal})

    def _relay_output(self, request_id: Any, stream: str, body: Any) -> None:
        if request_id is None or self.conn is None or self.conn_lost:
            return  # output of no exec's cell, or no one to tell: dropped (the reply keeps its head)
        try:
            self._send(self.conn, {"type": protocol.OUTPUT, "id": request_id, "stream": stream}, body)
        except OSError:
            self._lose_controller("sending output failed")

    def _drain_calls(self, request_id: Any) -> None:
        """Relay the output the worker sent before its cell ended (and refuse the calls that came with it)."""
        while self.worker.calls is not None:
            try:
                if not self.worker.calls.recv(1, _PEEK_NOW):
                    return  # the link closed: _take_call finds out next time
            except (BlockingIOError, InterruptedError):
                return  # nothing waits (the usual case: one syscall per reply)
            except OSError:
                return
            self._take_call(request_id, "the cell that made this host call has ended")

    def _take_reply(self, request_id: Any) -> bool:
        """Read a frame the controller sent while a cell runs: a host call's answer goes to the worker (a late one
        is dropped). Returns True when it is an interrupt of request ``request_id``."""
        inbox = self.inbox
        assert inbox is not None
        try:
            header, body_len, _ = inbox.head(protocol.MAX_HEADER_BYTES, self.config.max_body, self.config.frame_timeout)
            call = header.get("call")
            if header["type"] == protocol.INTERRUPT:
                self._discard(body_len)
                return header.get("id") == request_id
            if header["type"] != protocol.HOST_REPLY or call not in self.open_calls:
                self._discard(body_len)
                return False
            if body_len > self.config.host_call_max:
                self._discard(body_len)
                header = {
                    "status": protocol.STATUS_ERROR,
                    "error": "the result is %d bytes, over the sandbox's %d-byte limit for host calls"
                    % (body_len, self.config.host_call_max),
                }
                body: Any = b""
            else:
                body = inbox.read_exactly(body_len)
        except (OSError, protocol.ChannelClosed, protocol.ProtocolViolation) as exc:
            self._lose_controller("reading a host call's answer: %s" % (exc or type(exc).__name__))
            return False
        del self.open_calls[call]
        self.input_waits.pop(call, None)
        self._watch_controller(self.cell_running or bool(self.open_calls))
        self._answer_worker({"call": call, "status": header.get("status"), "error": header.get("error")}, body)
        return False

    def _answer_worker(self, header: Dict[str, Any], body: Any = b"") -> None:
        worker = self.worker
        if worker.calls is None:
            return
        header["type"] = protocol.HOST_REPLY
        try:
            protocol.send_frame(worker.calls, header, body)
        except OSError as exc:
            log("closed the worker's host-call link: %s" % (exc or type(exc).__name__))
            self._forget_calls(worker)

    def _end_calls(self, reason: str) -> None:
        """Answer every host call still open with an error: its cell ended (or its answer cannot come)."""
        calls, self.open_calls = list(self.open_calls), {}
        self.input_waits.clear()
        self.cell_running = False
        self._watch_controller(False)
        for call in calls:
            self._answer_worker({"call": call, "status": protocol.STATUS_ERROR, "error": reason})

    def _watch_controller(self, on: bool) -> None:
        """Read the controller during a request only while a cell runs (it may be interrupted) or host calls wait
        for answers (never a request's bytes). The busy selector follows before its next wait (``_sync_watch``)."""
        if self.conn is not None:
            self.watching_conn = on

    def _sync_watch(self) -> None:
        """Make the busy selector watch the controller's connection, or not, as ``watching_conn`` says.

        Between requests only the idle selector waits, so the connection may stay registered here: a run of
        cells registers it once, not twice per cell.
        """
        if self.watching_conn == self.conn_registered or self.conn is None:
            return
        if self.watching_conn:
            self.busy.register(self.conn, selectors.EVENT_READ)
        else:
            with contextlib.suppress(KeyError, ValueError):
                self.busy.unregister(self.conn)
        self.conn_registered = self.watching_conn

    def _forget_calls(self, worker: WorkerProcess) -> None:
        """Stop serving the worker's host-call link (its callers see it close and fail)."""
        self.open_calls.clear()
        self.input_waits.clear()
        self._watch_controller(False)
        if worker.calls is not None:
            for sel in (self.idle, self.busy):
                with contextlib.suppress(KeyError, ValueError):
                    sel.unregister(worker.calls)
        worker.close_calls()

    def _lose_controller(self, why: str) -> None:
        """The controller's connection broke in the middle of a request: finish the request without it."""
        log("the controller's connection broke during a request (%s)" % why)
        self.conn_lost = True
        self._end_calls("the controller connection was lost")

    # -- waiting for the worker: the two clocks and the ladder

    def _await_reply(self, request: Dict[str, Any], reply_type: str) -> Any:
        """Wait for the worker's reply to ``request`` under its time limits.

        Returns the reply as a _Frame (its body still to be copied), or the fields of a reply
        the supervisor makes up itself (timeout, crashed, protocol_error). Raises _Takeover.
        """
        kind = request["type"]
        request_id = request.get("id")
        checkpoint_limit = _seconds(request.get("checkpoint_timeout"), DEFAULT_STEP_SECONDS)
        if kind == protocol.EXEC:
            phase, limit = "cell", _seconds(request.get("timeout"), DEFAULT_STEP_SECONDS)
        elif kind == protocol.LOAD:
            phase, limit = "load", _seconds(request.get("timeout"), DEFAULT_STEP_SECONDS)
        elif kind in (protocol.SET_VALUE, protocol.RESET, protocol.CONTEXT_CREATE, protocol.CONTEXT_DESTROY):
            phase, limit = "checkpoint", checkpoint_limit
        else:  # restore_begin / restore_end: no user code, only a namespace to clear (whose __del__ may hang)
            phase, limit = "request", _seconds(request.get("timeout"), CONTROL_STEP_SECONDS)
        started = time.monotonic()
        deadline = started + limit
        interrupted = False  # interrupt sent in the current phase
        cell_interrupted = False
        cell_duration: Optional[float] = None
        notice_at: Optional[float] = None  # when to tell the controller the checkpoint's clock runs
        paused_at: Optional[float] = None  # since when the cell waits for an answer to input(): its clock stops
        takeover = False
        if kind == protocol.EXEC:
            self.cell_running = True
            self.input_allowed = request.get("input") is True
            self._watch_controller(True)
        while True:
            if not takeover and self._takeover_due():
                takeover = True
                if not interrupted:
                    self.worker.interrupt(phase)
                    interrupted = True
                deadline = min(deadline, time.monotonic()) + self.config.grace
            if self.input_waits and paused_at is None and not interrupted:
                paused_at = time.monotonic()
            elif paused_at is not None and not self.input_waits:
                deadline += time.monotonic() - paused_at
                paused_at = None
            wake = deadline if notice_at is None else min(deadline, notice_at)
            timeout = max(0.0, wake - time.monotonic()) if paused_at is None or notice_at is not None else None
            if self.watching_conn != self.conn_registered:
                self._sync_watch()
            worker = self.worker
            ahead = worker.inbox.buffered()  # a frame that came with the last one: nothing to wait for
            inbox = self.inbox
            conn_ahead = self.watching_conn and inbox is not None and inbox.buffered()
            if ahead or conn_ahead:
                timeout = 0.0
            ready = {key.fd for key, _ in self.busy.select(timeout)}
            if ahead:
                ready.add(worker.sock.fileno())
            if conn_ahead:
                assert inbox is not None
                ready.add(inbox.sock.fileno())
            if self.wake_r in ready:
                self._drain_wakeups()
            if self._calls_fd() in ready:
                if kind == protocol.EXEC and phase == "cell" and not takeover:
                    self._take_call(request_id, None)
                else:
                    self._take_call(None, "the cell that made this host call has ended")
            if (
                self.watching_conn
                and self.conn is not None
                and self.conn.fileno() in ready
                and self._take_reply(request_id)
                and phase == "cell"
                and not interrupted
            ):
                deadline, paused_at = time.monotonic(), None  # the controller cancelled the cell: the ladder
            worker = self.worker
            if worker.sock.fileno() in ready or (worker.pidfd in ready and worker.pending() is not None):
                if takeover:
                    self._replace_worker()  # the interrupted request may have changed the namespace
                    raise _Takeover(request_id)
                frame = self._read_worker_frame(request_id)
                if not isinstance(frame, _Frame):
                    frame.update(phase=phase)
                    return frame
                if phase == "cell" and kind == protocol.EXEC:
                    self._drain_calls(request_id)  # the cell's last output went out before this frame
                if frame.header["type"] == protocol.CELL_DONE and phase == "cell" and frame.body_len == 0:
                    self._end_calls("the cell that made this host call has ended")
                    cell_duration = time.monotonic() - started
                    phase, interrupted = "checkpoint", False
                    deadline = time.monotonic() + checkpoint_limit
                    notice_at = time.monotonic() + NOTICE_DELAY
                    continue
                if frame.header["type"] != reply_type:
                    return self._misbehaved_in(frame, phase, "the worker sent %r, not a reply" % frame.header["type"])
                return self._finish(frame, kind, interrupted, cell_interrupted)
            if worker.pidfd is not None and worker.pidfd in ready:
                info = self._replace_worker(died=True) or {}
                if takeover:
                    raise _Takeover(request_id)
                info.update(status=protocol.STATUS_CRASHED, ran=True, phase=phase)
                return info
            if notice_at is not None and time.monotonic() >= notice_at:
                # The checkpoint takes a while: the controller moves its deadline to the checkpoint's.
                self._tell_controller({"type": protocol.CHECKPOINTING, "id": request_id})
                notice_at = None
            if time.monotonic() < deadline or paused_at is not None:
                continue
            if takeover:
                self._replace_worker()
                raise _Takeover(request_id)
            if not interrupted:
                self.worker.interrupt(phase)
                interrupted = True
                cell_interrupted = cell_interrupted or phase == "cell"
                deadline = time.monotonic() + self.config.grace
                continue
            self._replace_worker()
            if kind == protocol.RESTORE_BEGIN:
                return {"status": protocol.STATUS_OK, "worker_restarted": True}  # a fresh worker is an empty one
            reply: Dict[str, Any] = {
                "status": protocol.STATUS_TIMEOUT,
                "ran": True,
                "worker_restarted": True,
                "phase": phase,
                "reason": "the %s ignored the interrupt for %.1f s; the worker was killed" % (phase, self.config.grace),
            }
            if kind == protocol.EXEC:
                reply["duration"] = cell_duration if cell_duration is not None else time.monotonic() - started
            return reply

    def _read_worker_frame(self, request_id: Any) -> Any:
        """The header of the worker's next frame as a _Frame, or the reply fields if it was invalid or died."""
        try:
            header, body_len, head_size = self.worker.inbox.head(
                protocol.MAX_HEADER_BYTES, self.config.max_body, self.config.frame_timeout
            )
        except socket.timeout as exc:
            return self._worker_failed(exc)
        except protocol.ProtocolViolation as exc:
            return self._worker_misbehaved("the worker sent an invalid frame (%s)" % exc)
        except (protocol.ChannelClosed, OSError) as exc:
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

    def _finish(self, frame: _Frame, kind: str, interrupted: bool, cell_interrupted: bool) -> _Frame:
        """Adjust the worker's reply for what the supervisor did, and learn the generation from it."""
        reply = frame.header
        status = reply.get("status")
        if status == protocol.STATUS_ERROR and (cell_interrupted or (kind == protocol.LOAD and interrupted)):
            # The interrupt stopped it (a cell that finished just at its deadline stays a success).
            reply["status"] = protocol.STATUS_TIMEOUT
            reply["worker_restarted"] = False
            reply.setdefault("phase", "cell" if kind == protocol.EXEC else "load")
            frame.edited = True
        checkpoint = reply.get("checkpoint")
        if isinstance(checkpoint, dict) and type(checkpoint.get("generation")) is int:
            self.generation = checkpoint["generation"]
        if kind == protocol.RESTORE_BEGIN and status == protocol.STATUS_OK:
            self.generation = 0
        if kind == protocol.RESTORE_END and type(reply.get("generation")) is int:
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
