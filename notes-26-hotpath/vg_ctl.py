"""Instructions per trivial cell of the controller (Session.execute against a container), under callgrind.

usage: PYTHONPATH=<checkout> valgrind --tool=callgrind --callgrind-out-file=OUT/cg.%p -q python vg_ctl.py N
Zeroes its own counters after a warm-up and dumps after N cells (callgrind_control on itself).
"""
import os, subprocess, sys
sys.path.insert(0, os.environ["PYTHONPATH"])
from bench.runners import OrchestratorRunner
import orchestrator.api.manager as M
M.RENEW_EVERY = 1e6  # no lease renewal during the count: it is per second, and valgrind makes seconds long
n = int(sys.argv[1])
r = OrchestratorRunner(); s = r.create()
try:
    for _ in range(100): s.execute("1")
    subprocess.run(["callgrind_control", "-z", str(os.getpid())], check=True, capture_output=True, timeout=120)
    for _ in range(n): s.execute("1")
    subprocess.run(["callgrind_control", "-d", "cells", str(os.getpid())], check=True, capture_output=True, timeout=120)
finally:
    s.close(); r.shutdown()
