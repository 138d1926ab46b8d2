"""One submission in one fresh sandbox: its files, then its code and its tests, graded by a harness it cannot reach.

The sandbox's worker has run nothing when the submission arrives, and never runs a line of it:
each part is an ``exec`` request whose cell calls the agent's grading harness
(``orchestrator_agent.grading``), which runs the code in a child process and decides what each
phase did from what the kernel says (docs/eval.md, "How a verdict is made"). The harness cell's
value is a small JSON report; stdout and stderr are what the harness copied from the children,
under the worker's output cap, streamed to the host as they come (a cell killed at its timeout
still leaves its partial output). Every number that decides anything is the host's own: the
code's duration is this host's clock around its cell, and the tests' budget is the timeout less
that. Whatever the sandbox does (dies, hangs, forges frames or reports) ends as a ``CellRun``
with its outcome; only a sandbox that could not be started is an infrastructure error.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..agent import framing, protocol, request_table
from ..api.events import LiveCall
from ..api.results import ExecError
from ..config import Settings
from ..errors import AgentTimeoutError, ChannelLost, ProtocolError, TransportError
from ..runtime.output import StreamRecorder
from ..runtime.sandbox import Sandbox
from ..units import describe_bytes
from ..wire.replies import is_signal_name, parse_exec_reply, worker_failure
from ..wire.wakeup import Wakeup
from .grading import CellRun, Verdict, grade
from .submissions import Submission, files_payload

_MIN_TESTS_SECONDS = 1.0
_HARNESS_MARGIN = 1.0
"""Seconds the harness cell gets past the submission's own budget: the harness stops the submission at its budget
and still has time to report; the worker's kill ladder stands behind it."""
_STDIN_CELL_SECONDS = 30.0
_HARNESS = "import orchestrator_agent.grading as __grading\n__grading."
_ENDINGS = frozenset({"ok", "error", "timeout", "oom", "crashed", "output_limit"})
_MAX_REPORT_CHARS = 1 << 17
_MAX_REASON_CHARS = 1000
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

    def run(
        self, sandbox: Sandbox, submission: Submission, timeout: float, *, strict: bool = False
    ) -> tuple[Verdict, CellRun, CellRun | None]:
        """The verdict and the phases that led to it; ``timeout`` covers the code and its tests together.

        ``strict``: the tests run in an interpreter of their own that reaches the code's functions through
        plain data only (docs/eval.md, "Strict mode"); without tests there is nothing to be strict about.
        """
        setup = []
        if submission.files:
            setup.append((_PLACE_FILES, files_payload(submission.files), "placing its files", timeout))
        if submission.stdin is not None:
            setup.append((_HARNESS + "receive_stdin()", submission.stdin, "passing its stdin", _STDIN_CELL_SECONDS))
        for code, stdin, what, seconds in setup:
            run, _ = self._cell(sandbox, code, seconds, stdin)
            if run.ended != "ok":
                failed = CellRun("error" if run.error else run.ended, error=run.error, reason=run.reason)
                verdict = grade(failed, None, None)
                return Verdict(verdict.status, f"{what} failed: {verdict.message}", "setup"), failed, None
        has_tests = submission.tests is not None
        strict = strict and has_tests
        call = f"run_code({strict!r}, {float(timeout)!r}, {has_tests!r})"
        code_run = self._phase(sandbox, call, timeout, submission.code)
        tests_run = None
        if code_run.ended == "ok" and submission.tests is not None:
            left = max(timeout - code_run.duration, min(_MIN_TESTS_SECONDS, timeout))
            tests_run = self._phase(sandbox, f"run_tests({float(left)!r})", left, submission.tests)
        return grade(code_run, tests_run, submission.expected_stdout), code_run, tests_run

    def _phase(self, sandbox: Sandbox, call: str, seconds: float, stdin: str) -> CellRun:
        """One phase of the submission, as the grading harness reports it; the duration is this host's clock."""
        run, value = self._cell(sandbox, _HARNESS + call, seconds + _HARNESS_MARGIN, stdin)
        if run.ended != "ok":
            if run.ended == "error":  # the harness itself raised (a signal it did not expect): no verdict on the code
                summary = run.error.summary if run.error is not None else "no details"
                return CellRun("crashed", run.stdout, run.stderr, None, run.duration, f"broke its grading ({summary})")
            return run
        try:
            ended, reason, error, ended_by = harness_report(value)
        except ProtocolError as exc:
            return CellRun("crashed", run.stdout, run.stderr, None, run.duration, f"broke its grading: {exc}")
        return CellRun(ended, run.stdout, run.stderr, error, run.duration, reason, ended_by)

    def _cell(self, sandbox: Sandbox, code: str, seconds: float, stdin: str) -> tuple[CellRun, str | None]:
        """One cell, whatever it does, and its value (the repr of its last expression, as the worker sent it);
        never raises for what the sandbox did. Its ``input()`` reads ``stdin``."""
        options = request_table.ExecOptions(
            checkpoint=False, stream=True, send_limit=self._output_limit, output_cap=self._output_limit, stdin=stdin
        )
        header = request_table.exec_request(code, seconds, options)
        wakeup = Wakeup()
        live = LiveCall(self._recorder, None, self._settings.timeouts.input, owner=self, wakeup=wakeup)
        started = time.monotonic()
        try:
            slack = self._settings.timeouts.interrupt_grace + self._settings.timeouts.reply_margin
            reply, _ = sandbox.request(header, seconds=seconds + slack, live=live)
            return self._cell_run(reply, live, started)
        except ChannelLost as exc:
            death = sandbox.settled_state()
            if death is not None and death.oom_killed:
                return self._partial(live, "oom", f"ran out of memory: {death.describe()}", started), None
            how = death.describe() if death is not None else "its container is gone"
            return self._partial(live, "crashed", f"ended with its sandbox: {how} ({exc})", started), None
        except AgentTimeoutError:
            return self._partial(
                live, "timeout", f"ran past its {seconds:g} s timeout and its sandbox hung", started
            ), None
        except ProtocolError as exc:  # a reply whose fields do not parse
            return self._partial(live, "crashed", f"broke the sandbox's protocol: {exc}", started), None
        except TransportError as exc:
            return self._partial(live, "crashed", f"lost its sandbox: {exc}", started), None
        finally:
            live.finish_output()
            live.close()
            wakeup.close()

    def _recorder(self, stream: str) -> StreamRecorder:
        return HeadRecorder(Path(), stream, self._output_limit)

    def _cell_run(self, reply: dict[str, Any], live: LiveCall, started: float) -> tuple[CellRun, str | None]:
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
            # the signal that ended the worker, as its supervisor (another uid than the cell's) saw from waitpid
            ended_by = failure["signal"] if ended in ("crashed", "oom") else None
            return self._partial(live, ended, reason, started, ended_by), None
        parsed = parse_exec_reply(reply)
        error = None if parsed["error"] is None else ExecError.from_reply(parsed["error"])
        if parsed["output_limited"]:
            ended, reason = "output_limit", f"printed more than {describe_bytes(self._output_limit)} and was stopped"
        elif parsed["status"] == protocol.STATUS_TIMEOUT:
            ended, reason = "timeout", "ran past its timeout and was interrupted"
        else:
            ended, reason = ("error" if error is not None else "ok"), ""
        took = time.monotonic() - started
        return CellRun(ended, parsed["stdout"], parsed["stderr"], error, took, reason), parsed["return_value"]

    def _partial(self, live: LiveCall, ended: str, reason: str, started: float, ended_by: str | None = None) -> CellRun:
        """A cell whose reply never came: the output it had streamed is what is left of it."""
        streams = {name: recorder.text() for name, recorder in live.recorders.items()}
        if ended == "timeout" and sum(r.received for r in live.recorders.values()) >= self._output_limit:
            ended, reason = (
                "output_limit",
                f"printed more than {describe_bytes(self._output_limit)} and ignored being stopped",
            )
        duration = time.monotonic() - started
        return CellRun(ended, streams.get("stdout", ""), streams.get("stderr", ""), None, duration, reason, ended_by)


def harness_report(value: str | None) -> tuple[str, str, ExecError | None, str | None]:
    """What the grading harness said about a phase: ``(ended, reason, error, signal)``, checked field by field.

    The harness runs where the submission never did, but its report still crossed from the sandbox: it is read
    as strict, bounded JSON (``framing.decode_json``) and every field is checked.

    Raises:
        ProtocolError: it is not a report.
    """
    if not isinstance(value, str) or len(value) > _MAX_REPORT_CHARS:
        raise ProtocolError("the grading harness sent no report")
    try:
        data = framing.decode_json(
            value.encode("utf-8", "surrogatepass"), "the grading harness's report", surrogates=True
        )
    except framing.ProtocolViolation as exc:
        raise ProtocolError(str(exc)) from None
    if not isinstance(data, dict):
        raise ProtocolError("the grading harness's report is not an object")
    ended, reason, raw_error = data.get("ended"), data.get("reason"), data.get("error")
    if ended not in _ENDINGS or not isinstance(reason, str):
        raise ProtocolError("the grading harness's report has no valid 'ended' and 'reason'")
    error = None if raw_error is None else _report_error(raw_error)
    if (ended == "error") != (error is not None):
        raise ProtocolError("the grading harness's report has an error exactly when it did not end in one")
    ended_by = data.get("signal")
    if ended_by is not None and (ended not in ("crashed", "oom") or not is_signal_name(ended_by)):
        raise ProtocolError("the grading harness's report names a signal that is not one, or for an ending without")
    return str(ended), reason[:_MAX_REASON_CHARS], error, ended_by


def _report_error(raw: Any) -> ExecError:
    if not isinstance(raw, dict):
        raise ProtocolError("the grading harness's report has an 'error' that is not an object")
    fields = dict(raw)
    for key in ("line", "column", "end_column"):  # out of range: unknown, as the harness clears a child's
        value = raw.get(key)
        fields[key] = value if type(value) is int and 0 < value < 10**9 else None
    error = ExecError.from_reply(fields)  # the texts: typed here
    if not error.type or len(error.type) > 200:
        raise ProtocolError("the grading harness's report names no exception type")
    return error
