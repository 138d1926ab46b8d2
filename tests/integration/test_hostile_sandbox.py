"""A hostile agent cannot hang or exhaust the controller: every call ends, typed, within its deadline.

The sandbox runs a patched supervisor (``Settings.agent_command``): it imports the real
``orchestrator_agent.supervisor`` after replacing ``socket.socket`` with a subclass that, on the
connection to the controller (a Unix socket to ``.../channel.sock``), misbehaves from the first
frame it sends after the file ``/tmp/hostile`` appeared in the container (the test's cell writes
a mode into it; the supervisor reads and deletes it). Modes:

- ``trickle``: the real bytes, one per 0.5 s;
- ``stall``: the prefix and half the header, then the supervisor sleeps for ever;
- ``hugebody``: a prefix declaring a body of ``max_body_bytes``, the header, then nothing;
- ``nested``: a valid prefix and a header ``{"type": "exec_reply", "id": ..., "x": [[[[...]]]]}``
  100,000 levels deep;
- ``garbage``: bytes that are no frame at all;
- ``nan``, ``twice``, ``digits``: the real reply, its header given a ``NaN`` field, a key twice, or an
  integer of 5,000 digits (strict JSON refuses each; docs/trust.md).
- ``stop``: the supervisor stops itself with SIGSTOP (a cell cannot: the supervisor is another uid,
  tests/integration/test_supervisor_out_of_reach.py).

The supervisor relays no reply (docs/design/one-hop.md): its connection carries only control frames, so
the cell has the supervisor send one: it writes garbage on its worker's data channel, for which the controller has
the supervisor replace the worker, and the supervisor's ``worker_replaced`` is the frame that misbehaves.

Each call raises ``ExecutionTimeout`` or ``ProtocolError`` with ``restored=True`` within
timeout + checkpoint_timeout + grace + reply_margin (+ a few seconds for the recycle), and the next
call works on the state from before the hostile call. The recycled container runs the same
command, but its ``/tmp`` is a fresh tmpfs without the marker, so it behaves.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from support import close_quietly

from orchestrator import ExecutionTimeout, Orchestrator, OrchestratorError, ProtocolError, Session, Settings

pytestmark = pytest.mark.docker

HOSTILE = r"""
import json, os, signal, socket, struct, sys, time

MARKER = '/tmp/hostile'
MAX_BODY = %(max_body)d
_Base = socket.socket


# The reply's own header, with what strict JSON has not: the controller's parser must refuse it.
NOT_STRICT = {
    'nan': lambda head: head[:-1] + b',"was":NaN}',  # any frame: here the supervisor's worker_replaced
    'twice': lambda head: head[:-1] + b',"type":"exec_reply"}',  # every frame has a type
    'digits': lambda head: head[:-1] + b',"n":' + b'9' * 5000 + b'}',
}


def _forever():
    while True:
        time.sleep(3600)


class HostileSocket(_Base):
    # Instance state lives in a dict keyed by nothing but the object (socket.socket has __slots__).
    def _state(self):
        try:
            return self.__hostile
        except AttributeError:
            self.__hostile = {'ctl': False, 'mode': None, 'buf': b'', 'done': False}
            return self.__hostile

    def connect(self, address):
        result = super().connect(address)
        if isinstance(address, (str, bytes)) and os.fsdecode(address).endswith('channel.sock'):
            self._state()['ctl'] = True
        return result

    def connect_ex(self, address):
        result = super().connect_ex(address)
        if result == 0 and isinstance(address, (str, bytes)) and os.fsdecode(address).endswith('channel.sock'):
            self._state()['ctl'] = True
        return result

    def _to_controller(self):
        state = self._state()
        if state['ctl']:
            return True
        try:
            peer = self.getpeername() if self.family == socket.AF_UNIX else ''
        except OSError:
            return False
        return bool(peer) and os.fsdecode(peer).endswith('channel.sock')

    def _hostile_mode(self):
        state = self._state()
        if state['mode'] is None and os.path.exists(MARKER) and self._to_controller():
            try:
                with open(MARKER) as fh:
                    mode = fh.read().strip()
                os.unlink(MARKER)
            except OSError:
                return None
            state['mode'] = mode or 'garbage'
            sys.stderr.write('hostile supervisor: %%s\n' %% state['mode'])
        return state['mode']

    def _misbehave(self, data, whole):
        state = self._state()
        mode = state['mode']
        if mode == 'stop':
            os.kill(os.getpid(), signal.SIGSTOP)
        if mode == 'trickle':
            if not whole:
                time.sleep(0.5)
                _Base.sendall(self, data[:1])
                return 1
            for i in range(len(data)):
                time.sleep(0.5)
                _Base.sendall(self, data[i:i + 1])
            return len(data)
        if state['done']:
            return len(data)  # swallow everything after the bad frame
        state['buf'] += data
        buf = state['buf']
        if len(buf) < 12:
            return len(data)
        magic, hlen, blen = struct.unpack('!4sII', buf[:12])
        if len(buf) < 12 + hlen and mode in ('stall', 'hugebody', 'nested') + tuple(NOT_STRICT):
            return len(data)
        state['done'] = True
        header = buf[12:12 + hlen]
        if mode == 'stall':
            _Base.sendall(self, buf[:12 + hlen // 2])
            _forever()
        elif mode == 'hugebody':
            _Base.sendall(self, struct.pack('!4sII', magic, hlen, MAX_BODY) + header)
        elif mode == 'nested':
            try:
                rid = json.loads(header.decode()).get('id')
            except ValueError:
                rid = None
            depth = 100000
            text = '{"type": "exec_reply", "id": %%s, "x": %%s}' %% (json.dumps(rid), '[' * depth + ']' * depth)
            raw = text.encode()
            _Base.sendall(self, struct.pack('!4sII', magic, len(raw), 0) + raw)
        elif mode in NOT_STRICT:
            raw = NOT_STRICT[mode](header)
            _Base.sendall(self, struct.pack('!4sII', magic, len(raw), blen) + raw + buf[12 + hlen:])
        else:
            _Base.sendall(self, b'\x00garbage, not a frame\xff' * 64)
        return len(data)

    def sendall(self, data, *args):
        if self._hostile_mode() is None:
            return super().sendall(data, *args)
        self._misbehave(bytes(data), True)
        return None

    def send(self, data, *args):
        if self._hostile_mode() is None:
            return super().send(data, *args)
        return self._misbehave(bytes(data), False)

    def sendmsg(self, buffers, *args):
        if self._hostile_mode() is None:
            return super().sendmsg(buffers, *args)
        return self._misbehave(b''.join(bytes(b) for b in buffers), False)


socket.socket = HostileSocket
import orchestrator_agent.supervisor
orchestrator_agent.supervisor.main()
"""

TIMEOUT = 2.0
BEFORE = "kept = 41\nimport os, signal"
LOST = "kept = 'lost'\n"
SUPERVISOR_SPEAKS = (
    "import sys\n"
    "frame = sys._getframe()\n"
    "while frame.f_code.co_name != 'handle':\n"
    "    frame = frame.f_back\n"
    "os.write(frame.f_locals['self'].sock.fileno(), b'garbage!!!!!')\n"
)
"""Cell code that has the supervisor send a frame (``worker_replaced``: the controller had it replace a worker that
wrote garbage on its data channel)."""


def misbehave(mode: str) -> str:
    """Cell code that turns the supervisor hostile in ``mode`` from its next frame to the controller on."""
    code = LOST + f"open('/tmp/hostile', 'w').write({mode!r})\n"
    return code + SUPERVISOR_SPEAKS


def hostile_settings(settings, settings_for) -> Settings:
    base = settings_for(timeouts=settings.timeouts.replace(interrupt_grace=1.0, reply_margin=3.0, checkpoint=1.0))
    script = HOSTILE % {"max_body": base.limits.max_body_bytes}
    return base.replace(agent_command=("python3", "-c", script))


@pytest.fixture(scope="module")
def hostile(settings, settings_for, image: str) -> Iterator[tuple[Orchestrator, Settings]]:
    settings = hostile_settings(settings, settings_for)
    orch = Orchestrator(settings)
    try:
        yield orch, settings
    finally:
        try:
            orch.close()
        finally:
            orch.backend.client.close()


@pytest.fixture
def victim(hostile: tuple[Orchestrator, Settings], run_id: str) -> Iterator[Session]:
    orch, _ = hostile
    s = orch.create_session(labels={"orchestrator.test.run": run_id})
    try:
        assert s.execute(BEFORE).ok
        yield s
    finally:
        close_quietly(s)


def deadline(settings: Settings) -> float:
    """The longest a hostile call may take: cell and checkpoint clocks, the ladder, the margin, a recycle."""
    return (
        TIMEOUT
        + settings.timeouts.checkpoint
        + 2 * settings.timeouts.interrupt_grace
        + settings.timeouts.reply_margin
        + 8.0
    )


def assert_typed_and_restored(session: Session, settings: Settings, code: str) -> OrchestratorError:
    generation = session.generation
    started = time.monotonic()
    with pytest.raises(OrchestratorError) as info:
        session.execute(code, timeout=TIMEOUT)
    took = time.monotonic() - started
    exc = info.value
    assert isinstance(exc, ExecutionTimeout | ProtocolError), f"{type(exc).__name__}: {exc}"
    assert exc.restored is True, f"{type(exc).__name__}: {exc}"
    assert took < deadline(settings), f"the call took {took:.1f} s ({type(exc).__name__}: {exc})"
    assert session.generation == generation
    started = time.monotonic()
    result = session.execute("kept += 1\nkept")
    assert result.return_value == "42", result
    assert time.monotonic() - started < 10
    return exc


def test_the_hostile_agent_behaves_until_told(victim: Session, hostile) -> None:
    """Sanity check of the patch itself: without the marker the patched agent is a normal agent."""
    assert victim.execute("kept + 1").return_value == "42"
    assert victim.execute("x = [1] * 1000\nlen(x)").return_value == "1000"


@pytest.mark.parametrize("mode", ["trickle", "stall", "hugebody", "nested", "garbage", "nan", "twice", "digits"])
def test_a_misbehaving_agent_frame_is_a_typed_error_within_the_deadline(victim: Session, hostile, mode: str) -> None:
    orch, settings = hostile
    old = victim.container_id
    exc = assert_typed_and_restored(victim, settings, misbehave(mode))
    assert victim.container_id != old, f"a misbehaving agent must be recycled ({type(exc).__name__}: {exc})"
    if mode in ("nan", "twice", "digits"):
        assert isinstance(exc, ProtocolError) and "frame header has" in str(exc), f"{type(exc).__name__}: {exc}"
    state = orch.backend.inspect(old)
    assert state is None or not state.running


@pytest.mark.parametrize("mode", ["garbage", "stall", "nan"])
def test_a_supervisor_that_misbehaves_as_it_kills_a_cell_past_its_grace_is_recycled(
    victim: Session, hostile, mode: str
) -> None:
    """The cell ignores its interrupt, so the controller's ladder has the worker killed; the supervisor's answer to
    that (``worker_replaced``) is the frame that misbehaves. The supervisor's fault, not the worker's: the sandbox
    goes."""
    orch, settings = hostile
    old = victim.container_id
    ignore = "signal.signal(signal.SIGINT, signal.SIG_IGN)\nimport time\ntime.sleep(60)\n"
    code = LOST + f"open('/tmp/hostile', 'w').write({mode!r})\n" + ignore
    exc = assert_typed_and_restored(victim, settings, code)
    assert victim.container_id != old, f"a misbehaving agent must be recycled ({type(exc).__name__}: {exc})"
    state = orch.backend.inspect(old)
    assert state is None or not state.running


def test_a_stopped_supervisor_is_a_timeout_and_a_recycle(victim: Session, hostile) -> None:
    """SIGSTOP on the supervisor: the controller stops waiting at the deadline and recycles the container."""
    orch, settings = hostile
    old = victim.container_id
    exc = assert_typed_and_restored(victim, settings, misbehave("stop"))
    assert isinstance(exc, ExecutionTimeout), f"{type(exc).__name__}: {exc}"
    assert victim.container_id != old
    state = orch.backend.inspect(old)
    assert state is None or not state.running
