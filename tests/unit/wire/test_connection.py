"""The connection to one agent (wire/connection.py, docs/design/one-hop.md): ``AgentConnection`` and its data channel.

The agent runs on the host (tests/agent_process.py's command and environment) and connects to a real
``UnixSocketEndpoint``; the controller's own connection code drives it, as a local sandbox's would.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from agent_process import AGENT_COMMAND, AGENT_ENV

from orchestrator.agent import blob_format, framing, handover, protocol, request_table
from orchestrator.agent.handshake import Hello
from orchestrator.api.events import LiveCall, OutputEvent
from orchestrator.errors import ChannelLost, ProtocolError
from orchestrator.runtime.output import StreamRecorder
from orchestrator.wire import connection as connection_module
from orchestrator.wire.call import Call
from orchestrator.wire.connection import AgentConnection
from orchestrator.wire.data_channel import DataChannel, Descriptors
from orchestrator.wire.endpoint import SECRET_NAME, UnixSocketEndpoint
from orchestrator.wire.replies import TakenOver
from orchestrator.wire.transport import Channel
from orchestrator.wire.wakeup import Wakeup

SANDBOX = "sb-unit"
EXEC: Any = {"type": request_table.EXEC, "id": "e1"}
SCAFFOLD = "def before_cell(namespace):\n    namespace['ask'] = host_call\n"


class HostAgent:
    """A supervisor on the host, connected to a real endpoint; ``connect`` runs the controller's handshake."""

    def __init__(self, base: Path, carrier: str) -> None:
        self.carrier = carrier
        self.endpoint = UnixSocketEndpoint.create(
            base / "run", SANDBOX, sandbox_uid=None, sandbox_gid=None, max_header=1 << 20, max_body=1 << 26
        )
        environ = {
            **AGENT_ENV,
            "ORCH_CHANNEL": str(self.endpoint.path),
            "ORCH_SECRET_FILE": str(self.endpoint.directory / SECRET_NAME),
            "ORCH_SANDBOX_ID": SANDBOX,
            "ORCH_INTERRUPT_GRACE": "0.5",
            "ORCH_FRAME_TIMEOUT": "1",
        }
        self.proc = subprocess.Popen(AGENT_COMMAND, env=environ)
        self.connections: list[AgentConnection] = []

    def connect(self, frame_seconds: float = 10.0) -> AgentConnection:
        connection = AgentConnection.open(
            self.endpoint,
            sandbox_id=SANDBOX,
            deadline=time.monotonic() + 20,
            carrier=self.carrier,
            frame_seconds=frame_seconds,
        )
        self.connections.append(connection)
        return connection

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for connection in self.connections:
            connection.close()
        self.endpoint.remove()


@pytest.fixture(params=["descriptors", "relayed"])
def host_agent(request: pytest.FixtureRequest) -> Iterator[HostAgent]:
    """The host agent, its one hop on each carrier (docs/design/one-hop.md, "Carriers")."""
    base = Path(tempfile.mkdtemp(prefix="orch-t-", dir="/tmp"))  # tmp_path can be too long for a socket path
    agent = HostAgent(base, request.param)
    yield agent
    agent.close()
    shutil.rmtree(base, ignore_errors=True)


def run(connection: AgentConnection, code: str, live: LiveCall | None = None, **fields: Any) -> dict[str, Any]:
    header: Any = {"type": request_table.EXEC, "code": code, "timeout": 10, "checkpoint_timeout": 10, **fields}
    reply, _ = connection.request(header, b"", Call(time.monotonic() + 30, checkpoint_seconds=10, live=live))
    return reply


def value(connection: AgentConnection, code: str) -> str:
    reply = run(connection, code)
    assert reply["status"] == "ok", reply
    return str(reply["return_value"])


def test_cells_go_on_the_data_channel_when_asked_and_offered(host_agent: HostAgent) -> None:
    connection = host_agent.connect()
    reply = run(connection, "x = 41")
    assert reply["status"] == "ok" and list(reply["checkpoint"]["vars"]) == ["x"], reply
    assert value(connection, "x + 1") == "42"
    reply = run(connection, "1 / 0")
    assert reply["status"] == "error" and reply["error"]["ename"] == "ZeroDivisionError"
    connection.check_idle()  # nothing waits on the connection, the data channel or the host-call link


def test_a_restore_goes_on_the_data_channel(host_agent: HostAgent) -> None:
    import dill

    connection = host_agent.connect()
    deadline = time.monotonic() + 30
    begin: Any = {"type": request_table.RESTORE_BEGIN, "timeout": 10}
    assert connection.request(begin, b"", Call(deadline))[0]["status"] == "ok"
    blob = dill.dumps([1, 2, 3])
    load: Any = {"type": request_table.LOAD, "name": "y", "digest": blob_format.blob_digest(blob), "timeout": 10}
    assert connection.request(load, blob, Call(deadline))[0]["status"] == "ok"
    end: Any = {"type": request_table.RESTORE_END, "generation": 3, "timeout": 10}
    assert connection.request(end, b"", Call(deadline))[0]["generation"] == 3
    assert value(connection, "sum(y)") == "6"


def test_output_comes_on_the_call_link_before_the_reply_returns(host_agent: HostAgent, tmp_path: Path) -> None:
    connection = host_agent.connect()
    events: list[object] = []
    live = LiveCall(lambda stream: StreamRecorder(tmp_path, stream, 1000), events.append, 300.0, object(), Wakeup())
    reply = run(connection, "for i in range(3):\n    print(i)", live=live, stream=True, send_limit=1000)
    assert reply["status"] == "ok", reply
    assert "".join(event.text for event in events if isinstance(event, OutputEvent)) == "0\n1\n2\n"
    connection.check_idle()
    live.close()


def test_a_host_call_without_a_desk_is_refused_on_its_link(host_agent: HostAgent) -> None:
    connection = host_agent.connect()
    install: Any = {"type": request_table.INSTALL, "code": SCAFFOLD, "names": ["ask"], "timeout": 10}
    assert connection.request(install, b"", Call(time.monotonic() + 30))[0]["status"] == "ok"
    code = "try:\n    ask('double', 21)\nexcept Exception as exc:\n    said = str(exc)\n"
    assert run(connection, code)["status"] == "ok"
    assert "without host calls" in value(connection, "said")
    connection.check_idle()


def test_a_worker_that_dies_in_a_cell_is_crashed_and_its_fresh_worker_gets_a_new_data_channel(
    host_agent: HostAgent,
) -> None:
    connection = host_agent.connect()
    assert run(connection, "x = 1")["status"] == "ok"
    reply = run(connection, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    assert reply["status"] == protocol.STATUS_CRASHED and reply["ran"] is True and reply["worker_restarted"], reply
    assert "SIGKILL" in reply["reason"], reply
    assert value(connection, "'x' in globals()") == "False"  # a fresh worker, one hop
    connection.check_idle()


def test_a_worker_that_died_between_calls_answers_the_next_request_crashed_without_running_it(
    host_agent: HostAgent,
) -> None:
    connection = host_agent.connect()
    assert run(connection, "import os, threading\nthreading.Timer(0.2, os._exit, (3,)).start()")["status"] == "ok"
    time.sleep(1)
    reply = run(connection, "ran = True")
    assert reply["status"] == protocol.STATUS_CRASHED and reply["ran"] is False, reply
    assert value(connection, "'ran' in globals()") == "False"


def test_a_host_call_between_requests_is_refused_by_the_worker_and_one_forged_on_k_by_check_idle(
    host_agent: HostAgent,
) -> None:
    connection = host_agent.connect()
    install: Any = {"type": request_table.INSTALL, "code": SCAFFOLD, "names": ["ask"], "timeout": 10}
    assert connection.request(install, b"", Call(time.monotonic() + 30))[0]["status"] == "ok"
    code = (
        "import gc, json, os, struct, threading, time\nsaid = []\n"
        "link = next(o for o in gc.get_objects() if type(o).__name__ == 'Worker').calls._sock\n"
        "def _later(ask=ask):\n    time.sleep(0.2)\n    try:\n        ask('late')\n"
        "    except Exception as exc:\n        said.append(str(exc))\n"
        "    head = json.dumps({'type': 'host_call', 'call': 99, 'name': 'late'}).encode()\n"
        "    os.write(link.fileno(), struct.pack('!4sII', b'ORC1', len(head), 2) + head + b'{}')\n"
        "    said.append(link.recv(4096))\n"  # no call went out before: nobody else reads the link
        "threading.Thread(target=_later, daemon=True).start()"
    )
    assert run(connection, code)["status"] == "ok"
    time.sleep(1)
    connection.check_idle()  # the forged call is answered, and nothing is lost
    waited = "import time\n_t = time.monotonic()\nwhile len(said) < 2 and time.monotonic() - _t < 5:\n"
    said = value(connection, waited + "    time.sleep(0.01)\nsaid")
    assert said.count(protocol.CALL_NO_CELL) == 2, said  # the worker's own refusal, then the controller's answer
    connection.check_idle()


def test_the_handover_sends_two_fresh_stream_sockets_and_keeps_none() -> None:
    ours, theirs = socket.socketpair()
    control = Channel(ours, 4096, 4096)
    data = DataChannel.hand_over(control, deadline=time.monotonic() + 5)
    theirs.settimeout(5)
    header, fds, _ = handover.recv_with_fds(theirs, 4)
    assert header == {"type": protocol.DATA_CHANNEL}
    requests, calls = handover.stream_sockets(fds, protocol.DATA_CHANNEL_FDS)
    data.requests.send({"type": "ping"}, deadline=time.monotonic() + 5)
    requests.settimeout(5)
    assert framing.recv_frame(requests)[0] == {"type": "ping"}
    data.close()
    calls.settimeout(5)
    assert calls.recv(1) == b""  # our end closed: the worker sees EOF
    for sock in (requests, calls, theirs):
        sock.close()
    control.close()


def test_the_callers_interrupt_goes_on_the_connection_and_the_namespace_stays(
    host_agent: HostAgent, tmp_path: Path
) -> None:
    connection = host_agent.connect()
    assert run(connection, "kept = 7")["status"] == "ok"
    live = LiveCall(lambda stream: StreamRecorder(tmp_path, stream, 1000), None, 300.0, object(), Wakeup())
    threading.Timer(0.5, live.interrupt).start()
    reply = run(connection, "import time\ntime.sleep(60)", live=live)  # nobody else stops it: the deadline is 30 s
    assert reply["status"] == protocol.STATUS_TIMEOUT and reply["worker_restarted"] is False, reply
    assert reply["phase"] == "cell" and reply["error"]["ename"] == "KeyboardInterrupt", reply
    live.close()
    assert value(connection, "kept") == "7"
    connection.check_idle()


def test_replace_worker_kills_it_through_the_supervisor_and_hands_the_fresh_one_a_new_data_channel(
    host_agent: HostAgent,
) -> None:
    connection = host_agent.connect()
    assert run(connection, "x = 1")["status"] == "ok"
    old = connection._data
    replaced = connection.replace_worker(deadline=time.monotonic() + 10)
    assert replaced["type"] == protocol.WORKER_REPLACED and "killed" in replaced["reason"], replaced
    assert connection._data is not None and connection._data is not old  # the old ends are closed, never read again
    assert value(connection, "'x' in globals()") == "False"  # a fresh worker, one hop
    connection.check_idle()


WORKER = "next(o for o in __import__('gc').get_objects() if type(o).__name__ == 'Worker')"


def test_a_cell_past_its_timeout_is_interrupted_by_the_controllers_ladder_and_the_namespace_stays(
    host_agent: HostAgent,
) -> None:
    connection = host_agent.connect()
    assert run(connection, "kept = 7")["status"] == "ok"
    reply = run(connection, "import time\ntime.sleep(60)", timeout=0.3)  # the deadline is 30 s: the ladder stops it
    assert reply["status"] == protocol.STATUS_TIMEOUT and reply["worker_restarted"] is False, reply
    assert reply["phase"] == "cell" and reply["error"]["ename"] == "KeyboardInterrupt", reply
    assert value(connection, "kept") == "7"
    connection.check_idle()


def test_a_cell_that_ignores_the_interrupt_is_killed_after_the_grace_and_its_fresh_worker_gets_a_data_channel(
    host_agent: HostAgent,
) -> None:
    connection = host_agent.connect()
    assert run(connection, "kept = 7")["status"] == "ok"
    code = "import time\nwhile True:\n    try:\n        time.sleep(60)\n    except KeyboardInterrupt:\n        pass"
    reply = run(connection, code, timeout=0.3)
    assert reply["status"] == protocol.STATUS_TIMEOUT and reply["worker_restarted"] is True, reply
    assert reply["phase"] == "cell" and reply["ran"] is True and "killed" in reply["reason"], reply
    assert reply["type"] == request_table.EXEC_REPLY and isinstance(reply["duration"], float), reply
    assert value(connection, "'kept' in globals()") == "False"  # a fresh worker, one hop
    connection.check_idle()


def test_a_cell_that_closes_its_own_data_channel_has_its_worker_replaced_and_is_crashed(host_agent: HostAgent) -> None:
    connection = host_agent.connect()
    assert run(connection, "kept = 7")["status"] == "ok"
    code = f"import socket, time\n{WORKER}.sock.shutdown(socket.SHUT_WR)\ntime.sleep(30)"  # the worker lives on
    reply = run(connection, code)
    assert reply["status"] == protocol.STATUS_CRASHED and reply["ran"] is True and reply["worker_restarted"], reply
    assert "killed" in reply["reason"], reply
    assert value(connection, "'kept' in globals()") == "False"
    connection.check_idle()


def test_a_cell_that_closes_its_own_call_link_loses_only_its_calls(host_agent: HostAgent) -> None:
    """A worker's call link that breaks is closed: the cell, its worker and its namespace go on, its calls fail
    until the worker's next data channel."""
    connection = host_agent.connect()
    install: Any = {"type": request_table.INSTALL, "code": SCAFFOLD, "names": ["ask"], "timeout": 10}
    assert connection.request(install, b"", Call(time.monotonic() + 30))[0]["status"] == "ok"
    assert run(connection, "kept = 7")["status"] == "ok"
    code = f"import socket\n{WORKER}.calls._sock.shutdown(socket.SHUT_WR)\nkept += 1"
    assert run(connection, code)["status"] == "ok"
    said = value(connection, "try:\n    ask('x')\nexcept Exception as exc:\n    said = str(exc)\nsaid")
    assert "could not be sent" in said or "unavailable" in said, said
    assert value(connection, "kept") == "8", "the same worker"
    connection.check_idle()


def test_a_worker_lost_between_calls_is_found_by_check_idle_and_answers_the_next_request(host_agent: HostAgent) -> None:
    connection = host_agent.connect()
    assert run(connection, "import os, threading\nthreading.Timer(0.2, os._exit, (3,)).start()")["status"] == "ok"
    time.sleep(1)
    connection.check_idle()  # the supervisor's worker_lost (or D's EOF): a fresh worker and data channel, no error
    connection.check_idle()
    reply = run(connection, "ran = True")
    assert reply["status"] == protocol.STATUS_CRASHED and reply["ran"] is False, reply
    assert "status 3" in reply["reason"], reply
    assert value(connection, "'ran' in globals()") == "False"
    connection.check_idle()


def test_a_cell_that_writes_on_its_data_channel_between_calls_has_its_worker_replaced(host_agent: HostAgent) -> None:
    connection = host_agent.connect()
    code = f"import threading, time\nw = {WORKER}\nthreading.Timer(0.2, w.sock.sendall, (b'forged',)).start()"
    assert run(connection, code)["status"] == "ok"
    time.sleep(1)
    connection.check_idle()  # D is readable between calls: the worker is killed and replaced through C
    reply = run(connection, "ran = True")
    assert reply["status"] == protocol.STATUS_CRASHED and reply["ran"] is False, reply
    assert "between calls" in reply["reason"], reply
    assert value(connection, "'w' in globals() or 'ran' in globals()") == "False"
    connection.check_idle()


def test_an_interrupt_that_comes_after_its_cell_ended_leaves_the_idle_worker_and_its_data_channel_alone(
    host_agent: HostAgent,
) -> None:
    connection = host_agent.connect()
    assert run(connection, "kept = 7")["status"] == "ok"
    for phase in ("cell", "checkpoint"):  # the ladder's (or the caller's) interrupt, sent as the reply came
        connection._interrupt("a-request-that-ended", phase)
    time.sleep(0.5)  # the supervisor has signalled the worker, which waits on D for its next request
    connection.check_idle()
    assert value(connection, "kept") == "7"
    connection.check_idle()


ON_D = (
    "import os, sys, threading, time\n"
    "frame = sys._getframe()\n"
    "while frame.f_code.co_name != 'handle':\n"
    "    frame = frame.f_back\n"
    "d = frame.f_locals['self'].sock.fileno()\n"
)
"""Cell code that finds its worker's end of D (``d``), as a forger would."""


@pytest.mark.parametrize(
    "write",
    [
        "os.write(d, b'garbage!!!!!')",
        "os.write(d, b'ORC1' + (2 ** 31).to_bytes(4, 'big') + bytes(4))",
        "import json\nhead = json.dumps({'type': 'exec_reply', 'id': 'another', 'status': 'ok'}).encode()\n"
        "os.write(d, b'ORC1' + len(head).to_bytes(4, 'big') + bytes(4) + head)",
    ],
    ids=["garbage", "huge-header", "another-id"],
)
def test_a_forged_frame_on_d_replaces_the_worker_and_is_a_protocol_error(host_agent: HostAgent, write: str) -> None:
    connection = host_agent.connect()
    assert run(connection, "x = 1")["status"] == "ok"
    reply = run(connection, ON_D + write + "\ntime.sleep(1)")
    assert reply["status"] == protocol.STATUS_PROTOCOL_ERROR and reply["worker_restarted"] is True, reply
    assert reply["ran"] is True and "killed" in reply["reason"], reply
    assert value(connection, "'x' in globals()") == "False"  # a fresh worker, a new D
    connection.check_idle()


def test_a_frame_that_stalls_on_d_is_a_protocol_error_after_the_frame_time(host_agent: HostAgent) -> None:
    connection = host_agent.connect(frame_seconds=0.5)
    started = time.monotonic()
    reply = run(connection, ON_D + "os.write(d, b'ORC1')\ntime.sleep(60)")
    assert time.monotonic() - started < 8
    assert reply["status"] == protocol.STATUS_PROTOCOL_ERROR and "middle of a frame" in reply["reason"], reply
    assert value(connection, "1 + 1") == "2"


FORGE_CELL_DONE = f"""
import sys, time
w = {WORKER}
framing = sys.modules[type(w).__module__.rpartition('.')[0] + '.framing']
f = sys._getframe()
while not isinstance(f.f_locals.get('header'), dict):
    f = f.f_back
framing.send_frame(w.sock, {{'type': 'cell_done', 'id': f.f_locals['header']['id']}})
while True:
    time.sleep(1)
"""


def test_a_cell_that_forges_its_cell_done_only_trades_its_clock_for_the_checkpoints_and_is_killed(
    host_agent: HostAgent,
) -> None:
    connection = host_agent.connect()
    reply = run(connection, FORGE_CELL_DONE, timeout=30, checkpoint_timeout=0.3)  # its own limit would be 30 s
    assert reply["status"] == protocol.STATUS_TIMEOUT and reply["worker_restarted"] is True, reply
    assert reply["phase"] == "checkpoint", reply  # the checkpoint's interrupt (SIGUSR2) does not stop a cell
    assert value(connection, "'w' in globals()") == "False"
    connection.check_idle()


class FakeSupervisor:
    """The supervisor's end of C, played by the test: what it says is written before the controller asks."""

    def __init__(self) -> None:
        ours, self.sock = socket.socketpair()
        self.sock.settimeout(5)
        self.control = Channel(ours, 4096, 4096)
        carrier = Descriptors()
        data = carrier.hand_over(self.control, deadline=time.monotonic() + 5)
        self.connection = AgentConnection(cast(Hello, {}), carrier, self.control, data, 0.5)
        self.take_data_channel()

    def take_data_channel(self) -> None:
        header, fds, _ = handover.recv_with_fds(self.sock, 4)
        assert header == {"type": protocol.DATA_CHANNEL} and len(fds) == protocol.DATA_CHANNEL_FDS
        handover.close_fds(fds)

    def say(self, **message: Any) -> None:
        framing.send_frame(self.sock, message)

    def heard(self) -> dict[str, Any]:
        return framing.recv_frame(self.sock)[0]

    def close(self) -> None:
        self.connection.close()
        self.sock.close()


@pytest.fixture
def supervisor() -> Iterator[FakeSupervisor]:
    fake = FakeSupervisor()
    yield fake
    fake.close()


def test_replace_worker_returns_the_death_the_kill_outran_and_hands_over_after_the_kills_answer(
    supervisor: FakeSupervisor,
) -> None:
    supervisor.say(type=protocol.WORKER_LOST, reason="the worker exited with status 3", oom=False)
    supervisor.say(type=protocol.WORKER_REPLACED, id="k1", reason="killed", oom=False)
    said = supervisor.connection.replace_worker("k1", deadline=time.monotonic() + 5)
    assert said["type"] == protocol.WORKER_LOST and "status 3" in said["reason"], said
    assert supervisor.heard() == {"type": protocol.KILL, "id": "k1"}
    supervisor.take_data_channel()  # only after the kill's own answer


@pytest.mark.parametrize(
    "answer",
    [{"type": request_table.PONG, "id": "k1"}, {"type": "lunch"}, {"type": protocol.WORKER_REPLACED, "id": "k0"}],
)
def test_replace_worker_refuses_any_other_answer_and_leaves_no_data_channel(
    supervisor: FakeSupervisor, answer: dict[str, Any]
) -> None:
    supervisor.say(**answer)
    with pytest.raises(ProtocolError, match="while it replaced its worker"):
        supervisor.connection.replace_worker("k1", deadline=time.monotonic() + 5)
    with pytest.raises(ChannelLost, match="could not be handed over"):
        supervisor.connection.request(EXEC, b"", Call(time.monotonic() + 1))


def test_replace_worker_says_goodbye_as_taken_over(supervisor: FakeSupervisor) -> None:
    supervisor.say(type=protocol.GOODBYE, reason="takeover", in_flight=None)
    with pytest.raises(TakenOver):
        supervisor.connection.replace_worker("k1", deadline=time.monotonic() + 5)


def test_a_kill_that_meets_a_connection_closed_behind_a_goodbye_is_taken_over(supervisor: FakeSupervisor) -> None:
    """The supervisor said goodbye (another controller took over) and closed C before the kill went out: the broken
    write is the takeover's, never a transport failure."""
    supervisor.say(type=protocol.GOODBYE, reason="takeover", in_flight=None)
    supervisor.sock.close()
    with pytest.raises(TakenOver):
        supervisor.connection.replace_worker("k1", deadline=time.monotonic() + 5)


def test_a_kill_that_meets_a_connection_closed_without_a_goodbye_is_a_lost_channel(
    supervisor: FakeSupervisor,
) -> None:
    supervisor.sock.close()
    with pytest.raises(ChannelLost):
        supervisor.connection.replace_worker("k1", deadline=time.monotonic() + 5)


def test_a_supervisor_that_does_not_answer_a_kill_between_calls_makes_the_sandbox_go(
    supervisor: FakeSupervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connection_module, "_REPLACE_SECONDS", 0.2)
    assert supervisor.connection._data is not None
    supervisor.connection._data.requests.close()  # as if the worker hung up on D: it is to be replaced through C
    with pytest.raises(ChannelLost, match="could not be replaced between calls"):
        supervisor.connection.check_idle()


def test_a_worker_lost_between_calls_answers_the_next_request_without_sending_it(supervisor: FakeSupervisor) -> None:
    supervisor.say(type=protocol.WORKER_LOST, reason="the worker was killed by SIGKILL", oom=True)
    supervisor.connection.check_idle()
    supervisor.take_data_channel()
    reply, _ = supervisor.connection.request(EXEC, b"", Call(time.monotonic() + 1))
    assert reply == {
        "type": request_table.EXEC_REPLY,
        "id": "e1",
        "status": protocol.STATUS_CRASHED,
        "reason": "the worker was killed by SIGKILL",
        "oom": True,
        "ran": False,
        "worker_restarted": True,
    }


def test_a_restore_that_hangs_clearing_the_namespace_gets_a_fresh_worker_through_the_ladder(
    host_agent: HostAgent,
) -> None:
    connection = host_agent.connect()
    code = "class Stuck:\n    def __del__(self):\n        __import__('time').sleep(60)\nstuck = Stuck()"
    assert run(connection, code, checkpoint=False)["status"] == "ok"
    begin: Any = {"type": request_table.RESTORE_BEGIN, "generation": 0, "timeout": 0.3}
    reply, _ = connection.request(begin, b"", Call(time.monotonic() + 30))
    assert reply["status"] == protocol.STATUS_OK and reply["worker_restarted"] is True, reply  # a fresh one is empty
    assert value(connection, "'stuck' in globals()") == "False"
    connection.check_idle()
