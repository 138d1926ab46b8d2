"""Unix-socket ping-pong floor: `serve PATH` echoes; `client PATH N` times N round trips (1-byte and 200-byte)."""
import socket, sys, time, os
mode, path = sys.argv[1], sys.argv[2]
if mode == "serve":
    if os.path.exists(path): os.unlink(path)
    s = socket.socket(socket.AF_UNIX); s.bind(path); os.chmod(path, 0o777); s.listen(1)
    c, _ = s.accept()
    while True:
        b = c.recv(65536)
        if not b: break
        c.sendall(b)
else:
    N = int(sys.argv[3])
    c = socket.socket(socket.AF_UNIX)
    for _ in range(100):
        try: c.connect(path); break
        except OSError: time.sleep(0.05)
    for size in (1, 200):
        msg = b"x" * size
        for _ in range(500): c.sendall(msg); c.recv(65536)
        ts = []
        for _ in range(N):
            t = time.perf_counter_ns(); c.sendall(msg); c.recv(65536); ts.append(time.perf_counter_ns() - t)
        ts.sort()
        print("%s %dB: median %.1f us p10 %.1f p90 %.1f" % (sys.argv[4] if len(sys.argv) > 4 else "", size, ts[N//2]/1e3, ts[N//10]/1e3, ts[9*N//10]/1e3), flush=True)
