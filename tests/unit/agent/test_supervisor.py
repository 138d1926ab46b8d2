"""The agent (supervisor + worker) as a host subprocess on a Unix socket: the handshake, the data channel, the ladder's
signals, crashes, takeover (docs/protocol.md, "One hop").

No container here: this pins the agent's side of docs/protocol.md. The test plays the controller with the bare frame
functions (tests/agent_process.py: its own listening socket, handshake, data channel and ladder), so it does not
depend on the controller's transport code. Container behaviour is proven in tests/integration against a real engine.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from agent_process import AGENT_COMMAND, AGENT_ENV, SLOW_REDUCE, Agent, Link, blobs_of, load

from orchestrator.agent import checkpoint, framing, handover, handshake, protocol, reply_types, request_table


def vm_hwm(pid: int) -> int:
    """Peak resident memory of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


# --- Connection set-up --------------------------------------------------------------------------------------


def test_hello_and_handshake(agent):
    hello = agent.hello
    assert hello["protocol"] == protocol.PROTOCOL_VERSION == 8
    assert hello["sandbox_id"] == "sb-unit" and hello["generation"] == 0
    assert hello["python"] and hello["dill"] and len(hello["nonce"]) == 2 * handshake.NONCE_BYTES
    assert hello["agent_pid"] == agent.proc.pid and hello["worker_pid"] not in (0, agent.proc.pid)
    assert "session_id" not in hello
    assert hello["capabilities"] == [protocol.BLOB_FILES, protocol.RELAYED]
    assert agent.request(request_table.PING, id="p0")[0] == {"type": request_table.PONG, "id": "p0", "generation": 0}


def test_a_wrong_proof_is_refused_and_the_agent_tries_again(agent):
    agent.link.close()
    link = agent.accept()
    hello, _ = link.recv()
    nonce = handshake.new_nonce()
    link.send(
        {
            "type": protocol.AUTH,
            "nonce": nonce,
            "proof": handshake.auth_proof(b"wrong", "controller", hello["nonce"], nonce),
        }
    )
    assert link.closed_by_peer()
    link.close()
    # Something else than auth is refused the same way.
    link = agent.accept()
    link.recv()
    link.send({"type": request_table.EXEC, "id": "1", "code": "1", "timeout": 5})
    assert link.closed_by_peer()
    link.close()
    agent.link = agent.connect()
    assert agent.value("1 + 1") == "2"


def test_a_silent_controller_is_dropped_after_the_frame_timeout(agent):
    agent.link.close()
    link = agent.accept()
    link.recv()
    started = time.monotonic()
    assert link.closed_by_peer(10)
    assert time.monotonic() - started < 5  # ORCH_FRAME_TIMEOUT=1
    link.close()
    agent.link = agent.connect()
    assert agent.value("3") == "3"


@pytest.mark.parametrize("content", [None, "abc", "zz" * 32])
def test_missing_or_invalid_secret_exits_with_status_2(tmp_path, content):
    secret = tmp_path / "secret"
    if content is not None:
        secret.write_text(content)
    env = {**AGENT_ENV, "ORCH_SECRET_FILE": str(secret), "ORCH_CHANNEL": str(tmp_path / "sock")}
    done = subprocess.run(AGENT_COMMAND, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "secret file" in done.stderr


def test_the_worker_sees_no_orchestrator_settings(agent):
    assert agent.value("import os; sorted(k for k in os.environ if k.startswith('ORCH'))") == "[]"


# --- exec ---------------------------------------------------------------------------------------------------


def test_exec_returns_output_value_and_checkpoint(agent):
    reply, body = agent.run("x = 41\nprint('hi')\nx + 1")
    assert reply["status"] == "ok" and reply["return_value"] == "42" and reply["stdout"] == "hi\n"
    assert list(reply["checkpoint"]["vars"]) == ["x"] and len(body) == reply["checkpoint"]["blobs"][0]["size"]
    assert reply["duration"] >= 0 and reply["checkpoint_duration"] >= 0
    assert reply["checkpoint"]["generation"] == 1


def test_exec_error_is_data(agent):
    reply, _ = agent.run("y = 1\n1 / 0")
    assert reply["status"] == "error" and reply["error"]["ename"] == "ZeroDivisionError"
    assert reply["checkpoint"]["vars"].keys() == {"y"}


def test_output_is_bounded_with_a_marker(agent):
    reply, _ = agent.run("print('a' * 5000)")
    assert reply["stdout"].startswith("a" * 1000) and "truncated" in reply["stdout"] and len(reply["stdout"]) < 1100


def test_a_large_checkpoint_is_streamed_through_intact(agent):
    reply, body = agent.run("import os\nblob = os.urandom(20_000_000)\nkeep = [1]")
    blobs = blobs_of(reply, body)
    assert {"blob", "keep"} <= set(blobs)
    assert len(body) > 20_000_000
    assert agent.value("import hashlib; hashlib.md5(blob).hexdigest()") == repr(
        __import__("hashlib").md5(checkpoint.loads(blobs["blob"])).hexdigest()
    )


# --- the cell's clock ---------------------------------------------------------------------------------------


def test_interruptible_cell_times_out_and_keeps_state(agent):
    agent.run("x = 1")
    reply, _ = agent.run("y = 2\nwhile True: pass", timeout=0.3)
    assert reply["status"] == protocol.STATUS_TIMEOUT and reply["worker_restarted"] is False
    assert reply["error"]["ename"] == "KeyboardInterrupt"
    assert reply["checkpoint"]["vars"].keys() == {"y"}  # what ran before the interrupt is kept and saved
    assert agent.value("x, y") == "(1, 2)"


def test_cell_that_swallows_the_interrupt_is_killed(agent):
    code = "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        pass"
    started = time.monotonic()
    reply, _ = agent.run(code, timeout=0.3)
    assert reply["status"] == protocol.STATUS_TIMEOUT and reply["worker_restarted"] is True
    assert reply["phase"] == "cell" and time.monotonic() - started < 5
    assert agent.request(request_table.PING)[0]["generation"] == 0
    assert agent.value("1 + 1") == "2"


def test_worker_death_is_reported_with_its_cause(agent):
    reply, _ = agent.run("import os; os._exit(3)")
    assert reply["status"] == protocol.STATUS_CRASHED and "status 3" in reply["reason"] and reply["ran"] is True
    reply, _ = agent.run("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert reply["signal"] == "SIGKILL"
    assert agent.value("2") == "2"


def test_worker_lost_between_requests_is_reported_once_without_running(agent):
    agent.run("import os, threading, time\nthreading.Thread(target=lambda: (time.sleep(0.3), os._exit(4))).start()")
    time.sleep(1.5)
    reply, _ = agent.run("ran = True")
    assert reply["status"] == protocol.STATUS_CRASHED and reply["ran"] is False and "status 4" in reply["reason"]
    assert agent.value("'ran' in globals()") == "False"


def test_sigint_never_tears_a_frame(agent):
    """SIGINT between and around requests is only noted; it raises only in a cell, a load or a pickling."""
    worker = agent.hello["worker_pid"]
    stop = threading.Event()

    def spam() -> None:
        while not stop.is_set():
            os.kill(worker, signal.SIGINT)
            time.sleep(0.0005)

    thread = threading.Thread(target=spam)
    thread.start()
    try:
        for i in range(100):
            assert agent.request(request_table.RESTORE_BEGIN, generation=i)[0]["status"] == "ok"
            reply = load(agent, "v", pickle.dumps(list(range(i))))
            assert reply["status"] == "ok" or reply["reason"].startswith("KeyboardInterrupt"), reply
            assert agent.request(request_table.RESTORE_END, generation=i)[0]["generation"] == i
    finally:
        stop.set()
        thread.join()
    assert agent.hello["worker_pid"] == worker and agent.value("'still alive'") == "'still alive'"


def test_a_cell_cannot_take_the_interrupt_away(agent):
    agent.run("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)")
    reply, _ = agent.run("while True: pass", timeout=0.3)
    assert reply["status"] == protocol.STATUS_TIMEOUT and reply["worker_restarted"] is False


# --- the checkpoint's clock ---------------------------------------------------------------------------------


def test_checkpoint_timeout_names_the_slow_value_and_saves_the_rest(agent):
    agent.run(SLOW_REDUCE)
    reply, _ = agent.run("a = 1\nb = [2]\ns = Slow()", checkpoint_timeout=0.5)
    assert reply["status"] == "ok" and "worker_restarted" not in reply
    assert reply["duration"] < 0.5 <= reply["checkpoint_duration"] < 5
    delta = reply["checkpoint"]
    assert {"a", "b"} <= delta["vars"].keys() and "s" not in delta["vars"]
    assert delta["unsaved"] == {"s": "checkpointing took longer than the checkpoint timeout"}
    assert agent.cell_done[-1] == reply["id"]  # before its first pickle: the controller's clock is the checkpoint's
    reply, _ = agent.run("b", checkpoint_timeout=0.3)  # s is tried again (and runs out of time again)
    assert reply["return_value"] == "[2]" and "s" in reply["checkpoint"]["unsaved"]  # the worker lives on


def test_dill_is_imported_by_the_first_value_that_needs_it(agent):
    # Plain data is pickled by the standard library: an idle or plain session never holds dill (3.6 MB).
    reply, body = agent.run("n = 1\ndata = {'a': [1, 2.5, None], 'b': (b'x', 'y')}")
    assert reply["status"] == "ok" and set(blobs_of(reply, body)) == {"n", "data"}
    assert agent.value("import sys\n'dill' in sys.modules") == "False"
    reply, body = agent.run("def f(x):\n    return x + n")
    assert reply["status"] == "ok" and not reply["checkpoint"]["unsaved"]
    f = blobs_of(reply, body)["f"]
    assert agent.value("'dill' in sys.modules") == "True"
    # A fresh worker (the old one died) unpickles the function: a load imports dill before it runs.
    assert agent.run("import os\nos._exit(1)")[0]["status"] == "crashed"
    assert agent.request(request_table.RESTORE_BEGIN, timeout=5)[0]["status"] == "ok"
    assert load(agent, "n", pickle.dumps(1))["status"] == "ok"
    assert load(agent, "f", f)["status"] == "ok"
    assert agent.value("f(1)") == "2"


def test_a_restore_that_prepares_a_pooled_sandbox_imports_dill_and_a_new_sessions_does_not(agent):
    # Sandbox.warm_up is an empty restore that says `prepare`: a fork or restore that takes the sandbox from the
    # warm pool then pays no import. A new session's own empty restore (no `prepare`) leaves dill out.
    assert agent.request(request_table.RESTORE_BEGIN, timeout=5)[0]["status"] == "ok"
    assert agent.request(request_table.RESTORE_END, timeout=5, generation=0)[0]["status"] == "ok"
    assert agent.value("import sys\n'dill' in sys.modules") == "False"
    assert agent.request(request_table.RESTORE_BEGIN, timeout=5, prepare=True)[0]["status"] == "ok"
    assert agent.value("import sys\n'dill' in sys.modules") == "True"  # (a restore empties the namespace)


def test_the_checkpoints_late_dill_import_ignores_a_planted_dill_on_an_appended_path(agent, tmp_path):
    # A cell imports its own modules by appending their directory (docs/identity.md); a dill planted there must
    # not be the one the checkpoint imports after the cell ran.
    (tmp_path / "dill.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    reply, _ = agent.run(f"import sys\nsys.path.append({str(tmp_path)!r})\ndef f():\n    return 1")
    assert reply["status"] == "ok" and "f" in reply["checkpoint"]["vars"] and not reply["checkpoint"]["unsaved"]
    assert agent.value(f"sys.modules['dill'].__file__.startswith({str(tmp_path)!r})") == "False"
    assert not (tmp_path / "ran").exists()


def test_a_slow_value_goes_last_so_later_values_are_saved(agent):
    agent.run(SLOW_REDUCE + "s = Slow()", checkpoint_timeout=0.3)
    reply, _ = agent.run("later = [1]", checkpoint_timeout=0.3)
    assert "later" in reply["checkpoint"]["vars"] and "s" in reply["checkpoint"]["unsaved"]


def test_checkpoint_that_ignores_the_interrupt_kills_the_worker(agent):
    code = "import time\nclass Stubborn:\n    def __reduce__(self):\n        while True:\n            try:\n"
    code += (
        "                time.sleep(10)\n            except KeyboardInterrupt:\n                pass\nx = Stubborn()"
    )
    started = time.monotonic()
    reply, _ = agent.run(code, checkpoint_timeout=0.3)
    assert reply["status"] == protocol.STATUS_TIMEOUT and reply["worker_restarted"] is True
    assert reply["phase"] == "checkpoint" and time.monotonic() - started < 5
    assert agent.value("'x' in globals()") == "False"


def test_a_cell_finishing_at_its_deadline_keeps_its_checkpoint(agent):
    # A SIGINT the cell's deadline sent as the cell ended cannot stop the checkpoint (that is SIGUSR2's job).
    for _ in range(5):
        reply, _ = agent.run("import time\nv = list(range(10))\ntime.sleep(0.2)", timeout=0.2)
        assert reply["status"] in ("ok", "timeout")
        assert reply["checkpoint"]["unsaved"] == {}


def test_a_value_that_could_not_be_saved_is_saved_once_it_can(agent):
    reply, _ = agent.run("box = [(i for i in range(3))]")
    assert "box" in reply["checkpoint"]["unsaved"]
    reply, _ = agent.run("box.pop(); None")  # the very same object, saveable now
    assert "box" in reply["checkpoint"]["vars"] and reply["checkpoint"]["unsaved"] == {}


def test_the_checkpoint_quota_leaves_out_what_does_not_fit(make_agent):
    agent = make_agent(ORCH_CHECKPOINT_QUOTA="100000")
    reply, _ = agent.run("small = 'a' * 1000\nbig = 'b' * 200000")
    delta = reply["checkpoint"]
    assert "small" in delta["vars"] and delta["unsaved"] == {"big": "checkpoint quota of 100000 bytes reached"}
    assert sum(b["size"] for b in delta["blobs"]) <= 100000
    reply, _ = agent.run("del big\nsmall = 'c' * 90000")
    assert "small" in reply["checkpoint"]["vars"]


# --- set_value and reset ------------------------------------------------------------------------------------


def test_set_value_kinds_and_aliases(agent):
    reply, _ = agent.request(
        request_table.SET_VALUE, "héllo".encode(), name="context_0", kind="str", aliases=["context"]
    )
    assert reply["type"] == request_table.STATE_REPLY and reply["status"] == "ok"
    assert reply["checkpoint"]["vars"]["context"] == reply["checkpoint"]["vars"]["context_0"]
    assert len(reply["checkpoint"]["blobs"]) == 1
    agent.request(request_table.SET_VALUE, b"\x00\x01", name="raw", kind="bytes")
    agent.request(request_table.SET_VALUE, b'{"k": [1]}', name="doc", kind="json")
    assert agent.value("context, raw, doc") == "('héllo', b'\\x00\\x01', {'k': [1]})"


def test_reset_deletes_everything(agent):
    agent.run("a = 1\nb = 2")
    reply, _ = agent.request(request_table.RESET)
    assert sorted(reply["checkpoint"]["deleted"]) == ["a", "b"] and reply["status"] == "ok"
    assert agent.value("'a' in globals()") == "False"


# --- restore, one value at a time ---------------------------------------------------------------------------


class _Raises:
    def __reduce__(self):
        return (int, ("not a number",))


class _Exits:
    def __reduce__(self):
        return (os._exit, (7,))


class _Sleeps:
    def __reduce__(self):
        return (time.sleep, (3600,))


class _Stubborn:
    def __reduce__(self):
        loop = "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        pass"
        return (exec, (loop,))


class _SystemExits:
    def __reduce__(self):
        return (sys.exit, (5,))


def test_restore_loads_values_and_reports_the_bad_one(agent):
    reply, body = agent.run("data = {'k': [1, 2]}\ntext = 'abc'\nn = 7")
    blobs = blobs_of(reply, body)
    agent.run("import os; os._exit(1)")
    begin, _ = agent.request(request_table.RESTORE_BEGIN, id="b", generation=5)
    assert begin == {"type": request_table.RESTORE_REPLY, "id": "b", "status": "ok"}
    for name, blob in blobs.items():
        assert load(agent, name, blob, id=name) == {"type": request_table.LOAD_REPLY, "id": name, "status": "ok"}
    bad = load(agent, "bad", pickle.dumps(_Raises()))
    assert bad["status"] == "error" and bad["reason"].startswith("ValueError: invalid literal")
    exits = load(agent, "exits", pickle.dumps(_SystemExits()))
    assert exits["status"] == "error" and exits["reason"].startswith("SystemExit")
    wrong = load(agent, "wrong", blobs["n"], digest="0" * 32)
    assert wrong["status"] == "error" and "digest" in wrong["reason"]
    # A blob the controller checked as it sent it is not hashed again here (the sandbox's CPU is the bottleneck).
    trusted = load(agent, "trusted", blobs["n"], digest="0" * 32, verified=True)
    assert trusted["status"] == "ok"
    end, _ = agent.request(request_table.RESTORE_END, generation=5)
    assert end["status"] == "ok" and end["generation"] == 5
    assert agent.value("data, text, n, trusted, 'bad' in globals()") == "({'k': [1, 2]}, 'abc', 7, 7, False)"
    # The loaded values count as saved: the next checkpoint sends nothing for them.
    reply, _ = agent.run("m = 1")
    assert reply["checkpoint"]["vars"].keys() == {"m"} and reply["checkpoint"]["generation"] == 6


def test_restore_retries_an_instance_after_its_class(agent):
    reply, body = agent.run("class Point:\n    def __init__(self, x):\n        self.x = x\np = Point(3)")
    blobs = blobs_of(reply, body)
    agent.run("import os; os._exit(1)")
    agent.request(request_table.RESTORE_BEGIN, generation=1)
    first = load(agent, "p", blobs["p"])
    assert first["status"] == "error" and "Point" in first["reason"]
    assert load(agent, "Point", blobs["Point"])["status"] == "ok"
    assert load(agent, "p", blobs["p"])["status"] == "ok"
    agent.request(request_table.RESTORE_END, generation=1)
    assert agent.value("p.x, isinstance(p, Point)") == "(3, True)"


def test_a_value_that_kills_the_worker_while_loading(agent):
    agent.request(request_table.RESTORE_BEGIN, generation=1)
    assert load(agent, "a", pickle.dumps([1]))["status"] == "ok"
    reply = load(agent, "exits", pickle.dumps(_Exits()))
    assert reply["status"] == protocol.STATUS_CRASHED and "status 7" in reply["reason"]
    assert agent.request(request_table.PING)[0]["generation"] == 0
    agent.request(request_table.RESTORE_BEGIN, generation=1)
    assert load(agent, "a", pickle.dumps([1]))["status"] == "ok"
    agent.request(request_table.RESTORE_END, generation=1)
    assert agent.value("a") == "[1]"


def test_a_value_that_hangs_while_loading_is_interrupted(agent):
    agent.request(request_table.RESTORE_BEGIN, generation=1)
    started = time.monotonic()
    reply = load(agent, "sleeps", pickle.dumps(_Sleeps()), timeout=0.3)
    assert reply["status"] == protocol.STATUS_TIMEOUT and reply["worker_restarted"] is False
    assert time.monotonic() - started < 0.3 + 0.5 + 1


def test_a_value_that_ignores_the_interrupt_while_loading_kills_the_worker(agent):
    agent.request(request_table.RESTORE_BEGIN, generation=1)
    worker = agent.hello["worker_pid"]
    started = time.monotonic()
    reply = load(agent, "stubborn", pickle.dumps(_Stubborn()), timeout=0.3)
    assert reply["status"] == protocol.STATUS_TIMEOUT and reply["worker_restarted"] is True
    assert reply["phase"] == "load" and time.monotonic() - started < 0.3 + 0.5 + 2
    with pytest.raises(ProcessLookupError):
        os.kill(worker, 0)


def test_restoring_a_large_value_costs_about_two_copies_of_it(agent):
    """Peak memory of restoring one 150 MB value: the receive buffer plus the value, nothing more."""
    size = 150_000_000
    blob = checkpoint.dumps("big", "x" * size)
    worker = agent.hello["worker_pid"]
    assert agent.request(request_table.RESTORE_BEGIN, generation=1)[0]["status"] == "ok"
    worker_before = vm_hwm(worker)
    reply, _ = agent.request(request_table.LOAD, blob.parts, name="big", digest=blob.digest, timeout=60)
    assert reply["status"] == "ok"
    worker_peak = vm_hwm(worker)
    agent.request(request_table.RESTORE_END, generation=1)
    assert agent.value("len(big)") == str(size)
    grown = worker_peak - worker_before
    print(
        f"\nrestore of a {size / 1e6:.0f} MB value: worker peak {worker_peak / 1e6:.0f} MB "
        f"(baseline {worker_before / 1e6:.0f} MB, +{grown / size:.2f}x the value)"
    )
    assert grown <= 2.2 * size


def test_checkpointing_a_large_value_costs_about_two_copies_of_it(agent):
    size = 150_000_000
    worker = agent.hello["worker_pid"]
    before = vm_hwm(worker)
    reply, body = agent.run(f"big = 'x' * {size}", timeout=60, checkpoint_timeout=60)
    assert reply["checkpoint"]["vars"].keys() == {"big"} and len(body) > size
    grown = vm_hwm(worker) - before
    print(f"\ncheckpoint of a {size / 1e6:.0f} MB value: worker +{grown / size:.2f}x the value")
    assert grown <= 2.2 * size


# --- takeover -----------------------------------------------------------------------------------------------


def quiet(link: Link) -> bool:
    """Nothing came on ``link``."""
    return not select.select([link.sock], [], [], 0)[0]


def test_requests_go_on_the_data_channel_and_host_calls_on_their_own_link(agent):
    reply, _ = agent.run("x = 41")
    assert agent.cell_done == [reply["id"]]  # x's pickle: the checkpoint's clock is the controller's now
    scaffold = "def before_cell(namespace):\n    namespace['ask'] = host_call\n"
    assert agent.request(request_table.INSTALL, code=scaffold, names=["ask"], timeout=10)[0]["status"] == "ok"

    def double(call: dict, payload: bytearray) -> tuple[dict, bytes]:
        assert call["name"] == "double" and payload == b"21", call
        return reply_types.host_reply(call["call"]), b"42"

    reply, _ = agent.request(request_table.EXEC, code="ask('double', x - 20)", timeout=10, on_call=double)
    assert reply["return_value"] == "42", reply
    assert quiet(agent.link)


def test_a_closed_data_channel_leaves_the_worker_idle_with_its_memory(agent):
    agent.run("x = 7")
    agent.drop_data()
    for _ in range(200):  # the worker's idle (generation 1) reaches the supervisor soon after the close
        pong, _ = agent.request(request_table.PING)
        assert pong["type"] == request_table.PONG and pong["generation"] in (0, 1), pong
        if pong["generation"] == 1:
            break
        time.sleep(0.01)
    assert pong["generation"] == 1
    agent.hand_over()
    assert agent.value("x") == "7"


def test_a_worker_that_writes_on_its_link_is_replaced(agent):
    pid = agent.value("import os\nos.getpid()")
    worker = "[o for o in __import__('gc').get_objects() if type(o).__name__ == 'Worker'][0]"
    # Cell code holds the worker's link to the supervisor; the worker is killed at once (its reply may not come).
    agent.data.send({"type": request_table.EXEC, "id": "e1", "code": f"{worker}.link.send(b'garbage!' * 4)"})
    lost, _ = agent.link.recv()
    assert lost["type"] == protocol.WORKER_LOST and "out of turn" in lost["reason"], lost
    agent.hand_over()
    assert agent.value("import os\nos.getpid()") != pid


@pytest.mark.parametrize("kind", ["pipe", "three"])
def test_a_data_channel_that_is_not_two_sockets_is_refused(agent, kind):
    read_end, write_end = os.pipe()
    extra, extra_theirs = socket.socketpair()
    fds = [read_end, extra_theirs.fileno()] if kind == "pipe" else [extra.fileno(), extra_theirs.fileno(), write_end]
    handover.send_with_fds(agent.link.sock, {"type": protocol.DATA_CHANNEL}, fds)
    for fd in (read_end, write_end):
        os.close(fd)
    extra.close()
    extra_theirs.close()
    assert agent.link.closed_by_peer()
    agent.link.close()
    agent.link = agent.connect()  # it connects again, and one hop works
    assert agent.value("1 + 1") == "2"


def test_an_unknown_control_frame_drops_the_connection(agent):
    agent.link.send({"type": protocol.INTERRUPT, "id": "e1", "phase": "lunch"})
    assert agent.link.closed_by_peer()
    agent.link.close()
    agent.link = agent.connect()
    assert agent.value("1") == "1"


@pytest.mark.parametrize("handed_again", [False, True])
def test_a_controller_that_leaves_during_a_cell_gets_it_interrupted_and_the_next_one_the_worker(
    agent, tmp_path, handed_again
):
    agent.run("x = 5\nimport time")
    if handed_again:  # a data channel handed right after another closed: the first one's idle may come after it
        agent.hand_over()
    # Interrupted, the cell's checkpoint (it tries `time` again) meets the closed channel, and so does its reply.
    started = tmp_path / "started"
    code = f"open({str(started)!r}, 'w').close()\ntime.sleep(60)"
    agent.data.send({"type": request_table.EXEC, "id": "e1", "code": code, "timeout": 120})
    while not started.exists():
        time.sleep(0.01)
    agent.drop_data()
    agent.link.close()
    agent.link = agent.connect()  # it connects again once the worker is idle (interrupted) or replaced
    assert agent.hello["generation"] == 1
    assert agent.value("x") == "5"


def _take_over(agent: Agent) -> Link:
    """Bind a new socket file at the channel path and signal the agent, as a second controller does."""
    old, agent.listener = agent.listener, agent.listen()
    agent.proc.send_signal(signal.SIGUSR1)
    old.close()
    return agent.link


def test_a_takeover_says_goodbye_on_the_connection_and_hands_the_idle_worker_over(agent):
    agent.run("x = 9")
    worker = agent.hello["worker_pid"]
    old = _take_over(agent)
    goodbye, _ = old.recv()
    assert goodbye == {"type": protocol.GOODBYE, "reason": "takeover", "in_flight": None}
    agent.drop_data()  # the old controller lets its data channel go: the worker reports idle
    old.close()
    agent.link = agent.connect()
    assert agent.hello["generation"] == 1 and agent.hello["worker_pid"] == worker
    assert agent.value("x") == "9"


def test_a_takeover_hands_over_the_idle_worker_with_its_memory_while_the_old_controller_holds_its_channel(agent):
    """The old controller is idle (nothing reads its connection, so it cannot close its data channel): the
    supervisor's interrupt sends the idle worker back to its link, and the new controller gets its memory."""
    agent.run("x = 9")
    old, old_data, old_calls = _take_over(agent), agent.data, agent.calls
    agent.data = agent.calls = None  # still open: the old controller's
    agent.link = agent.connect()
    assert agent.hello["generation"] == 1
    assert agent.value("x") == "9"
    assert old_data.closed_by_peer()  # the worker let the old data channel go
    for end in (old, old_data, old_calls):
        end.close()


def test_a_stale_sigusr1_is_ignored(agent):
    agent.proc.send_signal(signal.SIGUSR1)  # same socket file: not a takeover
    assert agent.value("6") == "6"


def test_a_kill_that_comes_as_the_worker_dies_names_its_death(agent):
    agent.data.send({"type": request_table.EXEC, "id": "e1", "code": "import os\nos._exit(3)", "timeout": 10})
    with pytest.raises(framing.ChannelClosed):
        agent.data.recv()
    agent.link.send({"type": protocol.KILL, "id": "e1"})  # the controller saw D break: the worker may live
    said = [agent.link.recv()[0]]
    if said[0]["type"] == protocol.WORKER_LOST:  # the supervisor saw the death first; the kill replaces its successor
        said.append(agent.link.recv()[0])
    assert said[-1]["type"] == protocol.WORKER_REPLACED and said[-1]["id"] == "e1", said
    assert "status 3" in said[0]["reason"] and said[0]["oom"] is False, said
    agent.hand_over()
    assert agent.value("1") == "1"


def test_an_interrupt_for_a_request_that_ended_leaves_the_idle_worker_on_its_data_channel(agent):
    agent.run("x = 3")
    for phase in ("cell", "checkpoint"):
        agent.link.send({"type": protocol.INTERRUPT, "id": "ended", "phase": phase})
    assert agent.request(request_table.PING)[0]["type"] == request_table.PONG  # the idle worker ignores them
    assert agent.value("x") == "3" and quiet(agent.link)
