"""The ``orchestrator`` command: create, list, inspect, use, follow, fork, rewind, hibernate, resume, remove, prune.

Human-readable by default, --json on every command that prints; each error is one line on
stderr and has its own exit status (below; docs/cli.md has the whole guide).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .. import __version__
from ..errors import OrchestratorError
from ..safe_text import log_to_stderr, visible
from .output import EXIT_HELP, Exit, Output
from .parser import COMMANDS, RAW, _Parser, add_commands

if TYPE_CHECKING:
    from ..api.manager import Orchestrator
    from ..config import Settings

__all__ = ["build_parser", "main"]

# Every command imports this module, ``--version`` and ``--help`` too: it imports only what parsing needs
# (``parser``'s table of commands says how the rest is imported when needed).


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command (``func`` in the namespace runs the command)."""
    description = (__doc__ or "").replace("``", "")  # the docstring's reST literals, as plain text for a terminal
    parser = _Parser(prog="orchestrator", description=description, epilog=EXIT_HELP, formatter_class=RAW)
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
    add_commands(sub, COMMANDS, {"printing": [printing], "common": [common], "own": []})
    return parser


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
