import sys, os, time, glob
sys.path.insert(0, os.environ["PYTHONPATH"])
from bench.runners import OrchestratorRunner
r = OrchestratorRunner()
try:
    for i in range(4):
        s = r.create()
        c = [c for c in r.client.containers.list() if c.name.endswith(s.sandbox_id)][0]
        cg = glob.glob("/sys/fs/cgroup/**/*%s*" % c.id, recursive=True)
        cg = [p for p in cg if os.path.exists(p + "/cpu.stat")][0]
        u0 = int(open(cg + "/cpu.stat").read().split()[1])
        time.sleep(2)
        u1 = int(open(cg + "/cpu.stat").read().split()[1])
        mg = "/sys/fs/cgroup/memory/docker/" + c.id
        ms = open(mg + "/memory.stat").read().split()
        st = dict(zip(ms[::2], ms[1::2]))
        print("start CPU %.3f s (after 2 s idle %.3f s); memory usage %.1f MiB rss %.1f cache %.1f" % (u0/1e6, u1/1e6, int(open(mg+"/memory.usage_in_bytes").read())/2**20, int(st["total_rss"])/2**20, int(st["total_cache"])/2**20), flush=True)
        s.close()
finally:
    r.shutdown()
