import os, sys, time, tempfile, subprocess
from pathlib import Path
wt = os.environ["WT"]; sys.path.insert(0, wt); sys.path.insert(0, wt + "/tests")
from agent_process import Agent
a = Agent(Path(tempfile.mkdtemp(prefix="h26-", dir="/tmp")))
try:
    for _ in range(100): a.run("1")
    sup = str(a.proc.pid); wrk = subprocess.run(["pgrep", "-P", sup], capture_output=True, text=True).stdout.split()[0]
    procs = [subprocess.Popen(["strace", "-c", "-o", "/tmp/h26/st-%s-%s.txt" % (os.environ["TAG"], role), "-p", pid]) for role, pid in (("sup", sup), ("wrk", wrk))]
    time.sleep(1)
    for _ in range(500): a.run("1")
    for p in procs: p.send_signal(2); p.wait()
finally:
    a.close()
