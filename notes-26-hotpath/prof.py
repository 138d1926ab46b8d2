"""Controller-side profile of trivial cells: wall per cell and cProfile over N cells."""
import cProfile, pstats, sys, time, statistics, os, json
sys.path.insert(0, os.environ["PYTHONPATH"])
from bench.runners import OrchestratorRunner
N = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
r = OrchestratorRunner()
s = r.create()
try:
    for _ in range(50): s.execute("1")
    ts = []
    for _ in range(N):
        t = time.perf_counter_ns(); s.execute("1"); ts.append(time.perf_counter_ns() - t)
    ts.sort()
    print("wall us: median %.1f p10 %.1f p90 %.1f" % (ts[N//2]/1e3, ts[N//10]/1e3, ts[9*N//10]/1e3))
    # CPU time of controller per cell
    c0 = time.process_time_ns(); w0 = time.perf_counter_ns()
    for _ in range(N): s.execute("1")
    print("controller CPU us/cell %.1f  wall us/cell %.1f" % ((time.process_time_ns()-c0)/N/1e3, (time.perf_counter_ns()-w0)/N/1e3))
    print("container:", s.sandbox_id if hasattr(s, "sandbox_id") else "")
    if os.environ.get("HOLD"):
        print("holding; pid", os.getpid(), flush=True); time.sleep(float(os.environ["HOLD"]))
    pr = cProfile.Profile(); pr.enable()
    for _ in range(N): s.execute("1")
    pr.disable()
    st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(35)
    st.sort_stats("cumulative").print_stats(45)
finally:
    s.close(); r.shutdown()
