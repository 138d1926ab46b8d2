"""CPU ns per trivial cell of each container process (schedstat), for A/B between two checkouts: run once per checkout."""
import sys, os, time, statistics
sys.path.insert(0, os.environ["PYTHONPATH"])
from bench.runners import OrchestratorRunner
N, R = int(sys.argv[1]), int(sys.argv[2])
r = OrchestratorRunner(); s = r.create()
def run_ns(pid): return int(open("/proc/%s/schedstat" % pid).read().split()[0])
try:
    for _ in range(200): s.execute("1")
    c = [c for c in r.client.containers.list() if c.name.endswith(s.sandbox_id)][0]
    top = c.top(); i = top["Titles"].index("PID"); pids = [p[i] for p in top["Processes"]]
    sup, wrk = pids[1], pids[2]
    out = {"supervisor": [], "worker": [], "wall": []}
    for _ in range(R):
        b = [run_ns(p) for p in (sup, wrk)]; t = time.perf_counter_ns()
        for _ in range(N): s.execute("1")
        w = time.perf_counter_ns() - t; e = [run_ns(p) for p in (sup, wrk)]
        out["supervisor"].append((e[0]-b[0])/N/1e3); out["worker"].append((e[1]-b[1])/N/1e3); out["wall"].append(w/N/1e3)
    print(os.environ.get("TAG", ""), r.image, "  ".join("%s %.1f us [%.1f-%.1f]" % (k, statistics.median(v), min(v), max(v)) for k, v in out.items()), "| load %.1f" % os.getloadavg()[0], flush=True)
finally:
    s.close(); r.shutdown()
