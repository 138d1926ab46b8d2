"""Run trivial cells in a loop for LOOP seconds after printing the container id; for perf/strace from outside."""
import sys, time, os
sys.path.insert(0, os.environ["PYTHONPATH"])
from bench.runners import OrchestratorRunner
r = OrchestratorRunner(); s = r.create()
try:
    for _ in range(50): s.execute("1")
    cid = [c for c in r.client.containers.list() if c.name == s.sandbox_id]
    print("session", s.id, [c.id[:12] for c in cid], "pid", os.getpid(), flush=True)
    time.sleep(float(os.environ.get("PRE", "3")))
    n = 0; t0 = time.perf_counter(); end = t0 + float(os.environ.get("LOOP", "10"))
    while time.perf_counter() < end:
        s.execute("1"); n += 1
    print("cells", n, "us/cell", (time.perf_counter()-t0)/n*1e6, flush=True)
    time.sleep(float(os.environ.get("POST", "0")))
finally:
    s.close(); r.shutdown()
