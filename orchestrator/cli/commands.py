"""The session commands of the CLI: each takes the parsed arguments and a ``Context``, and returns an exit status."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, TextIO

from ..config import Settings, save_default_base_image
from ..errors import ConfigError, OrchestratorError, SandboxError, SessionHeld
from ..state.store import SessionStore, validate_session_id
from ..units import describe_duration
from . import filters
from .output import Exit, Output, UsageError, error_json, error_line, one_line
from .render import (
    exec_json,
    fit_columns,
    fit_last_column,
    generation_json,
    history_columns,
    key_value_table,
    plain_table,
    session_columns,
    session_rows,
    write_exec_result,
)

if TYPE_CHECKING:  # the API is imported when a command first needs the engine (``Context.orch``)
    from tenacity import RetryCallState

    from ..api.manager import Orchestrator
    from ..api.session import Session
    from ..ops.prune import PruneReport


_HELD_POLL_SECONDS = 0.2
"""How often a command waiting for a held session tries again (a CLI call's detach frees it at once)."""


class Context:
    """One command's orchestrator and output, and the sessions it attached (each detached again, never closed)."""

    def __init__(self, settings: Settings, out: Output, connect: Callable[[Settings], Orchestrator]) -> None:
        """``connect``: makes the orchestrator of ``settings`` (it connects to the engine) when first needed."""
        self.settings = settings
        self.out = out
        self._connect = connect
        self._handles: list[Session] = []

    @cached_property
    def orch(self) -> Orchestrator:
        """The command's orchestrator, made on first use: a command that needs no engine never pays for it."""
        return self._connect(self.settings)

    def has_sessions(self) -> bool:
        """Whether the store names a session, read without the engine (``ls`` of an empty store connects to none)."""
        store = self.orch.store if "orch" in self.__dict__ else SessionStore(self.settings.state_dir)
        return bool(store.names())

    @contextlib.contextmanager
    def attached(self, session_id: str, *, force: bool = False, wait: float = 0.0) -> Iterator[Session]:
        """Attach a session for the block, then detach it: the session keeps running for the next command."""
        session = self.attach(session_id, force=force, wait=wait)
        try:
            yield session
        except BaseException:
            self.abandon(session)
            raise
        self.detach(session)

    def attach(self, session_id: str, *, force: bool = False, wait: float = 0.0) -> Session:
        """Attach a session. While a live controller holds it, ``force`` takes it; else this waits its turn for up to
        ``wait`` seconds (another terminal's call on the same session is ordinary), saying so once on stderr.

        Raises:
            SessionHeld: it was still held after ``wait`` seconds.
        """
        from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

        def waiting(state: RetryCallState) -> None:
            if state.attempt_number == 1 and state.outcome is not None:
                held = state.outcome.exception()
                holder = f"pid {held.pid} on host {held.host}" if isinstance(held, SessionHeld) else "another process"
                self.out.note(
                    f"orchestrator: session {session_id} is busy ({holder} holds it); waiting for its turn, up to "
                    f"{describe_duration(wait)} (--no-wait fails at once, --force takes it over)"
                )

        retrying = Retrying(
            retry=retry_if_exception_type(SessionHeld),
            stop=stop_after_delay(wait),
            wait=wait_fixed(_HELD_POLL_SECONDS),
            before_sleep=waiting,
            reraise=True,
        )
        try:
            session = retrying(self.orch.attach, session_id, force=force)
        except SessionHeld as held:
            if not wait:
                raise
            raise SessionHeld(
                f"{held} (waited {describe_duration(wait)}; --wait D waits longer)",
                host=held.host,
                pid=held.pid,
                since=held.since,
            ) from None
        self._handles.append(session)
        return session

    def detach(self, session: Session) -> None:
        try:
            session.detach()
        finally:
            if not _held(session):
                self._handles.remove(session)

    def abandon(self, session: Session) -> None:
        """Let go of a handle while already failing (its call raised or was interrupted); the first error counts.

        It lets go of the lease too, so a later ``attach`` takes the session over without force whatever this left
        behind (and stops a cell still running).
        """
        with contextlib.suppress(OrchestratorError):
            self.detach(session)

    def close(self) -> None:
        """Close the orchestrator; if a handle could not be detached, close only the engine client.

        ``Orchestrator.close`` closes (removes) the sessions it still holds, and a CLI command
        must never remove a session it was only asked to use.
        """
        if "orch" not in self.__dict__:  # never connected
            return
        if any(_held(h) for h in self._handles):
            self.orch.backend.close()
        else:
            self.orch.close()

    def keep_running(self, sessions: Sequence[Session]) -> None:
        """Detach sessions this command made (forks): they keep running for the next command."""
        self._handles.extend(sessions)
        for session in sessions:
            self.detach(session)

    @contextlib.contextmanager
    def created(self, *, name: str | None, image: str | None, labels: dict[str, str]) -> Iterator[Session]:
        """Create a session for the block (a spinner while it starts), then detach it, unless the block closed it."""
        with self.out.progress("starting a session ..."), self.names_free([] if name is None else [name]):
            session = self.orch.create_session(session_id=name, image=image, labels=labels)
        self._handles.append(session)
        try:
            yield session
        except BaseException:
            self.abandon(session)
            raise
        if _held(session):
            self.detach(session)

    @contextlib.contextmanager
    def names_free(self, names: Sequence[str]) -> Iterator[None]:
        """A ``--name`` of a session that exists already is refused in the CLI's words, not the API's."""
        try:
            yield
        except ConfigError:
            taken = [name for name in names if _valid_id(name) and self.orch.store.exists(name)]
            if not taken:
                raise
            raise ConfigError(
                f"session {one_line(taken[0])} exists already; `orchestrator exec {taken[0]} CODE` uses it, "
                f"`orchestrator rm {taken[0]}` removes it, or choose another --name"
            ) from None


def _valid_id(name: str) -> bool:
    try:
        validate_session_id(name)
    except ConfigError:
        return False
    return True


def _held(session: Session) -> bool:
    """The handle holds its session still (not detached, closed or gone stale)."""
    from ..api.session import SessionState  # loaded already, with the session

    return session.state is SessionState.READY


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
    """The stored sessions (those ``--filter`` selects): a table that fits the terminal, ids only, or JSON."""
    infos = filters.select(ctx.orch.list_sessions(), args.filters) if ctx.has_sessions() else []
    if ctx.out.json_mode or args.format == "json":
        ctx.out.json_rows([info.to_json() for info in infos])
    elif args.quiet:
        ctx.out.write("".join(f"{one_line(info.id)}\n" for info in infos))
    elif not infos and not args.filters:
        ctx.out.note(
            f"orchestrator: no sessions (state dir {ctx.settings.state_dir}); `orchestrator create` starts one"
        )
    elif infos:
        ctx.out.write(plain_table(fit_columns(session_columns(infos), ctx.out.width)))
    for info in infos if not (args.quiet or ctx.out.json_mode) else ():
        if info.problem:
            ctx.out.note(f"orchestrator: {one_line(info.id)}: {one_line(info.problem)}")
    return Exit.OK


def inspect(ctx: Context, args: argparse.Namespace) -> int:
    """Everything known of one session, without touching it."""
    from ..api.answers import listed_names

    now = time.time()
    info = ctx.orch.describe(args.session_id, now=now)
    unsaved = {} if info.record_unreadable else ctx.orch.history(info.id)[-1].unsaved  # the current generation's
    if ctx.out.json_mode:
        ctx.out.json({**info.to_json(), "unsaved": unsaved})
    else:
        listed = f"{listed_names(unsaved, _UNSAVED_CHARS)} (lost if the sandbox restarts)" if unsaved else "-"
        ctx.out.table(key_value_table(session_rows(info, now, listed)))
    return Exit.OK


_UNSAVED_CHARS = 200
"""Characters of names ``inspect`` lists as not saved (the rest are counted; ``--json`` has them all)."""


def create(ctx: Context, args: argparse.Namespace) -> int:
    """Start a session and leave it running (detached); print its id."""
    with ctx.created(name=args.name, image=args.image, labels=dict(args.labels)) as session:
        if ctx.out.json_mode:
            ctx.out.json({"id": session.id, "image": args.image or ctx.orch.default_image, "status": "running"})
        else:
            ctx.out.line(session.id)
    if not (args.quiet or ctx.out.json_mode):
        ctx.out.note(f"orchestrator: session {session.id} is running; `orchestrator exec {session.id} CODE` uses it")
    return Exit.OK


def fork(ctx: Context, args: argparse.Namespace) -> int:
    """Fork a stored session into new sessions left running (detached), as ``create`` leaves one; print their ids."""
    count = args.count or len(args.names) or 1
    if args.names and count != len(args.names):
        raise UsageError(f"-n {count} with {len(args.names)} --name: give one --name per fork, or none")
    with ctx.out.progress(f"forking {args.session_id} ..."), ctx.names_free(args.names):
        forks = ctx.orch.fork(
            args.session_id, count, at=args.at, labels=dict(args.labels), session_ids=args.names or None
        )
    ctx.keep_running(forks)
    if ctx.out.json_mode:
        ctx.out.json([_fork_json(session) for session in forks])
        return Exit.OK
    ctx.out.write("".join(f"{session.id}\n" for session in forks))
    if not args.quiet:
        origin = forks[0].forked_from
        at = f" at generation {origin[1]}" if origin else ""
        ctx.out.note(
            f"orchestrator: forked {args.session_id}{at} into {len(forks)} running session(s); "
            f"`orchestrator exec {forks[0].id} CODE` uses one"
        )
    return Exit.OK


def _fork_json(session: Session) -> dict[str, Any]:
    origin = session.forked_from
    forked_from = None if origin is None else {"session_id": origin[0], "generation": origin[1]}
    return {"id": session.id, "forked_from": forked_from, "generation": session.generation}


def history(ctx: Context, args: argparse.Namespace) -> int:
    """The generations a session keeps, oldest first (the last is the current one), without touching it."""
    generations = ctx.orch.history(args.session_id)
    if ctx.out.json_mode:
        ctx.out.json([generation_json(generation) for generation in generations])
    else:
        ctx.out.write(plain_table(fit_last_column(history_columns(generations, time.time()), ctx.out.width)))
    return Exit.OK


def rewind(ctx: Context, args: argparse.Namespace) -> int:
    """Bring a session back to a kept generation's state, as a new generation; print its number.

    Like ``resume``: the session is attached (refused while a live controller holds it, unless ``--force``),
    rewound and detached again.
    """
    with ctx.out.progress(f"rewinding {args.session_id} to generation {args.generation} ..."):
        generation = ctx.orch.rewind(args.session_id, args.generation, force=args.force)
    if ctx.out.json_mode:
        ctx.out.json(generation_json(generation, args.session_id))
        return Exit.OK
    ctx.out.line(str(generation.generation))
    changed = ", ".join(one_line(name) for name in generation.changed) or "nothing"
    ctx.out.note(
        f"orchestrator: session {args.session_id} has generation {args.generation}'s state again, as generation "
        f"{generation.generation} (changed: {changed})"
    )
    return Exit.OK


def run(ctx: Context, args: argparse.Namespace) -> int:
    """``create`` then ``exec``: start a session, run CODE in it, leave it running (``--rm``: remove it)."""
    code = read_code(args.code)
    with ctx.created(name=args.name, image=args.image, labels=dict(args.labels)) as session:
        if not (args.quiet or args.rm or ctx.out.json_mode):
            ctx.out.note(
                f"orchestrator: session {session.id} (it keeps running: `orchestrator rm {session.id}` ends it)"
            )
        try:
            return run_and_show(ctx, session, code, args.timeout, stdin=None if args.code == "-" else sys.stdin)
        finally:
            if args.rm:
                with ctx.out.progress(f"removing {session.id} ..."):
                    session.close()


def read_code(code: str) -> str:
    """The CODE argument, or standard input when it is ``-``."""
    return sys.stdin.read() if code == "-" else code


def exec_code(ctx: Context, args: argparse.Namespace) -> int:
    """Run code in a session (attach, execute, detach), its output streamed; exit 1 when the code raised."""
    code = read_code(args.code)
    with ctx.attached(args.session_id, force=args.force, wait=args.wait) as session:
        return run_and_show(ctx, session, code, args.timeout, stdin=None if args.code == "-" else sys.stdin)


def run_and_show(ctx: Context, session: Session, code: str, timeout: float | None, *, stdin: TextIO | None) -> int:
    """Run one cell of ``exec`` or ``run`` and show it; the exit status of the cell (docs/cli.md, "exec")."""
    from .cell import cut_streams, run_cell  # the live-call API: loaded with the session already

    result, live = run_cell(session, code, timeout=timeout, out=ctx.out, stdin=stdin)
    if ctx.out.json_mode:
        ctx.out.json(exec_json(session.id, result))
    else:
        write_exec_result(ctx.out, result, live)
    cut = cut_streams(result, ctx.orch.settings.limits.max_output_file_bytes)
    if cut:
        ctx.out.note(
            f"orchestrator: OutputCut: the host dropped {'; '.join(cut)}; raise ORCH_MAX_OUTPUT_FILE_BYTES for more"
        )
    if not result.ok:
        return Exit.CODE_RAISED
    return Exit.OUTPUT_CUT if cut else Exit.OK


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
        with ctx.out.progress(f"resuming {session_id} ..."):
            started = ctx.orch.resume(session_id, force=args.force)  # refused while a live controller holds it
        return "running" if started else "already running"

    return for_each(ctx, args.session_ids, act)


def rm(ctx: Context, args: argparse.Namespace) -> int:
    def act(session_id: str) -> str:
        with ctx.out.progress(f"removing {session_id} ..."):
            ctx.orch.remove(session_id, force=args.force)
        return "removed"

    return for_each(ctx, args.session_ids, act)


def prune(ctx: Context, args: argparse.Namespace) -> int:
    """Remove (or hibernate) stale sessions and orphans; one line per action, a summary; 3 on a partial failure.

    It needs a criterion, and asks first on a terminal (what it would do, then ``[y/N]``) unless ``--yes``;
    without a terminal it needs ``--yes`` (or ``--dry-run``).
    """
    if args.idle is None and args.older_than is None and not args.orphans:
        raise UsageError(
            "prune needs a criterion: --idle D, --older-than D, or --orphans (only what crashed controllers left)"
        )
    options = {"idle_for": args.idle, "older_than": args.older_than, "hibernate_only": args.hibernate_only}
    if not (args.dry_run or args.yes):
        if not ctx.out.interactive:
            raise UsageError("prune changes sessions without asking only with --yes (or see first with --dry-run)")
        with ctx.out.progress("looking for what to prune ..."):
            plan = ctx.orch.prune(**options, dry_run=True)
        if not [action for action in plan.actions if action.action != "skip"]:
            _show_prune(ctx, plan)
            return Exit.OK
        for action in plan.actions:
            ctx.out.note(one_line(action.describe(True)))
        if not ctx.out.confirm("prune these (they are decided again as it runs)? [y/N] "):
            ctx.out.note("orchestrator: prune cancelled; nothing was changed")
            return Exit.OK
    with ctx.out.progress("pruning ..."):
        report = ctx.orch.prune(**options, dry_run=args.dry_run)
    _show_prune(ctx, report)
    if report.failed:
        ctx.out.note(
            f"orchestrator: PartialFailure: {len(report.failed)} of {len(report.actions)} prune actions failed"
        )
        return Exit.PARTIAL
    return Exit.OK


def _show_prune(ctx: Context, report: PruneReport) -> None:
    if ctx.out.json_mode:
        ctx.out.json(report.to_json())
        return
    for action in report.actions:
        ctx.out.line(one_line(action.describe(report.dry_run)))
    ctx.out.line(report.summary())


def demo(ctx: Context, args: argparse.Namespace) -> int:
    """Create a session, set state, kill its container from outside, and show the state come back."""
    orch, line = ctx.orch, ctx.out.line
    with ctx.out.progress(f"building the sandbox image on {orch.settings.base_image} ..."):
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
