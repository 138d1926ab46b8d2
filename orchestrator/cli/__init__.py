"""The ``orchestrator`` command: create, list, inspect, use, follow, fork, rewind, hibernate, resume, remove, prune.

Human-readable by default, --json on every command that prints; each error is one line on
stderr and has its own exit status (below; docs/cli.md has the whole guide).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from .. import __version__
from ..errors import OrchestratorError
from ..safe_text import log_to_stderr, visible
from ..spelling import did_you_mean
from ..units import duration_argument, positive_duration_argument
from . import filters
from .labels import stored_key
from .output import EXIT_HELP, Exit, Output

if TYPE_CHECKING:
    from ..api.manager import Orchestrator
    from ..config import Settings

__all__ = ["build_parser", "main"]

# Every command imports this module, ``--version`` and ``--help`` too: it imports only what parsing needs. A
# command's module (and the API, rich, the Docker SDK behind it) is imported when that command runs, and the
# options that other modules define (eval, janitor, mcp) when that command is parsed (``_Parser``'s ``setup``).


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's one-line errors; ``setup`` adds a command's options when it is parsed or its help
    shown (they come from a module that costs to import)."""

    def __init__(self, *args: Any, setup: Callable[[argparse.ArgumentParser], None] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._setup = setup

    def _ready(self) -> None:
        setup, self._setup = self._setup, None
        if setup is not None:
            setup(self)

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        self._ready()
        return super().parse_known_args(*args, **kwargs)

    def format_help(self) -> str:
        self._ready()
        return super().format_help()

    def error(self, message: str) -> NoReturn:
        self.exit(Exit.USAGE, f"orchestrator: UsageError: {message} (see `{self.prog} --help`)\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """A value outside an argument's choices (a command, a format) is refused naming the closest one."""
        choices = action.choices
        if choices is not None and value not in choices:
            hint = did_you_mean(str(value), map(str, choices))
            listed = ", ".join(map(str, choices))
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}{hint}; choose from {listed}")


class Command:
    """A command's function, named by its module of ``orchestrator.cli``: imported when the command runs.

    (A plain class: ``dataclasses`` alone would cost ``--version`` 7 ms to import.)
    """

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.name = name

    def target(self) -> Callable[..., int]:
        function: Callable[..., int] = getattr(importlib.import_module(f".{self.module}", __name__), self.name)
        return function

    def __call__(self, *args: Any) -> int:
        return self.target()(*args)


def _tail(text: str) -> int | None:
    if text == "all":
        return None
    try:
        lines = int(text)
    except ValueError:
        lines = 0
    if lines < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of lines (1 or more) or 'all'")
    return lines


def _force_option(parser: argparse.ArgumentParser) -> None:
    """``--force``: take a session a live controller holds (its running call is stopped, its handle goes stale)."""
    parser.add_argument(
        "--force",
        action="store_true",
        help="take the session even from a live controller that holds it (its running call is stopped and lost)",
    )


def _sandbox_text_options(parser: argparse.ArgumentParser, default: str) -> None:
    """``--raw`` / ``--escape``: how text the sandbox made reaches the terminal (docs/cli.md, "Text from a sandbox")."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--raw",
        dest="sandbox_text",
        action="store_const",
        const="raw",
        help="write what the sandbox made as it is, control characters and escape sequences included",
    )
    group.add_argument(
        "--escape",
        dest="sandbox_text",
        action="store_const",
        const="escape",
        help="show control characters of what the sandbox made as escapes, even to a pipe or a file",
    )
    parser.set_defaults(sandbox_text=default)


def _generation(text: str) -> int:
    try:
        generation = int(text)
    except ValueError:
        generation = -1
    if generation < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a generation (an integer >= 0; `history ID` lists them)")
    return generation


def _count(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of forks (1 or more)")
    return count


def _labels_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--label",
        dest="labels",
        type=_label,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"a label to keep with {what}, as docker takes one (team=a); repeatable",
    )


def _label(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return stored_key(key), value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command (``func`` in the namespace runs the command)."""
    formatter = argparse.RawDescriptionHelpFormatter
    description = (__doc__ or "").replace("``", "")  # the docstring's reST literals, as plain text for a terminal
    parser = _Parser(prog="orchestrator", description=description, epilog=EXIT_HELP, formatter_class=formatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log lifecycle events to stderr")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text (also after the command)")
    parser.add_argument(
        "--log-json", action="store_true", help="log one JSON object per line to stderr (also after the command)"
    )
    parser.add_argument("--version", action="version", version=f"orchestrator {__version__}")
    # The same options after the command; SUPPRESS keeps a value given before it.
    common = _Parser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument("--log-json", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    printing = _Parser(add_help=False, parents=[common])
    printing.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON instead of text")

    # A bare command prints its help (as docker and kubectl do): no subcommand is required.
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parser.set_defaults(func=None, help_of=parser)

    def command(
        name: str,
        help: str,
        *,
        json: bool = True,
        aliases: Sequence[str] = (),
        setup: Callable[[argparse.ArgumentParser], None] | None = None,
    ) -> argparse.ArgumentParser:
        return sub.add_parser(
            name,
            help=help,
            description=help,
            aliases=list(aliases),
            parents=[printing if json else common],
            epilog=EXIT_HELP,
            formatter_class=formatter,
            setup=setup,
        )

    ls = command(
        "ls", "list stored sessions: id, state, image, age, idle, cpu, memory, checkpoint size", aliases=["list"]
    )
    ls.add_argument("-q", "--quiet", action="store_true", help="print only the ids, one a line")
    ls.add_argument(
        "-f",
        "--filter",
        dest="filters",
        type=filters.parse_filter,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"only sessions that match ({', '.join(filters.KEYS)}; id, image and node take * patterns; "
        "label=KEY or label=KEY=VALUE); repeatable: different keys must all match, the same key any",
    )
    ls.add_argument(
        "--format", choices=("table", "json"), default="table", help="table (default) or json (the same as --json)"
    )
    ls.set_defaults(func=Command("commands", "ls"))

    inspect = command("inspect", "show everything known of one session (without touching it)")
    inspect.add_argument("session_id", metavar="ID")
    inspect.set_defaults(func=Command("commands", "inspect"))

    exec_ = command(
        "exec",
        "run CODE in a session and print its output; exit 1 when the code raised "
        "(refused while a live controller holds the session, unless --force)",
    )
    exec_.add_argument("session_id", metavar="ID")
    exec_.add_argument("code", metavar="CODE", help="Python source; '-' reads it from standard input")
    exec_.add_argument(
        "--timeout", type=positive_duration_argument, metavar="S", help="seconds (or 90s, 5m) the cell may run"
    )
    _sandbox_text_options(exec_, "auto")
    _force_option(exec_)
    exec_.set_defaults(func=Command("commands", "exec_code"))

    for name, func, what in (
        ("create", "create", "start a session and leave it running; print its id"),
        (
            "run",
            "run",
            "start a session and run CODE in it, like exec (the session keeps running unless --rm); "
            "exit status as exec",
        ),
    ):
        new = command(name, what)
        new.add_argument("--name", metavar="ID", help="the session's id (3-63 lowercase letters, digits, dashes)")
        new.add_argument(
            "--image",
            help="a sandbox image, one `image build` made (default: the one it makes); for a base image with python3, "
            "run `image build --base BASE` first and pass the tag it prints",
        )
        _labels_option(new, "the session")
        new.add_argument("-q", "--quiet", action="store_true", help="print only the id (create) or the output (run)")
        new.set_defaults(func=Command("commands", func))
        if name == "run":
            new.add_argument("code", metavar="CODE", help="Python source; '-' reads it from standard input")
            new.add_argument(
                "--timeout", type=positive_duration_argument, metavar="S", help="seconds (or 90s, 5m) the cell may run"
            )
            new.add_argument("--rm", action="store_true", help="remove the session when the cell has run")
            _sandbox_text_options(new, "auto")

    fork = command(
        "fork",
        "new sessions with the state of session ID (its last committed generation, or --at GEN), left running; "
        "print their ids, one a line (ID is only read: it may be held or busy)",
    )
    fork.add_argument("session_id", metavar="ID")
    fork.add_argument("-n", "--count", type=_count, metavar="N", help="how many forks (default 1, or one per --name)")
    fork.add_argument(
        "--name",
        dest="names",
        action="append",
        default=[],
        metavar="ID",
        help="a fork's id (3-63 lowercase letters, digits, dashes); repeatable, one per fork",
    )
    fork.add_argument(
        "--at", type=_generation, metavar="GEN", help="fork from this kept generation (`history ID` lists them)"
    )
    _labels_option(fork, "each fork, added to ID's labels")
    fork.add_argument("-q", "--quiet", action="store_true", help="print only the ids (no note on stderr)")
    fork.set_defaults(func=Command("commands", "fork"))

    hist = command("history", "list the generations a session keeps for rewind and fork --at (without touching it)")
    hist.add_argument("session_id", metavar="ID")
    hist.set_defaults(func=Command("commands", "history"))

    rew = command(
        "rewind",
        "bring a session back to the state of a kept generation, as a new generation; print its number "
        "(refused while a live controller holds the session, unless --force)",
    )
    rew.add_argument("session_id", metavar="ID")
    rew.add_argument("generation", metavar="GEN", type=_generation, help="a generation `history ID` lists")
    _force_option(rew)
    rew.set_defaults(func=Command("commands", "rewind"))

    sh = command(
        "shell",
        "an interactive Python prompt in a session (Ctrl-D detaches; the session keeps running; "
        "refused like exec while a live controller holds the session, unless --force)",
    )
    sh.add_argument("session_id", metavar="ID")
    sh.add_argument(
        "--timeout", type=positive_duration_argument, metavar="S", help="seconds (or 90s, 5m) each input may run"
    )
    _sandbox_text_options(sh, "auto")
    _force_option(sh)
    sh.set_defaults(func=Command("shell", "shell"))

    for name, func, what in (
        ("hibernate", "hibernate", "remove sessions' containers and keep their checkpoints"),
        ("resume", "resume", "start hibernated sessions' containers now and restore them"),
        ("rm", "rm", "remove sessions: containers and stored state"),
    ):
        many = command(name, what)
        many.add_argument("session_ids", metavar="ID", nargs="+")
        if name != "hibernate":  # hibernating never takes a session: it refuses a busy one
            _force_option(many)
        many.set_defaults(func=Command("commands", func))

    logs = command(
        "logs",
        "print a session's container log (what cells wrote to the process's own stderr or stdout; the agent's "
        "messages with --agent), or with --output the whole outputs the host kept of its calls; -f follows",
    )
    logs.add_argument("session_id", metavar="ID")
    logs.add_argument("--tail", type=_tail, default=200, metavar="N", help="last N lines, or 'all' (default 200)")
    logs.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="then print new lines as they come, across restarts, until the session is removed or Ctrl-C",
    )
    logs.add_argument(
        "--output",
        action="store_true",
        help="the files where the host kept the whole stdout/stderr of calls past ORCH_MAX_OUTPUT_BYTES",
    )
    logs.add_argument(
        "--agent",
        action="store_true",
        help="also the agent's own lines ('orchestrator agent: connection ended ...'), for debugging the sandbox",
    )
    _sandbox_text_options(logs, "escape")
    logs.set_defaults(func=Command("logs", "run"))

    prune = command(
        "prune",
        "remove (or hibernate) stale sessions and what crashed controllers left behind; asks first "
        "on a terminal (--yes does not)",
    )
    prune.add_argument("--idle", type=duration_argument, metavar="D", help="stale after D without a call (30m, 2h, 1d)")
    prune.add_argument(
        "--older-than", type=duration_argument, metavar="D", help="stale when created more than D ago (24h)"
    )
    prune.add_argument("--hibernate-only", action="store_true", help="hibernate stale sessions instead of removing")
    prune.add_argument(
        "--orphans",
        action="store_true",
        help="the criterion when no session is stale: clean only what crashed controllers left (always cleaned)",
    )
    prune.add_argument("--dry-run", action="store_true", help="print what would be done; change nothing")
    prune.add_argument(
        "-y", "--yes", action="store_true", help="do not ask (needed without a terminal, unless --dry-run)"
    )
    prune.set_defaults(func=Command("commands", "prune"))

    sub.add_parser(
        "eval",
        help="grade a JSONL file of untrusted submissions, each in a fresh sandbox (docs/eval.md)",
        description="grade a JSONL file of untrusted submissions, each in a fresh sandbox (docs/eval.md)",
        parents=[printing],
        formatter_class=formatter,
        setup=_eval_options,
    )
    sub.add_parser(
        "janitor",
        help="run pruning on an interval until SIGTERM (the compose service)",
        description="run pruning on an interval until SIGTERM (the compose service)",
        setup=_janitor_options,
    )

    image = sub.add_parser("image", help="sandbox image commands", parents=[common])
    image.set_defaults(func=None, help_of=image)
    images = image.add_subparsers(dest="image_command", metavar="COMMAND")
    build = images.add_parser(
        "build",
        help="build (or reuse) the sandbox image; prints its tag",
        description="build (or reuse) the sandbox image on the base image; prints its tag",
        parents=[printing],
        epilog=EXIT_HELP,
        formatter_class=formatter,
    )
    build.add_argument(
        "--base", help="base image with python3 (default: ORCH_BASE_IMAGE, the recorded default, or python:3.12-slim)"
    )
    build.add_argument("--rebuild", action="store_true", help="build even if the image exists")
    build.add_argument(
        "--make-default",
        action="store_true",
        help="record the base image as the default of later runs on this state dir (no ORCH_BASE_IMAGE needed)",
    )
    build.set_defaults(func=Command("commands", "image_build"))

    command(
        "mcp",
        "serve persistent sessions to an MCP client (stdio, or --http on loopback with a token); docs/mcp.md",
        json=False,
        setup=_mcp_options,
    )

    command("demo", "show a session surviving a killed container", json=False).set_defaults(
        func=Command("commands", "demo")
    )
    return parser


def _eval_options(parser: argparse.ArgumentParser) -> None:
    from . import evaluate

    parser.epilog = evaluate.EXIT_HELP
    evaluate.add_arguments(parser)
    parser.set_defaults(func=evaluate.run, needs_orchestrator=False)


def _janitor_options(parser: argparse.ArgumentParser) -> None:
    from ..ops import janitor

    janitor.add_arguments(parser)
    parser.set_defaults(func=_janitor, needs_orchestrator=False)


def _janitor(args: argparse.Namespace) -> int:
    from ..ops import janitor

    return int(janitor.run(args))


def _mcp_options(parser: argparse.ArgumentParser) -> None:
    from ..extras import needs
    from ..mcp import EXTRA, NEEDS

    with needs(EXTRA, NEEDS):
        from . import mcp_command

    mcp_command.add_arguments(parser)
    _labels_option(parser, "each session it creates")
    parser.set_defaults(func=mcp_command.run)


def connect(settings: Settings) -> Orchestrator:
    """The orchestrator of a command that needs the engine (the Docker SDK is imported here, not before)."""
    from ..api.manager import Orchestrator

    return Orchestrator(settings)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit status."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version, a usage error
        return exc.code if isinstance(exc.code, int) else Exit.USAGE
    except OrchestratorError as exc:  # a command's options come from an extra that is not installed
        return Output().error(exc)
    if args.func is None:  # `orchestrator`, `orchestrator image`: what there is to do
        args.help_of.print_help()
        return Exit.OK
    log_to_stderr(logging.INFO if args.verbose else logging.WARNING, as_json=args.log_json)
    out = Output(json_mode=args.json, sandbox_text=getattr(args, "sandbox_text", "auto"))
    try:
        if not getattr(args, "needs_orchestrator", True):
            return int(args.func(args))
        return _run(args, out)
    except KeyboardInterrupt as exc:
        if str(exc):  # the cell was stopped, and the message says what the session kept
            return out.error(exc)
        out.note("")
        return out.error(KeyboardInterrupt("interrupted"))
    except BrokenPipeError:
        # The reader went away (`orchestrator logs ID | head`): stop quietly, without a second error at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return Exit.FAILED
    except OrchestratorError as exc:  # eval's and the janitor's own (the others are reported by ``_run``)
        return out.error(exc)
    except Exception as exc:
        return _unexpected(out, exc, verbose=args.verbose)


def _run(args: argparse.Namespace, out: Output) -> int:
    from ..config import Settings
    from .commands import Context

    try:
        settings = Settings.from_env()
        if getattr(args, "base", None):
            settings = settings.replace(base_image=args.base)
    except OrchestratorError as exc:
        return out.error(exc)
    ctx = Context(settings, out, connect)
    try:
        return int(args.func(ctx, args))
    except OrchestratorError as exc:
        return out.error(exc)
    except (KeyboardInterrupt, BrokenPipeError):
        raise
    except Exception as exc:
        return _unexpected(out, exc, verbose=args.verbose)
    finally:
        ctx.close()


def _unexpected(out: Output, exc: Exception, *, verbose: bool) -> int:
    """A bug: still one line, the traceback with -v."""
    if verbose:  # its messages may quote the sandbox
        out.stderr.write(visible(traceback.format_exc()))
    return out.error(exc, hint="" if verbose else " (unexpected: run with -v for the traceback)")
