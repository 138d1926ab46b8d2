import os, sys, threading, time
if os.environ.get("H26_SPANS"):
    import functools
    role = "worker" if len(sys.argv) > 1 else "supervisor"
    cur, rows = {}, []
    def wrap(owner, name, label, top=False):
        f = getattr(owner, name)
        @functools.wraps(f)
        def w(*a, **k):
            t = time.perf_counter_ns()
            try: return f(*a, **k)
            finally:
                cur[label] = cur.get(label, 0) + time.perf_counter_ns() - t
                if top:
                    rows.append(dict(cur)); cur.clear()
        setattr(owner, name, w)
    if role == "worker":
        from orchestrator_agent import worker as W, cells, capture, checkpoint, protocol
        wrap(W.Worker, "handle", "0 handle (all)", top=True)
        wrap(W.Worker, "execute", "1 execute")
        wrap(capture.CellStreams, "__init__", "2 CellStreams()")
        wrap(capture.CellStreams, "finish", "3 CellStreams.finish")
        W.cells.run_cell = cells.run_cell
        wrap(W.cells, "run_cell", "4 cells.run_cell (parse, compile, exec/eval, repr)")
        wrap(W.Worker, "checkpoint", "5 checkpoint (delta)")
        wrap(W.protocol, "decode_header", "6 decode_header")
        wrap(W.Worker, "send", "7 send reply (encode + sendall)")
    else:
        from orchestrator_agent import supervisor as SV, frames
        wrap(SV.Supervisor, "handle", "0 handle (all)", top=True)
        wrap(frames.Inbox, "head", "1 Inbox.head (recv + decode), both frames")
        wrap(SV.Supervisor, "_forward", "2 _forward (sendall to worker)")
        wrap(SV.Supervisor, "_await_reply", "3 _await_reply (ladder, wait, read reply head)")
        wrap(SV.Supervisor, "_wait_busy", "4 _wait_busy (epoll until the worker replies)")
        wrap(SV.Supervisor, "_deliver", "5 _deliver (sendall to controller)")
    def _dump():
        time.sleep(float(os.environ["H26_SPANS"]))
        got = rows[:]
        out = open("/tmp/h26/spans-%s.txt" % role, "w")
        keys = sorted({k for r in got for k in r})
        for k in keys:
            v = sorted(r.get(k, 0) / 1e3 for r in got)
            out.write("%s %-52s median %7.1f us  p10 %7.1f  p90 %7.1f  (n=%d)\n" % (role, k, v[len(v)//2], v[len(v)//10], v[9*len(v)//10], len(v)))
        out.close()
    threading.Thread(target=_dump, daemon=True).start()
