"""The agent (supervisor + worker) as a host subprocess on a Unix socket, driven by a test playing the controller.

The test side uses the bare frame functions (its own listening socket, its own handshake), so the agent's tests do
not depend on the controller's transport code. The fixtures ``make_agent`` and ``agent`` are in tests/unit/conftest.py.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import dill

from orchestrator.agent import blob_format, framing, handshake, protocol, request_table

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
    """A supervisor subprocess, its secret file, and the listening socket it connects to."""

    def __init__(self, directory: Path, one_hop: bool = False, **env: str) -> None:
        """``one_hop``: the connection takes one hop (docs/design/one-hop.md): requests then go on a data channel
        the test makes (tests/unit/agent/test_one_hop.py), not on ``link``."""
        self.directory = directory
        self.one_hop = one_hop
        self.path = directory / "channel.sock"
        self.secret = secrets.token_bytes(32)
        self.notices: list[dict] = []
        (directory / "secret").write_text(self.secret.hex() + "\n")
        self.listener = self.listen()
        environ = {
            **AGENT_ENV,
            "ORCH_CHANNEL": str(self.path),
            "ORCH_SECRET_FILE": str(directory / "secret"),
            "ORCH_SANDBOX_ID": "sb-unit",
            "ORCH_INTERRUPT_GRACE": "0.5",
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
        """Accept the agent and do the handshake as the controller."""
        link = self.accept(timeout)
        hello, _ = link.recv(timeout)
        assert hello["type"] == protocol.HELLO
        self.hello = hello
        nonce = handshake.new_nonce()
        proof = handshake.auth_proof(self.secret, "controller", hello["nonce"], nonce)
        auth = {"type": protocol.AUTH, "nonce": nonce, "proof": proof}
        link.send({**auth, protocol.ONE_HOP: True} if self.one_hop else auth)
        ok, _ = link.recv(timeout)
        assert ok["type"] == protocol.AUTH_OK
        assert handshake.proof_matches(handshake.auth_proof(self.secret, "agent", hello["nonce"], nonce), ok["proof"])
        return link

    def request(self, type_: str, body=b"", wait: float = 30, **fields) -> tuple[dict, bytearray]:
        header = {"type": type_, "id": fields.pop("id", uuid.uuid4().hex), **fields}
        self.link.send(header, body)
        reply, reply_body = self.link.recv(wait)
        if reply["type"] == protocol.CHECKPOINTING:  # an exec's cell ended; its checkpoint's clock runs now
            assert type_ == request_table.EXEC and reply["id"] == header["id"], reply
            self.notices.append(reply)
            reply, reply_body = self.link.recv(wait)
        assert reply["id"] == header["id"], reply
        return reply, reply_body

    def run(self, code: str, timeout: float = 10, checkpoint_timeout: float = 10) -> tuple[dict, bytearray]:
        return self.request(request_table.EXEC, code=code, timeout=timeout, checkpoint_timeout=checkpoint_timeout)

    def value(self, expression: str) -> str:
        reply, _ = self.run(expression)
        assert reply["status"] == "ok", reply
        return reply["return_value"]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.link.close()
        self.listener.close()


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
