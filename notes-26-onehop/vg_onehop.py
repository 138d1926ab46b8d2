"""Instructions per trivial cell of the supervisor and the worker, one hop (host agent under callgrind).

usage: WT=<checkout> python vg_onehop.py OUTDIR N [code]: like notes-26-onehop/vg_agent.py (a copy of branch i26-hot's notes-26-hotpath/vg_agent.py), but the test plays a
controller that takes one hop (docs/design/one-hop.md) and sends each cell on the data channel.
"""
import os, sys, subprocess, tempfile, time, socket, uuid
from pathlib import Path
wt = os.environ["WT"]
sys.path.insert(0, wt); sys.path.insert(0, wt + "/tests")
import agent_process
from orchestrator.agent import handover, protocol
out, n = sys.argv[1], int(sys.argv[2])
code = sys.argv[3] if len(sys.argv) > 3 else "1"
os.makedirs(out, exist_ok=True)
agent_process.AGENT_COMMAND[:0] = ["valgrind", "--tool=callgrind", "--trace-children=yes", "--callgrind-out-file=%s/cg.%%p" % out, "-q"]
a = agent_process.Agent(Path(tempfile.mkdtemp(prefix="o26vg-", dir="/tmp")), one_hop=True, ORCH_FRAME_TIMEOUT="30")
data, data_theirs = socket.socketpair()
calls, calls_theirs = socket.socketpair()
handover.send_with_fds(a.link.sock, {"type": protocol.DATA_CHANNEL}, [data_theirs.fileno(), calls_theirs.fileno()])
data_theirs.close(); calls_theirs.close()
def run():
    rid = uuid.uuid4().hex
    protocol.send_frame(data, {"type": protocol.EXEC, "id": rid, "code": code, "timeout": 60, "checkpoint_timeout": 60})
    reply, _ = protocol.recv_frame(data)
    while reply["type"] == protocol.CELL_DONE:
        reply, _ = protocol.recv_frame(data)
    assert reply["id"] == rid and reply["status"] == "ok", reply
try:
    for _ in range(50):
        run()
    pids = [str(a.proc.pid)] + subprocess.run(["pgrep", "-P", str(a.proc.pid)], capture_output=True, text=True).stdout.split()
    for p in pids:
        subprocess.run(["callgrind_control", "-z", p], check=True, capture_output=True, timeout=60)
    t = time.time()
    for _ in range(n):
        run()
    for p in pids:
        subprocess.run(["callgrind_control", "-d", "cells", p], check=True, capture_output=True, timeout=60)
    print("pids", pids, "%.1f s" % (time.time() - t))
finally:
    a.close()
