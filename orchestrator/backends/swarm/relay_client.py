"""The controller's side of a node relay: its requests over mutual TLS, and the ``Endpoint`` it makes of a sandbox.

``RelayClient`` speaks the relay's protocol (``orchestrator/agent/node_relay.py``): one TLS
connection per request, one JSON line each way. ``RelayEndpoint`` is a sandbox's endpoint
on a Swarm node: the relay there holds the sandbox's directory and listening socket, and
``accept`` turns the relay's bridge to the agent into a ``Channel``. A ``Channel`` polls and
reads a plain socket, so each bridge gets a socketpair whose far end one background thread
("relay-bridges", for all of them) copies to and from the TLS connection; every SSL object
is used by that one thread only. The secret handshake stays end to end: the relay sees only
encrypted frames of it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import selectors
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import PurePath, PurePosixPath
from typing import Any

from ...agent import handshake, rendezvous
from ...agent.bridge import Bridge
from ...agent.usage import MAX_USAGE_IDS
from ...checks import is_count, is_number
from ...errors import AgentTimeoutError, ChannelLost, ConfigError, RelayUnavailable
from ...wire.endpoint import CHANNEL_MOUNT, channel_environment
from ...wire.transport import Channel
from .tls import RELAY_NAME

logger = logging.getLogger(__name__)

MAX_ACCEPT_SECONDS = 3600.0
"""The longest wait one accept request asks of the relay (its limit); longer deadlines ask again."""
_REPLY_BYTES = 4096
_RELAY_RETRY_SECONDS = 0.5
_LIST_REPLY_BYTES = 4 << 20
_TEXT_CHARS = 500  # of a relay's error sentence
_REFUSALS: dict[str, type[Exception]] = {
    "timeout": AgentTimeoutError,
    "taken_over": ChannelLost,
    "removed": ChannelLost,
    "invalid": ConfigError,
    "exists": ConfigError,
    "missing": ConfigError,
    "unusable": ConfigError,
}


class RelayClient:
    """Requests to the relay at ``host:port`` (one TLS connection each).

    Args:
        host: the node's address.
        port: the relay's port.
        tls: ``tls.client_context`` (it checks the relay's certificate for ``RELAY_NAME``).
        timeout: seconds for connecting, the TLS handshake and an answer (an accept's wait comes on top).
    """

    def __init__(self, host: str, port: int, tls: ssl.SSLContext, *, timeout: float) -> None:
        self.host = host
        self.port = port
        self._tls = tls
        self._timeout = timeout

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def create(self, sandbox_id: str, uid: int | None, gid: int | None) -> bytes:
        """Have the relay make the sandbox's directory with a fresh secret and listen in it.

        Returns:
            The secret (the key ``handshake.auth_proof`` takes).

        Raises:
            ConfigError: the directory exists already (or the id or ids are invalid).
            RelayUnavailable: the relay cannot be reached, refused us or failed.
        """
        return self._secret(self._ask({"op": "create", "sandbox": sandbox_id, "uid": uid, "gid": gid}))

    def open(self, sandbox_id: str, uid: int | None, gid: int | None) -> bytes:
        """Take a live sandbox over: the relay listens on a new socket and cuts the agent's current connection.

        Returns:
            The secret.

        Raises:
            ConfigError: the sandbox's directory is gone or cannot be trusted.
            RelayUnavailable: the relay cannot be reached, refused us or failed.
        """
        return self._secret(self._ask({"op": "open", "sandbox": sandbox_id, "uid": uid, "gid": gid}))

    def remove(self, sandbox_id: str) -> None:
        """Have the relay stop serving the sandbox and delete its directory (a missing one is fine).

        Raises:
            RelayUnavailable: the relay cannot be reached, refused us or failed.
        """
        self._ask({"op": "remove", "sandbox": sandbox_id})

    def sandbox_ages(self) -> dict[str, float]:
        """The sandbox directories on the relay's node, each with its age.

        Returns:
            Sandbox id -> seconds since its directory last changed, by the node's clock (so the
            controller's clock does not matter).

        Raises:
            RelayUnavailable: the relay cannot be reached, refused us, failed or sent a malformed list.
        """
        reply = self._ask({"op": "list"}, limit=_LIST_REPLY_BYTES)
        ages = reply.get("sandboxes")
        if not isinstance(ages, dict) or not all(_is_id(k) and _is_age(v) for k, v in ages.items()):
            raise RelayUnavailable(f"the relay at {self.address} sent a malformed list of sandboxes")
        return {sandbox_id: float(age) for sandbox_id, age in ages.items()}

    def usage(self, container_ids: list[str]) -> dict[str, tuple[int | None, float | None]]:
        """Memory bytes and CPU seconds of containers on the relay's node (either None when unknown), for those its
        cgroups know; asked ``MAX_USAGE_IDS`` at a time.

        Raises:
            RelayUnavailable: the relay cannot be reached, refused us, failed or sent a malformed answer.
        """
        found: dict[str, tuple[int | None, float | None]] = {}
        for start in range(0, len(container_ids), MAX_USAGE_IDS):
            asked = container_ids[start : start + MAX_USAGE_IDS]
            usage = self._ask({"op": "usage", "containers": asked}, limit=_LIST_REPLY_BYTES).get("usage")
            if not isinstance(usage, dict) or not all(k in asked and _is_usage(v) for k, v in usage.items()):
                raise RelayUnavailable(f"the relay at {self.address} sent a malformed usage answer")
            found.update({k: (v[0], None if v[1] is None else float(v[1])) for k, v in usage.items()})
        return found

    def connect(self, sandbox_id: str, deadline: float) -> ssl.SSLSocket:
        """Wait until ``deadline`` for the sandbox's agent to connect to the relay, bridged to the returned socket.

        Returns:
            The TLS connection, positioned at the agent's first byte (nothing of it was read).

        Raises:
            AgentTimeoutError: no agent of the sandbox connected by ``deadline``.
            ChannelLost: another controller took the sandbox over, or it was removed, meanwhile.
            ConfigError: the sandbox's directory is gone.
            RelayUnavailable: the relay cannot be reached, refused us or failed.
        """
        while True:
            wait = min(max(0.0, deadline - time.monotonic()), MAX_ACCEPT_SECONDS)
            sock = self._dial()
            try:
                self._send(sock, {"op": "accept", "sandbox": sandbox_id, "timeout": round(wait, 3)})
                reply = self._reply(sock, _REPLY_BYTES, time.monotonic() + wait + self._timeout, exact=True)
                _raise_refusal(reply, self.address)
            except AgentTimeoutError:
                sock.close()
                if wait < MAX_ACCEPT_SECONDS or time.monotonic() >= deadline:
                    raise AgentTimeoutError(
                        f"no agent of sandbox {sandbox_id} connected to the relay at {self.address}: "
                        "the deadline passed"
                    ) from None
                continue
            except BaseException:
                sock.close()
                raise
            return sock

    # -- one request

    def _ask(self, request: dict[str, Any], *, limit: int = _REPLY_BYTES) -> dict[str, Any]:
        with self._dial() as sock:
            self._send(sock, request)
            reply = self._reply(sock, limit, time.monotonic() + self._timeout, exact=False)
        _raise_refusal(reply, self.address)
        return reply

    def _dial(self) -> ssl.SSLSocket:
        """A TLS connection to the relay, both certificates checked.

        Raises:
            RelayUnavailable: nothing answers, or the TLS handshake failed.
        """
        try:
            raw = socket.create_connection((self.host, self.port), timeout=self._timeout)
        except OSError as exc:
            raise RelayUnavailable(
                f"no relay answers at {self.address} ({exc}): check that the relay service runs on that node and "
                "that this controller can reach its port"
            ) from exc
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return self._tls.wrap_socket(raw, server_hostname=RELAY_NAME)
        except ssl.SSLCertVerificationError as exc:
            raw.close()
            raise RelayUnavailable(
                f"the relay at {self.address} presented a certificate this controller does not trust "
                f"({exc.verify_message}): it runs with another store's credentials; deploy the relay again"
            ) from exc
        except (OSError, ValueError) as exc:
            raw.close()
            raise RelayUnavailable(f"the TLS handshake with the relay at {self.address} failed: {exc}") from exc

    def _send(self, sock: ssl.SSLSocket, request: dict[str, Any]) -> None:
        try:
            sock.settimeout(self._timeout)
            sock.sendall(json.dumps(request, separators=(",", ":")).encode("utf-8") + b"\n")
        except OSError as exc:
            raise self._broken(exc) from exc

    def _reply(self, sock: ssl.SSLSocket, limit: int, deadline: float, *, exact: bool) -> dict[str, Any]:
        """Read the reply line by ``deadline``; ``exact`` reads it byte by byte, so nothing after it is consumed."""
        line = bytearray()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RelayUnavailable(f"the relay at {self.address} did not answer in time")
            try:
                sock.settimeout(remaining)
                chunk = sock.recv(1 if exact else 65536)
            except TimeoutError:
                continue
            except OSError as exc:
                raise self._broken(exc) from exc
            if not chunk:
                raise RelayUnavailable(
                    f"the relay at {self.address} closed the connection without an answer (it refuses this "
                    "controller's certificate, or it is stopping)"
                )
            line += chunk
            end = line.find(b"\n")
            if end >= 0:
                return _parse_reply(bytes(line[:end]), self.address)
            if len(line) >= limit:
                raise RelayUnavailable(f"the relay at {self.address} sent an answer over {limit} bytes")

    def _broken(self, exc: OSError) -> RelayUnavailable:
        if isinstance(exc, ssl.SSLError):
            return RelayUnavailable(
                f"the relay at {self.address} refused this controller's TLS credentials ({exc.reason or exc}): "
                "the relay runs with another store's CA; deploy it again"
            )
        return RelayUnavailable(f"the connection to the relay at {self.address} failed: {exc}")

    def _secret(self, reply: dict[str, Any]) -> bytes:
        text = reply.get("secret")
        try:
            if not isinstance(text, str):
                raise ValueError("no secret")
            return handshake.parse_secret(text.encode("ascii"))
        except ValueError:  # UnicodeEncodeError included
            raise RelayUnavailable(f"the relay at {self.address} sent a malformed secret") from None


def _parse_reply(line: bytes, where: str) -> dict[str, Any]:
    try:
        reply = json.loads(line.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError):
        reply = None
    if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
        raise RelayUnavailable(f"the relay at {where} sent an answer that is not one (is that port a relay?)")
    return reply


def _no_constant(name: str) -> Any:
    raise ValueError(name)


def _is_id(value: object) -> bool:
    return isinstance(value, str) and rendezvous.SANDBOX_ID.fullmatch(value) is not None


def _is_age(value: object) -> bool:
    """A finite number of seconds, not negative (JSON's 1e999 parses as inf; True is no number here)."""
    return is_number(value) and 0 <= value < math.inf


def _is_usage(value: object) -> bool:
    """``[memory bytes, CPU seconds]``, each a non-negative number or null (a bool is not a number)."""
    return (
        isinstance(value, list)
        and len(value) == 2
        and (value[0] is None or (is_count(value[0])))
        and (value[1] is None or (is_number(value[1]) and math.isfinite(value[1]) and value[1] >= 0))
    )


def _raise_refusal(reply: dict[str, Any], where: str) -> None:
    if reply["ok"]:
        return
    error, kind = reply.get("error"), reply.get("kind")
    text = "".join(c if c.isprintable() else "?" for c in str(error)[:_TEXT_CHARS])
    error_class = _REFUSALS.get(kind, RelayUnavailable) if isinstance(kind, str) else RelayUnavailable
    raise error_class(f"the relay at {where}: {text}")


@dataclass(frozen=True)
class NodeDirectory:
    """Where a node's relay keeps its sandboxes' directories."""

    node_id: str
    """The Swarm node's id: a sandbox with its directory there must run there (``RelayEndpoint.constraints``)."""
    path: PurePath | str
    """The relay's directory as that node's engine sees it (the bind mount's source)."""


class RelayEndpoint:
    """A sandbox's endpoint on a Swarm node: the node's relay holds its directory, secret and listening socket.

    Use ``create`` for a new sandbox and ``open`` to take over a live one.

    Attributes:
        sandbox_id: the sandbox's id.
        secret: its shared secret.
        node_id: the Swarm node whose relay serves it; the sandbox must run there (``constraints``).
    """

    def __init__(
        self,
        client: RelayClient,
        sandbox_id: str,
        secret: bytes,
        *,
        node: NodeDirectory,
        max_header: int,
        max_body: int,
    ) -> None:
        """Use ``create`` or ``open`` rather than this."""
        self.sandbox_id = sandbox_id
        self.secret = secret
        self.node_id = node.node_id
        self.client = client
        self.directory = PurePosixPath(node.path) / sandbox_id
        self._max_header = max_header
        self._max_body = max_body
        self._closed = False

    @classmethod
    def create(
        cls,
        client: RelayClient,
        sandbox_id: str,
        *,
        node: NodeDirectory,
        sandbox_uid: int | None,
        sandbox_gid: int | None,
        max_header: int,
        max_body: int,
    ) -> RelayEndpoint:
        """Have the relay make the new sandbox's directory with a fresh secret and listen in it.

        Args:
            client: the relay of the node the sandbox will run on.
            sandbox_id: the new sandbox's id.
            node: that node and its relay's directory.
            sandbox_uid: the uid the agent will run as, if known (numeric).
            sandbox_gid: its gid, if known.
            max_header: largest frame header accepted from the agent.
            max_body: largest frame body accepted from the agent.

        Raises:
            ConfigError: the id is not a plain name, or the directory exists on the node already.
            RelayUnavailable: the relay cannot be reached, refused us or failed.
        """
        _check_id(sandbox_id)
        key = client.create(sandbox_id, sandbox_uid, sandbox_gid)
        logger.info("sandbox %s: the relay at %s listens for it on node %s", sandbox_id, client.address, node.node_id)
        return cls(client, sandbox_id, key, node=node, max_header=max_header, max_body=max_body)

    @classmethod
    def open(
        cls,
        client: RelayClient,
        sandbox_id: str,
        *,
        node: NodeDirectory,
        sandbox_uid: int | None,
        sandbox_gid: int | None,
        max_header: int,
        max_body: int,
    ) -> RelayEndpoint:
        """Take over a live sandbox: the relay puts a new socket in place and cuts the agent's connection to the
        previous controller, so the agent reconnects (no signal is needed).

        Args: as ``create``.

        Raises:
            ConfigError: the sandbox's directory on the node is gone or cannot be trusted.
            RelayUnavailable: the relay cannot be reached, refused us or failed.
        """
        _check_id(sandbox_id)
        key = client.open(sandbox_id, sandbox_uid, sandbox_gid)
        logger.info("sandbox %s: took over its channel at the relay at %s", sandbox_id, client.address)
        return cls(client, sandbox_id, key, node=node, max_header=max_header, max_body=max_body)

    def accept(self, deadline: float) -> Channel:
        """Wait for the agent to connect to the relay, and return the bridged connection.

        Args:
            deadline: absolute ``time.monotonic()`` value.

        Returns:
            The connection, not yet authenticated (the handshake is the caller's).

        Raises:
            AgentTimeoutError: no agent connected by ``deadline`` (the relay's last error, if it failed, is named).
            ChannelLost: the endpoint is closed, or another controller took the sandbox over meanwhile.
            ConfigError: the sandbox's directory on the node is gone.
        """
        if self._closed:
            raise ChannelLost(f"the endpoint of sandbox {self.sandbox_id} is closed")
        tls = self._connect(deadline)
        try:
            near, far = socket.socketpair()
        except OSError as exc:
            tls.close()
            raise ChannelLost(f"cannot make a socket pair for sandbox {self.sandbox_id}: {exc}") from exc
        try:
            _bridges().add(tls, far)
        except BaseException:
            for sock in (tls, far, near):
                sock.close()
            raise
        logger.debug("sandbox %s: the relay at %s bridged an agent", self.sandbox_id, self.client.address)
        return Channel(near, self._max_header, self._max_body)

    def _connect(self, deadline: float) -> ssl.SSLSocket:
        """The relay's bridged connection; a relay that is restarting (a service update, a crash) is waited for
        until ``deadline``, as its agent waits for it."""
        while True:
            try:
                return self.client.connect(self.sandbox_id, deadline)
            except RelayUnavailable as exc:
                if time.monotonic() + _RELAY_RETRY_SECONDS >= deadline:
                    raise AgentTimeoutError(
                        f"no agent of sandbox {self.sandbox_id} connected through the relay at {self.client.address} "
                        f"in time; the relay's last answer: {exc}"
                    ) from exc
                logger.info("sandbox %s: the relay at %s: %s; trying again", self.sandbox_id, self.client.address, exc)
                time.sleep(_RELAY_RETRY_SECONDS)

    def mounts(self) -> dict[str, str]:
        """The sandbox directory on its node -> ``CHANNEL_MOUNT``, to be mounted read-only."""
        return {str(self.directory): CHANNEL_MOUNT}

    def environment(self) -> dict[str, str]:
        """``ORCH_CHANNEL`` and ``ORCH_SECRET_FILE``: the socket and the secret as the container sees them."""
        return channel_environment()

    def constraints(self) -> list[str]:
        """The sandbox must run on the relay's node, where its directory is."""
        return [f"node.id=={self.node_id}"]

    def groups(self) -> list[int]:
        """None: the relay runs as root and gives the directory to the sandbox's (supervisor's) uid."""
        return []

    def close(self) -> None:
        """Stop accepting (idempotent); the relay keeps listening for the sandbox's next controller."""
        self._closed = True

    def remove(self) -> None:
        """Close, then have the relay delete the sandbox's directory (its sandbox is gone).

        A relay that cannot be reached is logged, not raised: this is clean-up, and the
        directory is left to a later sweep (``SwarmBackend``: after each removal, the relay of
        every ready node lists its directories by ``RelayClient.sandbox_ages``, and those
        without a service go once they are older than the grace).
        """
        self.close()
        try:
            self.client.remove(self.sandbox_id)
        except RelayUnavailable as exc:
            logger.warning(
                "sandbox %s: its directory on node %s stays for now (%s); the next removal's sweep removes it once "
                "that node's relay answers",
                self.sandbox_id,
                self.node_id,
                exc,
            )


def _check_id(sandbox_id: str) -> None:
    try:
        rendezvous.check_sandbox_id(sandbox_id)
    except rendezvous.RendezvousError as exc:
        raise ConfigError(str(exc)) from None


# -- the bridges: one thread moves the bytes of every relay connection of this process


class _Bridges:
    """The thread that runs every bridge (``agent/bridge.py``) between a relay connection and a channel."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._new: list[Bridge] = []
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._thread = threading.Thread(target=self._run, name="relay-bridges", daemon=True)
        self._thread.start()

    def add(self, tls: ssl.SSLSocket, local: socket.socket) -> None:
        """Hand ``tls`` and ``local`` to the thread: from now on only it uses them, and it closes them."""
        bridge = Bridge(tls, local)
        with self._lock:
            self._new.append(bridge)
        with contextlib.suppress(BlockingIOError):
            self._wake_w.send(b"\0")

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        watched: dict[Bridge, dict[int, int]] = {}
        while True:
            deadlines = [b.ends_by for b in watched if b.ends_by is not None]
            timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            events: dict[Bridge, dict[int, int]] = {}
            for key, mask in selector.select(timeout):
                if key.data is None:
                    with contextlib.suppress(BlockingIOError):
                        while self._wake_r.recv(4096):
                            pass
                    with self._lock:
                        for bridge in self._new:
                            watched[bridge] = dict.fromkeys(bridge.interest(), 0)
                            events[bridge] = {}
                        self._new.clear()
                else:
                    events.setdefault(key.data, {})[key.fd] = mask
            now = time.monotonic()
            for bridge in watched:
                if bridge.ends_by is not None and now >= bridge.ends_by:
                    events.setdefault(bridge, {})
            for bridge, seen in events.items():
                try:
                    alive = bridge.pump(seen.get(bridge.plain_fd, 0), seen.get(bridge.tls_fd, 0))
                except Exception as exc:  # a bug must not stop every other bridge
                    logger.error("a relay bridge failed: %r", exc)
                    alive = False
                masks = watched[bridge]
                for fd, mask in (bridge.interest() if alive else dict.fromkeys(masks, 0)).items():
                    if mask != masks[fd]:
                        if not masks[fd]:
                            selector.register(fd, mask, bridge)
                        elif not mask:
                            selector.unregister(fd)
                        else:
                            selector.modify(fd, mask, bridge)
                        masks[fd] = mask
                if not alive:
                    bridge.close()
                    del watched[bridge]


_bridges_lock = threading.Lock()
_the_bridges: _Bridges | None = None


def _bridges() -> _Bridges:
    global _the_bridges
    with _bridges_lock:
        if _the_bridges is None:
            _the_bridges = _Bridges()
        return _the_bridges


def _forget_bridges() -> None:
    global _the_bridges, _bridges_lock
    _the_bridges = None  # a forked child has no bridge thread: it starts its own
    _bridges_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_bridges)
