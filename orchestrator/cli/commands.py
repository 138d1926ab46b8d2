"""The session commands of the CLI: each takes the parsed arguments and a ``Context``, and returns an exit status."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..api.manager import Orchestrator
from ..api.session import Session, SessionState
from ..config import save_default_base_image
from ..errors import OrchestratorError, SandboxError
from ..ops.survey import SessionStatus
from .render import (
    Exit,
    Output,
    error_json,
    error_line,
    exec_json,
    key_value_table,
    one_line,
    session_rows,
    sessions_table,
    write_exec_result,
)


class Context:
    """One command's orchestrator and output, and the sessions it attached (each detached again, never closed)."""

    def __init__(self, orch: Orchestrator, out: Output) -> None:
        self.orch = orch
        self.out = out
        self._handles: list[Session] = []

    @contextlib.contextmanager
    def attached(self, session_id: str) -> Iterator[Session]:
        """Attach a session for the block, then detach it: the session keeps running for the next command."""
        session = self.attach(session_id)
        try:
            yield session
        except BaseException:
            self.abandon(session)
            raise
        self.detach(session)

    def attach(self, session_id: str) -> Session:
        session = self.orch.attach(session_id)
        self._handles.append(session)
        return session

    def detach(self, session: Session) -> None:
        try:
            session.detach()
        finally:
            if session.state is not SessionState.READY:
                self._handles.remove(session)

    def abandon(self, session: Session) -> None:
        """Let go of a handle while already failing (its call raised or was interrupted); the first error counts.

        A later ``attach`` takes the session over whatever this left behind (and stops a cell still running).
        """
        with contextlib.suppress(OrchestratorError):
            self.detach(session)

    def close(self) -> None:
        """Close the orchestrator; if a handle could not be detached, close only the engine client.

        ``Orchestrator.close`` closes (removes) the sessions it still holds, and a CLI command
        must never remove a session it was only asked to use.
        """
        if any(h.state is SessionState.READY for h in self._handles):
            self.orch.backend.close()
        else:
            self.orch.close()


def image_build(ctx: Context, args: argparse.Namespace) -> int:
    """Build (or reuse) the sandbox image; with --make-default record its base for later ``Orchestrator()``s."""
    settings = ctx.orch.settings
    with ctx.out.progress(f"building the sandbox image on {settings.base_image} ..."):
        tag = ctx.orch.build_image(rebuild=args.rebuild)
    recorded = save_default_base_image(settings.base_image) if args.make_default else None
    if ctx.out.json_mode:
        ctx.out.json(
            {
                "image": tag,
                "base_image": settings.base_image,
                "default_recorded": None if recorded is None else str(recorded),
            }
        )
    else:
        ctx.out.line(tag)
        if recorded is not None:
            ctx.out.note(f"default base image is now {settings.base_image} (recorded in {recorded})")
    return Exit.OK


def ls(ctx: Context, args: argparse.Namespace) -> int:
    """Every stored session: a table, or a JSON list."""
    infos = ctx.orch.list_sessions()
    if ctx.out.json_mode:
        ctx.out.json([info.to_json() for info in infos])
        return Exit.OK
    if not infos:
        ctx.out.line(f"no sessions (state dir {ctx.orch.settings.state_dir})")
        return Exit.OK
    ctx.out.table(sessions_table(infos))
    for info in infos:
        if info.problem:
            ctx.out.line(f"{info.id}: {one_line(info.problem)}")
    return Exit.OK


def inspect(ctx: Context, args: argparse.Namespace) -> int:
    """Everything known of one session, without touching it."""
    now = time.time()
    info = ctx.orch.describe(args.session_id, now=now)
    if ctx.out.json_mode:
        ctx.out.json(info.to_json())
    else:
        ctx.out.table(key_value_table(session_rows(info, now)))
    return Exit.OK


def read_code(code: str, stdin: Any = None) -> str:
    """The CODE argument, or standard input when it is ``-``."""
    return (stdin or sys.stdin).read() if code == "-" else code


def exec_code(ctx: Context, args: argparse.Namespace) -> int:
    """Run code in a session (attach, execute, detach); exit 1 when the code raised."""
    code = read_code(args.code)
    with ctx.attached(args.session_id) as session:
        try:
            result = session.execute(code, timeout=args.timeout)
        except SandboxError as exc:
            # A timed-out cell's partial output is still worth showing (before the one error line).
            if not ctx.out.json_mode:
                ctx.out.program_output(getattr(exc, "stdout", ""))
                ctx.out.program_output(getattr(exc, "stderr", ""), ctx.out.stderr)
            raise
    if ctx.out.json_mode:
        ctx.out.json(exec_json(args.session_id, result))
    else:
        write_exec_result(ctx.out, result)
    return Exit.OK if result.ok else Exit.CODE_RAISED


def for_each(ctx: Context, session_ids: list[str], act: Callable[[str], str]) -> int:
    """Run ``act`` on each id (each failure one line on stderr); JSON: one result per id.

    Returns 0 when all succeeded; when all failed for the same kind of reason, that reason's
    status; otherwise ``Exit.PARTIAL``.
    """
    results: list[dict[str, Any]] = []
    failures: list[Exit] = []
    ids = list(dict.fromkeys(session_ids))
    for session_id in ids:
        try:
            message = act(session_id)
        except OrchestratorError as exc:
            ctx.out.note(f"orchestrator: {session_id}: {error_line(exc).removeprefix('orchestrator: ')}")
            results.append({"id": session_id, "ok": False, "result": None, "error": error_json(exc)})
            failures.append(Exit(error_json(exc)["exit_code"]))
            continue
        results.append({"id": session_id, "ok": True, "result": message, "error": None})
        if not ctx.out.json_mode:
            ctx.out.line(f"{session_id}: {message}")
    if ctx.out.json_mode:
        ctx.out.json(results)
    if not failures:
        return Exit.OK
    if len(failures) == len(ids) and len(set(failures)) == 1:
        return failures[0]
    return Exit.PARTIAL


def hibernate(ctx: Context, args: argparse.Namespace) -> int:
    def act(session_id: str) -> str:
        with ctx.out.progress(f"hibernating {session_id} ..."):
            done = ctx.orch.hibernate(session_id)
        return "hibernated" if done else "already hibernated"

    return for_each(ctx, args.session_ids, act)


def resume(ctx: Context, args: argparse.Namespace) -> int:
    def act(session_id: str) -> str:
        # Resuming attaches, which would take a running session away from its owner: leave those alone.
        if ctx.orch.describe(session_id).status in (SessionStatus.RUNNING, SessionStatus.BUSY):
            return "already running"
        with ctx.out.progress(f"resuming {session_id} ..."):
            ctx.orch.resume(session_id)
        return "running"

    return for_each(ctx, args.session_ids, act)


def rm(ctx: Context, args: argparse.Namespace) -> int:
    def act(session_id: str) -> str:
        with ctx.out.progress(f"removing {session_id} ..."):
            ctx.orch.remove(session_id)
        return "removed"

    return for_each(ctx, args.session_ids, act)


def logs(ctx: Context, args: argparse.Namespace) -> int:
    """The container log of a session (the agent's stderr)."""
    text = ctx.orch.logs(args.session_id, tail=args.tail)
    if ctx.out.json_mode:
        ctx.out.json({"id": args.session_id, "tail": args.tail, "log": text})
    else:
        ctx.out.sandbox_log(text if not text or text.endswith("\n") else text + "\n")
    return Exit.OK


def prune(ctx: Context, args: argparse.Namespace) -> int:
    """Remove (or hibernate) stale sessions and orphans; one line per action, a summary; 3 on a partial failure."""
    with ctx.out.progress("pruning ..."):
        report = ctx.orch.prune(
            idle_for=args.idle, older_than=args.older_than, hibernate_only=args.hibernate_only, dry_run=args.dry_run
        )
    if ctx.out.json_mode:
        ctx.out.json(report.to_json())
    else:
        for action in report.actions:
            ctx.out.line(one_line(action.describe(report.dry_run)))
        ctx.out.line(report.summary())
    if report.failed:
        ctx.out.note(
            f"orchestrator: PartialFailure: {len(report.failed)} of {len(report.actions)} prune actions failed"
        )
        return Exit.PARTIAL
    return Exit.OK


def demo(ctx: Context, args: argparse.Namespace) -> int:
    """Create a session, set state, kill its container from outside, and show the state come back."""
    orch, line = ctx.orch, ctx.out.line
    image = orch.build_image()
    line(f"sandbox image: {image}")
    started = time.monotonic()
    with orch.create_session() as session:
        line(f"session {session.id} ready in {time.monotonic() - started:.2f} s")
        session.execute(
            "import math\ndocs = {'intro': 'hello world'}\ndef area(r):\n    return math.pi * r * r\nx = 41"
        )
        line(f">>> x + 1  ->  {one_line(str(session.execute('x + 1').return_value))}")
        line(f"checkpoint generation {session.generation}, variables {session.variables}")
        old = session.container_id or ""
        line(f"killing container {old[:12]} with the Docker API ...")
        orch.backend.kill(old)
        started = time.monotonic()
        value = one_line(str(session.execute("area(2), docs['intro'], x").return_value))
        line(f">>> area(2), docs['intro'], x  ->  {value}  (restored in {time.monotonic() - started:.2f} s)")
        line(f"new container {(session.container_id or '')[:12]}")
        try:
            session.execute("import os; os._exit(1)")
        except SandboxError as exc:
            line(f"os._exit(1) -> {type(exc).__name__}: {one_line(str(exc))}")
        line(f">>> x  ->  {one_line(str(session.execute('x').return_value))}")
    line("session closed; container and checkpoint removed")
    return Exit.OK
