"""One submission in one fresh sandbox: place its files, run its code (with its stdin), then its tests.

Each part is one ``exec`` request with no checkpoint (nothing of a submission is kept), a hard
cap on what it may print (past it the cell is stopped: ``output_limit``) and its output
streamed to the host as it comes, so a cell killed at its timeout still leaves its partial
output. Whatever the sandbox does (dies, hangs, forges frames) ends as a ``CellRun`` with
its outcome; only a sandbox that could not be started is an infrastructure error.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..agent import protocol
from ..config import Settings
from ..errors import AgentTimeoutError, ChannelLost, ProtocolError, TransportError
from ..events import LiveCall
from ..messages import parse_exec_reply, worker_failure
from ..output import StreamRecorder
from ..results import ExecError
from ..sandbox import Sandbox
from ..wakeup import Wakeup
from .grading import CellRun, Verdict, grade
from .submissions import Submission, files_payload

_MIN_TESTS_SECONDS = 1.0
_PLACE_FILES = """\
def __orchestrator_place_files():
    import json, os, sys
    for path, text in json.loads(sys.stdin.read()).items():
        folder = os.path.dirname(path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
__orchestrator_place_files()
del __orchestrator_place_files
"""


class HeadRecorder(StreamRecorder):
    """A stream of a graded cell: its first ``limit`` bytes in memory, the rest only counted (never a file).

    A well-behaved sandbox sends at most the output cap; one that forges output frames past it
    costs the host nothing but the count.
    """

    def write(self, data: bytes | bytearray) -> None:
        room = self.limit - len(self._head)
        if room > 0:
            self._head += data[:room]
        self.received += len(data)


class SubmissionRunner:
    """Runs submissions in sandboxes it is given, under ``settings`` and an output cap (bytes, both streams)."""

    def __init__(self, settings: Settings, *, output_limit: int) -> None:
        self._settings = settings
        self._output_limit = output_limit

    def run(self, sandbox: Sandbox, submission: Submission, timeout: float) -> tuple[Verdict, CellRun, CellRun | None]:
        """The verdict and the cells that led to it; ``timeout`` covers the code and its tests together."""
        if submission.files:
            placed = self.run_cell(sandbox, _PLACE_FILES, timeout, stdin=files_payload(submission.files))
            if placed.ended != "ok":
                failed = CellRun("error" if placed.error else placed.ended, error=placed.error, reason=placed.reason)
                verdict = grade(failed, None, None)
                return Verdict(verdict.status, f"placing its files failed: {verdict.message}", "setup"), failed, None
        code = self.run_cell(sandbox, submission.code, timeout, stdin=submission.stdin or "")
        tests = None
        if code.ended == "ok" and submission.tests is not None:
            left = max(timeout - code.duration, min(_MIN_TESTS_SECONDS, timeout))
            tests = self.run_cell(sandbox, submission.tests, left)
        return grade(code, tests, submission.expected_stdout), code, tests

    def run_cell(self, sandbox: Sandbox, code: str, seconds: float, *, stdin: str = "") -> CellRun:
        """One cell, whatever it does; never raises for what the sandbox did. Its ``input()`` reads ``stdin``."""
        header: dict[str, Any] = {
            "type": protocol.EXEC,
            "code": code,
            "timeout": seconds,
            "checkpoint": False,
            "stream": True,
            "send_limit": self._output_limit,
            "output_cap": self._output_limit,
            "stdin": stdin,
        }
        wakeup = Wakeup()
        live = LiveCall(self._recorder, None, self._settings.input_timeout, owner=self, wakeup=wakeup)
        started = time.monotonic()
        try:
            slack = self._settings.interrupt_grace + self._settings.reply_margin
            reply, _ = sandbox.request(header, seconds=seconds + slack, live=live)
            return self._cell_run(reply, live, started)
        except ChannelLost as exc:
            death = sandbox.settled_state()
            if death is not None and death.oom_killed:
                return self._partial(live, "oom", f"ran out of memory: {death.describe()}", started)
            how = death.describe() if death is not None else "its container is gone"
            return self._partial(live, "crashed", f"ended with its sandbox: {how} ({exc})", started)
        except AgentTimeoutError:
            return self._partial(live, "timeout", f"ran past its {seconds:g} s timeout and its sandbox hung", started)
        except ProtocolError as exc:
            return self._partial(live, "crashed", f"broke the sandbox's protocol: {exc}", started)
        except TransportError as exc:
            return self._partial(live, "crashed", f"lost its sandbox: {exc}", started)
        finally:
            live.finish_output()
            live.close()
            wakeup.close()

    def _recorder(self, stream: str) -> StreamRecorder:
        return HeadRecorder(Path(), stream, self._output_limit)

    def _cell_run(self, reply: dict[str, Any], live: LiveCall, started: float) -> CellRun:
        failure = worker_failure(reply)
        if failure is not None:
            if failure["status"] == protocol.STATUS_TIMEOUT:
                ended, reason = "timeout", "ran past its timeout and ignored the interrupt (it was killed)"
            elif failure["oom"]:
                ended, reason = "oom", "ran out of its memory limit (the kernel's out-of-memory killer stopped it)"
            elif failure["status"] == protocol.STATUS_CRASHED:
                ended, reason = "crashed", f"ended its interpreter: {failure['reason']}"
            else:
                ended, reason = "crashed", f"broke the sandbox's protocol: {failure['reason']}"
            return self._partial(live, ended, reason, started)
        parsed = parse_exec_reply(reply)
        error = None if parsed["error"] is None else ExecError.from_reply(parsed["error"])
        if parsed["output_limited"]:
            ended, reason = "output_limit", f"printed more than {self._output_limit} bytes and was stopped"
        elif parsed["status"] == protocol.STATUS_TIMEOUT:
            ended, reason = "timeout", "ran past its timeout and was interrupted"
        else:
            ended, reason = ("error" if error is not None else "ok"), ""
        return CellRun(ended, parsed["stdout"], parsed["stderr"], error, parsed["duration"], reason)

    def _partial(self, live: LiveCall, ended: str, reason: str, started: float) -> CellRun:
        """A cell whose reply never came: the output it had streamed is what is left of it."""
        streams = {name: recorder.text() for name, recorder in live.recorders.items()}
        if ended == "timeout" and sum(r.received for r in live.recorders.values()) >= self._output_limit:
            ended, reason = "output_limit", f"printed more than {self._output_limit} bytes and ignored being stopped"
        duration = time.monotonic() - started
        return CellRun(ended, streams.get("stdout", ""), streams.get("stderr", ""), None, duration, reason)
