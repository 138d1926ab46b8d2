"""A cell that floods the controller with deferred values' blob calls costs the host a bounded amount, and another
session's deferred value never pays for it (issue 34, holes 2 and 5; docs/protocol.md "Deferred values").

The attacker is a cell that reaches its worker's call link (``worker.calls``) and asks for blobs it was never given
to load: keys its record names but no restore deferred, the same keys again and again, many distinct deferred blobs
at once. What is observed: the answers the cell gets, the controller's own descriptors (this test process is the
controller), what the controller hashed, its per-session queue of digest checks, and whether a victim session's
deferred value loads and stays in its checkpoint. Never time.
"""

from __future__ import annotations

import ast
import contextlib
import os
import resource
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from orchestrator import Orchestrator, Session
from orchestrator.agent import blob_format, protocol
from orchestrator.runtime.hostcalls import HostCalls

pytestmark = pytest.mark.docker

BIG = 2 << 20  # deferred by a restore (runtime.deferred.DEFER_BYTES is 1 MiB)
NAMES = 5_000
WORKER = """\
import gc
worker = next(o for o in gc.get_objects() if type(o).__name__ == 'Worker')
def ask(key, digest):
    try:
        blob = worker.calls.call_raw('__blob__', {'key': key, 'digest': digest})
    except Exception as exc:
        return str(exc)[:120]
    try:
        return len(blob)
    finally:
        getattr(blob, 'close', lambda: None)()
"""


def controller_fds() -> int:
    """Descriptors this process (the controller) holds now."""
    return len(os.listdir("/proc/self/fd"))


@contextlib.contextmanager
def descriptor_limit(headroom: int) -> Iterator[None]:
    """The controller may open only ``headroom`` more descriptors meanwhile (its soft RLIMIT_NOFILE lowered)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (controller_fds() + headroom, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def deferred_victim(
    new_session: Callable[..., Session], orch: Orchestrator, kill: Callable[[Session], None]
) -> Session:
    """A session whose value ``big`` its last restore deferred (not loaded yet)."""
    victim = new_session(orch)
    assert victim.execute(f"big = 'v' * {BIG}").ok
    kill(victim)
    assert victim.execute("1").ok
    assert victim._sandbox.sandbox.deferred.served_bytes == 0  # type: ignore[union-attr]
    return victim


def kept(victim: Session, kill: Callable[[Session], None]) -> None:
    """``big`` survives the victim's next checkpoint and a restore after it."""
    assert victim.execute("x = 1").ok
    assert "big" in victim.variables and "big" in victim._ledger.record.variables
    kill(victim)
    assert victim.execute("len(big)").return_value == str(BIG)


def test_a_flood_of_blob_calls_for_keys_not_deferred_is_refused_and_holds_no_descriptor(
    orch: Orchestrator, new_session: Callable[..., Session], kill_container: Callable[[Session], None]
) -> None:
    victim = deferred_victim(new_session, orch, kill_container)
    attacker = new_session(orch)
    assert attacker.execute(f"obj = [0]\nfor i in range({NAMES}):\n    globals()['n%d' % i] = obj").ok
    digest = attacker._ledger.record.variables["n0"]
    baseline = controller_fds()
    seen: dict[str, Any] = {}

    def meanwhile(_: object) -> bool:
        """While the attacker's request runs, with everything it was handed: the controller's descriptors, and the
        victim's deferred value loads."""
        seen["fds"] = controller_fds()
        seen["victim"] = victim.execute("len(big)").return_value
        return True

    flood = (
        WORKER
        + f"answers = [ask('n%d' % i, {digest!r}) for i in range({NAMES}) for _ in range(2)]\n"
        + f"answers += [ask('n0', {digest!r}) for _ in range(20)]\n"
        + "worker.calls.call('meanwhile', None)\n"
        + "sorted(set(answers), key=str)[:5]"
    )
    with descriptor_limit(2_000):
        result = attacker.execute(flood, host_calls=HostCalls({"meanwhile": meanwhile}))
    assert result.ok, f"{result.error}\n{result.stderr}"
    answers = ast.literal_eval(result.return_value or "")
    assert answers and all(isinstance(a, str) and protocol.BLOB_REFUSED in a for a in answers), answers
    assert seen["fds"] - baseline < 64, seen  # nothing held for the attacker's calls
    assert seen["victim"] == str(BIG)
    kept(victim, kill_container)


def test_a_host_out_of_descriptors_leaves_the_value_deferred(
    orch: Orchestrator, new_session: Callable[..., Session], kill_container: Callable[[Session], None]
) -> None:
    victim = deferred_victim(new_session, orch, kill_container)
    held: list[int] = []

    def exhaust(_: object) -> bool:
        """Take every descriptor the controller may still open (a real EMFILE for the next open)."""
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        held.append(soft)
        resource.setrlimit(resource.RLIMIT_NOFILE, (controller_fds() + 16, hard))
        with contextlib.suppress(OSError):
            while True:
                held.append(os.open("/dev/null", os.O_RDONLY))
        return True

    def release(_: object) -> bool:
        soft, *fds = held
        for fd in fds:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        held.clear()
        return True

    code = (
        WORKER
        + "worker.calls.call('exhaust', None)\n"
        + "try:\n    got = len(big)\nexcept NameError as exc:\n    got = (type(exc).__name__, str(exc))\n"
        + "worker.calls.call('release', None)\n"
        + "got"
    )
    try:
        result = victim.execute(code, host_calls=HostCalls({"exhaust": exhaust, "release": release}))
    finally:
        if held:
            release(None)
    assert result.ok, f"{result.error}\n{result.stderr}"
    kind, message = ast.literal_eval(result.return_value or "")
    assert kind == "DeferredValueUnavailable" and "try later" in message, message
    assert "big" in victim.variables  # still in the checkpoint after that cell's
    assert victim.execute("len(big)").return_value == str(BIG)  # and loads once the host can
    kept(victim, kill_container)


def test_one_sessions_digest_checks_never_queue_another_sessions(
    orch: Orchestrator,
    new_session: Callable[..., Session],
    kill_container: Callable[[Session], None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    victim = deferred_victim(new_session, orch, kill_container)
    attacker = new_session(orch)
    count = 6
    assert attacker.execute(f"for i in range({count}):\n    globals()['a%d' % i] = bytes([i]) * {BIG}").ok
    digests = [attacker._ledger.record.variables[f"a{i}"] for i in range(count)]
    kill_container(attacker)
    assert attacker.execute("1").ok  # restored: the six values are deferred
    blobs = attacker._sandbox.sandbox.deferred  # type: ignore[union-attr]
    assert blobs is not None and blobs.lane is attacker._sandbox.lane  # the session's, whichever sandbox serves

    gate = threading.Event()
    hashed: list[str] = []
    real = blob_format.blob_digest

    def held_digest(blob: Any) -> str:
        """The attacker's checks hash, then wait for the gate: they fill whatever queue they are on."""
        digest = real(blob)
        if digest in digests:
            hashed.append(digest)
            gate.wait(120)
        return digest

    monkeypatch.setattr(blob_format, "blob_digest", held_digest)
    seen: dict[str, Any] = {}

    def meanwhile(_: object) -> bool:
        """The attacker's checks are held; the victim's deferred value loads all the same (its check is its own)."""
        loading = threading.Thread(target=lambda: seen.update(victim=victim.execute("len(big)").return_value))
        loading.start()
        loading.join(60)
        lane = blobs.lane
        seen.update(busy=lane.busy, waiting=lane.waiting)
        gate.set()
        loading.join()
        return True

    flood = (
        WORKER
        + f"digests = {digests!r}\n"
        + "first = [ask('a%d' % i, d) for i, d in enumerate(digests)]\n"
        + "again = [ask('a%d' % i, d) for i, d in enumerate(digests) for _ in range(5)]\n"
        + "worker.calls.call('meanwhile', None)\n"
        + "first, sorted(set(map(str, again)))"
    )
    try:
        result = attacker.execute(flood, host_calls=HostCalls({"meanwhile": meanwhile}))
    finally:
        gate.set()
    assert result.ok, f"{result.error}\n{result.stderr}"
    first, again = ast.literal_eval(result.return_value or "")
    assert all(isinstance(size, int) and size > BIG for size in first), first
    assert any(protocol.BLOB_UNAVAILABLE in answer for answer in again), again  # each key twice per restore
    assert seen["victim"] == str(BIG), seen
    assert seen["busy"] and seen["waiting"] == count - 1, seen  # one check on the shared pool, five in its lane
    for check in list(blobs._checks.values()):
        check.result()
    assert sorted(hashed) == sorted(digests)  # each blob hashed once, however often it was asked for
    kept(victim, kill_container)
