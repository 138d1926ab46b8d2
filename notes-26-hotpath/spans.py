"""Controller-side spans (perf_counter_ns, inclusive, median over N trivial cells) on a real session."""
import sys, os, time, statistics, functools, contextlib
sys.path.insert(0, os.environ["PYTHONPATH"])
from bench.runners import OrchestratorRunner
from orchestrator.api import session as S
from orchestrator.runtime import recovery as R, sandbox as SB, restore as RS
from orchestrator.wire import connection as C, transport as T
spans = {}
cur = {}
def wrap(owner, name, label):
    f = getattr(owner, name)
    @functools.wraps(f)
    def w(*a, **k):
        t = time.perf_counter_ns()
        try: return f(*a, **k)
        finally: cur[label] = cur.get(label, 0) + time.perf_counter_ns() - t
    setattr(owner, name, w)
def wrap_cm(owner, name, label):  # time a context manager's enter and exit
    f = getattr(owner, name)
    @contextlib.contextmanager
    def w(*a, **k):
        t = time.perf_counter_ns(); cm = f(*a, **k); cm.__enter__(); cur[label + " enter"] = cur.get(label + " enter", 0) + time.perf_counter_ns() - t
        try: yield
        finally:
            t = time.perf_counter_ns(); cm.__exit__(None, None, None); cur[label + " exit"] = cur.get(label + " exit", 0) + time.perf_counter_ns() - t
    setattr(owner, name, w)
wrap(S.Session, "execute", "0 Session.execute (all)")
wrap_cm(RS.SessionSandbox, "turn", "1 turn (lock, log context, activity flock/utime)")
wrap(R.Recoverer, "call", "2 Recoverer.call")
wrap(C.AgentConnection, "request", "3 AgentConnection.request")
wrap(C.AgentConnection, "check_idle", "3a check_idle (poll)")
wrap(T.Channel, "send", "4 Channel.send (encode + send)")
wrap(C.AgentConnection, "_wait", "5 _wait (poll until the reply)")
wrap(T.Channel, "poll_recv", "6 Channel.poll_recv (recv + decode)")
wrap(S.Session, "_exec_result", "7 _exec_result (validate reply, ExecResult)")
N = int(sys.argv[1])
r = OrchestratorRunner(); s = r.create()
try:
    for _ in range(100): s.execute("1")
    rows = {}
    for _ in range(N):
        cur.clear(); s.execute("1")
        for k, v in cur.items(): rows.setdefault(k, []).append(v / 1e3)
    for k in sorted(rows):
        v = sorted(rows[k]); print("%-52s median %7.1f us  p10 %7.1f  p90 %7.1f" % (k, v[len(v)//2], v[len(v)//10], v[9*len(v)//10]))
    print("load", os.getloadavg())
finally:
    s.close(); r.shutdown()
