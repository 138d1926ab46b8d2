"""Host agent (tests/agent_process.py): CPU ns per trivial cell of each process from /proc/<pid>/schedstat, R rounds."""
import os, sys, time, tempfile, subprocess, statistics
from pathlib import Path
sys.path.insert(0, "/work/wt-hotpath"); sys.path.insert(0, "/work/wt-hotpath/tests")
from agent_process import Agent
N, R = int(sys.argv[1]), int(sys.argv[2])
code = sys.argv[3] if len(sys.argv) > 3 else "1"
a = Agent(Path(tempfile.mkdtemp(prefix="h26-", dir="/tmp")))
def run_ns(pid): return int(open("/proc/%s/schedstat" % pid).read().split()[0])
try:
    for _ in range(200): a.run(code)
    sup = str(a.proc.pid)
    wrk = subprocess.run(["pgrep", "-P", sup], capture_output=True, text=True).stdout.split()[0]
    me = str(os.getpid())
    out = {"driver": [], "supervisor": [], "worker": [], "wall": []}
    for _ in range(R):
        b = [run_ns(p) for p in (me, sup, wrk)]; t = time.perf_counter_ns()
        for _ in range(N): a.run(code)
        w = time.perf_counter_ns() - t; e = [run_ns(p) for p in (me, sup, wrk)]
        for k, x, y in zip(("driver", "supervisor", "worker"), b, e): out[k].append((y - x) / N / 1e3)
        out["wall"].append(w / N / 1e3)
    print("  ".join("%s %.1f us [%.1f-%.1f]" % (k, statistics.median(v), min(v), max(v)) for k, v in out.items()), "| load", os.getloadavg()[0])
finally:
    a.close()
