"""Wall per trivial cell and CPU per process, two hops vs one hop, host agent, interleaved.

usage: PYTHONPATH=<checkout> python ab_host.py ROUNDS N
"""
import os, sys, time, socket, statistics, tempfile, uuid
from pathlib import Path
sys.path.insert(0, os.environ["PYTHONPATH"] + "/tests")
import agent_process
from orchestrator.agent import handover, protocol

def cpu(pid):
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

def children(pid):
    return [int(p) for p in open("/proc/%d/task/%d/children" % (pid, pid)).read().split()]

def measure(one_hop, n):
    a = agent_process.Agent(Path(tempfile.mkdtemp(prefix="o26ab-", dir="/tmp")), one_hop=one_hop)
    try:
        if one_hop:
            data, theirs = socket.socketpair(); calls, calls_theirs = socket.socketpair()
            handover.send_with_fds(a.link.sock, {"type": protocol.DATA_CHANNEL}, [theirs.fileno(), calls_theirs.fileno()])
            theirs.close(); calls_theirs.close()
        else:
            data = a.link.sock
        data.settimeout(30)
        def run():
            rid = uuid.uuid4().hex
            protocol.send_frame(data, {"type": protocol.EXEC, "id": rid, "code": "1", "timeout": 60, "checkpoint_timeout": 60})
            reply, _ = protocol.recv_frame(data)
            assert reply["id"] == rid and reply["status"] == "ok", reply
        for _ in range(200):
            run()
        sup = a.proc.pid; (wrk,) = children(sup)
        c0 = (cpu(sup), cpu(wrk)); walls = []
        for _ in range(n):
            t = time.perf_counter(); run(); walls.append(time.perf_counter() - t)
        c1 = (cpu(sup), cpu(wrk))
        return statistics.median(walls) * 1e6, (c1[0] - c0[0]) / n * 1e6, (c1[1] - c0[1]) / n * 1e6
    finally:
        a.close()

rounds, n = int(sys.argv[1]), int(sys.argv[2])
for r in range(rounds):
    for one in (False, True):
        wall, s, w = measure(one, n)
        print("%-8s wall median %6.1f us   supervisor %6.1f us CPU   worker %6.1f us CPU   load %s" % (
            "one hop" if one else "two hops", wall, s, w, open("/proc/loadavg").read().split()[0]), flush=True)
