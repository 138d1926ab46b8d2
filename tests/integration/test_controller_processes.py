"""Sessions across controller processes: a controller SIGKILLed under its sessions, a fresh process resuming a
hibernated session, a hibernate from another process under a live owner, and two controllers on one state dir.

The other processes run short scripts (``lifecycle_support``): each gets the test's settings as ``ORCH_*``
variables, so it works on the same state dir, runtime dir and image as the test process.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import RUN_ID, TEST_LABEL
from lifecycle_support import ScriptProcess, run_script, script_processes

from orchestrator.backends.base import SESSION_ID

pytestmark = pytest.mark.docker

LABELS = {"label_key": TEST_LABEL, "label": RUN_ID}


@pytest.fixture
def script() -> Iterator[Callable[..., ScriptProcess]]:
    with script_processes() as start:
        yield start


CREATE_AND_HOLD = """
import threading

def main(orch, args):
    made = []
    for i in range(args["n"]):
        s = orch.create_session(labels={args["label_key"]: args["label"]})
        result = s.execute(
            f"x = {i}\\nname = 'session-{i}'\\ndata = list(range({i} * 10 + 5))\\n"
            "def plus_x(y):\\n    return y + x\\n"
        )
        assert result.ok, result
        made.append({"id": s.id, "container": s.container_id, "generation": s.generation})
    # The last session is in a call (never acknowledged) when the process dies.
    threading.Thread(target=s.execute, args=("import time\\ntime.sleep(60)\\nx = 'late'",), daemon=True).start()
    time.sleep(0.5)
    emit(made)
    time.sleep(600)
"""

READ_BACK = """
def main(orch, args):
    seen = {}
    for sid in args["ids"]:
        s = orch.attach(sid)
        result = s.execute("(x, name, len(data), plus_x(100))")
        seen[sid] = {
            "value": result.return_value,
            "error": None if result.error is None else result.error.message,
            "container": s.container_id,
            "restore_failures": s.restore_failures,
        }
        s.detach()
    return seen
"""


def test_a_sigkilled_controller_leaves_sessions_a_new_process_attaches(settings_for, make_orch, script) -> None:
    """Process A creates three sessions with variables, one of them in a call, and is SIGKILLed.

    The containers keep running; ``list_sessions`` shows them running (the dead process's call holds
    nothing); a new process attaches each, takes its live container over, and finds every variable
    (the interrupted call was never acknowledged, so its ``x = 'late'`` is not there).
    """
    settings = settings_for()
    controller = script(settings, CREATE_AND_HOLD, {"n": 3, **LABELS})
    made = controller.next(timeout=90)
    assert "exc" not in made, made
    controller.proc.send_signal(signal.SIGKILL)
    assert controller.proc.wait(30) == -signal.SIGKILL

    orch = make_orch(settings)
    infos = {info.id: info for info in orch.list_sessions()}
    assert set(infos) == {m["id"] for m in made}
    for m in made:
        assert infos[m["id"]].status.value == "running", infos[m["id"]]
        assert infos[m["id"]].container_id == m["container"]

    seen = run_script(settings, READ_BACK, {"ids": [m["id"] for m in made]})
    for i, m in enumerate(made):
        got = seen[m["id"]]
        assert got["error"] is None, got
        assert got["value"] == f"({i}, 'session-{i}', {i * 10 + 5}, {100 + i})", got
        assert got["restore_failures"] == {}
        assert got["container"] == m["container"], "the live container was replaced instead of taken over"
    for m in made:
        orch.remove(m["id"])
    assert orch.containers() == []


RESUME_BY_EXECUTE = """
def main(orch, args):
    s = orch.attach(args["sid"])
    before = {"container": s.container_id, "status": orch.describe(args["sid"]).status.value}
    result = s.execute("x, sorted(d.items()), f(2)")
    after = {"container": s.container_id, "status": orch.describe(args["sid"]).status.value}
    s.detach()
    error = result.error and result.error.message
    return {"before": before, "after": after, "value": result.return_value, "error": error,
            "restore_failures": s.restore_failures}
"""


def test_hibernate_then_resume_by_execute_in_a_fresh_process(settings_for, make_orch, new_session) -> None:
    settings = settings_for()
    orch = make_orch(settings)
    s = new_session(orch)
    assert s.execute("x = 'kept'\nd = {'a': 1, 'b': [2, 3]}\ndef f(n):\n    return n * 21").ok
    container = s.container_id
    s.hibernate()
    assert s.container_id is None
    assert orch.backend.inspect(container) is None, "hibernate left the container"
    assert orch.containers(s.id) == []
    info = orch.describe(s.id)
    assert info.status.value == "hibernated" and info.hibernated_at is not None and info.container_id is None
    assert info.variables == 3 and info.checkpoint_bytes > 0
    s.detach()

    seen = run_script(settings, RESUME_BY_EXECUTE, {"sid": s.id})
    assert seen["before"] == {"container": None, "status": "hibernated"}, "attaching alone must not resume"
    assert seen["error"] is None and seen["restore_failures"] == {}
    assert seen["value"] == "('kept', [('a', 1), ('b', [2, 3])], 42)"
    assert seen["after"]["status"] == "running" and seen["after"]["container"] not in (None, container)
    after = orch.describe(s.id)
    assert after.hibernated_at is None and after.container_id == seen["after"]["container"]
    orch.remove(s.id)


HIBERNATE_OTHER = """
def main(orch, args):
    done = orch.hibernate(args["sid"])
    return {"done": done, "status": orch.describe(args["sid"]).status.value}
"""


def test_hibernate_from_another_process_under_a_live_owner(settings_for, make_orch, new_session, script) -> None:
    """``Orchestrator.hibernate(id)`` in another process while this one holds the session.

    The owner's next call resumes transparently with its state (no error), and it still owns the session
    (same epoch). A hibernate while the owner is in a call is refused with SessionBusy and changes nothing.
    """
    settings = settings_for()
    orch = make_orch(settings)
    s = new_session(orch)
    assert s.execute("x = 41\nimport time").ok
    epoch, container, owner = s.epoch, s.container_id, orch.store.load(s.id).owner

    assert run_script(settings, HIBERNATE_OTHER, {"sid": s.id}) == {"done": True, "status": "hibernated"}
    assert orch.backend.inspect(container) is None
    assert orch.describe(s.id).status.value == "hibernated"

    result = s.execute("x + 1")
    assert result.error is None and result.return_value == "42"
    assert s.epoch == epoch and orch.store.load(s.id).owner == owner, "a hibernate must not change the owner"
    assert s.container_id not in (None, container)
    assert orch.describe(s.id).status.value == "running"

    # Hibernated already: a second hibernate from outside says so (False) and the owner still resumes.
    assert run_script(settings, HIBERNATE_OTHER, {"sid": s.id})["done"] is True
    assert run_script(settings, HIBERNATE_OTHER, {"sid": s.id}) == {"done": False, "status": "hibernated"}
    assert s.execute("x").return_value == "41"

    # Busy: refused, and the call in progress is not disturbed.
    live = s.container_id
    outcome: dict[str, Any] = {}
    caller = threading.Thread(target=lambda: outcome.update(r=s.execute("time.sleep(2.5)\nx = 43")))
    caller.start()
    try:
        deadline = time.monotonic() + 10
        while orch.describe(s.id).status.value != "busy":
            assert time.monotonic() < deadline, "the call never showed as busy"
            time.sleep(0.05)
        refused = script(settings, HIBERNATE_OTHER, {"sid": s.id}).outcome(timeout=60)
    finally:
        caller.join(30)
    assert refused.get("exc") == "SessionBusy", refused
    assert outcome["r"].ok
    assert s.container_id == live
    assert s.execute("x").return_value == "43"


TWO_CONTROLLERS = """
import random
import threading
from orchestrator import SessionAttachedElsewhere, SessionBusy, SessionNotFound

TYPED = (SessionNotFound, SessionAttachedElsewhere, SessionBusy)

def main(orch, args):
    rng = random.Random(args["seed"])
    deadline = time.monotonic() + args["seconds"]
    live, done, acked, lost, unexpected, failed_prunes = [], [], {}, {}, [], []
    prunes = [0]
    stop = threading.Event()

    def prune_loop():
        while not stop.wait(rng.uniform(0.05, 0.3)):
            try:
                report = orch.prune(idle_for=1, now=time.time() + 1e6)
            except Exception as exc:
                unexpected.append(f"prune: {type(exc).__name__}: {exc}")
                continue
            prunes[0] += 1
            failed_prunes.extend(a.describe(False) for a in report.failed)

    def create():
        try:
            s = orch.create_session(labels={args["label_key"]: args["label"]})
        except TYPED as exc:
            lost[f"create-{len(lost)}"] = type(exc).__name__
            return
        except Exception as exc:
            unexpected.append(f"create: {type(exc).__name__}: {exc}")
            return
        acked[s.id] = None  # n not known to be set yet
        try:
            assert s.execute("n = 0").ok
        except TYPED as exc:
            lost[s.id] = type(exc).__name__
            return
        except Exception as exc:
            unexpected.append(f"execute: {type(exc).__name__}: {exc}")
            return
        acked[s.id] = 0
        live.append(s)

    def call(s):
        try:
            assert s.execute("n += 1").ok
            acked[s.id] += 1
        except TYPED as exc:
            lost[s.id] = type(exc).__name__
            live.remove(s)
        except Exception as exc:
            unexpected.append(f"execute: {type(exc).__name__}: {exc}")
            live.remove(s)

    pruner = threading.Thread(target=prune_loop)
    pruner.start()
    try:
        while time.monotonic() < deadline:
            if len(live) < 2 and len(acked) < args["max_sessions"]:
                create()
            for s in list(live):
                call(s)
                time.sleep(rng.uniform(0, 0.03))
            if not live and len(acked) >= args["max_sessions"]:
                break
    finally:
        stop.set()
        pruner.join()
    # The prunes of this process have ended: a last session, which only the other process may still prune.
    create()
    for s in list(live):
        for _ in range(3):
            if s in live:
                call(s)
    kept = []
    for s in live:
        try:
            s.detach()
            kept.append(s.id)
        except TYPED:
            pass
    return {"acked": acked, "lost": lost, "unexpected": unexpected, "failed_prunes": failed_prunes,
            "prunes": prunes[0], "kept": kept}
"""


def test_two_controllers_on_one_state_dir_create_call_and_prune(settings_for, make_orch, script) -> None:
    """Two processes each create sessions and call them in a loop while a thread of each prunes with a clock far ahead.

    Each prunes the other's idle sessions (and its own) under their feet. Afterwards: no unexpected error
    (only SessionNotFound / SessionAttachedElsewhere / SessionBusy for sessions pruned away), no failed prune
    action, every remaining record loads and has all its blobs, every container of the store belongs to a
    stored session (one each), and each surviving session holds exactly the calls its process was told of.
    """
    settings = settings_for()
    processes = [
        script(settings, TWO_CONTROLLERS, {"seconds": 6.0, "max_sessions": 5, "seed": seed, **LABELS})
        for seed in range(2)
    ]
    results = [p.result(timeout=150) for p in processes]
    assert sum(len(r["lost"]) for r in results) > 0, f"no prune ever hit the other process's sessions: {results}"
    for r in results:
        assert r["unexpected"] == [], results
        assert r["failed_prunes"] == [], results
        assert r["prunes"] >= 1, results

    orch = make_orch(settings)
    store = orch.store
    ids = set(store.ids())
    for sid in ids:
        record = store.load(sid)
        assert store.missing_blobs(record) == set(), f"session {sid} lost blobs its manifest names"
    assert all((d / "meta.json").exists() for d in store.session_dirs()), "a session directory without a record"
    by_session: dict[str, int] = {}
    for c in orch.containers():
        sid = c.labels.get(SESSION_ID, "")
        assert sid in ids, f"container {c.name} of session {sid} has no record (an orphan)"
        by_session[sid] = by_session.get(sid, 0) + 1
    assert all(n == 1 for n in by_session.values()), by_session
    acked = {sid: n for r in results for sid, n in r["acked"].items()}
    for sid in ids:
        s = orch.attach(sid)
        try:
            if acked[sid] is not None:
                n = s.execute("n").return_value
                assert n == str(acked[sid]), f"session {sid}: n = {n}, its process was told of {acked[sid]} calls"
        finally:
            s.close()
    leftover = orch.prune(dry_run=True)
    assert [a for a in leftover.actions if a.action.startswith("remove-orphan")] == [], leftover.to_json()
