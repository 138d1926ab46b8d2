"""``orchestrator mcp``: serve persistent sessions to an MCP client, over stdio or streamable HTTP (docs/mcp.md)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from ..api.tools import DEFAULT_ANSWER_CHARS, MIN_ANSWER_CHARS
from ..bearer import RULE, acceptable
from ..errors import ConfigError
from ..extras import needs
from ..mcp import EXTRA, NEEDS
from ..mcp.seats import Seats
from ..mcp.workspace import DEFAULT_MAX_CONTEXT_BYTES, DEFAULT_MAX_SESSIONS, Binding, Limits, Workspace
from ..units import positive_duration_argument, size_argument
from .commands import Context

TOKEN_VARIABLE = "ORCH_MCP_TOKEN"
"""The bearer token of the HTTP transport; without it the server makes one and prints it on stderr."""
DEFAULT_PORT = 8765
DEFAULT_MAX_CLIENTS = 32
"""The most MCP sessions an HTTP server keeps open (the SDK's own default is 10,000)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``orchestrator mcp``."""
    parser.add_argument(
        "--session",
        metavar="ID",
        help="use this stored session (created when missing); it survives the client (default: a new session, "
        "removed when the client goes)",
    )
    parser.add_argument("--force", action="store_true", help="take --session even from a live controller that holds it")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="when the client goes, leave the sessions it made running (detached) instead of removing them",
    )
    parser.add_argument(
        "--image", help="the sandbox image of new sessions, one `image build` made (default: the one it makes)"
    )
    parser.add_argument(
        "--allow-files",
        dest="file_roots",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="add_context may read files under DIR (repeatable; default: none, only text)",
    )
    parser.add_argument(
        "--max-context-bytes",
        type=size_argument,
        default=DEFAULT_MAX_CONTEXT_BYTES,
        metavar="SIZE",
        help="the largest file add_context reads (default 16MiB)",
    )
    parser.add_argument(
        "--max-timeout", type=positive_duration_argument, metavar="S", help="the most seconds a call may ask for"
    )
    parser.add_argument(
        "--max-answer-chars",
        type=int,
        default=DEFAULT_ANSWER_CHARS,
        metavar="N",
        help=f"the most characters of one answer (default {DEFAULT_ANSWER_CHARS}; at least {MIN_ANSWER_CHARS})",
    )
    parser.add_argument(
        "--max-sessions",
        type=int,
        default=DEFAULT_MAX_SESSIONS,
        metavar="N",
        help=f"the most sandbox sessions the server holds, every client's forks included (default "
        f"{DEFAULT_MAX_SESSIONS})",
    )
    parser.add_argument(
        "--max-clients",
        type=int,
        default=DEFAULT_MAX_CLIENTS,
        metavar="N",
        help=f"--http: the most MCP sessions open at once (default {DEFAULT_MAX_CLIENTS})",
    )
    parser.add_argument(
        "--http",
        action="store_true",
        help=f"serve streamable HTTP at /mcp instead of stdio (bearer token: ${TOKEN_VARIABLE}, or one printed)",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="the address --http binds (default 127.0.0.1: this machine only)"
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the port of --http (default {DEFAULT_PORT})")


def run(ctx: Context, args: argparse.Namespace) -> int:
    """Serve until the client goes (stdio: its pipe closes) or SIGINT/SIGTERM, then let go of the sessions."""
    with needs(EXTRA, NEEDS):  # anyio too: the SDK brings it, and a user without the extra misses it first
        import anyio

        from ..mcp.clients import Clients
        from ..mcp.server import IDLE_AFTER, build_server, serve_http
    limits = _limits(args)
    seats = Seats(limits.max_sessions)  # one count for every client's workspace
    token, made = _token() if args.http else ("", False)
    if args.http and not 0 < args.port < 65536:
        raise ConfigError(f"--port must be a port number (1-65535), got {args.port}")

    def workspace() -> Workspace:
        binding = Binding(
            named=args.session, force=args.force, keep=args.keep, image=args.image, labels=dict(args.labels)
        )
        return Workspace(ctx.orch, limits, binding, seats=seats)

    # A named session has one holder: every HTTP client then shares it (docs/mcp.md, "Streamable HTTP").
    clients = Clients(workspace, per_session=args.http and args.session is None, idle_after=IDLE_AFTER)
    with _terminate_as_interrupt():
        try:
            clients.shared.open()
            server = build_server(clients)
            if args.http:
                _announce(args.host, args.port, token if made else None)
                try:
                    serve = (server, clients, token, args.host, args.port, args.max_clients)
                    _serve_until_stopped(lambda: anyio.run(serve_http, *serve))
                except SystemExit:  # uvicorn's way to say it could not listen (its error is on stderr)
                    raise ConfigError(
                        f"could not serve on {args.host} port {args.port} (see the error above)"
                    ) from None
            else:
                _serve_until_stopped(lambda: server.run("stdio"))
        except KeyboardInterrupt:
            pass
        finally:
            clients.close()
    return 0


def _serve_until_stopped(serve: Callable[[], None]) -> None:
    """Run ``serve`` on a thread of its own until it returns (stdio: the client closed the pipe), or until SIGINT or
    SIGTERM (``KeyboardInterrupt`` here), which the server's thread may not see: a thread blocked reading stdin
    would keep it from ever ending. Its failure is raised here."""
    failures: list[BaseException] = []

    def target() -> None:
        try:
            serve()
        except BaseException as exc:  # reported on the main thread
            failures.append(exc)

    thread = threading.Thread(target=target, name="mcp-server", daemon=True)
    thread.start()
    thread.join()
    if failures:
        raise failures[0]


def _limits(args: argparse.Namespace) -> Limits:
    if args.max_answer_chars < MIN_ANSWER_CHARS:
        raise ConfigError(f"--max-answer-chars must be at least {MIN_ANSWER_CHARS}, got {args.max_answer_chars}")
    if args.max_sessions < 1:
        raise ConfigError(f"--max-sessions must be at least 1, got {args.max_sessions}")
    if args.max_clients < 1:
        raise ConfigError(f"--max-clients must be at least 1, got {args.max_clients}")
    roots = []
    for root in args.file_roots:
        resolved = Path(os.path.realpath(os.path.expanduser(root)))
        if not resolved.is_dir():
            raise ConfigError(f"--allow-files {root}: not a directory")
        roots.append(resolved)
    return Limits(
        max_timeout=args.max_timeout,
        max_answer_chars=args.max_answer_chars,
        max_sessions=args.max_sessions,
        max_context_bytes=args.max_context_bytes,
        file_roots=tuple(roots),
    )


def _token() -> tuple[str, bool]:
    """The bearer token, and whether it was made here (then it is printed: the user has no other way to learn it)."""
    given = os.environ.get(TOKEN_VARIABLE)
    if given is None:
        return secrets.token_urlsafe(32), True
    if not acceptable(given):
        raise ConfigError(f"${TOKEN_VARIABLE} must be {RULE}")
    return given, False


def _announce(host: str, port: int, token: str | None) -> None:
    """Tell the user where the server is (stderr: stdout is nobody's here), and a token it made."""
    if not _is_loopback(host):
        print(
            f"orchestrator mcp: warning: {host} is not a loopback address: other machines can reach this server",
            file=sys.stderr,
        )
    shown = f"[{host}]" if ":" in host else host
    print(f"orchestrator mcp: serving http://{shown}:{port}/mcp", file=sys.stderr)
    if token is not None:
        print(f"orchestrator mcp: token (set ${TOKEN_VARIABLE} to choose one): {token}", file=sys.stderr)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (a client stopping its server) ends the serving like Ctrl-C, so the sessions are let go of."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
