"""In-process costs of the worker's per-cell setup (min of repeats: robust to load)."""
import os, sys, timeit
sys.path.insert(0, os.environ.get("WT", "/work/wt-hotpath"))
from orchestrator.agent import capture, cells
ns = {}
def t(name, fn, n=20000):
    print("%-45s %6.2f us" % (name, min(timeit.repeat(fn, number=n, repeat=7)) / n * 1e6))
def streams():
    s = capture.CellStreams(1000, None, False, 0, None); s.finish()
t("CellStreams(...) + finish(), not streamed", streams)
t("cells.run_cell('1')", lambda: cells.run_cell("1", ns, 1))
t("cells.run_cell('y = 1')", lambda: cells.run_cell("y = 1", ns, 1))
