"""Grading one submission from a clean worker: its code runs in a child process, never where a verdict is made.

Standard library only (runs in the sandbox). ``orchestrator eval`` sends a fresh sandbox's
worker, which has run nothing of the submission, a few cells that call this module
(docs/eval.md, "How a verdict is made"):

- ``receive_stdin()``: the submission's stdin (the cell's stdin), kept for the code.
- ``run_code(strict, seconds, tests)``: the code (the cell's stdin) runs in S, a child forked from
  this clean interpreter with every file descriptor closed but its own: its stdin, two pipes for
  its stdout and stderr (copied here into the cell's own, so the worker's output cap and streaming
  apply) and a socket for its reports. Its value is a ``Report``.
- ``run_tests(seconds)``: the tests (the cell's stdin). Default mode: S runs them after its code,
  in the same namespace. Strict mode: T runs them, a child forked from this clean interpreter
  *before* S and before the tests reached it; T never runs a line of the submission and reaches
  its functions only through stubs that pass plain data (``boundary``); T's own runner decides.

What a phase did is decided here from what the kernel says (S's or T's exit status or signal
from ``waitpid``, the cgroup's OOM-kill counter, the clock) and from the child's report on its
socket (bounded, validated; in default mode S's report is S's word, in strict mode the tests'
outcome is T's). Before any child exists this process makes itself non-dumpable, so a child of
the same uid can neither ptrace it nor read or write its memory; the children stay in the
worker's process group, so the supervisor's kill ladder ends them too.
"""

from __future__ import annotations

import builtins
import contextlib
import gc
import io
import json
import os
import re
import select
import signal
import socket
import sys
import time
import types
import warnings
from typing import Any, Callable, Dict, List, NoReturn, Optional, Tuple

from . import boundary, capture, cells, confinement, framing
from .cgroup import oom_kill_count  # the counter the supervisor reads for the worker

_RECORD_BYTES = 256 << 10
_CHUNK = 64 << 10
_CHUNKS_AT_ONCE = 16  # then the clock is looked at again: a flood of output cannot hold the harness past a deadline
_TICK = 0.02  # how often a child's death is looked for when the kernel has no pidfd
_REPORT_CHARS = 60000  # the report must fit the cell's return value (64 Ki characters)
_MAX_NAMES = 10000
_DATA_GLOBALS_BYTES = 16 << 20  # the code's plain-data globals the tests get, encoded; past it, the rest are not given
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,199}\Z")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}(\.[A-Za-z_][A-Za-z0-9_]{0,99}){0,9}\Z")
_CRASH_EXIT = 70
# Bound now, in the clean worker: code that patches ``cells.run_cell`` in S (as it could patch the worker's own
# cell runner) does not change how S runs the tests. Patching this module's names in S is not stopped (docs/eval.md).
_run_cell = cells.run_cell
_error_info = cells.error_info


class Report(object):
    """The value of a grading cell: its repr is the JSON the controller reads (``ended``, ``reason``, ``error``,
    ``signal``: the name of the signal that ended the child, when one did and the harness did not send it)."""

    def __init__(
        self, ended: str, reason: str = "", error: Optional[Dict[str, Any]] = None, signal: Optional[str] = None
    ) -> None:
        self.data = {"ended": ended, "reason": reason, "error": error, "signal": signal}

    def __repr__(self) -> str:
        error = self.data["error"]
        for keep in (16384, 4096, 512, 0):
            if error is not None:
                error = dict(error, traceback=error["traceback"][-keep:] if keep else "")
                error["evalue"] = error["evalue"][: max(keep, 200)]
                error["snippet"] = error["snippet"][: max(keep, 200)]
            text = json.dumps(dict(self.data, error=error), ensure_ascii=False, allow_nan=False)
            if len(text) <= _REPORT_CHARS:
                return text
        return json.dumps(dict(self.data, error=None), ensure_ascii=False)[:_REPORT_CHARS]


# -- the harness's own protection


def _make_undumpable() -> None:
    """No ptrace, no /proc/<pid>/mem, no process_vm_writev from a process of the same uid (a child included)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(confinement.PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


# -- children


def _memfd(text: str) -> int:
    fd = os.memfd_create("grading", 0)
    data = text.encode("utf-8", "surrogatepass")
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _read_fd(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode("utf-8", "surrogatepass")


def _only_fds(keep: List[int]) -> None:
    """In a new child: ``keep[i]`` becomes fd ``i``; every other descriptor is closed."""
    import fcntl

    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 256) for fd in keep]
    for target, fd in enumerate(high):
        os.dup2(fd, target)
    try:
        open_fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        open_fds = list(range(len(keep), 1 << 16))
    for fd in open_fds:
        if fd >= len(keep):
            with contextlib.suppress(OSError):
                os.close(fd)


def _fork(keep: List[int], body: Callable[[], None]) -> int:
    """A child running ``body`` with only ``keep`` open (as fds 0, 1, ...); the child never returns from here.

    The worker's objects are frozen out of the garbage collector first: a collection in the child would
    otherwise write to every one of them, copying most of the worker's memory page by page.
    """
    gc.freeze()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "this process is multi-threaded": the child touches no lock of another
        pid = os.fork()
    if pid == 0:
        _child(keep, body)
    return pid


def _child(keep: List[int], body: Callable[[], None]) -> NoReturn:
    code, streams = _CRASH_EXIT, False
    try:
        _only_fds(keep)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for signum in (signal.SIGUSR2, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        _child_streams()
        streams = True
        body()
        code = 0
    except BaseException:  # a child never returns into the worker's code
        pass
    finally:
        for stream in (sys.stdout, sys.stderr) if streams else ():  # never the worker's (another thread's lock)
            with contextlib.suppress(BaseException):
                stream.flush()
        os._exit(code)


class _PipeWriter(io.RawIOBase):
    """A child's stdout or stderr: every byte goes to the pipe at once (a kill keeps what was printed)."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        size = len(view)
        while view:
            view = view[os.write(self._fd, view) :]
        return size


def _child_streams() -> None:
    sys.stdin = sys.__stdin__ = io.open(0, "r", encoding="utf-8", newline="\n", closefd=False)  # noqa: SIM115
    out = [
        io.TextIOWrapper(_PipeWriter(fd), encoding="utf-8", errors="backslashreplace", write_through=True)
        for fd in (1, 2)
    ]
    sys.stdout = sys.__stdout__ = out[0]
    sys.stderr = sys.__stderr__ = out[1]


def _fresh_main() -> Dict[str, Any]:
    module = types.ModuleType("__main__")
    module.__dict__.update({"__builtins__": builtins, "__doc__": None})
    sys.modules["__main__"] = module
    return module.__dict__


def _send_record(sock: socket.socket, phase: str, outcome: Dict[str, Any]) -> None:
    error = outcome.get("error")
    if error is not None:
        error = dict(error, traceback=error["traceback"][-16384:])  # the record fits one socket buffer
    sock.send(json.dumps({"phase": phase, "error": error}, ensure_ascii=False).encode("utf-8", "replace"))


def _receive_text(sock: socket.socket) -> Optional[str]:
    """The text a command carries in a memfd (None: the other side said to stop, or closed)."""
    message, fds, _, _ = socket.recv_fds(sock, 64, 1)
    if message != b"text" or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        return None
    return _read_fd(fds[0])


def _subject(code: str, strict: bool, real_input: Any) -> Callable[[], None]:
    """S: run the code; then (default) the tests it is sent, or (strict) answer T's calls."""

    def body() -> None:
        builtins.input = real_input
        # S is the submission's own interpreter, as `python solution.py` in its workspace: the modules it placed
        # there import. (A worker never has its working directory on its path; T never gets it either.)
        sys.path.insert(0, os.getcwd())
        report = socket.socket(fileno=3)
        namespace = _fresh_main()
        _send_record(report, "code", _run_cell(code, namespace, 1))
        if strict:
            _serve(socket.socket(fileno=4), namespace)
        else:
            tests = _receive_text(report)
            if tests is not None:
                _send_record(report, "tests", _run_cell(tests, namespace, 2))

    return body


def _exposed(namespace: Dict[str, Any]) -> Tuple[List[str], Dict[str, str], Dict[str, Any]]:
    """What the tests may see of the code's namespace: callables (as stubs), modules (by name) and plain data."""
    callables: List[str] = []
    modules: Dict[str, str] = {}
    data: Dict[str, Any] = {}
    room = _DATA_GLOBALS_BYTES
    for name, value in list(namespace.items())[:_MAX_NAMES]:
        if type(name) is not str or name.startswith("__"):
            continue
        if isinstance(value, types.ModuleType):
            modules[name] = str(getattr(value, "__name__", ""))
        elif callable(value):
            callables.append(name)
        else:
            try:
                room -= len(boundary.encode(value))
            except boundary.NotData:
                continue
            if room >= 0:
                data[name] = value
    return callables, modules, data


def _serve(link: socket.socket, namespace: Dict[str, Any]) -> None:
    """S in strict mode: answer each request of T's stubs with data, until T closes the link."""
    while True:
        try:
            request = boundary.decode(boundary.receive(link))
        except EOFError:
            return
        response: Any
        if request == ("names",):
            response = ("ok", _exposed(namespace))
        elif type(request) is tuple and len(request) == 4 and request[0] == "call":
            response = _call(namespace, request[1], request[2], request[3])
        else:
            response = ("refused", "not a request")
        try:
            payload = boundary.encode(response)
        except boundary.NotData as exc:
            payload = boundary.encode(("refused", "returned a value that cannot cross: %s" % exc))
        boundary.send(link, payload)


def _call(namespace: Dict[str, Any], name: Any, args: Any, kwargs: Any) -> Any:
    function = namespace.get(name) if type(name) is str else None
    if not callable(function) or type(args) is not tuple or type(kwargs) is not dict:
        return ("raise", "NameError", "name %r is not defined by the submission" % (name,))
    if not all(type(key) is str for key in kwargs):
        return ("raise", "TypeError", "keywords must be strings")
    try:
        return ("ok", function(*args, **kwargs))
    except BaseException as exc:  # even SystemExit: it goes back to the tests as data
        base = boundary.builtin_base(exc)
        message = cells._text(exc)[:8192]
        if base != type(exc).__name__:
            message = "%s: %s" % (type(exc).__name__, message)
        return ("raise", base, message)


def _safe_import_path() -> None:
    """T imports only from directories it cannot be made to import a planted file from: no working directory, no
    path the sandbox's user may write, nor one it could make in a directory it may write (the submission writes
    files before the tests run). The supervisor's rule (``confinement.safe_path``) for T's uid; a root T (no worker
    uid of its own: not our sandboxes) can write everything, so there only what is not writable now is kept."""
    uid = os.getuid()
    if uid:
        sys.path[:] = confinement.safe_path(sys.path, uid, lambda _: None)
    else:
        sys.path[:] = [entry for entry in sys.path if os.path.isabs(entry) and not os.access(entry, os.W_OK)]
    sys.path_importer_cache.clear()


class _Link(object):
    """T's end of the link to S: one request, one reply."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def ask(self, request: Any) -> Any:
        try:
            payload = boundary.encode(request)
        except boundary.NotData as exc:
            raise TypeError("only plain data crosses to the submission in strict grading: %s" % exc) from None
        try:
            boundary.send(self.sock, payload)
            reply = boundary.decode(boundary.receive(self.sock))
        except (OSError, EOFError):
            raise AssertionError("the submission's interpreter ended during a call") from None
        except boundary.NotData as exc:
            raise AssertionError("the submission answered with something that is not plain data (%s)" % exc) from None
        if type(reply) is tuple and len(reply) == 2 and reply[0] == "ok":
            return reply[1]
        if type(reply) is tuple and len(reply) == 3 and reply[0] == "raise":
            raise boundary.builtin_exception(reply[1], reply[2], AssertionError)
        if type(reply) is tuple and len(reply) == 2 and reply[0] == "refused" and type(reply[1]) is str:
            raise AssertionError("the submission %s (only plain data crosses to the tests)" % reply[1][:500])
        raise AssertionError("the submission answered with something that is not a reply")


class _Stub(object):
    """A function of the submission as the tests see it in strict grading: a call sends data to S and back."""

    def __init__(self, name: str, link: _Link) -> None:
        self.__name__ = self.__qualname__ = name
        self._link = link

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._link.ask(("call", self.__name__, args, kwargs))

    def __repr__(self) -> str:
        return "<function %s (the submission's, called through strict grading)>" % self.__name__


def _given(name: Any) -> bool:
    """Whether the tests get a name of the code's: an identifier that is not a builtin's (a top-level ``abs`` of the
    code's must not replace the tests' own: that would be a monkeypatched test helper)."""
    return type(name) is str and bool(_NAME.match(name)) and not hasattr(builtins, name)


def _namespace_of(link: _Link) -> Dict[str, Any]:
    """T's namespace: a stub per callable of the submission, its plain-data globals, its modules imported anew."""
    namespace = _fresh_main()
    exposed = link.ask(("names",))
    if type(exposed) is not tuple or len(exposed) != 3:
        raise AssertionError("the submission did not say what it defined")
    callables, modules, data = exposed
    if type(callables) is list:
        for name in callables[:_MAX_NAMES]:
            if _given(name):
                namespace[name] = _Stub(name, link)
    if type(data) is dict:
        for name, value in list(data.items())[:_MAX_NAMES]:
            if _given(name):
                namespace[name] = value
    if type(modules) is dict:
        import importlib

        for name, module in list(modules.items())[:200]:
            if _given(name) and type(module) is str and _MODULE.match(module):
                with contextlib.suppress(Exception):
                    namespace[name] = importlib.import_module(module)
    return namespace


def _examiner() -> None:
    """T: wait for the tests, then run them against stubs of the submission; report their outcome."""
    _safe_import_path()
    control = socket.socket(fileno=3)
    tests = _receive_text(control)
    if tests is None:
        return
    link = _Link(socket.socket(fileno=4))
    try:
        namespace = _namespace_of(link)
    except AssertionError as exc:
        _send_record(control, "tests", {"error": _error_info(exc)})
        return
    _send_record(control, "tests", _run_cell(tests, namespace, 2))


# -- the harness


def _parse_record(raw: bytes, phase: str) -> Optional[Dict[str, Any]]:
    """A child's record (``{"phase", "error"}``) made safe, or None when it is not one."""
    try:
        record = framing.decode_json(raw, "a child's record")
    except framing.ProtocolViolation:
        return None
    if type(record) is not dict or record.get("phase") != phase:
        return None
    error = record.get("error")
    if error is None:
        return {"error": None}
    if type(error) is not dict:
        return None
    clean: Dict[str, Any] = {}
    for key, limit in (("ename", 200), ("evalue", 8192), ("snippet", 8192), ("traceback", 32768)):
        value = error.get(key)
        if type(value) is not str:
            return None
        clean[key] = value[:limit]
    for key in ("line", "column", "end_column"):
        value = error.get(key)
        clean[key] = value if type(value) is int and 0 < value < 10**9 else None
    if not clean["ename"]:
        return None
    return {"error": clean}


def _readable(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


def _signal_name(status: int) -> Optional[str]:
    """The signal that ended a child (``SIGSEGV``), from its wait status; None when it exited."""
    if not os.WIFSIGNALED(status):
        return None
    number = os.WTERMSIG(status)
    try:
        return signal.Signals(number).name
    except ValueError:
        return "SIG%d" % number


def _describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            return "was killed by %s" % signal.Signals(number).name
        except ValueError:
            return "was killed by signal %d" % number
    return "exited with status %d" % os.WEXITSTATUS(status)


class _Child(object):
    """A child of the harness: its pid, a pidfd when the kernel has them, its output pipes and its socket."""

    def __init__(self, role: str, pid: int, outputs: Dict[int, int], sock: socket.socket) -> None:
        self.role = role  # "code" (S) or "tests" (T)
        self.pid = pid
        self.outputs = outputs  # read end -> 1 (stdout) or 2 (stderr)
        self.sock = sock
        self.status: Optional[int] = None
        self.listening = True  # its socket is open (a child may close its end and go on)
        self.pidfd: Optional[int] = None
        with contextlib.suppress(AttributeError, OSError):
            self.pidfd = os.pidfd_open(pid)
        for fd in outputs:
            os.set_blocking(fd, False)

    def reap(self, block: bool = False) -> bool:
        """Whether it has ended (its status is then kept)."""
        if self.status is None:
            try:
                pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
            except ChildProcessError:
                pid, status = self.pid, 0x7F00  # reaped already: "exited with status 127"
            if pid:
                self.status = status
        return self.status is not None

    def kill(self) -> None:
        if self.status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self.reap(block=True)
        for fd in list(self.outputs):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.outputs.clear()
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = None


class _Stop(Exception):
    """Why watching stopped early: the deadline, or the output cap."""

    def __init__(self, ended: str) -> None:
        super().__init__(ended)
        self.ended = ended


class Grading(object):
    """The children of one submission and what they said; lives from ``run_code`` to the end of ``run_tests``."""

    def __init__(self, code: str, strict: bool, stdin: str) -> None:
        _make_undumpable()
        self.children: List[_Child] = []
        self.examiner: Optional[_Child] = None
        link_s = None
        stdin_fd = _memfd(stdin)
        try:
            if strict:  # T first: it exists, non-dumpable, before anything of the submission runs
                link_t, link_s = socket.socketpair()
                try:
                    self.examiner = self._start("tests", [link_t.fileno()], _examiner)
                finally:
                    link_t.close()
            extra = [link_s.fileno()] if link_s is not None else []
            self.subject = self._start("code", extra, _subject(code, strict, builtins.input), stdin_fd)
        except BaseException:
            self.close()
            raise
        finally:
            os.close(stdin_fd)
            if link_s is not None:
                link_s.close()

    def _start(self, role: str, extra: List[int], body: Callable[[], None], stdin_fd: Optional[int] = None) -> _Child:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        stdin = _memfd("") if stdin_fd is None else stdin_fd
        try:
            pid = _fork([stdin, out_w, err_w, theirs.fileno(), *extra], body)
        finally:
            os.close(out_w)
            os.close(err_w)
            if stdin_fd is None:
                os.close(stdin)
            theirs.close()
        child = _Child(role, pid, {out_r: 1, err_r: 2}, ours)
        self.children.append(child)
        return child

    def close(self) -> None:
        for child in self.children:
            child.kill()

    # -- watching

    def _pump(self, child: _Child, fd: int, stream: int) -> None:
        """Copy what waits in one of ``child``'s pipes to the cell's stream; at the pipe's end, close it."""
        if not self._copy(fd, stream):
            del child.outputs[fd]
            os.close(fd)

    def _copy(self, fd: int, stream: int) -> bool:
        """Copy what waits in a child's pipe to the cell's stream; False at its end."""
        target = sys.stdout if stream == 1 else sys.stderr
        for _ in range(_CHUNKS_AT_ONCE):
            try:
                chunk = os.read(fd, _CHUNK)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not chunk:
                return False
            try:
                target.buffer.write(chunk)
            except capture.OutputLimitExceeded:
                raise _Stop("output_limit") from None
        return True

    def _drain_all(self) -> None:
        for each in self.children:
            for fd, stream in list(each.outputs.items()):
                self._pump(each, fd, stream)

    def watch(self, child: _Child, phase: str, deadline: float) -> Tuple[Optional[Dict[str, Any]], bool]:
        """Copy every child's output until ``child`` sends its ``phase`` record or ends.

        Returns the record (None when it sent none, or an invalid one) and whether what it sent was invalid.

        Raises:
            _Stop: the deadline passed ("timeout"), or the output passed the cell's cap ("output_limit").
        """
        while True:
            if child.reap():
                record = self._record(child, phase) if child.listening and _readable(child.sock) else None
                self._drain_all()
                return record, False
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Stop("timeout")
            poller = select.poll()
            watched: Dict[int, Tuple[str, _Child, int]] = {}
            for each in self.children:
                for fd, stream in each.outputs.items():
                    watched[fd] = ("output", each, stream)
                if each.pidfd is not None and each.status is None:
                    watched[each.pidfd] = ("ended", each, 0)
            if child.listening:
                watched[child.sock.fileno()] = ("record", child, 0)
            for fd in watched:
                poller.register(fd, select.POLLIN)
            wait = left if child.pidfd is not None else min(left, _TICK)
            for fd, _ in poller.poll(max(1, int(wait * 1000) + 1)):
                kind, owner, stream = watched[fd]
                if kind == "output" and fd in owner.outputs:
                    self._pump(owner, fd, stream)
                elif kind == "ended":
                    owner.reap()
                elif kind == "record":
                    record = self._record(child, phase)
                    if child.listening:  # a record, valid or not; else its end of the socket closed
                        self._drain_all()
                        return record, record is None

    def _record(self, child: _Child, phase: str) -> Optional[Dict[str, Any]]:
        try:
            raw, _, flags, _ = child.sock.recvmsg(_RECORD_BYTES)
        except OSError:
            raw, flags = b"", 0
        if not raw:
            child.listening = False
            return None
        if flags & socket.MSG_TRUNC:
            return None
        return _parse_record(raw, phase)

    def send_text(self, child: _Child, text: str) -> bool:
        fd = _memfd(text)
        try:
            socket.send_fds(child.sock, [b"text"], [fd])
            return True
        except OSError:
            return False
        finally:
            os.close(fd)

    def verdict(self, child: _Child, record: Optional[Dict[str, Any]], invalid: bool, oom_before: int) -> Report:
        who = "its interpreter" if child.role == "code" else "the tests' interpreter"
        if invalid:
            return Report("crashed", "broke the grading protocol (%s sent a record that is not one)" % who)
        if record is not None:
            error = record["error"]
            return Report("error" if error is not None else "ok", "", error)
        child.reap(block=True)
        assert child.status is not None
        ended_by = _signal_name(child.status)
        if oom_kill_count() > oom_before:
            reason = "ran out of its memory limit (the kernel's out-of-memory killer stopped it)"
            return Report("oom", reason, signal=ended_by)
        reason = "ended %s before it finished: it %s" % (who, _describe_status(child.status))
        return Report("crashed", reason, signal=ended_by)


_current: Optional[Grading] = None
_stdin = ""


def receive_stdin() -> None:
    """Keep this cell's stdin: the submission's stdin, for ``run_code``."""
    global _stdin
    _stdin = sys.stdin.read()


def run_code(strict: bool, seconds: float, tests: bool) -> Report:
    """Run the code (this cell's stdin) in S for at most ``seconds``; with ``tests``, keep S (and T) for them."""
    global _current
    code = sys.stdin.read()
    deadline = time.monotonic() + seconds
    grading: Optional[Grading] = None
    keep = False
    try:
        oom_before = oom_kill_count()  # before S exists: an OOM kill right after its fork counts
        grading = Grading(code, strict, _stdin)
        record, invalid = grading.watch(grading.subject, "code", deadline)
        report = grading.verdict(grading.subject, record, invalid, oom_before)
        keep = tests and report.data["ended"] == "ok"
        return report
    except _Stop as stop:
        return _stopped(stop.ended, seconds)
    except KeyboardInterrupt:
        return _interrupted(deadline, seconds)
    finally:
        if keep:
            _current = grading
        elif grading is not None:
            grading.close()


def run_tests(seconds: float) -> Report:
    """Run the tests (this cell's stdin) for at most ``seconds``: in S (default mode) or in T (strict mode)."""
    global _current
    tests = sys.stdin.read()
    deadline = time.monotonic() + seconds
    grading, _current = _current, None
    if grading is None:
        return Report("crashed", "had no code run to test (the grading harness was not started)")
    try:
        oom_before = oom_kill_count()
        child = grading.examiner if grading.examiner is not None else grading.subject
        if not grading.send_text(child, tests):
            return grading.verdict(child, None, False, oom_before)
        record, invalid = grading.watch(child, "tests", deadline)
        return grading.verdict(child, record, invalid, oom_before)
    except _Stop as stop:
        return _stopped(stop.ended, seconds)
    except KeyboardInterrupt:
        return _interrupted(deadline, seconds)
    finally:
        grading.close()


def _stopped(ended: str, seconds: float) -> Report:
    if ended == "timeout":
        return Report("timeout", "ran past its %g s timeout and was killed" % seconds)
    return Report("output_limit", "printed more than its output limit and was stopped")


def _interrupted(deadline: float, seconds: float) -> Report:
    if time.monotonic() >= deadline:
        return _stopped("timeout", seconds)
    return Report("crashed", "was interrupted before it finished (a signal reached the grading harness)")
