"""Worker replacement: container CPU and wall time of a kill of the worker + the next call (restore of x = 1).

python notes-26-lean/replace.py [N]   (throwaway measuring script for NOTES-26-lean.md)
"""
import glob, os, sys, time, statistics
sys.path.insert(0, os.environ["PYTHONPATH"])
from bench.runners import OrchestratorRunner

n = int(sys.argv[1]) if len(sys.argv) > 1 else 10
r = OrchestratorRunner()
cpu, wall = [], []
try:
    s = r.create()
    s.execute("x = 1")
    cg = [p for p in glob.glob("/sys/fs/cgroup/**/*%s*" % s.container_id, recursive=True) if os.path.exists(p + "/cpu.stat")][0]
    usage = lambda: int(open(cg + "/cpu.stat").read().split()[1]) / 1e6
    for i in range(n):
        u0, t0 = usage(), time.perf_counter()
        try:
            s.execute("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
        except Exception as exc:
            assert "SIGKILL" in str(exc), exc
        assert s.execute("x").return_value == "1"
        wall.append(time.perf_counter() - t0); cpu.append(usage() - u0)
    s.close()
finally:
    r.shutdown()
print("kill + replace + restore + call: container CPU median %.1f ms (min %.1f), wall median %.1f ms (min %.1f), n=%d, load %s" % (
    statistics.median(cpu) * 1e3, min(cpu) * 1e3, statistics.median(wall) * 1e3, min(wall) * 1e3, n, open("/proc/loadavg").read().split()[:3]))
