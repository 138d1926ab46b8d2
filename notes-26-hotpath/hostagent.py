"""Agent processes on the host (as tests/agent_process.py); N trivial cells; wall per cell; profiles if H26_PROF."""
import os, sys, time, tempfile, resource
from pathlib import Path
sys.path.insert(0, "/work/wt-hotpath"); sys.path.insert(0, "/work/wt-hotpath/tests")
from agent_process import Agent
N = int(sys.argv[1])
d = Path(tempfile.mkdtemp(prefix="h26-", dir="/tmp"))
extra = {"PYTHONPATH": os.environ.get("AGENTPP", "") }
import agent_process
env = {"PYTHONPATH": str(agent_process.AGENT_PATH) + ":/tmp/h26/site", "H26_SPANS": os.environ["H26_SPANS"]} if os.environ.get("H26_SPANS") else {}
agent_process.AGENT_COMMAND[:] = [agent_process.AGENT_PYTHON, "-c", "from orchestrator_agent.supervisor import main; main()"] if env else agent_process.AGENT_COMMAND
a = Agent(d, **env)
try:
    for _ in range(100): a.run("1")
    pid = a.proc.pid
    import subprocess
    kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    def ticks(p): 
        f = open("/proc/%s/stat" % p).read().rsplit(")", 1)[1].split(); return int(f[11]) + int(f[12])
    c0 = [ticks(pid)] + [ticks(k) for k in kids]; me0 = time.process_time()
    ts = []
    for _ in range(N):
        t = time.perf_counter_ns(); a.run("1"); ts.append(time.perf_counter_ns() - t)
    c1 = [ticks(pid)] + [ticks(k) for k in kids]; me1 = time.process_time()
    ts.sort()
    print("host agent: median %.1f us, p10 %.1f, p90 %.1f" % (ts[N//2]/1e3, ts[N//10]/1e3, ts[9*N//10]/1e3))
    print("CPU us/cell: driver %.1f supervisor %.1f worker %s" % ((me1-me0)/N*1e6, (c1[0]-c0[0])*1e4/N, [(b-a_)*1e4/N for a_, b in zip(c0[1:], c1[1:])]))
    time.sleep(float(os.environ.get("POST", "0")))
finally:
    a.close()
