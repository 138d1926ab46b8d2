"""One worker process: started as the sandbox's uid in its own process group, signalled, killed (with every other
process of its uid), and why it died.

The worker runs the cells (worker.py). Its link to the supervisor is a socket pair: the data channels the
controller makes come on it, the worker's hello and ``idle`` go back. Its death is reported with its exit status,
signal, and whether the cgroup's out-of-memory killer took it (cgroup.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

from . import confinement, framing
from .cgroup import oom_kill_count
from .config import Config
from .log import log

_PEEK_NOW = int(socket.MSG_PEEK | socket.MSG_DONTWAIT)  # an int: or-ing the enum members costs a microsecond a call
_WORKER_START_SECONDS = 60.0
_WORKER_START_ATTEMPTS = 3
# The worker's first Python code: no entry that is not an absolute path (the working directory, '') stays on its
# import path, before anything is imported from it. ``-s`` (no user site) runs before it.
_WORKER_BOOTSTRAP = (
    "import sys; sys.path[:] = [p for p in sys.path if p.startswith('/')]; from %s.worker import main; main()"
    % __package__
)


class WorkerProcess:
    """One worker process (leader of its own process group) and our end of its link."""

    def __init__(self, config: Config) -> None:
        ours, theirs = socket.socketpair()
        self.sock = ours
        self.oom_baseline = oom_kill_count()
        self.uid = config.worker_uid  # None: ours
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
                    str(config.host_call_max),
                    config.workspace_dir,
                    str(config.workspace_bytes),
                    str(config.workspace_files),
                ],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=sys.stderr,
                env=config.worker_environ,
                start_new_session=True,
                **confinement.worker_identity(config.worker_uid),
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.pid = self.proc.pid
        self.pidfd: Optional[int] = None
        with contextlib.suppress(AttributeError, OSError):  # Linux >= 5.3, Python >= 3.9
            self.pidfd = os.pidfd_open(self.pid)
        try:
            framing.limit_each_io(self.sock, _WORKER_START_SECONDS)
            hello, _ = framing.recv_frame(self.sock, max_body=0)
            framing.limit_each_io(self.sock, config.frame_timeout)
        except (OSError, framing.ChannelClosed, framing.ProtocolViolation) as exc:
            self.kill()
            raise RuntimeError("the worker did not start: %s" % exc) from None
        self.dill = str(hello.get("dill", ""))

    def fds(self) -> List[int]:
        return [self.sock.fileno()] + ([self.pidfd] if self.pidfd is not None else [])

    def interrupt(self, phase: str) -> None:
        """SIGINT stops a cell or a load; SIGUSR2 a checkpoint, so a late cell interrupt can never cut one short."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGUSR2 if phase == "checkpoint" else signal.SIGINT)

    def leave_data_channel(self) -> None:
        """SIGHUP sends a worker that waits on its data channel back to our link (it reports ``idle``)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGHUP)

    def pending(self) -> Optional[bytes]:
        """Without blocking: b'' when the socket is at EOF, some bytes when it has data, None when empty."""
        try:
            return self.sock.recv(1, _PEEK_NOW)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            return b""

    def _end_processes(self) -> None:
        """Kill the worker and whatever it started: its process group, then, wherever they went (another session or
        process group), every process of its uid (confinement.end_processes_of); not for a worker of our own uid,
        where that sweep would end us too."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        if self.uid is not None:
            confinement.end_processes_of(self.uid, log)

    def _close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = None

    def kill(self) -> None:
        self._end_processes()
        self.proc.wait()
        self._close()

    def death(self) -> Dict[str, Any]:
        """Reap the dead (or dying) worker, kill every process it left behind, and say why it died."""
        try:
            code: Optional[int] = self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:  # it only closed its socket: make it dead (below)
            code = None
        self._end_processes()
        if code is None:
            code = self.proc.wait()
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


def start_worker(config: Config) -> WorkerProcess:
    """Start a worker; if none will start (no memory, no pids left), the sandbox is beyond repair: exit."""
    for attempt in range(_WORKER_START_ATTEMPTS):
        try:
            return WorkerProcess(config)
        except (OSError, RuntimeError) as exc:
            log("starting the worker failed (attempt %d): %s" % (attempt + 1, exc))
            time.sleep(0.5)
    log("no worker would start; exiting so that the controller replaces the sandbox")
    sys.exit(1)
