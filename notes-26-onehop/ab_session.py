"""A/B: a trivial cell through the whole controller (Session.execute), two hops vs one hop, interleaved rounds.

Prints per round: median wall per cell (us) and the controller's CPU per cell (us, this process)."""

import os, statistics, sys, time, tempfile
from pathlib import Path
from orchestrator import Orchestrator, Settings

N = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
base = Settings.from_env()
orchs, sessions = {}, {}
for name, hop in (("two", False), ("one", True)):
    s = base.replace(
        state_dir=Path(tempfile.mkdtemp(prefix="abs-", dir="/tmp")),
        runtime_dir=Path(tempfile.mkdtemp(prefix="abr-", dir="/tmp")),
        one_hop=hop,
    )
    orchs[name] = Orchestrator(s)
    sessions[name] = orchs[name].create_session()
    sessions[name].execute("1")
    assert sessions[name]._sandbox.sandbox.connection.one_hop == hop
try:
    for r in range(ROUNDS):
        for name in ("two", "one"):
            sess = sessions[name]
            for _ in range(200):
                sess.execute("1")
            walls = []
            c0 = time.process_time()
            for _ in range(N):
                t = time.perf_counter()
                sess.execute("1")
                walls.append(time.perf_counter() - t)
            cpu = (time.process_time() - c0) / N
            print(
                f"round {r} {name} hop(s): wall median {statistics.median(walls) * 1e6:.0f} us, controller CPU {cpu * 1e6:.0f} us",
                flush=True,
            )
finally:
    for name in sessions:
        sessions[name].close()
        orchs[name].close()
