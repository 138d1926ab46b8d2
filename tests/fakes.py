"""An engine and a sandbox agent without Docker, so a real ``Orchestrator`` and ``Session`` run in milliseconds.

The fake sits at the two boundaries of the controller: ``FakeBackend`` is the engine
(``backends.base.Backend``), and each endpoint it makes hands the controller a real socket whose
other end is a ``FakeAgent`` thread, which takes one hop on the descriptors carrier as a local agent does. Everything
between (session, recovery, ledger and store, sandbox, connection and its request loop, channel, frames, handshake) is
the real code. As httpx's ``MockTransport``
takes a handler that answers each request, the backend takes one ``Handler``: called with the
agent and each request, it answers as a healthy agent would (``agent.answer``) or misbehaves.

The healthy agent keeps a namespace of its own: a cell ``name = text`` stores ``text`` under
``name`` (a checkpoint delta with one blob), any other cell changes nothing; a restore loads the
blobs back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import re
import secrets
import select
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import reply_support

from orchestrator.agent import blob_format, framing, handover, handshake, protocol, request_table
from orchestrator.backends.base import SANDBOX_ID, ContainerState, Phase, Placement, ResourceUsage, SandboxSpec
from orchestrator.backends.docker import DockerBackend
from orchestrator.config import Settings
from orchestrator.wire.transport import Channel

Header = dict[str, Any]
Answer = Header | tuple[Header, bytes] | None
"""A reply header (with a body), sent on D as is (a reply the supervisor makes in the real agent, ``worker_lost``'s,
is one a worker could forge: the controller takes it), or None: the agent sends nothing more, on D or C (it hangs, or
it hung up with ``die``)."""
Handler = Callable[["FakeAgent", Header, bytes], Answer]

_ASSIGNMENT = re.compile(r"(\w+) = (.*)", re.DOTALL)
_container_ids = itertools.count(1)


def fake_settings(root: Path, **environ: str) -> Settings:
    """Settings for sessions on the fake engine, their state under ``root``; ``environ``: more ``ORCH_*`` variables."""
    return Settings.from_env(
        {
            "ORCH_STATE_DIR": str(root / "state"),
            "ORCH_RUNTIME_DIR": str(root / "run"),
            "ORCH_IMAGE": "fake:latest",
            **environ,
        }
    )


def healthy(agent: FakeAgent, request: Header, body: bytes) -> Answer:
    """The handler of an agent that does what it is asked."""
    return agent.answer(request, body)


@dataclasses.dataclass
class FakeContainer:
    id: str
    spec: SandboxSpec
    running: bool = True
    exit_code: int | None = None
    oom_killed: bool = False
    agent: FakeAgent | None = None

    def state(self) -> ContainerState:
        status, phase = ("running", Phase.RUNNING) if self.running else ("exited", Phase.ENDED)
        facts = (status, phase, self.running, self.exit_code, self.oom_killed)
        return ContainerState(self.id, self.spec.name, *facts, dict(self.spec.labels))


class FakeBackend:
    """The engine: containers are records, each sandbox's agent a thread behind a socket pair."""

    capabilities = DockerBackend.capabilities  # a local engine's
    check_placement = DockerBackend.check_placement

    def __init__(self, handler: Handler = healthy) -> None:
        self.handler = handler
        self.containers: dict[str, FakeContainer] = {}
        self.removed: list[str] = []
        self.resources: dict[str, ResourceUsage] = {}
        """What ``resource_usage`` reports of a container (by id) while it exists; a test sets it."""
        self._lock = threading.Lock()

    def image_exists(self, tag: str) -> bool:
        return True

    def image_id(self, tag: str) -> str | None:
        return "sha256:" + "0" * 64

    def image_labels(self, tag: str) -> dict[str, str] | None:
        return {"orchestrator.protocol": "1"}

    def build_image(
        self, context_tar: bytes, tag: str, buildargs: Mapping[str, str], labels: Mapping[str, str]
    ) -> None:
        pass

    def create_endpoint(self, sandbox_id: str, settings: Settings, placement: Placement) -> FakeEndpoint:
        return FakeEndpoint(self, sandbox_id, settings)

    def open_endpoint(self, sandbox_id: str, container_id: str, settings: Settings) -> FakeEndpoint:
        return FakeEndpoint(self, sandbox_id, settings)

    def run_sandbox(self, spec: SandboxSpec, settings: Settings) -> str:
        container = FakeContainer(f"{next(_container_ids):012x}", spec)
        with self._lock:
            self.containers[container.id] = container
        return container.id

    def inspect(self, container_id: str) -> ContainerState | None:
        container = self.containers.get(container_id)
        return None if container is None else container.state()

    def kill(self, container_id: str, signal: str = "SIGKILL") -> None:
        container = self.containers.get(container_id)
        if container is not None and signal == "SIGKILL":
            container.running, container.exit_code = False, 137
            if container.agent is not None:
                container.agent.hang_up()

    def remove(self, container_id: str) -> None:
        with self._lock:
            container = self.containers.pop(container_id, None)
        if container is not None:
            self.removed.append(container_id)
            if container.agent is not None:
                container.agent.hang_up()

    def find(self, labels: Mapping[str, str]) -> list[ContainerState]:
        with self._lock:
            found = list(self.containers.values())
        return [c.state() for c in found if all(c.spec.labels.get(k) == v for k, v in labels.items())]

    def resource_usage(self, container_ids: Iterable[str]) -> dict[str, ResourceUsage]:
        with self._lock:
            return {c: self.resources[c] for c in container_ids if c in self.resources and c in self.containers}

    def usage(self, container_id: str) -> None:
        return None

    def logs(self, container_id: str, tail: int | None) -> str:
        return ""

    def close(self) -> None:
        for container_id in list(self.containers):
            self.remove(container_id)

    def container_of(self, sandbox_id: str) -> FakeContainer:
        with self._lock:
            return next(c for c in self.containers.values() if c.spec.labels.get(SANDBOX_ID) == sandbox_id)

    def running(self) -> list[FakeContainer]:
        with self._lock:
            return [c for c in self.containers.values() if c.running]


class FakeEndpoint:
    """A sandbox's endpoint: ``accept`` starts its container's agent on one end of a socket pair."""

    def __init__(self, backend: FakeBackend, sandbox_id: str, settings: Settings) -> None:
        self.sandbox_id = sandbox_id
        self.secret = secrets.token_bytes(handshake.SECRET_BYTES)
        self._backend = backend
        self._settings = settings
        self._accepted = False

    def accept(self, deadline: float) -> Channel:
        """The container's agent connects; one that served another controller says goodbye there first and keeps
        its namespace (a takeover, docs/protocol.md)."""
        assert not self._accepted, "the fake agent connects once"
        self._accepted = True
        ours, theirs = socket.socketpair()
        container = self._backend.container_of(self.sandbox_id)
        previous = container.agent
        container.agent = FakeAgent(self._backend, container, self, theirs, previous)
        if previous is not None:
            previous.say_goodbye()
            previous.hang_up()
        return Channel(ours, self._settings.limits.max_header_bytes, self._settings.limits.max_body_bytes)

    def mounts(self) -> dict[str, str]:
        return {}

    def environment(self) -> dict[str, str]:
        return {}

    def constraints(self) -> list[str]:
        return []

    def groups(self) -> list[int]:
        return []

    def close(self) -> None:
        pass

    def remove(self) -> None:
        pass


class FakeAgent:
    """The agent of one fake sandbox, on a thread: the handshake, then one hop (docs/design/one-hop.md) on the
    descriptors carrier. Each request on the data channel (D) goes to the backend's handler, its reply back on D; on
    the supervisor's connection (C) a ``kill`` replaces the "worker" (its D closes, ``worker_replaced`` answers, the
    next ``data_channel`` brings a new D), a ``ping`` is answered and an ``interrupt`` ignored (no cell runs here)."""

    capabilities: tuple[str, ...] = ()
    """What its hello offers (a test makes it an agent too old for this controller)."""

    def __init__(
        self,
        backend: FakeBackend,
        container: FakeContainer,
        endpoint: FakeEndpoint,
        sock: socket.socket,
        previous: FakeAgent | None = None,
    ) -> None:
        """``previous``: the same agent's connection to the controller it was taken from (its namespace stays)."""
        self.container = container
        self.requests: list[Header] = []
        """Every request this agent got on this connection, in order."""
        self.values: dict[str, bytes] = {} if previous is None else previous.values
        self.generation = 0 if previous is None else previous.generation
        self.workspace: dict[str, tuple[str, int, int, bytes | str]] = {} if previous is None else previous.workspace
        """Path -> (kind, mode, mtime_ns, a file's bytes or a link's target): what files_put and file_write made."""
        self._backend = backend
        self._endpoint = endpoint
        self._control = sock
        self._data: list[socket.socket] = []  # the worker's ends of D and K
        self._sending = threading.Lock()  # a goodbye comes from another thread
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"fake-agent-{endpoint.sandbox_id}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ what a handler may do

    def answer(self, request: Header, body: bytes) -> Answer:
        """What a healthy agent replies to ``request``."""
        kind = request["type"]
        if kind == request_table.RESTORE_BEGIN:
            self.values, self.workspace = {}, {}
            return {"type": request_table.RESTORE_REPLY, "status": protocol.STATUS_OK}
        if kind == request_table.FILES_PUT:
            self._put_files(request["entries"], memoryview(body))
            return {"type": request_table.RESTORE_REPLY, "status": protocol.STATUS_OK}
        if kind in (request_table.FILE_WRITE, request_table.FILE_REMOVE):
            return self._change_file(request, bytes(body))
        if kind == request_table.LOAD:
            self.values[request["name"]] = bytes(body)
            return {"type": request_table.LOAD_REPLY, "status": protocol.STATUS_OK}
        if kind == request_table.RESTORE_END:
            self.generation = request["generation"]
            return {"type": request_table.RESTORE_REPLY, "status": protocol.STATUS_OK, "generation": self.generation}
        if kind == request_table.INSTALL:
            return {"type": request_table.INSTALL_REPLY, "status": protocol.STATUS_OK}
        if kind == request_table.EXEC:
            assignment = _ASSIGNMENT.fullmatch(request["code"])
            changed = {} if assignment is None else {assignment[1]: assignment[2].encode()}
            delta, blobs = self.delta(changed)
            return exec_reply(checkpoint=delta), blobs
        if kind in (
            request_table.RESET,
            request_table.SET_VALUE,
            request_table.CONTEXT_CREATE,
            request_table.CONTEXT_DESTROY,
        ):
            delta, blobs = self.delta({})
            return {"type": request_table.STATE_REPLY, "status": protocol.STATUS_OK, "checkpoint": delta}, blobs
        raise AssertionError(f"the fake agent does not know {kind!r}")

    def delta(self, changed: Mapping[str, bytes], files: Header | None = None) -> tuple[Header, bytes]:
        """A checkpoint delta storing ``changed`` (name -> pickle bytes) and its body; ``files``: its workspace
        part (the changed files' contents are the fake workspace's)."""
        if changed or files is not None:
            self.generation += 1
            self.values.update(changed)
        digests = {name: blob_format.blob_digest(value) for name, value in changed.items()}
        blobs = {digests[name]: value for name, value in changed.items()}
        for path, (kind, _, _, content) in self.workspace.items():
            if files is not None and kind == "f" and path in {entry[0] for entry in files["changed"]}:
                assert isinstance(content, bytes)
                blobs[blob_format.blob_digest(content)] = content
        delta = {
            "generation": self.generation,
            "blobs": [{"digest": d, "size": len(v)} for d, v in blobs.items()],
            "vars": digests,
            "deleted": [],
            "unsaved": {},
        }
        if files is not None:
            delta["files"] = files
        return delta, b"".join(blobs.values())

    def _put_files(self, entries: list[list[Any]], body: memoryview) -> None:
        """A files_put batch written into the fake workspace (each directory must be there first)."""
        offset = 0
        for path, kind, mode, mtime_ns, ref, size in entries:
            parent = path.rpartition("/")[0]
            assert not parent or self.workspace[parent][0] == "d", f"files_put sent {path!r} before its directory"
            content: bytes | str = ref
            if kind == "f":
                content, offset = bytes(body[offset : offset + size]), offset + size
            self.workspace[path] = (kind, mode, mtime_ns, content)
        assert offset == len(body)

    def _change_file(self, request: Header, body: bytes) -> Answer:
        """file_write (its directories made) or file_remove, then a delta with the change."""
        path = request["path"]
        if request["type"] == request_table.FILE_REMOVE:
            if path not in self.workspace:
                return {"type": request_table.STATE_REPLY, "status": protocol.STATUS_ERROR, "reason": "no such file"}
            for each in [p for p in self.workspace if p == path or p.startswith(path + "/")]:
                del self.workspace[each]
            return self._state({"changed": [], "deleted": [path], "unsaved": {}})
        parts = path.split("/")
        made = ["/".join(parts[: i + 1]) for i in range(len(parts) - 1)]
        made = [p for p in made if p not in self.workspace]
        for directory in made:
            self.workspace[directory] = ("d", 0o755, 1, "")
        self.workspace[path] = ("f", request["mode"], 2, body)
        changed = [[d, "d", 0o755, 1, "", 0] for d in made]
        changed.append([path, "f", request["mode"], 2, blob_format.blob_digest(body), len(body)])
        return self._state({"changed": changed, "deleted": [], "unsaved": {}})

    def _state(self, files: Header) -> Answer:
        delta, blobs = self.delta({}, files)
        return {"type": request_table.STATE_REPLY, "status": protocol.STATUS_OK, "checkpoint": delta}, blobs

    def die(self, *, oom: bool = False) -> None:
        """The container dies now (its channel closes); ``oom``: killed for its memory."""
        self.container.running, self.container.exit_code, self.container.oom_killed = False, 137, oom
        self.hang_up()

    def say_goodbye(self) -> None:
        """Another controller took the sandbox over (docs/protocol.md, "Takeover"): goodbye on C."""
        with contextlib.suppress(OSError):  # its controller may have hung up already
            self._send(self._control, {"type": protocol.GOODBYE, "reason": "taken over"})

    def hang_up(self) -> None:
        """Close C, D and K (the container died, or the agent moved to another controller)."""
        self._ended.set()
        for sock in (self._control, *self._data):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def count(self, kind: str) -> int:
        return sum(request["type"] == kind for request in self.requests)

    # ------------------------------------------------------------------ the thread

    def _serve(self) -> None:
        try:
            self._handshake()
            while not self._ended.is_set():
                ready, _, _ = select.select([self._control, *self._data[:1]], [], [])
                if self._control in ready:
                    self._control_frame()
                elif self._data and not self._request(self._data[0]):
                    self._drop_data()  # the controller closed D: the worker waits for its next data channel
        except (OSError, ValueError, framing.ChannelClosed):
            pass
        finally:
            self._drop_data()
            self._control.close()

    def _control_frame(self) -> None:
        message, fds, _ = handover.recv_with_fds(self._control, protocol.DATA_CHANNEL_FDS)
        kind = message["type"]
        if kind == protocol.DATA_CHANNEL:
            self._drop_data()
            self._data = [socket.socket(fileno=fd) for fd in fds]
        elif kind == protocol.KILL:  # the ladder's kill, or a worker the controller found misbehaving
            self._drop_data()
            self.values = {}
            reply = {"type": protocol.WORKER_REPLACED, "id": message["id"], "reason": "killed", "oom": False}
            self._send(self._control, reply)
        elif kind == request_table.PING:
            self._send(self._control, {"type": request_table.PONG, "id": message["id"], "generation": self.generation})

    def _request(self, data: socket.socket) -> bool:
        """Serve the request on D; False when D closed. A handler's None hangs the whole agent until it hangs up."""
        try:
            request, body = framing.recv_frame(data)
        except framing.ChannelClosed:
            return False
        self.requests.append(request)
        answer = self._backend.handler(self, request, bytes(body))
        if answer is None:
            self._ended.wait()
            return True
        header, reply_body = answer if isinstance(answer, tuple) else (answer, b"")
        self._send(data, {**header, "id": header.get("id", request["id"])}, reply_body)
        return True

    def _send(self, sock: socket.socket, header: Header, body: bytes = b"") -> None:
        with self._sending:
            framing.send_frame(sock, header, body)

    def _drop_data(self) -> None:
        data, self._data = self._data, []
        for sock in data:
            sock.close()

    def _handshake(self) -> None:
        nonce = handshake.new_nonce()
        hello = {
            "type": protocol.HELLO,
            "protocol": protocol.PROTOCOL_VERSION,
            "sandbox_id": self._endpoint.sandbox_id,
            "generation": self.generation,
            "python": "3.12.0",
            "dill": "fake",
            "nonce": nonce,
            "capabilities": list(self.capabilities),
        }
        framing.send_frame(self._control, hello)
        auth, _ = framing.recv_frame(self._control)
        proof = handshake.auth_proof(self._endpoint.secret, "agent", nonce, auth["nonce"])
        framing.send_frame(self._control, {"type": protocol.AUTH_OK, "proof": proof})


def exec_reply(status: str = protocol.STATUS_OK, *, checkpoint: Header | None = None, **fields: Any) -> Header:
    """An exec reply (a failed worker's when ``status`` says so: add ``reason``, ``oom``, ``ran``, ``phase``)."""
    reply = reply_support.exec_reply(status=status, duration=0.0, **fields)
    del reply["checkpoint"]
    if checkpoint is not None:
        reply["checkpoint"] = checkpoint
    return reply


def worker_lost(*, reason: str = "the worker died (killed by signal 9)", **fields: Any) -> Header:
    """The reply of an agent whose worker died during the request (``oom``, ``ran``, ``phase``, ``status`` to vary)."""
    return exec_reply(
        str(fields.pop("status", protocol.STATUS_CRASHED)), reason=reason, worker_restarted=True, **fields
    )
