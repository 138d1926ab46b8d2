"""The agent (supervisor + worker) as a host subprocess on a Unix socket: protocol, ladder, crashes.

No container here: this pins the agent's side of the protocol. Container behaviour is
proven in tests/integration against a real engine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from orchestrator.agent import protocol
from orchestrator.transport import Channel, ChannelListener


class Agent:
    def __init__(self, listener: ChannelListener, proc: subprocess.Popen[bytes]) -> None:
        self.listener = listener
        self.proc = proc
        self.channel: Channel | None = None
        self.channel = self.accept()

    def accept(self) -> Channel:
        if self.channel is not None:
            self.channel.close()
        channel = self.listener.accept(20)
        hello, _ = channel.recv(20)
        assert hello["type"] == protocol.HELLO
        self.hello = hello
        return channel

    def request(self, kind: str, body: bytes = b"", **fields):
        header = {"type": kind, "id": fields.pop("id", uuid.uuid4().hex), **fields}
        self.channel.send(header, body)
        reply, reply_body = self.channel.recv(30)
        assert reply["id"] == header["id"]
        return reply, reply_body


@pytest.fixture
def agent():
    directory = Path(tempfile.mkdtemp(prefix="orch-ut-", dir="/tmp"))
    listener = ChannelListener(directory, 8 << 20, 1 << 30)
    env = {
        **os.environ,
        "ORCH_CHANNEL": str(listener.path),
        "ORCH_SESSION_ID": "unit",
        "ORCH_INTERRUPT_GRACE": "0.5",
        "ORCH_OUTPUT_LIMIT": "1000",
        "ORCH_FRAME_TIMEOUT": "1",
    }
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.agent.supervisor"], env=env)
    agent = Agent(listener, proc)
    try:
        yield agent
    finally:
        proc.kill()
        proc.wait()
        if agent.channel is not None:
            agent.channel.close()
        agent.listener.close()
        listener.close()
        directory.rmdir()


def test_hello_names_versions_and_session(agent):
    assert agent.hello["protocol"] == protocol.PROTOCOL_VERSION
    assert agent.hello["session_id"] == "unit" and agent.hello["generation"] == 0
    assert agent.hello["python"] and agent.hello["dill"]


def test_exec_returns_output_value_and_checkpoint(agent):
    reply, body = agent.request(protocol.EXEC, code="x = 41\nprint('hi')\nx + 1", timeout=10)
    assert reply["status"] == "ok" and reply["return_value"] == "42" and reply["stdout"] == "hi\n"
    assert list(reply["checkpoint"]["vars"]) == ["x"] and len(body) == reply["checkpoint"]["blobs"][0]["size"]


def test_output_is_bounded_with_a_marker(agent):
    reply, _ = agent.request(protocol.EXEC, code="print('a' * 5000)", timeout=10)
    assert reply["stdout"].startswith("a" * 1000) and "truncated" in reply["stdout"] and len(reply["stdout"]) < 1100


def test_interruptible_cell_times_out_and_keeps_state(agent):
    agent.request(protocol.EXEC, code="x = 1", timeout=10)
    reply, _ = agent.request(protocol.EXEC, code="while True: pass", timeout=0.3)
    assert reply["status"] == protocol.STATUS_TIMEOUT and reply["worker_restarted"] is False
    assert reply["error"]["ename"] == "KeyboardInterrupt"
    assert agent.request(protocol.EXEC, code="x", timeout=10)[0]["return_value"] == "1"


def test_cell_that_swallows_the_interrupt_is_killed(agent):
    code = "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        pass"
    reply, _ = agent.request(protocol.EXEC, code=code, timeout=0.3)
    assert reply["status"] == protocol.STATUS_TIMEOUT and reply["worker_restarted"] is True
    assert agent.request(protocol.EXEC, code="1 + 1", timeout=10)[0]["return_value"] == "2"


def test_worker_death_is_reported_with_its_cause(agent):
    reply, _ = agent.request(protocol.EXEC, code="import os; os._exit(3)", timeout=10)
    assert reply["status"] == protocol.STATUS_CRASHED and reply["exit_code"] == 3 and reply["ran"] is True
    reply, _ = agent.request(protocol.EXEC, code="import os, signal; os.kill(os.getpid(), signal.SIGKILL)", timeout=10)
    assert reply["signal"] == "SIGKILL"
    assert agent.request(protocol.EXEC, code="2", timeout=10)[0]["return_value"] == "2"


def test_a_resent_request_never_runs_twice(agent):
    agent.request(protocol.EXEC, code="n = 0", timeout=10)
    first, _ = agent.request(protocol.EXEC, id="same", code="n += 1\nn", timeout=10)
    again, _ = agent.request(protocol.EXEC, id="same", code="n += 1\nn", timeout=10)
    assert first["return_value"] == again["return_value"] == "1"


def test_restore_loads_a_checkpoint_into_a_fresh_worker(agent):
    reply, body = agent.request(protocol.EXEC, code="data = {'k': [1, 2]}", timeout=10)
    delta = reply["checkpoint"]
    agent.request(protocol.EXEC, code="import os; os._exit(1)", timeout=10)
    restored, _ = agent.request(
        protocol.RESTORE, bytes(body), generation=delta["generation"], vars=delta["vars"], blobs=delta["blobs"]
    )
    assert restored["failed"] == {} and restored["generation"] == delta["generation"]
    assert agent.request(protocol.EXEC, code="data['k']", timeout=10)[0]["return_value"] == "[1, 2]"


def test_garbage_from_the_worker_kills_it_cleanly(agent):
    code = "import os, sys; os.write(int(sys.argv[1]), b'garbage!!!!!')"
    reply, _ = agent.request(protocol.EXEC, code=code, timeout=10)
    assert reply["status"] == protocol.STATUS_PROTOCOL_ERROR
    assert agent.request(protocol.EXEC, code="3", timeout=10)[0]["return_value"] == "3"


def test_half_a_frame_from_the_worker_does_not_stall_the_agent(agent):
    code = "import os, sys, struct; os.write(int(sys.argv[1]), struct.pack('!4sII', b'ORC1', 100, 0) + b'{')\n"
    code += "import time; time.sleep(30)"
    reply, _ = agent.request(protocol.EXEC, code=code, timeout=30)
    assert reply["status"] == protocol.STATUS_PROTOCOL_ERROR and "middle of a frame" in reply["reason"]
    assert agent.request(protocol.EXEC, code="4", timeout=10)[0]["return_value"] == "4"


def test_sigusr1_hands_the_agent_to_a_new_connection(agent):
    agent.request(protocol.EXEC, code="keep = 'me'", timeout=10)
    # A new controller binds a new socket file at the same path, then signals the agent.
    old_listener, agent.listener = agent.listener, ChannelListener(agent.listener.path.parent, 8 << 20, 1 << 30)
    agent.proc.send_signal(signal.SIGUSR1)
    goodbye, _ = agent.channel.recv(10)
    old_listener.close()
    assert goodbye == {"type": protocol.GOODBYE, "reason": "takeover"}
    agent.channel = agent.accept()
    assert agent.hello["generation"] == 1
    assert agent.request(protocol.EXEC, code="keep", timeout=10)[0]["return_value"] == "'me'"
