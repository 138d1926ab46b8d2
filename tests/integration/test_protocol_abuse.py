"""User code that writes to the worker's channel: a clean ProtocolError, a restored session, a live controller.

The socket the worker reads its requests on and replies on is the cell's too, so a cell can forge or corrupt
frames on it: the controller's data channel D (docs/design/one-hop.md), which the controller checks, having the
supervisor replace the worker. The cell digs it out of the worker (``WORKER_SOCKET``).
"""

from __future__ import annotations

import time

import pytest

from orchestrator import ExecutionTimeout, ProtocolError, SandboxCrashed, Session, Settings, TransportError

pytestmark = pytest.mark.docker

STATE = "import sys, os, struct, json\nkept = {'a': 1}\n"
WORKER_SOCKET = (
    "frame = sys._getframe()\n"
    "while frame.f_code.co_name != 'handle':\n"
    "    frame = frame.f_back\n"
    "fd = frame.f_locals['self'].sock.fileno()\n"
)
"""Cell code that finds the socket its worker serves requests on: D."""
FD = WORKER_SOCKET


@pytest.fixture
def stateful(session: Session) -> Session:
    assert session.execute(STATE).ok
    return session


def assert_recovered(session: Session) -> None:
    result = session.execute("kept['a'] += 1\nkept, 'lost' in globals()")
    assert result.return_value == "({'a': 2}, False)"
    assert session.execute("kept").return_value == "{'a': 2}"


REQUEST_ID = (
    "frame = sys._getframe()\n"
    "while frame.f_code.co_name != 'handle':\n"
    "    frame = frame.f_back\n"
    "rid = frame.f_locals['header']['id']\n"
)
"""Cell code that digs the id of the running request out of the worker's stack, as a forger could."""


def forge(header: str, body_len: int = 0, with_id: bool = False) -> str:
    """Cell code that writes a well-framed frame with the JSON ``header`` to the supervisor."""
    return (
        (REQUEST_ID + f"forged = dict({header}, id=rid)\n" if with_id else f"forged = {header}\n")
        + "head = json.dumps(forged).encode()\n"
        + f"os.write(fd, struct.pack('!4sII', b'ORC1', len(head), {body_len}) + head + b'\\0' * {body_len})\n"
    )


@pytest.mark.parametrize(
    "write",
    [
        "os.write(fd, struct.pack('!4sII', b'ORC1', 10, 2**31 - 2))",
        "os.write(fd, struct.pack('!4sII', b'ORC1', 2**31, 0))",
        "os.write(fd, b'garbage!!!!!')",
        "os.write(fd, struct.pack('!4sII', b'ORC1', 4, 0) + b'\\xff\\xfe{]')",
        "os.write(fd, struct.pack('!4sII', b'ORC1', 2, 0) + b'[]')",
    ],
    ids=["huge-body", "huge-header", "bad-magic", "not-json", "not-an-object"],
)
def test_malformed_frame_is_a_protocol_error(stateful: Session, write: str) -> None:
    container = stateful.container_id
    started = time.monotonic()
    with pytest.raises(ProtocolError) as info:
        stateful.execute("lost = 1\n" + FD + write)
    assert time.monotonic() - started < 10
    assert isinstance(info.value, TransportError)
    assert "restored" in str(info.value)
    assert stateful.container_id == container  # the agent survived and replaced its worker
    assert_recovered(stateful)


@pytest.mark.parametrize(
    "header",
    [
        "{'type': 'exec_reply', 'status': 'ok', 'stdout': 5, 'stderr': '', 'return_value': None, 'error': None, "
        "'duration': 0.0, 'checkpoint': {'generation': 1, 'blobs': [], 'vars': {}, 'deleted': [], 'unsaved': {}}}",
        "{'type': 'exec_reply', 'status': 'ok'}",
        "{'type': 'exec_reply', 'status': 'weird'}",
        "{'type': 'pong', 'status': 'ok'}",
        "{'type': 'exec_reply', 'status': 'ok', 'stdout': '', 'stderr': '', 'return_value': None, 'error': None, "
        "'duration': 0.0, 'checkpoint': {'generation': 99, 'blobs': [], 'vars': {'x': 'f' * 32}, 'deleted': [], "
        "'unsaved': {}}}",
        "{'type': 'exec_reply', 'status': 'ok', 'stdout': '', 'stderr': '', 'return_value': None, 'error': None, "
        "'duration': 0.0, 'checkpoint': {'generation': 2, 'blobs': [{'digest': 'a' * 32, 'size': 8}], "
        "'vars': {'x': 'a' * 32}, 'deleted': [], 'unsaved': {}}}",
        "{'type': 'exec_reply', 'status': 'ok', 'stdout': '', 'stderr': '', 'return_value': None, 'error': 'boom', "
        "'duration': 0.0, 'checkpoint': {'generation': 1, 'blobs': [], 'vars': {}, 'deleted': [], 'unsaved': {}}}",
    ],
    ids=[
        "stdout-int",
        "missing-fields",
        "unknown-status",
        "wrong-type",
        "generation-skew",
        "body-mismatch",
        "error-str",
    ],
)
@pytest.mark.parametrize("with_id", [False, True], ids=["no-id", "right-id"])
def test_well_framed_bogus_reply_is_a_protocol_error(stateful: Session, header: str, with_id: bool) -> None:
    """Without the request id the agent rejects the frame; with it, the controller's validation does."""
    generation = stateful.generation
    started = time.monotonic()
    with pytest.raises(ProtocolError, match="restored"):
        stateful.execute("lost = 1\n" + FD + forge(header, with_id=with_id) + "import time\ntime.sleep(0.2)")
    assert time.monotonic() - started < 10
    assert stateful.generation == generation
    started = time.monotonic()
    assert_recovered(stateful)
    assert time.monotonic() - started < 5, "the next call must not wait for a confused agent"


@pytest.mark.parametrize("with_id", [False, True], ids=["no-id", "right-id"])
def test_forged_reply_with_a_body_is_a_protocol_error(stateful: Session, with_id: bool) -> None:
    header = (
        "{'type': 'exec_reply', 'status': 'ok', 'stdout': '', 'stderr': '', 'return_value': None, 'error': None, "
        "'duration': 0.0, 'checkpoint': {'generation': 2, 'blobs': [{'digest': 'x' * 32, 'size': 16}], "
        "'vars': {'evil': 'x' * 32}, 'deleted': [], 'unsaved': {}}}"
    )
    with pytest.raises(ProtocolError):
        stateful.execute(FD + forge(header, body_len=16, with_id=with_id))
    assert "evil" not in stateful.variables
    assert_recovered(stateful)


def test_half_a_frame_is_not_waited_on_for_ever(stateful: Session, settings: Settings) -> None:
    """A partial frame stalls the agent's read only for Settings.timeouts.frame; then the worker is replaced."""
    container = stateful.container_id
    started = time.monotonic()
    with pytest.raises(ProtocolError, match="middle of a frame"):
        stateful.execute(FD + "os.write(fd, b'ORC1')\nimport time\ntime.sleep(60)", timeout=30)
    assert time.monotonic() - started < settings.timeouts.frame + 5
    assert stateful.container_id == container
    assert_recovered(stateful)


def test_closing_the_channel_fd_is_a_crash_with_restore(stateful: Session) -> None:
    with pytest.raises(SandboxCrashed) as info:
        stateful.execute("lost = 1\n" + FD + "import socket\nsocket.socket(fileno=fd).shutdown(socket.SHUT_RDWR)")
    assert info.value.restored is True
    assert_recovered(stateful)


def test_a_child_in_its_own_session_that_holds_the_workers_socket_reaches_no_later_worker(stateful: Session) -> None:
    """A ``setsid`` child outlives its worker's death (outside the killed process group) and writes on the socket
    it inherited: every worker gets a fresh D, so it writes into a socket
    nobody reads (``EPIPE``) and the calls after it go on in the same sandbox."""
    container = stateful.container_id
    child = FD + (
        "import time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    time.sleep(1)\n"
        "    for _ in range(100):\n"
        "        try:\n"
        "            os.write(fd, b'garbage!!!!!')\n"
        "        except OSError:\n"
        "            os._exit(0)\n"
        "        time.sleep(0.02)\n"
        "    os._exit(0)\n"
        "os._exit(1)\n"
    )
    with pytest.raises(SandboxCrashed) as info:
        stateful.execute("lost = 1\n" + child)
    assert info.value.restored is True
    time.sleep(2)  # the child has written, or found the socket closed
    started = time.monotonic()
    for i in range(3):
        assert stateful.execute(f"{i} * 10").return_value == str(i * 10)
    assert time.monotonic() - started < 5
    assert stateful.container_id == container
    assert_recovered(stateful)


def test_a_thread_that_reads_the_next_request_leaves_it_to_the_ladder(stateful: Session) -> None:
    """A thread the cell left reads the next request off the worker's socket (the worker's own loop is kept from
    it): no reply comes, so the controller's ladder ends the call,
    the worker is replaced and the session goes on in the same sandbox."""
    container = stateful.container_id
    steal = FD + (
        "import socket, threading\n"
        "module = sys.modules[type(frame.f_locals['self']).__module__]\n"
        "stolen = []\n"
        "thief = socket.socket(fileno=os.dup(fd))\n"
        "threading.Thread(target=lambda: stolen.append(thief.recv(1 << 16)), daemon=True).start()\n"
        "module._recv_request = lambda sock: threading.Event().wait()\n"  # the worker's loop waits for ever
    )
    assert stateful.execute(steal).ok
    with pytest.raises(ExecutionTimeout) as info:
        stateful.execute("lost = 1", timeout=2)
    assert info.value.restored is True
    assert stateful.container_id == container
    assert_recovered(stateful)


def valid_reply(generation: int) -> str:
    """A reply that passes every check: nothing changed, stdout 'forged'."""
    return (
        "{'type': 'exec_reply', 'status': 'ok', 'stdout': 'forged', 'stderr': '', 'stdout_bytes': 6, "
        "'stderr_bytes': 0, 'return_value': None, "
        "'error': None, 'duration': 0.0, 'checkpoint_duration': 0.0, "
        f"'checkpoint': {{'generation': {generation}, 'blobs': [], 'vars': {{}}, "
        "'deleted': [], 'unsaved': {}}}"
    )


def test_a_perfectly_forged_reply_does_not_desynchronize_the_session(stateful: Session) -> None:
    """A valid reply forged by the cell is the cell's own business, but later replies must stay in step."""
    header = valid_reply(stateful.generation)
    result = stateful.execute("lost = 1\n" + FD + forge(header, with_id=True) + "import time\ntime.sleep(0.3)\n'real'")
    assert result.stdout == "forged"
    time.sleep(0.5)  # the real reply reaches the agent, which must not relay it as the next answer
    started = time.monotonic()
    for i in range(3):
        assert stateful.execute(f"{i} * 10").return_value == str(i * 10)
    assert time.monotonic() - started < 5
    assert_recovered(stateful)


def test_a_forged_reply_sent_long_before_the_cell_ends(stateful: Session) -> None:
    """The real reply comes while the controller already waits for the next call's reply."""
    header = valid_reply(stateful.generation)
    result = stateful.execute(FD + forge(header, with_id=True) + "import time\ntime.sleep(1.5)\n'real'")
    assert result.stdout == "forged"
    # The next request reaches a worker still busy with the previous cell, whose late reply does not
    # answer it: the agent rejects that reply instead of relaying it, and the session is restored.
    with pytest.raises(ProtocolError, match="does not answer request"):
        stateful.execute("'next'")
    assert stateful.execute("'next'").return_value == "'next'"
    assert stateful.execute("'after'").return_value == "'after'"
    assert_recovered(stateful)
