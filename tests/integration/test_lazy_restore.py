"""A restore defers big values: a cell that does not use one never loads it, one that does loads it then.

Values whose blob is at least ``runtime.deferred.DEFER_BYTES`` come back on first use
(docs/protocol.md, "Deferred values"). What a test observes: the worker's peak memory (from inside
the container) and the bytes the controller handed out for deferred values (its counter), never time.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable

import pytest
from support import kill_and_wait, passes_descriptors

from orchestrator import Orchestrator, Session, Settings
from orchestrator.runtime.deferred import DEFER_BYTES

pytestmark = pytest.mark.docker

BIG_MB = 64
SETUP = f"""\
big = 'x' * ({BIG_MB} << 20)
small = [1, 2, 3]
def size():
    return len(big)
class Point:
    def __init__(self, x):
        self.x = x
point = Point(5)
"""
PEAK_MB = "import resource\nresource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10"  # the worker's, in MB
FOREIGN = """\
import gc
worker = next(o for o in gc.get_objects() if type(o).__name__ == 'Worker')
def ask(key, digest):
    try:
        return len(worker.calls.call_raw('__blob__', {'key': key, 'digest': digest}))
    except Exception as exc:
        return type(exc).__name__ + ': ' + str(exc)
"""


def served(s: Session) -> int:
    """Bytes of deferred values the controller handed to the session's sandbox since its restore."""
    blobs = s._sandbox.sandbox.deferred  # type: ignore[union-attr]
    assert blobs is not None
    return blobs.served_bytes


def peak_mb(s: Session) -> int:
    return int(s.execute(PEAK_MB).return_value or "0")


def restored(s: Session, kill: Callable[[Session], None]) -> None:
    """Kill the container; the next call restores."""
    kill(s)
    assert s.execute("1").ok


def test_a_big_value_is_loaded_by_the_first_cell_that_uses_it(
    session: Session, kill_container: Callable[[Session], None]
) -> None:
    assert session.execute(SETUP).ok
    restored(session, kill_container)
    assert served(session) == 0
    assert session.execute("small.append(4)\npoint.x, isinstance(point, Point)").return_value == "(5, True)"
    assert peak_mb(session) < BIG_MB, "the deferred value was not loaded"
    assert served(session) == 0 and "big" in session.variables

    assert session.execute("size()").return_value == str(BIG_MB << 20)  # a function defined before the restore
    assert served(session) > BIG_MB << 20
    assert peak_mb(session) >= BIG_MB
    assert session.execute("big[:2], small").return_value == "('xx', [1, 2, 3, 4])"
    assert served(session) < 2 * (BIG_MB << 20)  # loaded once


@pytest.mark.parametrize("code, shown", [("len(globals()['big'])", str(BIG_MB << 20)), ("len(big)", None)])
def test_a_cell_loads_what_it_reads(
    session: Session, kill_container: Callable[[Session], None], code: str, shown: str | None
) -> None:
    assert session.execute(SETUP).ok
    restored(session, kill_container)
    assert session.execute(code).return_value == (shown or str(BIG_MB << 20))
    assert served(session) > BIG_MB << 20


def test_deleting_a_deferred_value_removes_it_from_the_checkpoint(
    session: Session, kill_container: Callable[[Session], None]
) -> None:
    assert session.execute(SETUP).ok
    restored(session, kill_container)
    assert session.execute("del big").ok
    assert "big" not in session.variables
    restored(session, kill_container)
    assert session.execute("'big' in globals(), size.__name__").return_value == "(False, 'size')"


def test_a_kill_while_values_are_pending_brings_them_back(
    session: Session, kill_container: Callable[[Session], None]
) -> None:
    assert session.execute(SETUP).ok
    restored(session, kill_container)
    assert session.execute("other = len(small)").ok  # a checkpoint while big is pending keeps it
    assert "big" in session.variables
    restored(session, kill_container)
    assert session.execute("size(), other").return_value == f"({BIG_MB << 20}, 3)"
    assert session.restore_failures == {}


def test_a_context_defers_its_own_big_value(session: Session, kill_container: Callable[[Session], None]) -> None:
    one = session.create_context(context_id="one")
    assert one.execute(f"doc = 'd' * ({BIG_MB} << 20)\ndef head():\n    return doc[:1]").ok
    assert session.execute("doc = 'default'").ok
    restored(session, kill_container)
    assert one.execute("1 + 1").return_value == "2" and served(session) == 0
    assert session.execute("doc").return_value == "'default'" and served(session) == 0
    assert one.execute("head(), len(doc)").return_value == f"('d', {BIG_MB << 20})"
    assert served(session) > BIG_MB << 20


def test_small_values_are_not_deferred(session: Session, kill_container: Callable[[Session], None]) -> None:
    assert session.execute(f"almost = b'a' * ({DEFER_BYTES} - 100)").ok
    restored(session, kill_container)
    assert session.execute("len(almost)").return_value == str(DEFER_BYTES - 100)
    assert served(session) == 0


def test_a_takeover_serves_what_the_previous_controller_deferred(
    session: Session, kill_container: Callable[[Session], None], make_orch, settings
) -> None:
    assert session.execute(SETUP).ok
    restored(session, kill_container)
    other: Orchestrator = make_orch(settings)
    taken = other.attach(session.id, force=True)
    assert taken.container_id == session.container_id  # the live worker, its values still pending
    assert taken.execute("size()").return_value == str(BIG_MB << 20)
    assert served(taken) > BIG_MB << 20


def test_a_cell_gets_no_blob_it_was_not_given(
    orch: Orchestrator, new_session: Callable[..., Session], kill_container: Callable[[Session], None]
) -> None:
    victim = new_session(orch)
    assert victim.execute(f"secret = 's' * ({BIG_MB} << 20)").ok
    secret_digest = victim._ledger.record.variables["secret"]
    s = new_session(orch)
    assert s.execute(SETUP).ok
    own = s._ledger.record.variables["big"]
    restored(s, kill_container)
    assert s.execute(FOREIGN).ok
    refusals = {
        "a verdict for nothing handed out": (  # first; a cell naming 'big' loads it
            f"worker.calls.call('__blob_check__', {{'key': ''.join(['bi', 'g']), 'digest': {own!r}}})"
        ),
        "foreign key": f"ask('secret', {secret_digest!r})",
        "own key, foreign blob": f"ask('big', {secret_digest!r})",
        "a name that is not deferred": "ask('small', 'x' * 32)",
        "not an object": "len(worker.calls.call_raw('__blob__', [1, 2]))",
    }
    for what, code in refusals.items():
        result = s.execute(code)
        shown = result.return_value or str(result.error)
        assert "not served" in shown or "HostCallError" in shown, (what, shown)
        assert not shown.isdigit(), what
    flood = ast.literal_eval(s.execute(f"[ask('big', {own!r}) for _ in range(8)]").return_value or "")
    assert sum(isinstance(answer, int) for answer in flood) <= 2, flood  # twice per key per restore
    assert sum("not available now" in str(answer) for answer in flood) >= 6, flood  # the value stays deferred
    assert served(s) <= 2 * (BIG_MB << 20) + (1 << 20)
    # The controller goes on; the session's own value still loads (its budget is per restore).
    assert s.execute("small").return_value == "[1, 2, 3]"
    restored(s, kill_container)
    assert s.execute("size()").return_value == str(BIG_MB << 20)


def test_deferred_values_on_the_oldest_supported_python(settings: Settings, make_orch, new_session) -> None:
    """Python 3.9 looks globals up in a dict subclass of builtins as 3.11 does (``__missing__``)."""
    base = os.environ.get("ORCH_OLDEST_BASE_IMAGE")
    if not base:
        pytest.skip("ORCH_OLDEST_BASE_IMAGE is not set (scripts/ensure-image sets it)")
    orch: Orchestrator = make_orch(settings.replace(base_image=base))
    orch.build_image()
    s = new_session(orch)
    assert s.agent_info["python"].startswith("3.9"), s.agent_info
    assert s.execute(SETUP).ok
    kill_and_wait(orch, s.container_id)
    assert s.execute("point.x").return_value == "5" and served(s) == 0
    assert s.execute("size()").return_value == str(BIG_MB << 20)
    kill_and_wait(orch, s.container_id)
    assert s.execute("len(globals()['big'])").return_value == str(BIG_MB << 20)
    kill_and_wait(orch, s.container_id)
    assert s.execute("del big").ok and "big" not in s.variables


FILE_PROBE = """\
import gc, os
from orchestrator_agent import hostcall
worker = next(o for o in gc.get_objects() if type(o).__name__ == 'Worker')
def fds():
    return len(os.listdir('/proc/self/fd'))
def kind(key, digest):
    blob = worker.calls.call_raw('__blob__', {'key': key, 'digest': digest})
    try:
        return type(blob).__name__, len(blob)
    finally:
        getattr(blob, 'close', lambda: None)()
"""


def test_a_blob_comes_as_a_read_only_file_and_leaves_no_descriptor(
    session: Session, kill_container: Callable[[Session], None]
) -> None:
    assert session.execute(SETUP).ok
    digest = session._ledger.record.variables["big"]
    restored(session, kill_container)
    assert session.execute(FILE_PROBE + "before = fds()").ok
    assert session.execute("size()").return_value == str(BIG_MB << 20)
    kind, size = ast.literal_eval(session.execute(f"kind('big', {digest!r})").return_value or "")
    assert size > BIG_MB << 20
    assert kind == ("mmap" if passes_descriptors(session) else "bytearray")  # the relayed carrier: the body
    assert session.execute("fds() - before").return_value == "0"


def test_a_cell_that_takes_the_blobs_descriptor_cannot_change_the_stored_blob(
    session: Session, kill_container: Callable[[Session], None]
) -> None:
    assert session.execute(SETUP).ok
    digest = session._ledger.record.variables["big"]
    restored(session, kill_container)
    if not passes_descriptors(session):
        pytest.skip("the relayed carrier: the blob comes as the body")
    # A cell that closes the descriptor before the worker maps it: the load fails, the value stays and loads later.
    closing = "real_map = hostcall.map_file\ndef shut(fd, size):\n    os.close(fd)\n    return real_map(fd, size)\n"
    assert session.execute(FILE_PROBE + closing + "hostcall.map_file = shut\nbefore = fds()").ok
    result = session.execute("size()")
    assert not result.ok and "cannot be loaded now" in str(result.error), result.error
    assert session.execute("hostcall.map_file = real_map\nfds() - before").return_value == "0"
    # A cell that keeps a copy of it: the file is the controller's, read-only, and not the cell's to change.
    stolen = """\
tried = []
def grab(fd, size):
    copy = os.dup(fd)
    try:
        for attempt in (lambda: os.write(copy, b'x'), lambda: os.fchmod(copy, 0o666),
                        lambda: os.open('/proc/self/fd/%d' % copy, os.O_RDWR)):
            try:
                attempt()
                tried.append('changed')
            except OSError as exc:
                tried.append(type(exc).__name__)
    finally:
        os.close(copy)
    return real_map(fd, size)
hostcall.map_file = grab
"""
    assert session.execute(stolen).ok
    assert session.execute("size(), tried").return_value == (
        f"({BIG_MB << 20}, ['OSError', 'PermissionError', 'PermissionError'])"  # EBADF, EPERM (fchmod), EACCES
    )
    assert session._ledger.record.variables["big"] == digest


FORGED_FD = """\
import array, json, socket
from orchestrator_agent import framing
def forge(key, digest):
    head = json.dumps({'type': 'host_call', 'call': 999, 'name': '__blob__'}).encode()
    body = json.dumps({'key': key, 'digest': digest}).encode()
    frame = framing.PREFIX.pack(framing.MAGIC, len(head), len(body)) + head + body
    link = worker.calls._sock
    with open('/proc/self/status', 'rb') as attached:  # any descriptor: the controller must never take it in
        link.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [attached.fileno()]))])
"""


def test_a_descriptor_a_cell_sends_on_its_call_link_never_reaches_the_controller(
    session: Session, kill_container: Callable[[Session], None]
) -> None:
    assert session.execute(SETUP).ok
    digest = session._ledger.record.variables["big"]
    restored(session, kill_container)
    if not passes_descriptors(session):
        pytest.skip("the relayed carrier: the worker's call link ends in the supervisor")
    assert session.execute(FILE_PROBE + FORGED_FD + f"forge('big', {digest!r})").ok
    assert session.execute("size()").return_value == str(BIG_MB << 20)
    blobs = session._sandbox.sandbox.deferred  # type: ignore[union-attr]
    assert blobs is not None
    for check in list(blobs._checks.values()):  # the forged call's: its hash holds the file until it ends
        check.result()
    held = [_opened(fd) for fd in os.listdir("/proc/self/fd")]
    assert not [path for path in held if path.endswith("/status") or digest in path], held  # nor a blob's file


def _opened(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""
