"""The commands of ``orchestrator`` and their arguments, as one table that ``build_parser`` turns into argparse.

Every command imports this module, ``--version`` and ``--help`` too: it imports only what parsing needs. A
command's module (and the API, rich, the Docker SDK behind it) is imported when that command runs, and the
options that other modules define (eval, janitor, mcp) when that command is parsed (``_Parser``'s ``setup``).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from typing import Any, NamedTuple, NoReturn

from ..spelling import did_you_mean
from ..units import duration_argument, positive_duration_argument
from . import filters
from .labels import stored_key
from .output import EXIT_HELP, Exit

Argument = Callable[[argparse.ArgumentParser], object]
"""Adds one argument (or a group of them) to a command's parser."""


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's one-line errors; ``setup`` adds a command's options when it is parsed or its help
    shown (they come from a module that costs to import)."""

    def __init__(self, *args: Any, setup: Argument | None = None, **kwargs: Any):
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
        function: Callable[..., int] = getattr(importlib.import_module(f".{self.module}", __package__), self.name)
        return function

    def __call__(self, *args: Any) -> int:
        return self.target()(*args)


class Spec(NamedTuple):
    """One command of the table: what ``--help`` says of it, the function it runs and its arguments, in help order."""

    name: str
    help: str
    run: Command | None = None
    """None for a command whose ``setup`` sets the function, or a group's."""
    arguments: tuple[Argument, ...] = ()
    aliases: tuple[str, ...] = ()
    options: str = "printing"
    """The options it shares: ``printing`` (``--json``, ``-v``, ``--log-json``), ``common`` (the last two) or
    ``own`` (none, nor the exit statuses)."""
    setup: Argument | None = None
    """Adds its options from their own module, when it is parsed."""
    description: str = ""
    """Its help's first line, when not ``help``."""
    commands: tuple[Spec, ...] = ()
    """A group's commands (``image build``)."""


def _arg(*flags: str, **options: Any) -> Argument:
    """One argument, as ``add_argument`` takes it."""
    return lambda parser: parser.add_argument(*flags, **options)


def _at_least(least: int, what: str) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``least``, or a usage error saying it is not ``what``."""

    def parse(text: str) -> int:
        try:
            number = int(text)
        except ValueError:
            number = least - 1
        if number < least:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return number

    return parse


_generation = _at_least(0, "a generation (an integer >= 0; `history ID` lists them)")
_count = _at_least(1, "a number of forks (1 or more)")
_lines = _at_least(1, "a number of lines (1 or more) or 'all'")


def _tail(text: str) -> int | None:
    return None if text == "all" else _lines(text)


def _label(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return stored_key(key), value


def _labels(what: str) -> Argument:
    return _arg(
        "--label",
        dest="labels",
        type=_label,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"a label to keep with {what}, as docker takes one (team=a); repeatable",
    )


def _sandbox_text(default: str) -> Argument:
    """``--raw`` / ``--escape``: how text the sandbox made reaches the terminal (docs/cli.md, "Text from a sandbox")."""

    def add(parser: argparse.ArgumentParser) -> None:
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

    return add


def _timeout(what: str) -> Argument:
    return _arg("--timeout", type=positive_duration_argument, metavar="S", help=f"seconds (or 90s, 5m) {what} may run")


ID = _arg("session_id", metavar="ID")
IDS = _arg("session_ids", metavar="ID", nargs="+")
CODE = _arg("code", metavar="CODE", help="Python source; '-' reads it from standard input")
FORCE = _arg(  # take a session a live controller holds (its running call is stopped, its handle goes stale)
    "--force",
    action="store_true",
    help="take the session even from a live controller that holds it (its running call is stopped and lost)",
)
WAIT = (  # exec's and shell's: two terminals on one session take turns
    _arg(
        "--wait",
        type=duration_argument,
        metavar="D",
        default=600.0,
        help="while another call holds the session, wait up to D for its turn (default 10m)",
    ),
    _arg(
        "--no-wait",
        dest="wait",
        action="store_const",
        const=0.0,
        help="fail at once (exit 5) while another call holds the session",
    ),
)
NEW = (  # create's and run's
    _arg("--name", metavar="ID", help="the session's id (3-63 lowercase letters, digits, dashes)"),
    _arg(
        "--image",
        help="a sandbox image, one `image build` made (default: the one it makes); for a base image with python3, "
        "run `image build --base BASE` first and pass the tag it prints",
    ),
    _labels("the session"),
    _arg("-q", "--quiet", action="store_true", help="print only the id (create) or the output (run)"),
)
FILTER = _arg(
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
    _labels("each session it creates")(parser)
    parser.set_defaults(func=mcp_command.run)


# The table: one row a command, in the order `orchestrator --help` lists them. (A table, not code: the commands'
# help and arguments read as data, and the one function that builds them is below.)
COMMANDS = (
    Spec(
        "ls",
        "list stored sessions: id, state, image, age, idle, cpu, memory, checkpoint size",
        Command("commands", "ls"),
        (
            _arg("-q", "--quiet", action="store_true", help="print only the ids, one a line"),
            FILTER,
            _arg(
                "--format",
                choices=("table", "json"),
                default="table",
                help="table (default) or json (the same as --json)",
            ),
        ),
        aliases=("list",),
    ),
    Spec(
        "inspect", "show everything known of one session (without touching it)", Command("commands", "inspect"), (ID,)
    ),
    Spec(
        "exec",
        "run CODE in a session and print its output; exit 1 when the code raised "
        "(while another call holds the session, it waits its turn: --wait, --no-wait, --force)",
        Command("commands", "exec_code"),
        (ID, CODE, _timeout("the cell"), _sandbox_text("auto"), FORCE, *WAIT),
    ),
    Spec("create", "start a session and leave it running; print its id", Command("commands", "create"), NEW),
    Spec(
        "run",
        "start a session and run CODE in it, like exec (the session keeps running unless --rm); exit status as exec",
        Command("commands", "run"),
        (
            *NEW,
            CODE,
            _timeout("the cell"),
            _arg("--rm", action="store_true", help="remove the session when the cell has run"),
            _sandbox_text("auto"),
        ),
    ),
    Spec(
        "fork",
        "new sessions with the state of session ID (its last committed generation, or --at GEN), left running; "
        "print their ids, one a line (ID is only read: it may be held or busy)",
        Command("commands", "fork"),
        (
            ID,
            _arg("-n", "--count", type=_count, metavar="N", help="how many forks (default 1, or one per --name)"),
            _arg(
                "--name",
                dest="names",
                action="append",
                default=[],
                metavar="ID",
                help="a fork's id (3-63 lowercase letters, digits, dashes); repeatable, one per fork",
            ),
            _arg(
                "--at", type=_generation, metavar="GEN", help="fork from this kept generation (`history ID` lists them)"
            ),
            _labels("each fork, added to ID's labels"),
            _arg("-q", "--quiet", action="store_true", help="print only the ids (no note on stderr)"),
        ),
    ),
    Spec(
        "history",
        "list the generations a session keeps for rewind and fork --at (without touching it)",
        Command("commands", "history"),
        (ID,),
    ),
    Spec(
        "rewind",
        "bring a session back to the state of a kept generation, as a new generation; print its number "
        "(refused while a live controller holds the session, unless --force)",
        Command("commands", "rewind"),
        (ID, _arg("generation", metavar="GEN", type=_generation, help="a generation `history ID` lists"), FORCE),
    ),
    Spec(
        "shell",
        "an interactive Python prompt in a session (Ctrl-D detaches; the session keeps running; "
        "waits its turn like exec while another call holds the session)",
        Command("shell", "shell"),
        (ID, _timeout("each input"), _sandbox_text("auto"), FORCE, *WAIT),
    ),
    # hibernating never takes a session: it refuses a busy one
    Spec(
        "hibernate", "remove sessions' containers and keep their checkpoints", Command("commands", "hibernate"), (IDS,)
    ),
    Spec(
        "resume",
        "start hibernated sessions' containers now and restore them",
        Command("commands", "resume"),
        (IDS, FORCE),
    ),
    Spec("rm", "remove sessions: containers and stored state", Command("commands", "rm"), (IDS, FORCE)),
    Spec(
        "logs",
        "print a session's container log (what cells wrote to the process's own stderr or stdout; the agent's "
        "messages with --agent), or with --output the whole outputs the host kept of its calls; -f follows",
        Command("logs", "run"),
        (
            ID,
            _arg("--tail", type=_tail, default=200, metavar="N", help="last N lines, or 'all' (default 200)"),
            _arg(
                "-f",
                "--follow",
                action="store_true",
                help="then print new lines as they come, across restarts, until the session is removed or Ctrl-C",
            ),
            _arg(
                "--output",
                action="store_true",
                help="the files where the host kept the whole stdout/stderr of calls past ORCH_MAX_OUTPUT_BYTES",
            ),
            _arg(
                "--agent",
                action="store_true",
                help="also the agent's own lines ('orchestrator agent: connection ended ...'), "
                "for debugging the sandbox",
            ),
            _sandbox_text("escape"),
        ),
    ),
    Spec(
        "prune",
        "remove (or hibernate) stale sessions and what crashed controllers left behind; asks first "
        "on a terminal (--yes does not)",
        Command("commands", "prune"),
        (
            _arg("--idle", type=duration_argument, metavar="D", help="stale after D without a call (30m, 2h, 1d)"),
            _arg("--older-than", type=duration_argument, metavar="D", help="stale when created more than D ago (24h)"),
            _arg("--hibernate-only", action="store_true", help="hibernate stale sessions instead of removing"),
            _arg(
                "--orphans",
                action="store_true",
                help="the criterion when no session is stale: clean only what crashed controllers left "
                "(always cleaned)",
            ),
            _arg("--dry-run", action="store_true", help="print what would be done; change nothing"),
            _arg("-y", "--yes", action="store_true", help="do not ask (needed without a terminal, unless --dry-run)"),
        ),
    ),
    Spec(
        "eval",
        "grade a JSONL file of untrusted submissions, each in a fresh sandbox (docs/eval.md)",
        setup=_eval_options,
    ),
    Spec(
        "janitor",
        "run pruning on an interval until SIGTERM (the compose service)",
        options="own",
        setup=_janitor_options,
    ),
    Spec(
        "image",
        "sandbox image commands",
        options="common",
        commands=(
            Spec(
                "build",
                "build (or reuse) the sandbox image; prints its tag",
                Command("commands", "image_build"),
                (
                    _arg(
                        "--base",
                        help="base image with python3 (default: ORCH_BASE_IMAGE, the recorded default, "
                        "or python:3.12-slim)",
                    ),
                    _arg("--rebuild", action="store_true", help="build even if the image exists"),
                    _arg(
                        "--make-default",
                        action="store_true",
                        help="record the base image as the default of later runs on this state dir "
                        "(no ORCH_BASE_IMAGE needed)",
                    ),
                ),
                description="build (or reuse) the sandbox image on the base image; prints its tag",
            ),
        ),
    ),
    Spec(
        "mcp",
        "serve persistent sessions to an MCP client (stdio, or --http on loopback with a token); docs/mcp.md",
        options="common",
        setup=_mcp_options,
    ),
    Spec("demo", "show a session surviving a killed container", Command("commands", "demo"), options="common"),
)


def add_commands(sub: Any, specs: tuple[Spec, ...], shared: dict[str, list[argparse.ArgumentParser]]) -> None:
    """Add each command of ``specs`` to the subparsers ``sub``; ``shared`` holds the parents of each ``options``."""
    for spec in specs:
        if spec.commands:  # a group: its bare name prints its help, as `orchestrator` does
            group = sub.add_parser(spec.name, help=spec.help, parents=shared[spec.options])
            group.set_defaults(func=None, help_of=group)
            add_commands(group.add_subparsers(dest=f"{spec.name}_command", metavar="COMMAND"), spec.commands, shared)
            continue
        formatted = {} if spec.options == "own" else {"epilog": EXIT_HELP, "formatter_class": RAW}
        parser = sub.add_parser(
            spec.name,
            help=spec.help,
            description=spec.description or spec.help,
            aliases=list(spec.aliases),
            parents=shared[spec.options],
            setup=spec.setup,
            **formatted,
        )
        for argument in spec.arguments:
            argument(parser)
        if spec.run is not None:
            parser.set_defaults(func=spec.run)


RAW = argparse.RawDescriptionHelpFormatter
"""The help's layout: descriptions and epilogs (the exit statuses) as written."""
