"""One hop, the agent's side (docs/design/one-hop.md, step 1): the data channel the controller makes and passes.

The test plays the controller: it takes one hop in its auth, makes the two socket pairs, sends one end of each on
the connection (SCM_RIGHTS) and then talks to the worker directly; the connection carries only control frames.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import tempfile
import time
import uuid
from pathlib import Path

import dill
import pytest
from agent_process import Agent, Link

from orchestrator.agent import blob_format, framing, handover, protocol, reply_types, request_table

_OPEN: list[DataChannel] = []


@pytest.fixture
def one_hop():
    directory = Path(tempfile.mkdtemp(prefix="orch-ut-", dir="/tmp"))
    agent = Agent(directory, one_hop=True)
    yield agent
    agent.close()
    while _OPEN:
        _OPEN.pop().close()
    shutil.rmtree(directory, ignore_errors=True)


class DataChannel:
    """The controller's ends of one data channel: requests and replies, host calls."""

    def __init__(self, control: Link) -> None:
        data, data_theirs = socket.socketpair()
        calls, calls_theirs = socket.socketpair()
        handover.send_with_fds(
            control.sock, {"type": protocol.DATA_CHANNEL}, [data_theirs.fileno(), calls_theirs.fileno()]
        )
        data_theirs.close()
        calls_theirs.close()
        self.data = Link(data)
        self.calls = Link(calls)
        self.cell_done: list[str] = []
        _OPEN.append(self)

    def request(self, type_: str, body=b"", **fields) -> tuple[dict, bytearray]:
        header = {"type": type_, "id": uuid.uuid4().hex, **fields}
        self.data.send(header, body)
        return self.reply(header["id"])

    def reply(self, request_id: str) -> tuple[dict, bytearray]:
        reply, reply_body = self.data.recv()
        if reply["type"] == protocol.CELL_DONE:  # the cell ended and its checkpoint pickles: its clock runs now
            assert reply["id"] == request_id and not reply_body, reply
            self.cell_done.append(request_id)
            reply, reply_body = self.data.recv()
        assert reply["id"] == request_id, reply
        return reply, reply_body

    def run(self, code: str, **fields) -> dict:
        return self.request(request_table.EXEC, code=code, timeout=10, checkpoint_timeout=10, **fields)[0]

    def value(self, code: str) -> str:
        reply = self.run(code)
        assert reply["status"] == "ok", reply
        return reply["return_value"]

    def close(self) -> None:
        self.data.close()
        self.calls.close()


def quiet(link: Link) -> bool:
    """Nothing came on ``link``."""
    return not select.select([link.sock], [], [], 0)[0]


def test_the_hello_offers_one_hop_blob_files_and_the_relayed_carrier(agent):
    assert agent.hello["capabilities"] == [protocol.ONE_HOP, protocol.BLOB_FILES, protocol.RELAYED]


def test_cells_run_on_the_data_channel_and_the_connection_stays_quiet(one_hop):
    channel = DataChannel(one_hop.link)
    reply = channel.run("x = 41")
    assert reply["status"] == "ok" and list(reply["checkpoint"]["vars"]) == ["x"], reply
    assert len(channel.cell_done) == 1  # x's pickle: the checkpoint's clock is the controller's now
    assert channel.value("x + 1") == "42"
    reply = channel.run("1 / 0")
    assert reply["status"] == "error" and reply["error"]["ename"] == "ZeroDivisionError"
    assert quiet(one_hop.link)


def test_a_restore_goes_through_the_data_channel(one_hop):
    channel = DataChannel(one_hop.link)
    assert channel.request(request_table.RESTORE_BEGIN, timeout=10)[0]["status"] == "ok"
    blob = dill.dumps([1, 2, 3])
    reply, _ = channel.request(request_table.LOAD, blob, name="y", digest=blob_format.blob_digest(blob), timeout=10)
    assert reply["status"] == "ok", reply
    assert channel.request(request_table.RESTORE_END, generation=3, timeout=10)[0]["generation"] == 3
    assert channel.value("sum(y)") == "6"


def test_host_calls_go_to_the_controller_on_their_own_link(one_hop):
    channel = DataChannel(one_hop.link)
    scaffold = "def before_cell(namespace):\n    namespace['ask'] = host_call\n"
    assert channel.request(request_table.INSTALL, code=scaffold, names=["ask"], timeout=10)[0]["status"] == "ok"
    channel.data.send({"type": request_table.EXEC, "id": "e1", "code": "ask('double', 21)", "timeout": 10})
    call, payload = channel.calls.recv()
    assert call["type"] == protocol.HOST_CALL and call["name"] == "double" and payload == b"21"
    channel.calls.send(reply_types.host_reply(call["call"]), b"42")
    reply, _ = channel.reply("e1")
    assert reply["return_value"] == "42", reply
    assert quiet(one_hop.link)


def test_a_closed_data_channel_leaves_the_worker_idle_with_its_memory(one_hop):
    channel = DataChannel(one_hop.link)
    channel.run("x = 7")
    channel.close()
    for _ in range(200):  # the worker's idle (generation 1) reaches the supervisor soon after the close
        one_hop.link.send({"type": request_table.PING, "id": "p"})
        pong, _ = one_hop.link.recv()
        assert pong["type"] == request_table.PONG and pong["generation"] in (0, 1), pong
        if pong["generation"] == 1:
            break
        time.sleep(0.01)
    assert pong["generation"] == 1
    again = DataChannel(one_hop.link)
    assert again.value("x") == "7"


def test_a_worker_that_dies_is_reported_on_the_connection_and_replaced(one_hop):
    channel = DataChannel(one_hop.link)
    channel.run("x = 1")
    channel.data.send({"type": request_table.EXEC, "id": "e1", "code": "import os\nos._exit(3)", "timeout": 10})
    with pytest.raises(framing.ChannelClosed):
        channel.data.recv()
    lost, _ = one_hop.link.recv()
    assert lost["type"] == protocol.WORKER_LOST and lost["oom"] is False and "3" in lost["reason"], lost
    fresh = DataChannel(one_hop.link)
    assert fresh.value("'x' in globals()") == "False"


def test_a_worker_that_writes_on_its_link_is_replaced(one_hop):
    channel = DataChannel(one_hop.link)
    pid = channel.value("import os\nos.getpid()")
    worker = "[o for o in __import__('gc').get_objects() if type(o).__name__ == 'Worker'][0]"
    # Cell code holds the worker's link to the supervisor; the worker is killed at once (its reply may not come).
    channel.data.send({"type": request_table.EXEC, "id": "e1", "code": f"{worker}.link.send(b'garbage!' * 4)"})
    lost, _ = one_hop.link.recv()
    assert lost["type"] == protocol.WORKER_LOST and "out of turn" in lost["reason"], lost
    assert DataChannel(one_hop.link).value("import os\nos.getpid()") != pid


@pytest.mark.parametrize("kind", ["pipe", "three"])
def test_a_data_channel_that_is_not_two_sockets_is_refused(one_hop, kind):
    read_end, write_end = os.pipe()
    extra, extra_theirs = socket.socketpair()
    fds = [read_end, extra_theirs.fileno()] if kind == "pipe" else [extra.fileno(), extra_theirs.fileno(), write_end]
    handover.send_with_fds(one_hop.link.sock, {"type": protocol.DATA_CHANNEL}, fds)
    for fd in (read_end, write_end):
        os.close(fd)
    extra.close()
    extra_theirs.close()
    assert one_hop.link.closed_by_peer()
    one_hop.link.close()
    one_hop.link = one_hop.connect()  # it connects again, and one hop works
    assert DataChannel(one_hop.link).value("1 + 1") == "2"


def test_a_controller_that_leaves_during_a_cell_gets_it_interrupted_and_the_next_one_the_worker(one_hop, tmp_path):
    channel = DataChannel(one_hop.link)
    channel.run("x = 5\nimport time")
    # Interrupted, the cell's checkpoint (it tries `time` again) meets the closed channel, and so does its reply.
    started = tmp_path / "started"
    code = f"open({str(started)!r}, 'w').close()\ntime.sleep(60)"
    channel.data.send({"type": request_table.EXEC, "id": "e1", "code": code, "timeout": 120})
    while not started.exists():
        time.sleep(0.01)
    channel.close()
    one_hop.link.close()
    one_hop.link = one_hop.connect()  # it connects again once the worker is idle (interrupted) or replaced
    assert one_hop.hello["generation"] == 1
    assert DataChannel(one_hop.link).value("x") == "5"


def test_a_data_channel_handed_right_after_another_closed_is_still_watched(one_hop, tmp_path):
    first = DataChannel(one_hop.link)
    first.run("x = 3\nimport time")
    first.close()
    second = DataChannel(one_hop.link)  # the idle for the first may reach the supervisor after this one
    started = tmp_path / "started"
    code = f"open({str(started)!r}, 'w').close()\ntime.sleep(60)"
    second.data.send({"type": request_table.EXEC, "id": "e2", "code": code, "timeout": 120})
    while not started.exists():
        time.sleep(0.01)
    second.close()
    one_hop.link.close()
    one_hop.link = one_hop.connect()  # the sleeping cell was interrupted: the worker and its memory are kept
    assert one_hop.hello["generation"] == 1
    assert DataChannel(one_hop.link).value("x") == "3"


def test_the_controller_interrupts_a_cell_through_the_connection(one_hop):
    channel = DataChannel(one_hop.link)
    channel.run("x = 2")
    channel.data.send({"type": request_table.EXEC, "id": "e1", "code": "while True:\n    pass", "timeout": 60})
    for _ in range(200):  # until the cell runs: an interrupt that comes before it is only noted
        one_hop.link.send({"type": protocol.INTERRUPT, "id": "e1", "phase": "cell"})
        if select.select([channel.data.sock], [], [], 0.05)[0]:
            break
    reply, _ = channel.reply("e1")
    assert reply["status"] == "error" and reply["error"]["ename"] == "KeyboardInterrupt", reply
    assert channel.value("x") == "2"


def test_the_controller_has_a_worker_that_ignores_the_interrupt_killed(one_hop):
    channel = DataChannel(one_hop.link)
    pid = channel.value("import os\nos.getpid()")
    code = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
    channel.data.send({"type": request_table.EXEC, "id": "e1", "code": code, "timeout": 60})
    one_hop.link.send({"type": protocol.INTERRUPT, "id": "e1", "phase": "cell"})
    one_hop.link.send({"type": protocol.KILL, "id": "e1"})
    replaced, _ = one_hop.link.recv()
    assert replaced["type"] == protocol.WORKER_REPLACED and replaced["id"] == "e1", replaced
    # The data channel went with the worker (a reset when bytes it had not read were in it): nothing to resynchronise.
    with pytest.raises((framing.ChannelClosed, ConnectionResetError)):
        channel.data.recv()
    assert DataChannel(one_hop.link).value("import os\nos.getpid()") != pid


def test_an_unknown_control_frame_drops_the_connection(one_hop):
    one_hop.link.send({"type": protocol.INTERRUPT, "id": "e1", "phase": "lunch"})
    assert one_hop.link.closed_by_peer()
    one_hop.link.close()
    one_hop.link = one_hop.connect()
    assert DataChannel(one_hop.link).value("1") == "1"


def test_a_takeover_says_goodbye_on_the_connection_and_hands_the_idle_worker_over(one_hop):
    channel = DataChannel(one_hop.link)
    channel.run("x = 9")
    old = one_hop.link
    one_hop.listener.close()
    one_hop.listener = one_hop.listen()  # a new controller binds a new socket file, then signals
    os.kill(one_hop.proc.pid, signal.SIGUSR1)
    goodbye, _ = old.recv()
    assert goodbye["type"] == protocol.GOODBYE and goodbye["reason"] == "takeover" and goodbye["in_flight"] is None
    channel.close()  # the old controller lets its data channel go: the worker reports idle
    old.close()
    one_hop.link = one_hop.connect()
    assert one_hop.hello["generation"] == 1
    assert DataChannel(one_hop.link).value("x") == "9"


def test_a_takeover_hands_over_the_idle_worker_with_its_memory_while_the_old_controller_holds_its_channel(one_hop):
    """The old controller is idle (nothing reads its connection, so it cannot close its data channel): the
    supervisor's interrupt sends the idle worker back to its link, and the new controller gets its memory."""
    channel = DataChannel(one_hop.link)
    channel.run("x = 9")
    old = one_hop.link
    one_hop.listener.close()
    one_hop.listener = one_hop.listen()
    os.kill(one_hop.proc.pid, signal.SIGUSR1)
    one_hop.link = one_hop.connect()
    assert one_hop.hello["generation"] == 1
    assert DataChannel(one_hop.link).value("x") == "9"
    assert channel.data.closed_by_peer()  # the worker let the old data channel go
    old.close()


def test_a_kill_that_comes_as_the_worker_dies_names_its_death(one_hop):
    channel = DataChannel(one_hop.link)
    channel.data.send({"type": request_table.EXEC, "id": "e1", "code": "import os\nos._exit(3)", "timeout": 10})
    with pytest.raises(framing.ChannelClosed):
        channel.data.recv()
    one_hop.link.send({"type": protocol.KILL, "id": "e1"})  # the controller saw D break: the worker may live
    said = [one_hop.link.recv()[0]]
    if said[0]["type"] == protocol.WORKER_LOST:  # the supervisor saw the death first; the kill replaces its successor
        said.append(one_hop.link.recv()[0])
    assert said[-1]["type"] == protocol.WORKER_REPLACED and said[-1]["id"] == "e1", said
    assert "status 3" in said[0]["reason"] and said[0]["oom"] is False, said
    assert DataChannel(one_hop.link).value("1") == "1"


def test_an_interrupt_for_a_request_that_ended_leaves_the_idle_worker_on_its_data_channel(one_hop):
    channel = DataChannel(one_hop.link)
    channel.run("x = 3")
    for phase in ("cell", "checkpoint"):
        one_hop.link.send({"type": protocol.INTERRUPT, "id": "ended", "phase": phase})
    one_hop.link.send({"type": request_table.PING, "id": "p1"})
    assert one_hop.link.recv()[0]["type"] == request_table.PONG  # the signals were sent: the idle worker ignores them
    assert channel.value("x") == "3" and quiet(one_hop.link)
