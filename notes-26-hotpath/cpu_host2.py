"""Host agent (tests/agent_process.py of $WT): wall and CPU per trivial cell of driver, supervisor, worker; R rounds of N.
Extra agent environment from AGENT_ENV_EXTRA="K=V,K=V"."""
import os, sys, time, tempfile, subprocess, statistics
from pathlib import Path
wt = os.environ["WT"]; sys.path.insert(0, wt); sys.path.insert(0, wt + "/tests")
from agent_process import Agent
N, R = int(sys.argv[1]), int(sys.argv[2])
extra = dict(kv.split("=", 1) for kv in os.environ.get("AGENT_ENV_EXTRA", "").split(",") if kv)
a = Agent(Path(tempfile.mkdtemp(prefix="h26-", dir="/tmp")), **extra)
def run_ns(pid): return int(open("/proc/%s/schedstat" % pid).read().split()[0])
try:
    for _ in range(300): a.run("1")
    sup = str(a.proc.pid)
    wrk = subprocess.run(["pgrep", "-P", sup], capture_output=True, text=True).stdout.split()[0]
    me = str(os.getpid())
    out = {"driver": [], "supervisor": [], "worker": [], "wall-median": []}
    for _ in range(R):
        b = [run_ns(p) for p in (me, sup, wrk)]; ts = []
        for _ in range(N):
            t = time.perf_counter_ns(); a.run("1"); ts.append(time.perf_counter_ns() - t)
        e = [run_ns(p) for p in (me, sup, wrk)]
        for k, x, y in zip(("driver", "supervisor", "worker"), b, e): out[k].append((y - x) / N / 1e3)
        out["wall-median"].append(statistics.median(ts) / 1e3)
    print(os.environ.get("TAG", ""), "  ".join("%s %.1f us [min %.1f]" % (k, statistics.median(v), min(v)) for k, v in out.items()), "| load %.1f" % os.getloadavg()[0], flush=True)
finally:
    a.close()
