"""Instructions per trivial cell of the supervisor and the worker (host agent under callgrind).

usage: WT=<checkout> python vg_agent.py OUTDIR N [code]: warm up 50 cells, zero the counters, run N cells, dump.
"""
import os, sys, subprocess, tempfile, time
from pathlib import Path
wt = os.environ["WT"]
sys.path.insert(0, wt); sys.path.insert(0, wt + "/tests")
import agent_process
out, n = sys.argv[1], int(sys.argv[2])
code = sys.argv[3] if len(sys.argv) > 3 else "1"
os.makedirs(out, exist_ok=True)
agent_process.AGENT_COMMAND[:0] = ["valgrind", "--tool=callgrind", "--trace-children=yes", "--callgrind-out-file=%s/cg.%%p" % out, "-q"]
extra = dict(kv.split("=", 1) for kv in os.environ.get("AGENT_ENV_EXTRA", "").split(",") if kv)
a = agent_process.Agent(Path(tempfile.mkdtemp(prefix="h26vg-", dir="/tmp")), ORCH_FRAME_TIMEOUT="30", **extra)
try:
    for _ in range(50):
        a.run(code, timeout=60, checkpoint_timeout=60)
    pids = [str(a.proc.pid)] + subprocess.run(["pgrep", "-P", str(a.proc.pid)], capture_output=True, text=True).stdout.split()
    for p in pids:
        subprocess.run(["callgrind_control", "-z", p], check=True, capture_output=True, timeout=60)
    t = time.time()
    for _ in range(n):
        a.run(code, timeout=60, checkpoint_timeout=60)
    for p in pids:
        subprocess.run(["callgrind_control", "-d", "cells", p], check=True, capture_output=True, timeout=60)
    print("pids", pids, "%.1f s" % (time.time() - t))
finally:
    a.close()
