"""Instructions per cell from vg_agent.py dumps: python vg_sum.py OUTDIR N."""
import glob, sys
out, n = sys.argv[1], int(sys.argv[2])
for f in sorted(glob.glob(out + "/cg.*.1")):
    text = open(f).read()
    total = int([l for l in text.splitlines() if l.startswith("summary:") or l.startswith("totals:")][0].split()[1])
    cmd = [l for l in text.splitlines() if l.startswith("cmd:")][0]
    role = "worker" if "-c" in cmd or "worker" in cmd else "supervisor"
    print("%-10s %8.0f instructions/cell  (%s)" % (role, total / n, f))
