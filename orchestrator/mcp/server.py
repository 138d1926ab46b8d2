"""The MCP server: a client's ``Workspace`` calls as tools of the official ``mcp`` SDK, over stdio or streamable HTTP.

Each tool finds the calling client's workspace (``Clients``) and runs its blocking call on a
worker thread (``anyio.to_thread``), so a long cell does not stop the server from answering.
Over HTTP every request must carry the bearer token (``BearerToken``, compared in constant
time) before the SDK sees it; the server binds to loopback unless told otherwise.
"""

# No "from __future__ import annotations": the SDK reads the tools' annotations, some made in _add_cell_tools.

import functools
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import anyio
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http_manager import DEFAULT_SESSION_IDLE_TIMEOUT
from mcp.types import ToolAnnotations
from pydantic import Field
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from .. import __version__
from ..bearer import REFUSAL, Bearer
from .clients import SESSION_HEADER, Clients
from .workspace import Workspace

_T = TypeVar("_T")

INSTRUCTIONS = (
    "A persistent Python session in a sandbox (no network). Variables, imports and functions stay from one "
    "execute_code call to the next, and survive the sandbox being restarted. fork_session copies a session; "
    "history and rewind go back to an earlier state; undo_last_cell takes back your last call that changed variables."
)

SessionArg = Annotated[
    str | None,
    Field(
        description="One of your sessions (fork_session makes more; list_sessions lists them); "
        "leave out for your default session."
    ),
]


IDLE_AFTER = DEFAULT_SESSION_IDLE_TIMEOUT
"""Seconds after which the SDK drops an HTTP client's idle MCP session (30 minutes); its sessions go then too."""


def build_server(clients: Clients) -> MCPServer[Any]:
    """The MCP server whose tools act on the sessions of the client that calls them (``clients``)."""
    server: MCPServer[Any] = MCPServer(
        "orchestrator", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING"
    )

    def tool(name: str, description: str, *, read_only: bool = False) -> Callable[[Callable[..., Any]], Any]:
        annotations = ToolAnnotations(read_only_hint=read_only, destructive_hint=False, open_world_hint=False)
        return server.tool(name=name, description=description, annotations=annotations, structured_output=False)

    _add_cell_tools(tool, clients)
    _add_session_tools(tool, clients)
    return server


_Tool = Callable[..., Callable[[Callable[..., Any]], Any]]
"""Registers a tool with the server: ``tool(name, description, read_only=False)`` as a decorator."""


def _add_cell_tools(tool: _Tool, clients: Clients) -> None:
    """The tools that run code in a session and read or change its variables."""
    limit = clients.shared.limits.max_timeout
    most = f" (at most {limit:g})" if limit is not None else ""

    @tool(
        "execute_code",
        "Run Python code in a persistent Python session in a sandbox (no network). Variables, imports and functions "
        "stay from one call to the next. Returns what the code printed, the value of a final expression (as in a "
        "REPL), and for an error its type, message, line, column and traceback.",
    )
    async def execute_code(
        ctx: Context,
        code: Annotated[str, Field(description="The Python code to run.")],
        timeout_seconds: Annotated[
            float | None, Field(description=f"Seconds the code may run{most}; the session's default when left out.")
        ] = None,
        session: SessionArg = None,
    ) -> str:
        workspace = await _on(clients, ctx, lambda w: w)
        try:
            return await anyio.to_thread.run_sync(
                functools.partial(workspace.execute, code, timeout_seconds, session), abandon_on_cancel=True
            )
        except anyio.get_cancelled_exc_class():  # the client cancelled the call (or went): the cell is stopped
            workspace.interrupt(session)
            raise

    @tool(
        "reset_repl",
        "Reset the Python session: clears all variables, imports and functions. The sandbox keeps running.",
    )
    async def reset_repl(ctx: Context, session: SessionArg = None) -> str:
        return await _on(clients, ctx, lambda w: w.reset(session))

    @tool(
        "undo_last_cell",
        "Undo your last execute_code (or reset_repl) call that changed variables: they go back to what they were "
        "before it. Call it again to undo the call before that one. Only variables are undone.",
    )
    async def undo_last_cell(ctx: Context, session: SessionArg = None) -> str:
        return await _on(clients, ctx, lambda w: w.undo(session))

    @tool(
        "list_variables",
        "List the variable names the session holds (saved, so they survive a restart).",
        read_only=True,
    )
    async def list_variables(ctx: Context, session: SessionArg = None) -> str:
        return await _on(clients, ctx, lambda w: w.list_variables(session))

    @tool(
        "add_context",
        "Load a context into the session as the variable context_<n> (the first also as context): either the "
        "text given, or a file on the server's machine read by the server (only under the directories its user "
        "allowed). A UTF-8 file becomes a str, any other a bytes.",
    )
    async def add_context(
        ctx: Context,
        text: Annotated[str | None, Field(description="The context itself.")] = None,
        path: Annotated[str | None, Field(description="A file to read instead of text.")] = None,
        session: SessionArg = None,
    ) -> str:
        return await _on(clients, ctx, lambda w: w.add_context(text, path, session))


def _add_session_tools(tool: _Tool, clients: Clients) -> None:
    """The tools of a client's sessions: forks, the generations each keeps, and rewinding to one."""

    @tool(
        "fork_session",
        "Copy a session (its variables, at its current state or a kept generation) into a new session of yours, "
        "to try something without touching the original. Returns the new session's name, for the session argument.",
    )
    async def fork_session(
        ctx: Context,
        session: SessionArg = None,
        at: Annotated[
            int | None, Field(description="A generation the session keeps (history lists them); default: now.", ge=0)
        ] = None,
    ) -> str:
        return await _on(clients, ctx, lambda w: w.fork(session, at))

    @tool(
        "history",
        "List the earlier states (generations) the session keeps, for rewind and fork_session.",
        read_only=True,
    )
    async def history(ctx: Context, session: SessionArg = None) -> str:
        return await _on(clients, ctx, lambda w: w.history(session))

    @tool(
        "rewind",
        "Bring the session's variables back to a generation history lists (as a new generation: nothing is lost).",
    )
    async def rewind(
        ctx: Context,
        generation: Annotated[int, Field(description="The generation to go back to.", ge=0)],
        session: SessionArg = None,
    ) -> str:
        return await _on(clients, ctx, lambda w: w.rewind(generation, session))

    @tool("list_sessions", "List your sessions: the default one and the forks you made.", read_only=True)
    async def list_sessions(ctx: Context) -> str:
        return await _on(clients, ctx, lambda w: w.sessions())

    @tool("close_session", "Remove one of your forks (its sandbox and its stored state) when you are done with it.")
    async def close_session(ctx: Context, session: Annotated[str, Field(description="The fork to remove.")]) -> str:
        return await _on(clients, ctx, lambda w: w.close_session(session))


async def _on(clients: Clients, ctx: Context, call: Callable[[Workspace], _T]) -> _T:
    """``call`` on the workspace of the client that sent the request, on a worker thread (both may block)."""
    headers = ctx.headers
    return await anyio.to_thread.run_sync(lambda: call(clients.of(headers)))


class BearerToken:
    """ASGI middleware: an HTTP request without ``Authorization: Bearer <token>`` gets 401, and reaches nothing."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self._app = app
        self._bearer = Bearer(token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = next((value for key, value in scope["headers"] if key == b"authorization"), None)
            if not self._bearer.admits(given):
                refusal = PlainTextResponse(REFUSAL, status_code=401, headers={"WWW-Authenticate": "Bearer"})
                await refusal(scope, receive, send)
                return
        await self._app(scope, receive, send)


class SessionEnds:
    """ASGI middleware: a ``DELETE`` of an MCP session (the client ends it) closes that client's workspace too."""

    def __init__(self, app: ASGIApp, clients: Clients) -> None:
        self._app = app
        self._clients = clients

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "DELETE":  # before the reply: the client sees them gone
            key = next((value for name, value in scope["headers"] if name == SESSION_HEADER.encode()), None)
            if key is not None:
                await anyio.to_thread.run_sync(self._clients.end, key.decode("latin-1"))
        await self._app(scope, receive, send)


def http_app(server: MCPServer[Any], clients: Clients, token: str, host: str, max_clients: int) -> ASGIApp:
    """The streamable HTTP app at ``/mcp``, behind the bearer token (DNS-rebinding checks on for a loopback host).

    At most ``max_clients`` MCP sessions are open at once: the SDK answers a request that would open another one
    503 with a JSON-RPC error ("Too many open sessions")."""
    app = server.streamable_http_app(host=host, session_idle_timeout=IDLE_AFTER, max_sessions=max_clients)
    return BearerToken(SessionEnds(app, clients), token)


async def serve_http(
    server: MCPServer[Any], clients: Clients, token: str, host: str, port: int, max_clients: int
) -> None:
    """Serve streamable HTTP on ``host:port`` until the process ends."""
    import uvicorn

    app = http_app(server, clients, token, host, max_clients)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning")
    await uvicorn.Server(config).serve()
