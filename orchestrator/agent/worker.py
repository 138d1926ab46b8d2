"""The sandbox worker: holds the session's globals and runs cells; the supervisor does everything else.

Standard library plus dill. Started by the supervisor as the sandbox's worker uid, as ``python3 -s -c
'<drop relative sys.path entries>; from orchestrator_agent.worker import main; main()' FD OUTPUT_LIMIT QUOTA
CALL_MAX`` with one end of a socket pair on FD: its link to the supervisor, which hands it each data channel the
controller makes (docs/design/one-hop.md) and hears ``idle`` when the controller closes one. On the data channel it
answers one request at a time with a reply and the checkpoint delta that the request caused; the cell's host calls
and output go on the data channel's second socket (hostcall.py). The
session's scaffold (``install``) runs in a module of its own; its ``before_cell`` and
``after_cell`` run around every cell, and the names it owns are never checkpointed. It
installs the session namespace as ``__main__``, where dill (imported on first use) finds it,
so that functions defined in cells pickle with a reference to the namespace rather than a copy.

The interrupts (the controller's ladder, sent by the supervisor): SIGINT stops a cell or the unpickling of one value,
SIGUSR2 a checkpoint. Each raises KeyboardInterrupt only inside its own phase (and at most once per
phase); anywhere else, frame I/O above all, it is only noted, so a late interrupt can never
tear a frame, and a cell's interrupt that comes as the cell ends cannot cut its checkpoint
short. A checkpoint that is interrupted names the values it had not saved yet and replies
normally. SIGHUP sends a worker that waits on its data channel back to the supervisor's link
(the controller is gone); it is a signal of its own so that an interrupt the
controller sent as its request ended can never make an idle worker drop its data channel.

Contexts: more namespaces of the session in this one worker (docs/protocol.md, "Contexts").
Each is a module of its own with its own checkpoint tracker, working directory and environment
variables. A request on another context than the last one switches to it first: the working
directory and ``os.environ`` of the context left are kept (a cell's ``chdir`` or ``putenv``
stays in its context), the new context's are put in place, and its module becomes
``sys.modules["__main__"]``, which is where dill finds the globals of the functions and
classes it pickles. A request on the same context as the last one switches nothing.
"""

from __future__ import annotations

import _signal  # signal without its enum wrappers: handlers are checked on every call
import builtins
import contextlib
import gc
import io
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
import types
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from . import blob_format, capture, cgroup, checkpoint_names, framing, handover, hostcall, protocol, request_table

_session_module = types.ModuleType("__main__")
sys.modules["__main__"] = _session_module

# After the session module is __main__:
from . import cells, checkpoint, lazy, workspace_files, workspace_restore  # noqa: E402
from .workspace import Workspace  # noqa: E402

_IDLE, _CELL, _LOAD, _CHECKPOINT = "idle", "cell", "load", "checkpoint"


class _LeaveDataChannel(BaseException):
    """SIGHUP while the worker waits on its data channel for a request: go back to the supervisor's link."""


_MISSING = object()
_MAX_REASON = 200
_MAX_PROMPT = 64 << 10
_BUILTIN_INPUT = builtins.input  # Python's own input(), for a cell that reads the exec's ``stdin``


def _fresh_namespace(namespace: Dict[str, Any]) -> None:
    namespace.clear()
    namespace.update({"__name__": "__main__", "__builtins__": __builtins__, "__doc__": None})


class _Context(object):
    """One namespace of the session, with the working directory and environment its requests run in."""

    __slots__ = ("context_id", "cwd", "deferred", "environ", "module", "tracker")

    def __init__(
        self,
        context_id: Optional[str],
        module: types.ModuleType,
        tracker: checkpoint.Tracker,
        cwd: str,
        environ: Any,
        blobs: lazy.Blobs,
    ) -> None:
        self.context_id = context_id  # None: the default context
        self.module = module
        self.tracker = tracker
        self.cwd = cwd
        self.environ = environ  # Dict[str, str]
        self.deferred = lazy.Deferred(self, blobs)  # its values a restore deferred (lazy.py)


def _current_dir(fallback: str) -> str:
    try:
        return os.getcwd()
    except OSError:  # a cell removed it
        return fallback


def _enter_dir(path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)  # a cell of another context may have removed it
        os.chdir(path)
    except OSError as exc:
        print("orchestrator worker: cannot enter %s: %s" % (path, exc), file=sys.stderr)


def _replace_environ(target: Dict[str, str]) -> None:
    for key in [k for k in os.environ if k not in target]:
        del os.environ[key]
    for key, value in target.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _prefixed(delta: Dict[str, Any], context_id: str) -> Dict[str, Any]:
    """A context's checkpoint delta with its names as checkpoint keys (``<context>/<name>``)."""
    prefix = context_id + checkpoint_names.CONTEXT_SEPARATOR
    delta["vars"] = dict((prefix + name, d) for name, d in delta["vars"].items())
    delta["deleted"] = [prefix + name for name in delta["deleted"]]
    delta["unsaved"] = dict((prefix + name, reason) for name, reason in delta["unsaved"].items())
    return delta


def _recv_into(sock: socket.socket, buf: bytearray, got: int = 0) -> None:
    view = memoryview(buf)
    while got < len(buf):
        count = sock.recv_into(view[got:])
        if not count:
            raise framing.ChannelClosed("the link closed after %d of %d bytes" % (got, len(buf)))
        got += count


_FD_SPACE = socket.CMSG_SPACE(4)  # room for the one descriptor a frame may bring: a value file (set_value)


def _recv_request(sock: socket.socket) -> Tuple[Dict[str, Any], bytearray, Optional[int]]:
    """One frame from the controller (on the data channel) or the supervisor (on the link), and the descriptor that
    came with it (a value file, docs/protocol.md), if any.

    The body lands in one buffer of its exact size with no copy after it: a 150 MB restore
    blob costs 150 MB here, and is unpickled straight out of this buffer.
    """
    prefix = bytearray(framing.PREFIX.size)
    got, ancillary, _, _ = sock.recvmsg_into([prefix], _FD_SPACE)
    fds = handover.rights(ancillary)
    for extra in fds[1:]:
        os.close(extra)
    fd = fds[0] if fds else None
    try:
        if not got:
            raise framing.ChannelClosed("the link closed")
        _recv_into(sock, prefix, got)
        head_len, body_len = framing.parse_prefix(prefix)
        raw = bytearray(head_len)
        _recv_into(sock, raw)
        header = framing.decode_header(raw)
        body = bytearray(body_len)
        _recv_into(sock, body)
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise
    return header, body, fd


def _map_value_file(fd: int, size: int) -> Any:
    """The host-made blob in a value file, mapped read-only (the host wrote it whole before it sent the request).

    Raises:
        ValueError: the file is not ``size`` bytes or not a host-made blob's frame.
    """
    mapped = hostcall.map_file(fd, size)
    if not blob_format.host_blob_framed(mapped):
        mapped.close()
        raise ValueError("the value file is not a whole host-made blob")
    return mapped


def _reason(exc: BaseException) -> str:
    return checkpoint.describe(exc)[:_MAX_REASON]


class Worker:
    """Serves the controller's requests on each data channel the supervisor hands it over its link."""

    def __init__(
        self,
        link: socket.socket,
        output_limit: int,
        quota: int,
        call_max: int = protocol.HOST_CALL_MAX_BYTES,
        workspace: Optional[Workspace] = None,
    ) -> None:
        self.link = link  # to the supervisor: the data channels come on it, ``idle`` goes back
        self.sock: Optional[socket.socket] = None  # the data channel's requests and replies, while the worker holds one
        self.output_limit = output_limit
        self.quota = quota
        self.namespace = _session_module.__dict__
        _fresh_namespace(self.namespace)
        self.tracker = checkpoint.Tracker(quota)
        # deferred values' blobs, from the controller
        self._blobs = lazy.Blobs(self._fetch_blob, self._check_blob, self._all_deferred)
        self.base_environ = dict(os.environ)  # what a new context's environment starts from
        self.default = _Context(None, _session_module, self.tracker, _current_dir("/"), self.base_environ, self._blobs)
        self.active = self.default  # the context of the last request; self.namespace and self.tracker are its
        self.contexts: Dict[str, _Context] = {}
        self.excluded: Any = frozenset()  # the scaffold's names, left out of every context's checkpoint
        self.cell_number = 0
        self.phase = _IDLE
        self.armed = False  # a KeyboardInterrupt may be raised right now
        self.awaiting_data = False  # waiting on D for a request, where SIGHUP leaves D
        self.stop_checkpoint = False  # SIGUSR2 came during the checkpoint: pickle nothing more
        self.cell_done_for: Any = _MISSING  # the exec whose cell_done is still to be sent
        self.restored_frozen: Dict[str, Any] = {}  # digest -> immutable value loaded in this restore
        self._body: Optional[bytearray] = None  # the current request's body, until a handler takes it
        self._value_fd: Optional[int] = None  # the descriptor that came with it (a value file), until taken
        self._handlers = (
            (signal.SIGINT, self._on_sigint),
            (signal.SIGUSR2, self._on_sigusr2),
            (signal.SIGHUP, self._on_sighup),
        )
        self.shielded = False  # the main thread writes a host-call frame: an interrupt waits until it is out
        self.deferred = False
        self.calls: Optional[hostcall.HostCallClient] = None  # the data channel's host calls and output (K)
        self.call_max = call_max
        self.scaffold: Dict[str, Any] = {}  # the installed scaffold's module namespace
        self.input_allowed = False  # the running cell's input() may ask the controller
        self.call_refusal: Optional[str] = protocol.CALL_NO_CELL  # why host_call fails now (None: an exec's cell runs)
        self.output: Optional[capture.CellStreams] = None  # the running cell's output
        self.workspace = workspace  # /workspace's files, checkpointed with the values; None: this sandbox has none
        self.fresh = True  # no restore_begin nor checkpoint yet: /workspace may hold a worker before this one's files

    # -- the interrupt

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.armed and self.phase in (_CELL, _LOAD):
            if self.shielded:
                self.deferred = True
                return
            self.armed = False  # once: the code that catches it must not be interrupted again
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def _shield(self) -> Iterator[None]:
        """Hold the cell's interrupt back while the main thread writes a frame (a torn frame breaks the link)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self.shielded = True
        try:
            yield
        finally:
            self.shielded = False
            if self.deferred and self.armed:
                self.deferred = False
                self.armed = False
                raise KeyboardInterrupt

    def _on_sighup(self, signum: int, frame: Any) -> None:
        """The supervisor lost its controller, who may never close D; only an idle worker leaves it (one
        that runs something is interrupted, and gets this again once idle)."""
        if self.awaiting_data:
            self.awaiting_data = False
            raise _LeaveDataChannel

    def _on_sigusr2(self, signum: int, frame: Any) -> None:
        if self.phase != _CHECKPOINT:
            return
        self.stop_checkpoint = True
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt

    def _install_handlers(self) -> None:
        """Ours, whatever cell code installed: the ladder needs them (checked first: this runs on every call)."""
        for signum, handler in self._handlers:
            if _signal.getsignal(signum) is not handler:
                _signal.signal(signum, handler)

    def _enter(self, phase: str) -> None:
        self.phase = phase
        self.armed = False
        self.deferred = False
        self.stop_checkpoint = False

    def _guarded_dumps(self, name: str, value: Any) -> checkpoint.Blob:
        """checkpoint.dumps that SIGUSR2 may stop; KeyboardInterrupt tells the tracker time is up."""
        if self.cell_done_for is not _MISSING:
            self._announce_checkpoint()
        if self.stop_checkpoint:
            raise KeyboardInterrupt
        if not checkpoint.dill_imported():
            # Plain data needs no dill; the first value that does imports it here, unarmed: a SIGUSR2 during the
            # import is only noted (a KeyboardInterrupt in the middle of it would leave dill half imported).
            blob = self._armed(checkpoint.dump_plain, value)
            if blob is not None:
                return blob
            checkpoint.dill_module()
            if self.stop_checkpoint:
                raise KeyboardInterrupt
        return self._armed(checkpoint.dumps, name, value)

    def _armed(self, pickler: Callable[..., Any], *args: Any) -> Any:
        """``pickler(*args)`` with the checkpoint's interrupt armed."""
        try:
            self.armed = True
            return pickler(*args)
        finally:
            self.armed = False

    # -- the loop

    def send(self, reply: Dict[str, Any], parts: Any = b"") -> None:
        assert self.sock is not None
        try:
            framing.send_frame(self.sock, reply, parts)
        except (TypeError, ValueError) as exc:  # a header that cannot be JSON (should not happen): say so
            fallback = {
                "type": reply.get("type"),
                "id": reply.get("id"),
                "status": protocol.STATUS_ERROR,
                "reason": "the worker could not encode its reply: %s" % _reason(exc),
            }
            framing.send_frame(self.sock, fallback)

    def serve(self) -> None:
        """Say hello on the link, then serve each data channel the supervisor hands over until the link closes."""
        self._install_handlers()
        hello = {"type": protocol.HELLO, "python": sys.version.split()[0], "dill": checkpoint.dill_version()}
        framing.send_frame(self.link, dict(hello, pid=os.getpid()))
        while self._take_data_channel():
            self._serve_data_channel()
            self._leave_data_channel()

    def _take_data_channel(self) -> bool:
        """Wait on the link for the next data channel (requests, host calls); False once the supervisor closed it."""
        try:
            header, _, fd = _recv_request(self.link)
        except framing.ChannelClosed:
            return False
        if fd is not None:  # its descriptors come with the byte after it (handover.pass_fds)
            os.close(fd)
        if header["type"] != protocol.DATA_CHANNEL:
            raise framing.ProtocolViolation("the supervisor sent %r, not a data channel" % header["type"])
        data, calls = handover.take_fds(self.link, protocol.DATA_CHANNEL_FDS)
        self.sock = data
        self.calls = hostcall.HostCallClient(calls, self.call_max, self._shield)
        return True

    def _serve_data_channel(self) -> None:
        """Serve requests on the data channel until the controller closes it (or SIGHUP: it is gone)."""
        assert self.sock is not None
        while True:
            self._enter(_IDLE)
            self.call_refusal = protocol.CALL_NO_CELL
            try:
                self.awaiting_data = True
                try:
                    header, self._body, self._value_fd = _recv_request(self.sock)
                finally:
                    self.awaiting_data = False
            except (_LeaveDataChannel, framing.ChannelClosed, OSError):
                return
            self._install_handlers()
            row = request_table.REQUESTS.get(header["type"])
            if (row is not None and row.imports_dill(header)) or any(d.pending for d in self._all_deferred()):
                checkpoint.dill_module()  # now, while interrupts are only noted, never torn mid-import by one
            try:
                reply, parts = self.handle(header)
            finally:
                if self._value_fd is not None:  # a descriptor no request took
                    os.close(self._value_fd)
                    self._value_fd = None
            self._body = None  # restore input can be hundreds of MB: free it before the reply goes out
            self._enter(_IDLE)
            reply["id"] = header.get("id")
            try:
                self.send(reply, parts)
            except OSError:
                return  # the controller closed it (it went away, or gave the sandbox up)
            del reply, parts

    def _leave_data_channel(self) -> None:
        """The controller closed its data channel: back to the link, and tell the supervisor the worker is idle.

        Its generation is the last checkpoint's, delivered or not: a controller that did not get it has another one
        stored, and restores."""
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
        if self.calls is not None:
            self.calls.close()
        self.sock, self.calls = None, None
        framing.send_frame(self.link, {"type": protocol.WORKER_IDLE, "generation": self.tracker.generation})

    def _take_body(self) -> bytearray:
        """The request's body; the worker keeps no other reference, so dropping it frees it."""
        body, self._body = self._body, None
        return body if body is not None else bytearray()

    def handle(self, header: Dict[str, Any]) -> Tuple[Dict[str, Any], List[Any]]:
        """Serve one request as its row of ``request_table.REQUESTS`` says: the context it runs in, the phase it
        starts in, its reader, then its handler (a method of this class, given the request the reader returned)."""
        kind = header["type"]
        row = request_table.REQUESTS.get(kind)
        if row is None or row.handler is None:
            return {
                "type": protocol.ERROR,
                "status": protocol.STATUS_PROTOCOL_ERROR,
                "reason": "unknown request type %r" % kind,
            }, []
        context_id = header.get("context")
        if row.in_context and context_id != self.active.context_id:
            target = self.default if context_id is None else self.contexts.get(context_id)
            if target is None:
                reason = "no context %r in this worker" % (context_id,)
                return {"type": row.reply, "status": protocol.STATUS_PROTOCOL_ERROR, "reason": reason}, []
            self._activate(target)
        if row.phase == request_table.CHECKPOINT_PHASE:
            # The controller runs the checkpoint's clock for the whole request: a namespace changed or cleared (its
            # __del__ runs), then a checkpoint.
            self._enter(_CHECKPOINT)
        try:
            request = row.read(header, 0 if self._body is None else len(self._body))
        except protocol.BadRequest as exc:
            return {"type": row.reply, "status": row.refusal, "reason": str(exc)}, []
        handler: Callable[[Any], Tuple[Dict[str, Any], List[Any]]] = getattr(self, row.handler)
        return handler(request)

    def reset(self, request: request_table.ResetRequest) -> Tuple[Dict[str, Any], List[Any]]:
        """Clear the context's namespace, then checkpoint."""
        _fresh_namespace(self.namespace)
        self.active.deferred.clear()
        return self.state_reply()

    def restore_begin(self, request: request_table.RestoreBeginRequest) -> Tuple[Dict[str, Any], List[Any]]:
        """Clear every namespace and drop every context but the default one: a restore starts."""
        self._activate(self.default)
        for context in self.contexts.values():
            _fresh_namespace(context.module.__dict__)
        self.contexts = {}
        _fresh_namespace(self.namespace)
        self.tracker = self.default.tracker = checkpoint.Tracker(self.quota)
        self.default.deferred = lazy.Deferred(self.default, self._blobs)
        self.restored_frozen = {}
        gc.collect()
        self.fresh = False
        if self.workspace is not None:
            try:
                self.workspace.begin_restore()  # emptied: the files_put batches fill it
            except OSError as exc:
                return self._restore_error("the workspace cannot be emptied: %s" % _reason(exc)), []
        return {"type": request_table.RESTORE_REPLY, "status": protocol.STATUS_OK}, []

    def files_put(self, request: request_table.FilesPutRequest) -> Tuple[Dict[str, Any], List[Any]]:
        """Write a batch of the stored workspace (its files' contents are the body, in order) into the restore's."""
        body = self._take_body()
        entries = request["entries"]
        if self.workspace is None:
            if not entries:
                return {"type": request_table.RESTORE_REPLY, "status": protocol.STATUS_OK}, []
            return self._restore_error("this sandbox has no workspace directory"), []
        try:
            self._restoring_workspace().put(entries, workspace_restore.contents_of(entries, body))
        except (protocol.BadRequest, OSError) as exc:
            return self._restore_error(_reason(exc) if isinstance(exc, OSError) else str(exc)), []
        return {"type": request_table.RESTORE_REPLY, "status": protocol.STATUS_OK}, []

    def _restoring_workspace(self) -> Workspace:
        """The workspace, in a restore: a fresh worker that the restore's ``restore_begin`` never reached (it
        replaced one killed during it) empties it now, as that request would have."""
        assert self.workspace is not None
        if self.fresh and not self.workspace.restoring:
            self.fresh = False
            self.workspace.begin_restore()
        return self.workspace

    @staticmethod
    def _restore_error(reason: str) -> Dict[str, Any]:
        return {"type": request_table.RESTORE_REPLY, "status": protocol.STATUS_ERROR, "reason": reason}

    # -- checkpoints

    def checkpoint(self) -> Tuple[Dict[str, Any], List[Any], float]:
        """The delta since the last checkpoint; SIGUSR2 from here on means: out of time."""
        started = time.monotonic()
        self.phase = _CHECKPOINT
        self.fresh = False
        workspace = self.workspace
        try:
            if workspace is not None:  # one quota for values and files: the values' delta counts the files' bytes
                self.tracker.held.files_bytes = workspace.blob_bytes
            delta, parts = self.tracker.delta(self.namespace, self._guarded_dumps)
            if workspace is not None:
                workspace.checkpoint(delta, parts, self.tracker, self._armed_for_files)
        finally:
            self.phase = _IDLE
            self.cell_done_for = _MISSING
        if self.active.context_id is not None:
            delta = _prefixed(delta, self.active.context_id)
        return delta, parts, time.monotonic() - started

    @contextlib.contextmanager
    def _armed_for_files(self) -> Iterator[None]:
        """The checkpoint's interrupt armed while the workspace reads what changed (it rolls back when it lands)."""
        if self.cell_done_for is not _MISSING:  # files to read: the controller's checkpoint clock runs from here
            self._announce_checkpoint()
        if self.stop_checkpoint:
            raise KeyboardInterrupt
        self.armed = True
        try:
            yield
        finally:
            self.armed = False

    def empty_delta(self) -> Dict[str, Any]:
        """The delta of a checkpoint that found nothing changed (or of one that was not taken)."""
        return {"generation": self.tracker.generation, "blobs": [], "vars": {}, "deleted": [], "unsaved": {}}

    def state_reply(self) -> Tuple[Dict[str, Any], List[Any]]:
        delta, parts, took = self.checkpoint()
        reply = {
            "type": request_table.STATE_REPLY,
            "status": protocol.STATUS_OK,
            "checkpoint": delta,
            "checkpoint_duration": took,
        }
        return reply, parts

    # -- requests

    def execute(self, request: request_table.ExecRequest) -> Tuple[Dict[str, Any], List[Any]]:
        """Run a cell, then checkpoint. Optional fields (docs/protocol.md): ``stdin`` (text that ``sys.stdin``
        and Python's own ``input()`` read), ``output_cap`` (bytes of stdout and stderr together, past which
        writes raise ``OutputLimitExceeded``) and ``checkpoint: false`` (no checkpoint: an empty delta)."""
        code = request["code"]
        self.cell_number += 1
        stdin = request.get("stdin")
        output = capture.CellStreams(
            self.output_limit,
            None if self.calls is None else self.calls.send_output,
            request.get("stream", False),
            request.get("send_limit", 0),
            request.get("output_cap"),
        )
        saved_streams = sys.stdout, sys.stderr
        saved_input = builtins.input
        saved_stdin = sys.stdin
        self.output = output
        self.input_allowed = request.get("input", False)
        self._enter(_CELL)
        self.call_refusal = None
        started = time.monotonic()
        scaffold = None
        try:
            try:
                sys.stdout, sys.stderr = output.streams
                if stdin is None:
                    builtins.input = self._input
                else:  # input() reads lines of the text, prints its prompt, and raises EOFError at its end
                    sys.stdin, builtins.input = io.StringIO(stdin), _BUILTIN_INPUT
                self.armed = True
                lost = self._load_needed(code)
                self._hook("before_cell")
                if lost is None:
                    outcome = cells.run_cell(code, self.namespace, self.cell_number)
                else:  # a deferred value the cell names is gone: the cell does not run
                    outcome = {"return_value": None, "error": cells.error_info(lost)}
                scaffold = self._hook("after_cell")
            finally:
                self.armed = False
        except (KeyboardInterrupt, capture.OutputLimitExceeded) as exc:  # it landed just outside the user's own code
            outcome = {"return_value": None, "error": cells.error_info(exc)}
        finally:
            sys.stdout, sys.stderr = saved_streams
            builtins.input = saved_input
            if stdin is not None:
                sys.stdin = saved_stdin
            self.output = None
            self.phase = _IDLE
            self.call_refusal = protocol.CALL_ENDED
        duration = time.monotonic() - started
        self._install_handlers()  # the checkpoint must be interruptible whatever the cell did
        output.finish()  # every output frame is out before the checkpoint's clock can start
        if not request.get("checkpoint", True):  # the caller keeps nothing of this cell: nothing to pickle or send
            delta, parts, took = self.empty_delta(), [], 0.0
        else:
            self._cell_done(request.get("id"))
            delta, parts, took = self.checkpoint()
        reply = {
            "type": request_table.EXEC_REPLY,
            "status": protocol.STATUS_ERROR if outcome["error"] else protocol.STATUS_OK,
            "stdout": output.sinks[0].text(),
            "stderr": output.sinks[1].text(),
            "stdout_bytes": output.sinks[0].total,
            "stderr_bytes": output.sinks[1].total,
            "return_value": outcome["return_value"],
            "error": outcome["error"],
            "duration": duration,
            "checkpoint_duration": took,
            "checkpoint": delta,
        }
        if scaffold is not None:
            reply["scaffold"] = scaffold
        if output.limited:
            reply["output_limited"] = True
        return reply, parts

    def _load_needed(self, code: str) -> Optional[NameError]:
        """Load the deferred values ``code`` needs before it runs (lazy.py); why one could not be, if one could not."""
        try:
            self.active.deferred.before_cell(code)
        except (lazy.DeferredValueLost, lazy.DeferredValueUnavailable) as exc:
            return exc
        return None

    def _input(self, prompt: Any = "") -> str:
        """``input()`` in a cell: the caller answers it through the controller (docs/protocol.md, "input()")."""
        text = str(prompt)
        if text:
            sys.stdout.write(text)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        if self.output is not None:
            self.output.flush()  # the prompt reaches the caller before the request
        if not self.input_allowed or self.calls is None:
            raise EOFError(
                "input() has no one to answer it: this cell was run without an input handler "
                "(pass on_output= to execute, or use stream(), to answer input requests)"
            )
        try:
            answer = self.calls.call(protocol.INPUT_CALL, {"prompt": text[:_MAX_PROMPT]})
        except hostcall.HostCallError as exc:
            raise EOFError("input() got no answer: %s" % exc) from None
        if not isinstance(answer, str):
            raise EOFError("input() got no answer: the controller sent a %s, not text" % type(answer).__name__)
        return answer

    # -- the scaffold

    def _host_call(self, name: str, payload: Any = None, timeout: Optional[float] = None) -> Any:
        """The scaffold's ``host_call``: on the data channel's K, while an exec's cell runs. A call at any other time
        (from a thread a cell left) fails here at once, with the error the controller answers it with: nobody reads K
        between calls."""
        calls = self.calls
        if calls is None or self.call_refusal is not None:
            raise hostcall.HostCallError(self.call_refusal or protocol.CALL_NO_CELL)
        return calls.call(name, payload, timeout)

    def install(self, request: request_table.InstallRequest) -> Tuple[Dict[str, Any], List[Any]]:
        """Run the session's scaffold code in a fresh module of its own; it replaces the one before."""
        code, names = request["code"], request["names"]
        scope: Dict[str, Any] = {
            "__name__": "__orchestrator_scaffold__",
            "__builtins__": __builtins__,
            "host_call": self._host_call,
            "HostCallError": hostcall.HostCallError,
            # Values a restore deferred are not in the namespace until used (lazy.py): the hooks can see and load them.
            "deferred_values": self._deferred_values,
            "load_deferred": self._load_deferred,
        }
        self._enter(_CELL)
        try:
            try:
                self.armed = True
                exec(compile(code, "<scaffold>", "exec"), scope)
            finally:
                self.armed = False
        except BaseException:  # even SystemExit: the scaffold is not installed, the worker goes on
            return self._install_reply("the scaffold raised:\n" + traceback.format_exc(limit=-8)[-8000:])
        finally:
            self.phase = _IDLE
        self.scaffold = scope
        self.excluded = frozenset(names)
        for context in [self.default, *self.contexts.values()]:
            context.tracker.excluded = self.excluded
        return self._install_reply(None)

    # -- contexts

    def _activate(self, target: _Context) -> None:
        """Make ``target`` the context requests run in: its namespace, tracker, directory and environment."""
        current = self.active
        if target is current:
            return
        current.cwd = _current_dir(current.cwd)
        current.environ = dict(os.environ)
        _replace_environ(target.environ)
        _enter_dir(target.cwd)
        sys.modules["__main__"] = target.module
        target.tracker.generation = current.tracker.generation  # one generation for the whole session
        self.namespace = target.module.__dict__
        self.tracker = target.tracker
        self.active = target

    def context_create(self, request: request_table.ContextCreateRequest) -> Tuple[Dict[str, Any], List[Any]]:
        """Make an empty context (an existing one of that id is destroyed first); replies with the delta."""
        return self._replace_context(request["context"], request)

    def context_destroy(self, request: request_table.ContextDestroyRequest) -> Tuple[Dict[str, Any], List[Any]]:
        """Delete a context and its names; replies with the delta."""
        return self._replace_context(request["context"], None)

    def _replace_context(
        self, context_id: str, create: Optional[request_table.ContextCreateRequest]
    ) -> Tuple[Dict[str, Any], List[Any]]:
        """Destroy context ``context_id`` if it exists, then make it anew as ``create`` says (None: do not)."""
        if create is not None:
            cwd = create["cwd"]
            try:
                os.makedirs(cwd, exist_ok=True)
            except OSError as exc:
                return self._state_error("cannot create the directory %s: %s" % (cwd, _reason(exc)))
        existing = self.contexts.get(context_id)
        if existing is None:
            empty = self.empty_delta()
            reply, parts = {"type": request_table.STATE_REPLY, "status": protocol.STATUS_OK, "checkpoint": empty}, []
        else:
            self._activate(existing)
            _fresh_namespace(self.namespace)
            existing.deferred.clear()
            reply, parts = self.state_reply()  # its names, deleted
            self._activate(self.default)
            del self.contexts[context_id]
        if create is not None:
            module = types.ModuleType("__main__")
            _fresh_namespace(module.__dict__)
            # One quota and one manifest bound for the session; this context's keys are ``<id>/<name>``.
            tracker = checkpoint.Tracker(
                self.quota, self.default.tracker.held, context_id + checkpoint_names.CONTEXT_SEPARATOR
            )
            tracker.excluded = self.excluded
            environ = dict(self.base_environ)
            environ.update(create["env"])
            self.contexts[context_id] = _Context(context_id, module, tracker, create["cwd"], environ, self._blobs)
        return reply, parts

    @staticmethod
    def _state_error(reason: str) -> Tuple[Dict[str, Any], List[Any]]:
        return {"type": request_table.STATE_REPLY, "status": protocol.STATUS_ERROR, "reason": reason}, []

    @staticmethod
    def _install_reply(reason: Optional[str]) -> Tuple[Dict[str, Any], List[Any]]:
        if reason is None:
            return {"type": request_table.INSTALL_REPLY, "status": protocol.STATUS_OK}, []
        return {"type": request_table.INSTALL_REPLY, "status": protocol.STATUS_ERROR, "reason": reason}, []

    def _hook(self, name: str) -> Any:
        """Call the scaffold's ``name`` with the namespace; a failure goes to the cell's stderr (and gives None)."""
        hook = self.scaffold.get(name)
        if hook is None:
            return None
        try:
            result = hook(self.namespace)
            if result is not None:
                # It goes into the reply's header, which must be strict JSON (docs/trust.md): fail here, with a message.
                reply = json.dumps({"scaffold": result}, allow_nan=False)  # as deep as the reply's header
                framing.decode_json(reply.encode("ascii"), "after_cell's result")
            return result
        except (Exception, capture.OutputLimitExceeded):  # it printed past the cell's output cap: a failure too
            with contextlib.suppress(capture.OutputLimitExceeded):
                sys.stderr.write("orchestrator scaffold: %s failed:\n%s" % (name, traceback.format_exc(limit=-8)))
            return None

    def _cell_done(self, request_id: Any) -> None:
        """The cell finished; the checkpoint (interrupted by SIGUSR2 from now on) follows.

        The controller's clock switches from the cell's to the checkpoint's when it hears
        ``cell_done``; that is sent only before the first value is pickled, so the common
        checkpoint that pickles nothing costs no extra frame.
        """
        self._enter(_CHECKPOINT)
        self.cell_done_for = request_id

    def _announce_checkpoint(self) -> None:
        request_id, self.cell_done_for = self.cell_done_for, _MISSING
        assert self.sock is not None
        # The controller may have closed the data channel: the checkpoint goes on all the same (a tracker cut short
        # would not match the generation it reports); its reply finds the channel closed too, and the worker goes idle.
        with contextlib.suppress(OSError):
            framing.send_frame(self.sock, {"type": protocol.CELL_DONE, "id": request_id})

    def load(self, request: request_table.LoadRequest) -> Tuple[Dict[str, Any], List[Any]]:
        """Unpickle the body (one blob) into the request's name."""
        body = self._take_body()
        name, expected = request["name"], request["digest"]
        if blob_format.is_host_blob(expected):  # the controller made it (no digest to check): its frame must be whole
            if not blob_format.host_blob_framed(body):
                return self._load_error("the host-made blob is not whole"), []
        elif request.get("verified") is not True and blob_format.blob_digest(body) != expected:
            return self._load_error("the blob does not match its digest"), []
        value = self.restored_frozen.get(expected, _MISSING)
        if value is _MISSING:  # not loaded yet in this restore (or mutable: each name gets its own copy)
            self._enter(_LOAD)
            try:
                try:
                    self.armed = True
                    value = checkpoint.loads(body)
                finally:
                    self.armed = False
            except BaseException as exc:  # even SystemExit or KeyboardInterrupt from a __reduce__: an error
                return self._load_error(_reason(exc)), []
            finally:
                self.phase = _IDLE
        self.namespace[name] = value
        self.tracker.record(name, value, expected, len(body))
        if checkpoint.deeply_immutable(value):
            self.restored_frozen[expected] = value
        return {"type": request_table.LOAD_REPLY, "status": protocol.STATUS_OK}, []

    def defer(self, request: request_table.DeferRequest) -> Tuple[Dict[str, Any], List[Any]]:
        """Bind a name to a stored blob loaded when a cell first uses it (lazy.py)."""
        self.active.deferred.defer(request["name"], request["digest"], request["size"])
        return {"type": request_table.LOAD_REPLY, "status": protocol.STATUS_OK}, []

    def _fetch_blob(self, key: str, digest: str) -> Any:
        """A deferred value's blob, from the controller (a host call it answers from the store)."""
        if self.calls is None:
            raise hostcall.HostCallError("this worker has no link for host calls")
        return self.calls.call_raw(protocol.BLOB_CALL, blob_format.blob_call(key, digest))

    def _deferred_values(self) -> Dict[str, int]:
        """The active context's deferred names, with their stored sizes (for the scaffold's hooks); a name the cell
        bound again is its own value now."""
        pending = self.active.deferred.pending
        return dict((name, size) for name, (_, size) in pending.items() if name not in self.namespace)

    def _load_deferred(self, name: str) -> Any:
        """Load a deferred name of the active context now and return it (for the scaffold's hooks; lazy.py's errors)."""
        return self.active.deferred.load(name)

    def _all_deferred(self) -> List[lazy.Deferred]:
        return [context.deferred for context in (self.default, *self.contexts.values())]

    def _check_blob(self, key: str, digest: str) -> None:
        """Whether the blob the controller handed out matched its digest (it checked while the blob was unpickled)."""
        assert self.calls is not None  # a blob was fetched
        if self.calls.call(protocol.BLOB_CHECK_CALL, blob_format.blob_call(key, digest)) is not True:
            raise hostcall.HostCallError("the controller did not confirm the blob")

    @staticmethod
    def _load_error(reason: str) -> Dict[str, Any]:
        return {"type": request_table.LOAD_REPLY, "status": protocol.STATUS_ERROR, "reason": reason}

    def restore_end(self, request: request_table.RestoreEndRequest) -> Tuple[Dict[str, Any], List[Any]]:
        """The restore is complete: the worker holds the request's checkpoint generation now, and the workspace its
        files (their modes and mtimes set; what the store holds is the baseline of the next delta)."""
        if self.workspace is not None:
            try:
                self._restoring_workspace().finish_restore()
            except (protocol.BadRequest, OSError) as exc:
                return self._restore_error("the workspace's restore cannot finish: %s" % _reason(exc)), []
        generation = request["generation"]
        self.tracker.generation = generation
        self.restored_frozen = {}
        return {"type": request_table.RESTORE_REPLY, "status": protocol.STATUS_OK, "generation": generation}, []

    def set_value(self, request: request_table.SetValueRequest) -> Tuple[Dict[str, Any], List[Any]]:
        """Bind a value the controller made (the body) to a name and its aliases; reply with the checkpoint delta.

        With ``blob`` (a host-made blob id) and ``blob_size``, the controller stores the value's
        blob itself: the names are adopted as saved in it, nothing is pickled or sent back.
        """
        body: Any = self._take_body()
        kind, blob_id, blob_size = request["kind"], request.get("blob"), request.get("blob_size")
        names = [request["name"], *request.get("aliases", [])]
        mapped = None
        try:
            if request.get("file") is not None:  # the value's blob is a file of the host's, mapped, not a body
                fd, self._value_fd = self._value_fd, None
                if fd is None:
                    raise ValueError("the value file %s did not arrive" % request["file"])
                try:
                    mapped = _map_value_file(fd, blob_size)
                finally:
                    os.close(fd)
                body = memoryview(mapped)[blob_format.HOST_BLOB_OVERHEAD - 1 : -1]
            if kind == "str":
                value: Any = str(body, "utf-8", "surrogatepass")  # as the controller encoded it
            elif kind == "bytes":
                value = bytes(body)
            elif kind == "json":
                value = json.loads(body.decode("utf-8"))
            else:
                raise ValueError("unknown kind %r" % (kind,))
        except (OSError, ValueError, RecursionError, MemoryError) as exc:
            return self._state_error(_reason(exc))
        finally:
            if mapped is not None:
                body = bytearray()  # drop the view before the mapping goes
                mapped.close()
        del body
        for name in names:
            self.namespace[name] = value
        if blob_id is not None:
            self.tracker.adopt(names, value, blob_id, blob_size)
        del value
        return self.state_reply()

    def file_write(self, request: request_table.FileWriteRequest) -> Tuple[Dict[str, Any], List[Any]]:
        """Write the body as a file of the workspace (workspace_files.write), then checkpoint (the request's context:
        the workspace is the session's)."""
        body = self._take_body()
        workspace = self.workspace
        if workspace is None:
            return self._state_error("this sandbox has no workspace directory")
        if len(body) > workspace.max_file_bytes:
            reason = "the file is %d bytes; the workspace saves at most %d bytes of one file"
            return self._state_error(reason % (len(body), workspace.max_file_bytes))
        try:
            workspace_files.write(workspace.root, request["path"], body, request["mode"])
        except workspace_files.FileRequestError as exc:
            return self._state_error(str(exc))
        del body
        return self.state_reply()

    def file_remove(self, request: request_table.FileRemoveRequest) -> Tuple[Dict[str, Any], List[Any]]:
        """Remove a path of the workspace (workspace_files.remove), then checkpoint."""
        if self.workspace is None:
            return self._state_error("this sandbox has no workspace directory")
        try:
            workspace_files.remove(self.workspace.root, request["path"], request["recursive"])
        except workspace_files.FileRequestError as exc:
            return self._state_error(str(exc))
        return self.state_reply()


def _make_worker_the_oom_victim() -> None:
    # If the sandbox runs out of memory the kernel should kill the worker, not the supervisor.
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("1000")
    except OSError:
        pass


def open_workspace(root: str, max_bytes: int, max_entries: int) -> Optional[Workspace]:
    """The workspace at ``root``, watched; None when there is no such directory (an image from before workspaces).

    One file is saved up to ``max_bytes``, the frame's largest body and a quarter of the sandbox's memory limit,
    whichever is least: a checkpoint reads a changed file whole, and a bigger one would have the worker OOM-killed at
    every checkpoint (docs/files.md)."""
    if not os.path.isdir(root):
        return None
    limits = [max_bytes, framing.MAX_BODY_BYTES]
    memory = cgroup.memory_limit()
    if memory is not None:
        limits.append(memory // 4)
    workspace = Workspace(root, max_entries, max_bytes, min(limits))
    workspace.start()
    return workspace


def main() -> None:
    """Entry point: ``argv[1]`` the link's fd, ``argv[2]`` the output limit per stream, ``argv[3]`` the quota,
    ``argv[4]`` the host-call size limit, ``argv[5:8]`` the workspace's directory, bytes and entries."""
    _make_worker_the_oom_victim()
    link = socket.socket(fileno=int(sys.argv[1]))
    try:
        workspace = open_workspace(sys.argv[5], int(sys.argv[6]), int(sys.argv[7]))
        Worker(link, int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), workspace).serve()
    except (framing.ProtocolViolation, framing.ChannelClosed, OSError) as exc:
        print("orchestrator worker: %s" % exc, file=sys.stderr)
        sys.exit(3)
