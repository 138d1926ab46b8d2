"""Idle sandbox: container memory (as the bench reads it), anon/cache, per-process Pss/USS, CPU after create + 1 call.

python notes-26-lean/idle.py [N]   (throwaway measuring script for NOTES-26-lean.md)
"""
import glob, os, sys, time, statistics
sys.path.insert(0, os.environ["PYTHONPATH"])
from bench.runners import OrchestratorRunner, container_memory

def rollup(cid, pid):
    out = {}
    for line in open("/proc/%d/smaps_rollup" % pid):
        parts = line.split()
        if len(parts) >= 3 and parts[1].isdigit():
            out[parts[0].rstrip(":")] = int(parts[1]) / 1024
    return out

def procs(cid):
    tasks = [int(p) for p in open("/sys/fs/cgroup/memory/docker/%s/cgroup.procs" % cid).read().split()]
    rows = []
    for pid in tasks:
        try:
            cmd = open("/proc/%d/cmdline" % pid, "rb").read().replace(b"\0", b" ")[:60].decode()
            r = rollup(cid, pid)
        except OSError:
            continue
        rows.append((pid, cmd, r.get("Rss", 0), r.get("Pss", 0), r.get("Private_Clean", 0) + r.get("Private_Dirty", 0), r.get("Private_Dirty", 0)))
    return rows

n = int(sys.argv[1]) if len(sys.argv) > 1 else 4
r = OrchestratorRunner()
mems, cpus, firsts = [], [], []
try:
    for i in range(n):
        t0 = time.perf_counter()
        s = r.create()
        s.execute("1 + 1")
        firsts.append(time.perf_counter() - t0)
        cid = s.container_id
        cg = [p for p in glob.glob("/sys/fs/cgroup/**/*%s*" % cid, recursive=True) if os.path.exists(p + "/cpu.stat")][0]
        usage = int(open(cg + "/cpu.stat").read().split()[1]) / 1e6
        time.sleep(0.5)
        mem = container_memory(r.client, cid) / 2**20
        st = dict(l.split() for l in open("/sys/fs/cgroup/memory/docker/%s/memory.stat" % cid))
        mems.append(mem); cpus.append(usage)
        print("start+call CPU %.3f s  wall %.3f s  memory %.2f MiB (rss %.2f cache %.2f)" % (usage, firsts[-1], mem, int(st["total_rss"]) / 2**20, int(st["total_cache"]) / 2**20), flush=True)
        if i == 0:
            for row in procs(cid):
                print("   pid %6d %-60s Rss %.1f Pss %.1f USS %.1f PrivDirty %.1f" % row)
        s.close()
finally:
    r.shutdown()
print("median memory %.2f MiB, median CPU %.3f s (n=%d) load %s" % (statistics.median(mems), statistics.median(cpus), n, open("/proc/loadavg").read().split()[:3]))
