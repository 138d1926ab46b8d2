"""One cell's run: its exec request, the host calls and live output it serves, and its result with the checkpoint
committed (``Session.execute`` checks the arguments; this runs them)."""

from __future__ import annotations

import dataclasses
import time
from functools import partial
from typing import Any

from ..agent import protocol
from ..errors import ExecutionTimeout
from ..runtime.hostcalls import CallDesk, HostCalls
from ..runtime.output import StreamRecorder, keep_newest
from ..wire.replies import parse_exec_reply
from .contexts import local_names
from .events import LiveCall, OnOutput
from .results import ExecError, ExecResult, output_fields
from .transactions import Transactions


def run_cell(
    calls: Transactions,
    code: str,
    limit: float,
    host_calls: HostCalls | None,
    on_output: OnOutput | None,
    context: str | None,
) -> ExecResult:
    """Run ``code`` for at most ``limit`` seconds in ``context`` (None: the default one), on the caller's behalf."""
    settings, sandbox = calls.settings, calls.sandbox
    header = protocol.exec_request(
        code,
        limit,
        checkpoint_timeout=settings.timeouts.checkpoint,
        send_limit=settings.limits.max_output_file_bytes,
        stream=on_output is not None,
        input=on_output is not None,
    )
    slack = settings.timeouts.interrupt_grace + settings.timeouts.reply_margin
    with calls.turn():
        calls.in_context(header, context)
        desk = (
            None
            if host_calls is None
            else CallDesk(
                host_calls,
                sandbox.handler_pool(),
                max_held=settings.limits.max_host_calls_per_cell,
                owner=sandbox,
                metrics=sandbox.metrics,
            )
        )
        live = calls.live = LiveCall(
            partial(_recorder, calls), on_output, settings.timeouts.input, owner=sandbox, wakeup=sandbox.wakeup()
        )
        started = time.monotonic()
        try:
            return calls.recovery.call(
                header,
                b"",
                limit + slack,
                lambda r, b: _result(calls, r, b, live, limit, time.monotonic() - started, context),
                checkpoint_seconds=settings.timeouts.checkpoint + slack,
                desk=desk,
                live=live,
            )
        finally:
            calls.live = None
            live.close()
            if desk is not None:
                desk.close()


def _recorder(calls: Transactions, stream: str) -> StreamRecorder:
    """Where a stream of the running call goes when its output travels (made on its first frame)."""
    limits = calls.settings.limits
    return StreamRecorder(
        calls.ledger.store.outputs_dir(calls.session_id), stream, limits.max_output_bytes, limits.max_output_file_bytes
    )


def _output(calls: Transactions, parsed: protocol.ExecReply, live: LiveCall) -> dict[str, Any]:
    """What the result gets beside the reply: the bytes of streams that came as frames, previews of streams
    kept in files (and their paths), the callback's errors. Empty for a call that printed little text and had
    no callback (nothing to copy)."""
    live.finish_output()
    fields = output_fields(parsed, live.recorders)
    if live.callback_errors:
        fields["callback_errors"] = tuple(live.callback_errors)
    if any(recorder.spilled for recorder in live.recorders.values()):
        keep_newest(calls.ledger.store.outputs_dir(calls.session_id), calls.settings.limits.max_output_files)
    return fields


def _result(
    calls: Transactions,
    reply: dict[str, Any],
    body: bytearray,
    live: LiveCall,
    limit: float,
    elapsed: float,
    context: str | None,
) -> ExecResult:
    """The result of an exec reply, its checkpoint committed; ``elapsed`` is the call's time on the host's clock.

    The durations the agent reports are never more than ``elapsed``: whoever budgets with them (a
    grader's time for the tests) gets at most what the host measured, whatever the sandbox says.
    """
    ledger = calls.ledger
    parsed = parse_exec_reply(reply)
    if parsed["error"] is not None:
        ExecError.from_reply(parsed["error"])  # every field checked before anything is stored
    parsed["duration"] = min(parsed["duration"], elapsed)
    parsed["checkpoint_duration"] = min(parsed["checkpoint_duration"], elapsed)
    before = set(ledger.record.unsaved)  # the session's unsaved report up to this call
    reported = ledger.commit(parsed["checkpoint"], body, context=context)
    unsaved = local_names(reported)
    newly = local_names({k: why for k, why in reported.items() if k not in before and repr(k) not in before})
    failures = calls.sandbox.take_unreported()
    output = _output(calls, parsed, live)
    generation = ledger.record.generation
    if parsed["status"] == protocol.STATUS_TIMEOUT:
        why = "was stopped by the caller" if live.interrupt_requested else f"ran past its {limit:g} s timeout"
        raise ExecutionTimeout(
            f"the cell {why} and was interrupted; session {calls.session_id} keeps "
            f"what the cell did before the interrupt (generation {generation}"
            + (f"; not saved: {', '.join(sorted(unsaved))}" if unsaved else "")
            + ")",
            restored=False,
            generation=generation,
            restore_failures=failures,
            stdout=output.get("stdout", parsed["stdout"]),
            stderr=output.get("stderr", parsed["stderr"]),
        )
    result = ExecResult.from_reply(parsed, unsaved, generation, failures, newly)
    return dataclasses.replace(result, **output) if output else result
