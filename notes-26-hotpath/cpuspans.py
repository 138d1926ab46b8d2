"""Controller thread-CPU (user+sys) per stage of a trivial cell, inclusive, mean over N (wrappers cost ~0.5 us each)."""
import os, sys, time, functools, collections
sys.path.insert(0, os.environ["PYTHONPATH"])
from bench.runners import OrchestratorRunner
from orchestrator.wire import connection, transport
from orchestrator.runtime import recovery, restore, sandbox as sbx
from orchestrator.api import session as sess, events
from orchestrator.state import activity

acc = collections.Counter(); cnt = collections.Counter()
tt = time.thread_time_ns
def wrap(cls, name, label=None):
    f = getattr(cls, name); label = label or f"{cls.__name__}.{name}"
    @functools.wraps(f)
    def w(*a, **k):
        t = tt()
        try: return f(*a, **k)
        finally: acc[label] += tt() - t; cnt[label] += 1
    setattr(cls, name, w)
import select
for c, n in [(sess.Session, "execute"), (recovery.Recoverer, "call"), (restore.SessionSandbox, "ready"),
             (sbx.Sandbox, "request"), (connection.AgentConnection, "request"), (connection.AgentConnection, "_wait"),
             (connection.AgentConnection, "check_idle"),
             (transport.Channel, "send"), (transport.Channel, "poll_recv"), (sess.Session, "_exec_result"),
             (activity.Activity, "__enter__"), (activity.Activity, "__exit__"), (events.LiveCall, "__init__"), (events.LiveCall, "close"),
             (sess.Session, "_output")]:
    if c is not None: wrap(c, n)
r = OrchestratorRunner(); s = r.create()
try:
    for _ in range(300): s.execute("1")
    acc.clear(); cnt.clear()
    N = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    c0 = time.process_time_ns()
    for _ in range(N): s.execute("1")
    print("process CPU us/cell %.1f load %.1f" % ((time.process_time_ns() - c0) / N / 1e3, os.getloadavg()[0]))
    for k, v in sorted(acc.items(), key=lambda kv: -kv[1]):
        print("%-40s %7.1f us x%.0f" % (k, v / N / 1e3, cnt[k] / N))
finally:
    s.close(); r.shutdown()
