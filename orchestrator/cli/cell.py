"""One cell run by ``exec`` or ``run``: its output streamed as it comes, Ctrl-C to stop it, ``input()`` read from stdin.

The cell runs on a thread of its own so that the main thread is free for Ctrl-C: the first one
asks the sandbox to stop the cell (``Session.interrupt``; the session keeps what the cell did
before, and what it printed is already on the terminal); a second one abandons the call (the
next command that attaches the session stops it).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from pathlib import Path
from typing import TextIO

from ..api.events import Event, InputRequest, OutputEvent
from ..api.results import ExecResult
from ..api.session import Session
from ..errors import ExecutionTimeout, InputRequestNotFound, OrchestratorError
from ..units import describe_bytes
from .output import Output
from .render import LiveOutput


def run_cell(
    session: Session, code: str, *, timeout: float | None, out: Output, stdin: TextIO | None
) -> tuple[ExecResult, LiveOutput | None]:
    """Run ``code``; its stdout and stderr reach ``out`` as the cell prints them (not in JSON mode).

    ``stdin``: where the cell's ``input()`` reads a line (its prompt is on the cell's stdout), or None when it
    has nothing to read (the code came from stdin); at its end ``input()`` gets an empty string.

    Returns:
        The result and the streams already written (None in JSON mode: nothing was written).

    Raises:
        KeyboardInterrupt: Ctrl-C stopped the cell (the message says what the session kept; what it printed
            is out already), or a second Ctrl-C abandoned the call (no message).
        OrchestratorError: what ``Session.execute`` raises (the output so far is out already).
    """
    live = None if out.json_mode else LiveOutput(out)

    def on_output(event: Event) -> str | None:
        if isinstance(event, OutputEvent):
            if live is not None:
                live.write(event.stream, event.text, event.data)
        elif isinstance(event, InputRequest):  # its prompt came on stdout already, as the cell's own output
            _answer_from(session, event.request_id, stdin)
        return None

    outcomes: queue.SimpleQueue[tuple[ExecResult | None, BaseException | None]] = queue.SimpleQueue()

    def call() -> None:
        try:
            outcomes.put((session.execute(code, timeout, on_output=None if live is None else on_output), None))
        except BaseException as exc:
            outcomes.put((None, exc))

    runner = threading.Thread(target=call, name=f"exec-{session.id}", daemon=True)
    runner.start()
    interrupted = False
    while True:
        try:
            result, error = outcomes.get()
            break
        except KeyboardInterrupt:
            if interrupted:
                raise  # the second Ctrl-C: give up on the call
            interrupted = True
            out.note("")
            out.note("orchestrator: stopping the cell (Ctrl-C again abandons it) ...")
            while runner.is_alive() and not session.interrupt():
                runner.join(0.005)  # the call has not begun yet: stop it once it has
    if live is not None:
        live.finish()
    if interrupted and isinstance(error, ExecutionTimeout):
        raise KeyboardInterrupt(str(error).replace("was stopped by the caller and was interrupted", "was interrupted"))
    if error is not None:
        raise error
    assert result is not None
    return result, live


def _answer_from(session: Session, request_id: str, stdin: TextIO | None) -> None:
    """Answer an ``input()`` with the next line of ``stdin``, read on a thread (the call goes on meanwhile)."""

    def read() -> None:
        line = "" if stdin is None else stdin.readline()
        with contextlib.suppress(InputRequestNotFound, OrchestratorError):
            session.submit_input(request_id, line.removesuffix("\n"))

    threading.Thread(target=read, name=f"input-{request_id}", daemon=True).start()


def cut_streams(result: ExecResult, file_limit: int) -> list[str]:
    """What the host dropped of the cell's output: one phrase per stream that reached the per-call file limit."""
    cut = []
    for name, path in (("stdout", result.stdout_path), ("stderr", result.stderr_path)):
        if path is not None and _size(path) >= file_limit:
            cut.append(f"{name} past its first {describe_bytes(file_limit)} (those are in {path})")
    return cut


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
