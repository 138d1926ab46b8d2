"""CPU us per trivial cell of the controller (process_time), supervisor and worker (schedstat), and wall; R rounds of N."""
import sys, os, time, statistics
sys.path.insert(0, os.environ["PYTHONPATH"])
from bench.runners import OrchestratorRunner
N, R = int(sys.argv[1]), int(sys.argv[2])
CODE = os.environ.get("CELL", "1")
r = OrchestratorRunner(); s = r.create()
def run_ns(pid): return int(open("/proc/%s/schedstat" % pid).read().split()[0])
try:
    for _ in range(300): s.execute(CODE)
    c = [c for c in r.client.containers.list() if c.name.endswith(s.sandbox_id)][0]
    top = c.top(); i = top["Titles"].index("PID"); pids = [p[i] for p in top["Processes"]]
    sup, wrk = pids[1], pids[2]
    out = {"ctl": [], "sup": [], "wrk": [], "wall-median": []}
    for _ in range(R):
        b = [run_ns(p) for p in (sup, wrk)]; c0 = time.process_time_ns(); t = time.perf_counter_ns()
        ts = []
        for _ in range(N):
            t1 = time.perf_counter_ns(); s.execute(CODE); ts.append(time.perf_counter_ns() - t1)
        w = statistics.median(ts) * N; cc = time.process_time_ns() - c0; e = [run_ns(p) for p in (sup, wrk)]
        out["ctl"].append(cc/N/1e3); out["sup"].append((e[0]-b[0])/N/1e3); out["wrk"].append((e[1]-b[1])/N/1e3); out["wall-median"].append(w/N/1e3)
    print(os.environ.get("TAG", ""), "  ".join("%s %.1f [min %.1f]" % (k, statistics.median(v), min(v)) for k, v in out.items()), "| load %.1f" % os.getloadavg()[0], flush=True)
finally:
    s.close(); r.shutdown()
