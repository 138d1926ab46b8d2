"""The node relay: the sandboxes' channel directories on one Swarm node, bridged to controllers over mutual TLS.

On a Swarm a sandbox runs on some node, away from its controller. Each node runs one relay
(``python3 -m orchestrator_agent.node_relay`` in our sandbox image; root; host network), which does
there what ``UnixSocketEndpoint`` does on the controller's host: ``<ORCH_RELAY_DIR>/<sandbox_id>/``
with a fresh secret and a listening socket owned by the sandbox's uid (``rendezvous.py``), which
the sandbox bind-mounts read-only. Controllers reach it over TLS only, with a client certificate
from our CA (``orchestrator/backends/swarm/tls.py``): there is no plaintext and no unauthenticated port.

Each connection carries one JSON line from the controller (at most ``MAX_REQUEST`` bytes) and
gets one back, ``{"ok": true, ...}`` or ``{"ok": false, "error": "<sentence>", "kind": "<word>"}``:

========  ==================================================  =========================================
op        request fields                                      reply
========  ==================================================  =========================================
create    ``sandbox``, ``uid``, ``gid`` (int or null)         ``secret``: a new directory's, hex
open      ``sandbox``, ``uid``, ``gid``                       ``secret``; takeover: a new socket renamed
                                                              over the old one, and the agent side of
                                                              every bridge of the sandbox closed, so its
                                                              agent reconnects there
accept    ``sandbox``, ``timeout`` (seconds)                  when an agent of the sandbox's uid connects;
                                                              then raw bytes both ways until either side
                                                              closes (which closes the other)
remove    ``sandbox``                                         the directory deleted (missing is fine)
list      (none)                                              ``sandboxes``: each id present -> its age,
                                                              seconds since its directory last changed
                                                              (made, taken over, or listened in again by
                                                              a restarted relay) by this node's clock, so
                                                              a controller can tell a leftover from a
                                                              directory being made now
usage     ``containers``: up to ``MAX_USAGE_IDS`` full            ``usage``: each of them the node's cgroups
          container ids of this node                          know -> ``[memory bytes, CPU seconds]``
                                                              (either null when unknown), read from the
                                                              node's cgroup root (``ORCH_RELAY_CGROUP``)
========  ==================================================  =========================================

Refusal kinds: ``invalid`` (a bad request), ``exists``, ``missing``, ``unusable`` (the directory
cannot be trusted or made), ``timeout`` (no agent came), ``taken_over`` / ``removed`` (while an
accept waited), ``failed`` (the relay itself).

The relay forwards bytes and never parses them: the secret handshake stays end to end between
the controller and the agent. It holds nothing that matters for recovery: on start it listens
again in every sandbox directory it finds, so agents whose relay restarted reconnect at once.
Standard library only, Python 3.9+.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import signal
import socket
import ssl
import stat
import struct
import sys
import time
from pathlib import Path
from typing import Any, Deque, Dict, List, Mapping, Optional, Set, Tuple

from . import handshake, rendezvous
from .bridge import READ, WRITE, Bridge
from .usage import CGROUP_ROOT, CONTAINER_ID, MAX_USAGE_IDS, container_usage

logger = logging.getLogger("orchestrator.relay")

DEFAULT_LISTEN = "0.0.0.0:7443"
DEFAULT_DIR = "/relay"
DEFAULT_CERT = "/run/secrets/relay.crt"
DEFAULT_KEY = "/run/secrets/relay.key"
DEFAULT_CA = "/run/secrets/ca.crt"
MAX_REQUEST = 4096
"""Longest request line, newline included."""
HANDSHAKE_SECONDS = 10.0
"""For the TLS handshake, and again for the request line after it."""
MAX_CONNECTIONS = 1024
"""Controller connections at once (bridges included; ``ORCH_RELAY_MAX_CONNECTIONS``); more are closed as they
come."""
MAX_ACCEPT_SECONDS = 3600.0

OPS = ("create", "open", "accept", "remove", "list", "usage")
_FIELDS = {
    "create": {"sandbox", "uid", "gid"},
    "open": {"sandbox", "uid", "gid"},
    "accept": {"sandbox", "timeout"},
    "remove": {"sandbox"},
    "list": set(),
    "usage": {"containers"},
}
_SETTING = "ORCH_RELAY_DIR"
_PEERCRED = struct.Struct("3i")
_MAX_ID = 0xFFFFFFFE  # (uid_t)-1 means "unchanged" to chown


class BadRequest(ValueError):
    """A request line that is not a valid request; the message says what is wrong."""


class Refusal(Exception):
    """A request the relay will not or cannot serve: becomes ``{"ok": false, "error": ..., "kind": ...}``."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def parse_request(line: bytes) -> Dict[str, Any]:
    """The request in one line (without its newline), checked field by field.

    Raises:
        BadRequest: not a JSON object of a known op with exactly its fields, well formed.
    """
    if len(line) >= MAX_REQUEST:
        raise BadRequest("the request is over %d bytes" % MAX_REQUEST)
    try:
        request = json.loads(line.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise BadRequest("the request is not JSON: %s" % exc) from None
    if not isinstance(request, dict):
        raise BadRequest("the request is not a JSON object")
    op = request.get("op")
    if op not in OPS:
        raise BadRequest("unknown op %r (one of %s)" % (str(op)[:32], ", ".join(OPS)))
    unexpected = set(request) - _FIELDS[op] - {"op"}
    if unexpected:
        raise BadRequest("unexpected fields for %s: %s" % (op, ", ".join(sorted(repr(k[:32]) for k in unexpected))))
    if "sandbox" in _FIELDS[op]:
        try:
            rendezvous.check_sandbox_id(request.get("sandbox"))
        except rendezvous.RendezvousError as exc:
            raise BadRequest(str(exc)) from None
    for name in ("uid", "gid"):
        if name in _FIELDS[op]:
            value = request.setdefault(name, None)
            if value is not None and (type(value) is not int or not 0 <= value <= _MAX_ID):
                raise BadRequest("%s must be null or an integer from 0 to %d" % (name, _MAX_ID))
    if op == "usage":
        ids = request.get("containers")
        if not isinstance(ids, list) or len(ids) > MAX_USAGE_IDS:
            raise BadRequest("containers must be a list of at most %d container ids" % MAX_USAGE_IDS)
        if not all(isinstance(i, str) and CONTAINER_ID.match(i) for i in ids):
            raise BadRequest("containers must be full container ids (64 hex digits)")
    if op == "accept":
        timeout = request.get("timeout")
        if type(timeout) not in (int, float) or not 0 <= float(timeout) <= MAX_ACCEPT_SECONDS:
            raise BadRequest("timeout must be a number of seconds from 0 to %g" % MAX_ACCEPT_SECONDS)
    return request


def _no_constant(name: str) -> Any:
    raise ValueError("%s is not a number" % name)


def encode_reply(reply: Mapping[str, Any]) -> bytes:
    return json.dumps(reply, separators=(",", ":")).encode("utf-8") + b"\n"


def refusal_reply(message: str, kind: str) -> Dict[str, Any]:
    return {"ok": False, "error": message, "kind": kind}


class RelayConfig:
    """The relay's settings, from ``ORCH_RELAY_*`` variables."""

    def __init__(
        self,
        host: str,
        port: int,
        directory: Path,
        cert: str,
        key: str,
        ca: str,
        max_connections: int,
        cgroup_root: str = CGROUP_ROOT,
    ) -> None:
        self.cgroup_root = cgroup_root
        self.host = host
        self.port = port
        self.directory = directory
        self.cert = cert
        self.key = key
        self.ca = ca
        self.max_connections = max_connections

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> RelayConfig:
        """Read ``ORCH_RELAY_LISTEN`` (host:port), ``ORCH_RELAY_DIR``, ``ORCH_RELAY_CERT``, ``_KEY`` and ``_CA``,
        ``ORCH_RELAY_MAX_CONNECTIONS``, and ``ORCH_RELAY_CGROUP`` (where the node's cgroups are seen).

        Raises:
            ValueError: ``ORCH_RELAY_LISTEN`` is not host:port, ``ORCH_RELAY_DIR`` is not absolute, or
                ``ORCH_RELAY_MAX_CONNECTIONS`` is not a positive integer.
        """
        listen = environ.get("ORCH_RELAY_LISTEN") or DEFAULT_LISTEN
        host, _, port = listen.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError("ORCH_RELAY_LISTEN must be host:port (such as %s), got %r" % (DEFAULT_LISTEN, listen))
        directory = Path(environ.get("ORCH_RELAY_DIR") or DEFAULT_DIR)
        if not directory.is_absolute():
            raise ValueError("ORCH_RELAY_DIR must be an absolute path, got %r" % str(directory))
        limit = environ.get("ORCH_RELAY_MAX_CONNECTIONS") or str(MAX_CONNECTIONS)
        if not limit.isdigit() or int(limit) < 1:
            raise ValueError("ORCH_RELAY_MAX_CONNECTIONS must be a positive integer, got %r" % limit)
        return cls(
            host,
            int(port),
            directory,
            environ.get("ORCH_RELAY_CERT") or DEFAULT_CERT,
            environ.get("ORCH_RELAY_KEY") or DEFAULT_KEY,
            environ.get("ORCH_RELAY_CA") or DEFAULT_CA,
            int(limit),
            environ.get("ORCH_RELAY_CGROUP") or CGROUP_ROOT,
        )

    def tls(self) -> ssl.SSLContext:
        """The server side of mutual TLS: our certificate, and clients only with a certificate our CA signed.

        Raises:
            OSError, ssl.SSLError: a file is missing or not what it should be.
        """
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_cert_chain(self.cert, self.key)
        context.load_verify_locations(cafile=self.ca)
        return context


class _Running:
    """A bridge on the relay's event loop: its sockets watched for what it waits for, finished once."""

    def __init__(self, loop: asyncio.AbstractEventLoop, bridge: Bridge) -> None:
        self.loop = loop
        self.bridge = bridge
        self.done: asyncio.Future[None] = loop.create_future()
        self._masks = {bridge.tls_fd: 0, bridge.plain_fd: 0}
        self._timer: Optional[asyncio.TimerHandle] = None

    def start(self) -> None:
        self._step(0, 0)

    def finish(self) -> None:
        """Stop watching and close both sockets (idempotent)."""
        if self.done.done():
            return
        self._watch({fd: 0 for fd in self._masks})
        if self._timer is not None:
            self._timer.cancel()
        self.bridge.close()
        self.done.set_result(None)

    def _on(self, fd: int, event: int) -> None:
        if fd == self.bridge.plain_fd:
            self._step(event, 0)
        else:
            self._step(0, event)

    def _step(self, plain_events: int, tls_events: int) -> None:
        if self.done.done():
            return
        try:
            alive = self.bridge.pump(plain_events, tls_events)
        except Exception as exc:  # a bug must not take the relay down
            logger.error("a bridge failed: %r", exc)
            alive = False
        if not alive:
            self.finish()
            return
        self._watch(self.bridge.interest())
        if self.bridge.ends_by is not None and self._timer is None:  # one side ended: the other has until then
            self._timer = self.loop.call_later(max(0.0, self.bridge.ends_by - time.monotonic()) + 0.01, self._expire)

    def _expire(self) -> None:
        self._timer = None
        self._step(0, 0)

    def _watch(self, masks: Dict[int, int]) -> None:
        for fd, mask in masks.items():
            before = self._masks[fd]
            for event, add, remove in (
                (READ, self.loop.add_reader, self.loop.remove_reader),
                (WRITE, self.loop.add_writer, self.loop.remove_writer),
            ):
                if mask & event and not before & event:
                    add(fd, self._on, fd, event)
                elif before & event and not mask & event:
                    remove(fd)
            self._masks[fd] = mask


class _Site:
    """One sandbox directory the relay serves: its listening socket, the accepts waiting on it, its bridges."""

    def __init__(self, sandbox_id: str, made: rendezvous.Rendezvous, uid: Optional[int]) -> None:
        self.sandbox_id = sandbox_id
        self.listener = made.listener
        self.uid = uid
        self.waiters: Deque[asyncio.Future[Tuple[socket.socket, str]]] = collections.deque()
        self.bridges: Set[_Running] = set()
        self.watching = False


class Relay:
    """The relay's state: the sites by sandbox id, and the controller connections being served."""

    def __init__(
        self,
        directory: Path,
        context: ssl.SSLContext,
        *,
        max_connections: int = MAX_CONNECTIONS,
        cgroup_root: str = CGROUP_ROOT,
    ) -> None:
        self.cgroup_root = cgroup_root
        self.directory = Path(directory)
        self.context = context
        self.max_connections = max_connections
        self.sites: Dict[str, _Site] = {}
        self.connections = 0
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._tasks: Set[asyncio.Task[None]] = set()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None
        return self._loop

    async def serve(self, host: str, port: int) -> None:
        """Listen again in every sandbox directory, then serve controllers on ``host:port`` until SIGTERM/SIGINT.

        Raises:
            rendezvous.RendezvousError: the directory is not private to us.
            OSError: the address cannot be listened on.
        """
        self._loop = asyncio.get_running_loop()
        self.loop.set_exception_handler(self._loop_error)
        rendezvous.ensure_private_dir(self.directory, _SETTING)
        self.relisten_all()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server = socket.create_server((host, port), family=family, backlog=128)
        server.setblocking(False)
        stop: asyncio.Future[None] = self.loop.create_future()
        for signum in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(signum, _resolve, stop)
        try:
            self.loop.add_reader(server.fileno(), self._on_controller, server)
            bound = server.getsockname()
            logger.info("listening on %s:%d for %s (%d sandboxes)", bound[0], bound[1], self.directory, len(self.sites))
            await stop
            logger.info("stopping")
        finally:
            self.loop.remove_reader(server.fileno())
            server.close()
            for site in list(self.sites.values()):
                self._retire(site, "the relay is stopping", "failed")

    # -- sites

    def relisten_all(self) -> None:
        """Listen in every sandbox directory present (after a restart), so their agents can reconnect."""
        for entry in sorted(os.scandir(self.directory), key=lambda e: e.name):
            if not rendezvous.SANDBOX_ID.fullmatch(entry.name) or not entry.is_dir(follow_symlinks=False):
                continue
            try:
                self._relisten(entry.name)
            except (rendezvous.RendezvousError, OSError) as exc:
                logger.warning("sandbox %s: not served: %s", entry.name, exc)

    def _relisten(self, sandbox_id: str) -> _Site:
        """A site for a directory made before this relay started: the sandbox's uid and gid are its owner's."""
        try:
            st = os.lstat(self.directory / sandbox_id)
        except FileNotFoundError:
            raise rendezvous.RendezvousError(
                "no sandbox directory %s: the sandbox %s is gone" % (self.directory / sandbox_id, sandbox_id),
                "missing",
            ) from None
        uid: Optional[int] = None
        gid: Optional[int] = None
        if stat.S_ISDIR(st.st_mode) and st.st_uid != os.geteuid():
            uid, gid = st.st_uid, st.st_gid
        made = rendezvous.take_over(self.directory, sandbox_id, uid, gid, _SETTING)
        site = self.sites[sandbox_id] = _Site(sandbox_id, made, uid)
        logger.info("sandbox %s: listening again (uid %s)", sandbox_id, "any" if uid is None else uid)
        return site

    def create(self, sandbox_id: str, uid: Optional[int], gid: Optional[int], peer: str = "") -> bytes:
        made = rendezvous.create(self.directory, sandbox_id, uid, gid, _SETTING)
        old = self.sites.get(sandbox_id)
        self.sites[sandbox_id] = _Site(sandbox_id, made, uid)
        if old is not None:  # its directory was deleted behind our back
            self._retire(old, "the sandbox %s was made anew" % sandbox_id, "removed")
        logger.info("sandbox %s: created for %s (uid %s)", sandbox_id, peer, "any" if uid is None else uid)
        return made.secret

    def open(self, sandbox_id: str, uid: Optional[int], gid: Optional[int], peer: str = "") -> bytes:
        made = rendezvous.take_over(self.directory, sandbox_id, uid, gid, _SETTING)
        old = self.sites.get(sandbox_id)
        self.sites[sandbox_id] = _Site(sandbox_id, made, uid)
        bridges = 0
        if old is not None:
            bridges = len(old.bridges)
            self._retire(old, "another controller took the sandbox %s over" % sandbox_id, "taken_over")
        logger.info(
            "sandbox %s: taken over by %s (uid %s; %d bridges closed)",
            sandbox_id,
            peer,
            "any" if uid is None else uid,
            bridges,
        )
        return made.secret

    def remove(self, sandbox_id: str, peer: str = "") -> None:
        site = self.sites.pop(sandbox_id, None)
        if site is not None:
            self._retire(site, "the sandbox %s was removed" % sandbox_id, "removed")
        rendezvous.remove_tree(self.directory / sandbox_id)
        logger.info("sandbox %s: removed by %s", sandbox_id, peer)

    def sandboxes(self) -> Dict[str, float]:
        """Each sandbox directory's id -> seconds since its mtime (0 for one from the future: a clock set back)."""
        now = time.time()
        ages: Dict[str, float] = {}
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if not rendezvous.SANDBOX_ID.fullmatch(entry.name) or not entry.is_dir(follow_symlinks=False):
                    continue
                try:
                    mtime = entry.stat(follow_symlinks=False).st_mtime
                except FileNotFoundError:  # deleted meanwhile
                    continue
                ages[entry.name] = round(max(0.0, now - mtime), 3)
        return dict(sorted(ages.items()))

    def usage(self, container_ids: List[str]) -> Dict[str, Any]:
        """Memory and CPU time of the containers of this node the cgroup root knows (``usage.container_usage``)."""
        found = {}
        for container_id in container_ids:
            memory, cpu = container_usage(container_id, self.cgroup_root)
            if memory is not None or cpu is not None:
                found[container_id] = [memory, cpu]
        return found

    def _retire(self, site: _Site, why: str, kind: str) -> None:
        """Stop serving ``site``: its listener closes, its waiting accepts are refused, its agents cut off."""
        self._stop_watching(site)
        site.listener.close()
        while site.waiters:
            waiter = site.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(Refusal(why, kind))
        for running in list(site.bridges):
            running.finish()

    # -- agents

    def _watch(self, site: _Site) -> None:
        """Take what agents wait in the backlog for the waiting accepts; watch the listener while any remain."""
        if self.sites.get(site.sandbox_id) is not site:
            return
        self._on_agent(site)
        if site.waiters and not site.watching:
            self.loop.add_reader(site.listener.fileno(), self._on_agent, site)
            site.watching = True

    def _stop_watching(self, site: _Site) -> None:
        if site.watching:
            site.watching = False
            self.loop.remove_reader(site.listener.fileno())

    def _on_agent(self, site: _Site) -> None:
        while site.waiters:
            if site.waiters[0].done():  # its controller left or timed out
                site.waiters.popleft()
                continue
            try:
                conn, _ = site.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, say: try again shortly rather than spin
                logger.warning("sandbox %s: accepting an agent failed: %s", site.sandbox_id, exc)
                self._stop_watching(site)
                self.loop.call_later(0.5, self._watch, site)
                return
            who = _peer(conn)
            if site.uid is not None and (who is None or who[1] != site.uid):
                logger.warning(
                    "sandbox %s: refused a connection from %s (the sandbox runs as uid %d)",
                    site.sandbox_id,
                    "an unknown peer" if who is None else "pid %d uid %d" % (who[0], who[1]),
                    site.uid,
                )
                conn.close()
                continue
            site.waiters.popleft().set_result((conn, "an unknown peer" if who is None else "pid %d" % who[0]))
        self._stop_watching(site)

    # -- controllers

    def _on_controller(self, server: socket.socket) -> None:
        for _ in range(64):
            try:
                conn, address = server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                logger.warning("accepting a controller connection failed: %s", exc)
                self.loop.remove_reader(server.fileno())
                self.loop.call_later(0.5, self.loop.add_reader, server.fileno(), self._on_controller, server)
                return
            peer = "%s:%d" % address[:2]
            if self.connections >= self.max_connections:
                logger.warning("refused %s: %d connections are open already", peer, self.connections)
                conn.close()
                continue
            self.connections += 1
            task = self.loop.create_task(self._serve(conn, peer))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve(self, conn: socket.socket, peer: str) -> None:
        tls: Optional[ssl.SSLSocket] = None
        try:
            _tune(conn)
            conn.setblocking(False)
            tls = self.context.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
            try:
                await asyncio.wait_for(self._handshake(tls), HANDSHAKE_SECONDS)
            except (OSError, asyncio.TimeoutError) as exc:
                logger.warning("refused %s: TLS handshake failed (%s)", peer, exc or "it took too long")
                return
            try:
                line, early = await asyncio.wait_for(self._request_line(tls), HANDSHAKE_SECONDS)
            except asyncio.TimeoutError:
                logger.warning("%s: sent no request within %g s", peer, HANDSHAKE_SECONDS)
                return
            except OSError:
                return  # it left without asking
            try:
                request = parse_request(line)
            except BadRequest as exc:
                logger.warning("%s: bad request: %s", peer, exc)
                await self._reply(tls, refusal_reply(str(exc), "invalid"))
                return
            if request["op"] == "accept":
                handed, tls = tls, None  # _accept closes it, or its bridge does
                await self._accept(handed, early, request["sandbox"], float(request["timeout"]), peer)
            else:
                await self._reply(tls, self._answer(request, peer))
        except Exception as exc:  # never let one peer take the relay down
            logger.error("%s: unexpected %s: %s", peer, type(exc).__name__, exc)
        finally:
            self.connections -= 1
            conn.close()
            if tls is not None:
                tls.close()

    async def _ready(self, sock: socket.socket, event: int) -> None:
        """Wait until ``sock`` is readable (READ) or writable (WRITE)."""
        ready: asyncio.Future[None] = self.loop.create_future()
        if event == READ:
            self.loop.add_reader(sock.fileno(), _resolve, ready)
        else:
            self.loop.add_writer(sock.fileno(), _resolve, ready)
        try:
            await ready
        finally:
            if event == READ:
                self.loop.remove_reader(sock.fileno())
            else:
                self.loop.remove_writer(sock.fileno())

    async def _handshake(self, tls: ssl.SSLSocket) -> None:
        while True:
            try:
                tls.do_handshake()
                return
            except ssl.SSLWantReadError:
                await self._ready(tls, READ)
            except ssl.SSLWantWriteError:
                await self._ready(tls, WRITE)

    async def _request_line(self, tls: ssl.SSLSocket) -> Tuple[bytes, bytes]:
        """The request line (without its newline; a too long one as it came) and what came after it.

        Raises:
            OSError: the peer closed the connection or it failed first.
        """
        received = bytearray()
        while True:
            try:
                data = tls.recv(MAX_REQUEST)
            except ssl.SSLWantReadError:
                await self._ready(tls, READ)
                continue
            except ssl.SSLWantWriteError:
                await self._ready(tls, WRITE)
                continue
            if not data:
                raise ConnectionResetError("closed before a whole request")
            received += data
            end = received.find(b"\n")
            if end >= 0:
                return bytes(received[:end]), bytes(received[end + 1 :])
            if len(received) >= MAX_REQUEST:
                return bytes(received), b""  # parse_request refuses it

    async def _reply(self, tls: ssl.SSLSocket, reply: Mapping[str, Any]) -> None:
        """Send one reply line; a peer that does not take it within HANDSHAKE_SECONDS (or is gone) gets nothing."""
        view = memoryview(encode_reply(reply))
        deadline = time.monotonic() + HANDSHAKE_SECONDS
        try:
            while view:
                try:
                    view = view[tls.send(view) :]
                except ssl.SSLWantWriteError:
                    await asyncio.wait_for(self._ready(tls, WRITE), max(0.0, deadline - time.monotonic()))
                except ssl.SSLWantReadError:
                    await asyncio.wait_for(self._ready(tls, READ), max(0.0, deadline - time.monotonic()))
        except (OSError, asyncio.TimeoutError):
            pass

    def _answer(self, request: Dict[str, Any], peer: str) -> Dict[str, Any]:
        op = request["op"]
        sandbox_id = str(request.get("sandbox", ""))
        try:
            if op == "create":
                key = self.create(sandbox_id, request["uid"], request["gid"], peer)
                return {"ok": True, "secret": handshake.format_secret(key).decode("ascii")}
            if op == "open":
                key = self.open(sandbox_id, request["uid"], request["gid"], peer)
                return {"ok": True, "secret": handshake.format_secret(key).decode("ascii")}
            if op == "remove":
                self.remove(sandbox_id, peer)
                return {"ok": True}
            if op == "usage":
                return {"ok": True, "usage": self.usage(request["containers"])}
            return {"ok": True, "sandboxes": self.sandboxes()}
        except rendezvous.RendezvousError as exc:
            logger.warning("%s: %s %s refused: %s", peer, op, sandbox_id, exc)
            return refusal_reply(str(exc), exc.kind)
        except OSError as exc:
            logger.error("%s: %s %s failed: %s", peer, op, sandbox_id, exc)
            return refusal_reply("the relay failed to %s: %s" % (op, exc), "failed")

    async def _accept(self, tls: ssl.SSLSocket, early: bytes, sandbox_id: str, timeout: float, peer: str) -> None:
        """Wait for the sandbox's agent, answer, then bridge the two until either closes; ``tls`` is ours to close."""
        conn: Optional[socket.socket] = None
        bridged = False
        try:
            try:
                site = self.sites.get(sandbox_id) or self._relisten(sandbox_id)
            except (rendezvous.RendezvousError, OSError) as exc:
                logger.warning("%s: accept %s refused: %s", peer, sandbox_id, exc)
                await self._reply(tls, refusal_reply(str(exc), getattr(exc, "kind", "failed")))
                return
            waiter: asyncio.Future[Tuple[socket.socket, str]] = self.loop.create_future()
            site.waiters.append(waiter)
            self._watch(site)
            kept = bytearray(early)
            gone = self._watch_peer(tls, kept)
            try:
                if not waiter.done():
                    await asyncio.wait({waiter, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                self.loop.remove_reader(tls.fileno())
            if not waiter.done() or waiter.cancelled():
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    site.waiters.remove(waiter)
                if not gone.done():
                    message = "no agent of sandbox %s connected within %g s" % (sandbox_id, timeout)
                    await self._reply(tls, refusal_reply(message, "timeout"))
                return
            failure = waiter.exception()
            if failure is not None:
                await self._reply(tls, refusal_reply(str(failure), getattr(failure, "kind", "failed")))
                return
            conn, who = waiter.result()
            if gone.done():
                return  # its controller left just now; the agent will dial again
            await self._reply(tls, {"ok": True})
            running = _Running(self.loop, Bridge(tls, conn, early=bytes(kept)))
            bridged = True  # the bridge closes both
        finally:
            if not bridged:
                tls.close()
                if conn is not None:
                    conn.close()
        site.bridges.add(running)
        logger.info("sandbox %s: bridged its agent (%s) to %s", sandbox_id, who, peer)
        running.start()
        try:
            await running.done
        finally:
            running.finish()
            site.bridges.discard(running)
        logger.info(
            "sandbox %s: bridge to %s ended (%d bytes to the agent, %d from it)",
            sandbox_id,
            peer,
            running.bridge.to_plain,
            running.bridge.to_tls,
        )

    def _watch_peer(self, tls: ssl.SSLSocket, kept: bytearray) -> asyncio.Future[None]:
        """A future that ends when the controller closes ``tls`` while its accept waits; what it sends meanwhile
        (it should send nothing) is kept, up to MAX_REQUEST bytes."""
        gone: asyncio.Future[None] = self.loop.create_future()

        def readable() -> None:
            try:
                data = tls.recv(MAX_REQUEST)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except OSError:
                data = b""
            kept.extend(data)
            if not data or len(kept) > MAX_REQUEST:
                self.loop.remove_reader(tls.fileno())
                if not gone.done():
                    gone.set_result(None)

        self.loop.add_reader(tls.fileno(), readable)
        return gone

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: Dict[str, Any]) -> None:
        exc = context.get("exception")
        logger.error("%s%s", context.get("message", "error"), ": %r" % exc if exc is not None else "")


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _peer(conn: socket.socket) -> Optional[Tuple[int, int]]:
    """The connecting process's (pid, uid) by SO_PEERCRED; None where the OS does not tell."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    try:
        pid, uid, _ = _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, option, _PEERCRED.size))
    except OSError:
        return None
    return pid, uid


def _tune(conn: socket.socket) -> None:
    """No Nagle delay for small frames; and find a controller that vanished without closing (its machine died)
    within a few minutes."""
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 15), ("TCP_KEEPCNT", 4)):
        option = getattr(socket, name, None)
        if option is not None:
            conn.setsockopt(socket.IPPROTO_TCP, option, value)


def main(environ: Optional[Mapping[str, str]] = None) -> int:
    """Run the relay until SIGTERM; 2 when its settings or credentials are unusable."""
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s relay %(levelname)s %(message)s")
    try:
        config = RelayConfig.from_env(os.environ if environ is None else environ)
        context = config.tls()
    except (ValueError, OSError, ssl.SSLError) as exc:
        logger.error("cannot start: %s", exc)
        return 2
    relay = Relay(config.directory, context, max_connections=config.max_connections, cgroup_root=config.cgroup_root)
    try:
        asyncio.run(relay.serve(config.host, config.port))
    except (rendezvous.RendezvousError, OSError) as exc:
        logger.error("cannot serve: %s", exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
