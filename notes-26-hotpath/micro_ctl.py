"""In-process costs of the controller's per-call pieces (min of repeats): run with PYTHONPATH=<checkout>."""
import json, os, socket, sys, timeit
sys.path.insert(0, os.environ["PYTHONPATH"])
from orchestrator.agent import protocol
from orchestrator.wire.transport import Channel
from orchestrator.wire.replies import parse_exec_reply, worker_failure
sample = json.load(open("/tmp/h26/sample.json"))
req, rep = sample["req"], sample["rep"]
frame = b"".join(protocol.frame_parts(rep))
head = protocol.encode_header(rep)
def t(name, fn, n=20000):
    print("%-50s %6.2f us" % (name, min(timeit.repeat(fn, number=n, repeat=7)) / n * 1e6), flush=True)
a, b = socket.socketpair()
ch = Channel(b, protocol.MAX_HEADER_BYTES, protocol.MAX_BODY_BYTES)
def recv_one():
    a.send(frame)
    assert ch.poll_recv() is not None
t("a.send(reply) + Channel.poll_recv()", recv_one)
t("a.send(reply) alone (subtract)", lambda: (a.send(frame), b.recv(65536)))
t("decode_header(reply)", lambda: protocol.decode_header(head))
t("worker_failure + parse_exec_reply", lambda: (worker_failure(rep), parse_exec_reply(rep)))
chs = Channel(a, protocol.MAX_HEADER_BYTES, protocol.MAX_BODY_BYTES)
def send_one():
    chs.send(dict(req), deadline=None); b.recv(65536)
t("Channel.send(exec) + peer recv", send_one)
t("frame_parts(exec)", lambda: protocol.frame_parts(req))
t("exec_request(...)", lambda: protocol.exec_request("1", 300.0, checkpoint_timeout=60.0, send_limit=1 << 20, stream=False, input=False))
