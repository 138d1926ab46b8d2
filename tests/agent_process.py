"""The agent (supervisor + worker) as a host subprocess on a Unix socket, driven by a test playing the controller.

The test side uses the bare frame functions (its own listening socket, its own handshake, its own data channel and
the agent's ladder), so the agent's tests do not depend on the controller's transport code. The fixtures
``make_agent`` and ``agent`` are in tests/unit/conftest.py.
"""

from __future__ import annotations

import atexit
import os
import secrets
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import dill

from orchestrator.agent import blob_format, control, framing, handover, handshake, protocol, request_table
from orchestrator.agent.ladder import KILL, Ladder

GRACE = 0.5  # the agent's ORCH_INTERRUPT_GRACE, and the test's ladder's
OnCall = Callable[[dict, bytearray], "tuple[dict, bytes] | None"]

SLOW_REDUCE = """
import time
class Slow:
    def __reduce__(self):
        time.sleep(60)
        return (Slow, ())
"""


class Link:
    """One connection from the agent, seen from the controller's side."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def send(self, header: dict, body=b"") -> None:
        self.sock.settimeout(60)
        framing.send_frame(self.sock, header, body)

    def recv(self, timeout: float = 30) -> tuple[dict, bytearray]:
        self.sock.settimeout(timeout)
        return framing.recv_frame(self.sock)

    def closed_by_peer(self, timeout: float = 10) -> bool:
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


# The agent runs as the image runs it: the package ``orchestrator_agent`` alone, with dill beside it, on
# the interpreter AGENT_TEST_PYTHON names (default: this one), e.g. the oldest Python the agent supports.
AGENT_PYTHON = os.environ.get("AGENT_TEST_PYTHON") or sys.executable
AGENT_PATH = Path(tempfile.mkdtemp(prefix="orch-agent-pkg-"))
atexit.register(shutil.rmtree, AGENT_PATH, ignore_errors=True)
(AGENT_PATH / "orchestrator_agent").symlink_to(Path(protocol.__file__).parent)
(AGENT_PATH / "dill").symlink_to(Path(dill.__file__).parent)
# The worker runs as the test's own uid: a worker uid of its own could not even run this (private) interpreter.
AGENT_ENV = {
    **os.environ,
    "PYTHONPATH": str(AGENT_PATH),
    "PYTHONDONTWRITEBYTECODE": "1",
    "ORCH_WORKER_UID": str(os.geteuid()),
}
AGENT_COMMAND = [AGENT_PYTHON, "-m", "orchestrator_agent.supervisor"]


class Agent:
    """A supervisor subprocess, its secret file, the listening socket it connects to, and its worker's data channel.

    The test plays the controller of docs/protocol.md, "One hop": after the handshake (and after every worker
    replacement) it hands the worker a data channel, ``data`` (requests and replies) and ``calls`` (host calls and
    output), and keeps each request's ladder (agent/ladder.py), asking the supervisor on ``link`` to interrupt and kill.
    """

    def __init__(self, directory: Path, **env: str) -> None:
        self.directory = directory
        self.path = directory / "channel.sock"
        self.secret = secrets.token_bytes(32)
        self.cell_done: list[str] = []  # the requests whose worker said cell_done
        self.output: list[tuple[str, bytes]] = []  # the cells' output frames
        self.data: Link | None = None
        self.calls: Link | None = None
        (directory / "secret").write_text(self.secret.hex() + "\n")
        self.listener = self.listen()
        environ = {
            **AGENT_ENV,
            "ORCH_CHANNEL": str(self.path),
            "ORCH_SECRET_FILE": str(directory / "secret"),
            "ORCH_SANDBOX_ID": "sb-unit",
            "ORCH_INTERRUPT_GRACE": str(GRACE),
            "ORCH_OUTPUT_LIMIT": "1000",
            "ORCH_FRAME_TIMEOUT": "1",
            **env,
        }
        self.proc = subprocess.Popen(AGENT_COMMAND, env=environ)
        self.link = self.connect()

    def listen(self) -> socket.socket:
        """Bind a new socket file at the channel path (replacing any), as a (new) controller does."""
        if self.path.exists():
            self.path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(self.path))
        sock.listen(8)
        return sock

    def accept(self, timeout: float = 20) -> Link:
        self.listener.settimeout(timeout)
        conn, _ = self.listener.accept()
        return Link(conn)

    def connect(self, timeout: float = 20) -> Link:
        """Accept the agent, do the handshake as the controller and hand over a data channel."""
        link = self.accept(timeout)
        hello, _ = link.recv(timeout)
        assert hello["type"] == protocol.HELLO
        self.hello = hello
        nonce = handshake.new_nonce()
        proof = handshake.auth_proof(self.secret, "controller", hello["nonce"], nonce)
        link.send({"type": protocol.AUTH, "nonce": nonce, "proof": proof})
        ok, _ = link.recv(timeout)
        assert ok["type"] == protocol.AUTH_OK
        assert handshake.proof_matches(handshake.auth_proof(self.secret, "agent", hello["nonce"], nonce), ok["proof"])
        self.hand_over(link)
        return link

    def hand_over(self, link: Link | None = None) -> None:
        """A new data channel for the worker (the one before, if any, is closed): D and K, sent on ``link``."""
        self.drop_data()
        data, data_theirs = socket.socketpair()
        calls, calls_theirs = socket.socketpair()
        theirs = [data_theirs.fileno(), calls_theirs.fileno()]
        handover.send_with_fds((link or self.link).sock, control.data_channel_message(), theirs)
        data_theirs.close()
        calls_theirs.close()
        self.data, self.calls = Link(data), Link(calls)

    def drop_data(self) -> None:
        for end in (self.data, self.calls):
            if end is not None:
                end.close()
        self.data = self.calls = None

    def request(
        self, type_: str, body=b"", wait: float = 30, on_call: OnCall | None = None, fds=(), **fields
    ) -> tuple[dict, bytearray]:
        """Send a request on D (``fds`` attached: a value file) and wait for its reply under its ladder; ``on_call``
        answers the cell's host calls (None: no answer). A ``ping`` goes on the connection."""
        header = {"type": type_, "id": fields.pop("id", uuid.uuid4().hex), **fields}
        if type_ == request_table.PING:
            self.link.send(header)
            return self.link.recv(wait)
        if select.select([self.link.sock], [], [], 0)[0]:  # the worker was lost between requests
            lost, _ = self.link.recv()
            assert lost["type"] == protocol.WORKER_LOST, lost
            self.hand_over()
            return _made_up(header, lost, status=protocol.STATUS_CRASHED, ran=False), bytearray()
        assert self.data is not None
        if fds:
            handover.send_with_fds(self.data.sock, header, fds)
        else:
            self.data.send(header, body)
        return self.reply(header, wait, on_call)

    def reply(self, header: dict, wait: float = 30, on_call: OnCall | None = None) -> tuple[dict, bytearray]:
        """The reply to ``header``, sent on D: the ladder interrupts and kills as the controller's does."""
        interrupt = lambda phase: self.link.send(control.phase_interrupt_message(header["id"], phase))  # noqa: E731
        ladder = Ladder.for_request(header, GRACE, interrupt)
        give_up = time.monotonic() + wait
        while True:
            assert self.data is not None and time.monotonic() < give_up, header
            watched = [self.data.sock, self.link.sock] + ([self.calls.sock] if self.calls is not None else [])
            rung = ladder.wait_seconds()
            ready = select.select(watched, [], [], give_up - time.monotonic() if rung is None else rung)[0]
            if self.calls is not None and self.calls.sock in ready:
                self._serve_call(on_call)
            if self.link.sock in ready:
                lost, _ = self.link.recv()
                assert lost["type"] == protocol.WORKER_LOST, lost
                self.hand_over()
                return _made_up(header, lost, status=protocol.STATUS_CRASHED, ran=True), bytearray()
            if self.data.sock in ready:
                try:
                    reply, reply_body = self.data.recv(wait)
                except (framing.ChannelClosed, ConnectionResetError):  # the worker died: the supervisor says how
                    continue
                assert reply["id"] == header["id"], reply
                if reply["type"] == protocol.CELL_DONE:  # the checkpoint's clock runs now
                    self.cell_done.append(header["id"])
                    ladder.cell_done()
                    continue
                while self.calls is not None and select.select([self.calls.sock], [], [], 0)[0]:
                    self._serve_call(on_call)  # the cell's last output came before its reply
                if ladder.interrupted or ladder.cell_interrupted:  # its signal has reached the worker
                    assert self.request(request_table.PING)[0]["type"] == request_table.PONG
                if ladder.stopped_by_interrupt(reply.get("status")):
                    reply.update(status=protocol.STATUS_TIMEOUT, worker_restarted=False)
                    reply.setdefault("phase", "load" if header["type"] == request_table.LOAD else "cell")
                return reply, reply_body
            if ladder.expired() == KILL:
                self.link.send(control.kill_message(header["id"]))
                while (said := self.link.recv(wait)[0])["type"] == protocol.WORKER_LOST:
                    pass
                assert said["type"] == protocol.WORKER_REPLACED, said
                self.hand_over()
                return _made_up(header, {}, **ladder.killed_reply()), bytearray()

    def _serve_call(self, on_call: OnCall | None) -> None:
        """One frame on K: output is kept, a host call given to ``on_call`` (its answer, if any, sent back)."""
        assert self.calls is not None
        try:
            frame, body = self.calls.recv()
        except framing.ChannelClosed:
            self.calls.close()
            self.calls = None
            return
        if frame["type"] == protocol.OUTPUT:
            self.output.append((frame["stream"], bytes(body)))
            return
        assert frame["type"] == protocol.HOST_CALL and on_call is not None, frame
        answer = on_call(frame, body)
        if answer is not None:
            self.calls.send(*answer)

    def run(self, code: str, timeout: float = 10, checkpoint_timeout: float = 10, **fields) -> tuple[dict, bytearray]:
        return self.request(
            request_table.EXEC, code=code, timeout=timeout, checkpoint_timeout=checkpoint_timeout, **fields
        )

    def value(self, expression: str) -> str:
        reply, _ = self.run(expression)
        assert reply["status"] == "ok", reply
        return reply["return_value"]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.drop_data()
        self.link.close()
        self.listener.close()


def _made_up(request: dict, lost: dict, **fields) -> dict:
    """The reply the controller makes for a request whose worker was lost (``lost``: its ``worker_lost``) or killed."""
    row = request_table.REQUESTS[request["type"]]
    said = {key: lost[key] for key in ("reason", "oom", "signal") if key in lost}
    return {"type": row.reply, "id": request["id"], **said, **fields}


def blobs_of(reply: dict, body: bytes) -> dict[str, bytes]:
    """name -> blob bytes of an exec / state reply (blobs the checkpoint held before are not in it)."""
    index = reply["checkpoint"]["blobs"]
    parts = framing.split_body(body, [entry["size"] for entry in index])
    by_digest = {entry["digest"]: bytes(part) for entry, part in zip(index, parts, strict=True)}
    for digest, blob in by_digest.items():
        assert blob_format.blob_digest(blob) == digest
    return {name: by_digest[digest] for name, digest in reply["checkpoint"]["vars"].items() if digest in by_digest}


def load(agent: Agent, name: str, blob: bytes, timeout: float = 10, **fields) -> dict:
    digest = fields.pop("digest", blob_format.blob_digest(blob))
    return agent.request(request_table.LOAD, blob, name=name, digest=digest, timeout=timeout, **fields)[0]
