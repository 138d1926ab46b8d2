"""The HTTP server of ``/metrics``, bounded: whoever can connect costs the controller at most a few threads and
descriptors, for at most a few seconds each.

``prometheus_client``'s own server gives every connection a thread that waits for the request as long as the
client likes: 500 idle connections from any local user held 500 threads and descriptors of the controller. Here
every connection has a deadline (``READ_TIMEOUT``, for reading the request and writing the answer together; a
connection past it is shut down), and at most ``MAX_CONNECTIONS`` are served at once. Past the cap the oldest
connection that has not yet sent its whole request is shut down to make room (a scraper sends its request at
once: an idle connection is the one that goes); when every place is a request being answered, or as many
connections shut down are still winding down, the new one is closed unread. So handler threads and their
descriptors never exceed twice the cap. With a token (``Settings.metrics_token``) a request without
``Authorization: Bearer <token>`` gets 401, checked as ``orchestrator mcp --http`` checks its own
(``bearer.Bearer``).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterable
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from .bearer import REFUSAL, Bearer

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment
    from prometheus_client.registry import CollectorRegistry

logger = logging.getLogger(__name__)

READ_TIMEOUT = 10.0
"""Seconds a connection may take to send its request and receive the answer."""
MAX_CONNECTIONS = 32
"""Connections served at once (a scraper needs one at a time)."""


class _Connection:
    """What the server knows of one connection it serves."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.reading = True  # it has not sent its whole request yet
        self.ended = False  # shut down by the server (past its deadline, or to make room): its thread is ending


class BoundedServer(ThreadingMixIn, WSGIServer):
    """A WSGI server with a deadline per connection and a cap on connections (the module's docstring)."""

    daemon_threads = True
    request_queue_size = 128  # the kernel's queue of connections not yet accepted (socketserver's 5 drops a burst)

    def __init__(self, host: str, port: int, app: WSGIApplication, *, cap: int, timeout: float) -> None:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        self.address_family = family
        self.cap = cap
        self.timeout_seconds = timeout
        self._lock = threading.Lock()
        self._live: dict[Any, _Connection] = {}
        super().__init__((str(address[0]), int(address[1])), _Handler)
        self.set_app(app)

    def process_request(self, request: Any, client_address: Any) -> None:
        """On the serving thread: admit the connection (making room if an idle one holds it), or close it."""
        with self._lock:
            self._end_late(time.monotonic())
            admitted = self._admit(request)
        if not admitted:
            logger.debug("metrics: %d connections served already: one from %s closed", self.cap, client_address)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def service_actions(self) -> None:
        """On the serving thread, between connections (every half second when idle): end those past their time."""
        with self._lock:
            self._end_late(time.monotonic())

    def shutdown_request(self, request: Any) -> None:
        """The connection is done (its thread ends, or it was never admitted): its place is free."""
        with self._lock:
            self._live.pop(request, None)
        super().shutdown_request(request)

    def request_read(self, request: Any) -> None:
        """Its whole request has come: it is being answered, no longer an idle connection to make room with."""
        with self._lock:
            held = self._live.get(request)
            if held is not None:
                held.reading = False

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that timed out or broke: the client's business, not worth a traceback on stderr."""
        logger.debug("metrics: a connection from %s failed", client_address, exc_info=True)

    def _admit(self, request: Any) -> bool:
        held = [(connection.deadline, sock) for sock, connection in self._live.items() if not connection.ended]
        if len(held) >= self.cap:
            if len(self._live) - len(held) >= self.cap:
                return False  # as many shut down and still ending: wait for them
            idle = [(deadline, sock) for deadline, sock in held if self._live[sock].reading]
            if not idle:
                return False
            self._end(min(idle, key=lambda pair: pair[0])[1])
        self._live[request] = _Connection(time.monotonic() + self.timeout_seconds)
        return True

    def _end_late(self, now: float) -> None:
        for sock, connection in list(self._live.items()):
            if not connection.ended and now > connection.deadline:
                self._end(sock)

    def _end(self, sock: Any) -> None:
        """Shut the connection down: its thread's read or write returns at once and the thread ends."""
        self._live[sock].ended = True
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class _Handler(WSGIRequestHandler):
    """One request per connection (HTTP/1.0), each read and write within the server's timeout; nothing logged."""

    server: BoundedServer

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.timeout_seconds)

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        if parsed:
            self.server.request_read(self.request)
        return parsed

    def log_message(self, format: str, *args: Any) -> None:
        """Every request would be a line on stderr (the base class's habit)."""


def metrics_app(registry: CollectorRegistry, token: str | None) -> WSGIApplication:
    """``prometheus_client``'s ``/metrics`` app, behind ``token`` when one is given."""
    from prometheus_client import make_wsgi_app

    app = make_wsgi_app(registry)
    if token is None:
        return app
    bearer = Bearer(token)

    def guarded(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if bearer.admits(environ.get("HTTP_AUTHORIZATION")):
            served: Iterable[bytes] = app(environ, start_response)
            return served
        start_response(
            "401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"), ("WWW-Authenticate", "Bearer")]
        )
        return [REFUSAL.encode()]

    return guarded
