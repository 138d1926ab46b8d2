"""``Orchestrator.prune``: stale sessions go (container, record and blobs), busy ones stay, races lose nothing,
a dry run changes nothing, what crashed controllers left behind is found and removed, prunes run side by side.

The clock is injected (``now=``) or a session's activity file is dated back (``os.utime``), so nothing waits
for real idleness.
"""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from lifecycle_support import ScriptProcess, script_processes
from support import kill_and_wait, tree_snapshot

from orchestrator import Orchestrator, Session, SessionAttachedElsewhere, SessionBusy, SessionNotFound
from orchestrator.ops.prune import PruneReport
from orchestrator.ops.survey import SessionStatus

pytestmark = pytest.mark.docker

HOUR = 3600.0
TYPED = (SessionNotFound, SessionAttachedElsewhere, SessionBusy)


def _date_back(orch: Orchestrator, session_id: str, seconds: float) -> None:
    """Make the session look unused for ``seconds`` (its activity file's mtime is its last use)."""
    past = time.time() - seconds
    os.utime(orch.store.activity_path(session_id), (past, past))


def _age_path(path: Path, seconds: float = 2 * HOUR) -> None:
    past = time.time() - seconds
    os.utime(path, (past, past))


def _acted(report: PruneReport, action: str | None = None) -> set[tuple[str, str]]:
    return {(a.action, a.target) for a in report.actions if a.ok and (action is None or a.action == action)}


def _gone(orch: Orchestrator, session_id: str) -> bool:
    return (
        not orch.store.exists(session_id)
        and not (orch.settings.state_dir / "sessions" / session_id).exists()
        and orch.containers(session_id) == []
    )


def _sandbox_dirs(orch: Orchestrator) -> dict[str, int]:
    return {p.name: p.lstat().st_mtime_ns for p in orch.settings.runtime_dir.iterdir()}


def _containers(orch: Orchestrator) -> dict[str, str]:
    return {c.id: c.status for c in orch.containers()}


@pytest.fixture
def script() -> Iterator[Callable[..., ScriptProcess]]:
    with script_processes() as start:
        yield start


# ---------------------------------------------------------------- stale and busy


def test_idle_and_old_sessions_go_and_a_busy_one_stays(settings_for, make_orch, new_session) -> None:
    orch = make_orch(settings_for())
    idle = new_session(orch)
    assert idle.execute("x = 'a' * 5000").ok
    busy = new_session(orch)
    assert busy.execute("import time\nn = 1").ok
    busy_container = busy.container_id
    idle_bytes = idle.checkpoint_bytes

    done: dict[str, Any] = {}
    caller = threading.Thread(target=lambda: done.update(r=busy.execute("time.sleep(2.5)\nn = 2")))
    caller.start()
    try:
        deadline = time.monotonic() + 10
        while orch.describe(busy.id).status is not SessionStatus.BUSY:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        report = orch.prune(idle_for=60, now=time.time() + HOUR)
    finally:
        caller.join(30)
    assert report.failed == [] and not report.dry_run
    by_target = {a.target: a for a in report.actions}
    assert by_target[idle.id].action == "remove" and by_target[idle.id].freed_bytes == idle_bytes
    assert "idle 1h" in by_target[idle.id].reason
    assert busy.id not in by_target or by_target[busy.id].action == "skip", report.to_json()
    assert _gone(orch, idle.id), "the idle session's container, record or blobs are still there"
    assert done["r"].ok, "the busy session's call was disturbed"
    assert busy.container_id == busy_container and busy.execute("n").return_value == "2"
    with pytest.raises(SessionNotFound):
        idle.execute("x")

    # Old: created an hour before the (injected) clock; a young-enough criterion keeps it.
    assert _acted(orch.prune(older_than=2 * HOUR, now=time.time() + HOUR)) == set()
    assert orch.store.exists(busy.id)
    report = orch.prune(older_than=HOUR / 2, now=time.time() + HOUR)
    assert _acted(report, "remove") == {("remove", busy.id)}
    assert "created 1h" in report.actions[0].reason
    assert _gone(orch, busy.id)
    with pytest.raises(SessionNotFound):
        busy.execute("n")


def test_criteria_are_anded_and_hibernate_only_keeps_the_session(settings_for, make_orch, new_session) -> None:
    orch = make_orch(settings_for())
    a = new_session(orch)
    assert a.execute("v = 'a'").ok
    b = new_session(orch)
    assert b.execute("v = 'b'").ok
    _date_back(orch, a.id, 2 * HOUR)  # a: unused for 2 h, created just now; b: used just now
    now = time.time()

    def stale(**criteria: float) -> set[str]:
        report = orch.prune(dry_run=True, **criteria)
        assert report.dry_run and report.failed == []
        return {a.target for a in report.actions if a.action == "remove"}

    assert stale(idle_for=HOUR) == {a.id}
    assert stale(idle_for=HOUR, older_than=HOUR) == set(), "young sessions went: criteria are not ANDed"
    assert stale(older_than=HOUR / 2, now=now + HOUR) == {a.id, b.id}
    assert stale(idle_for=2.5 * HOUR, older_than=HOUR / 2, now=now + HOUR) == {a.id}
    assert stale(idle_for=4 * HOUR, older_than=HOUR / 2, now=now + HOUR) == set()
    assert stale() == set(), "without criteria nothing is stale"

    container = a.container_id
    report = orch.prune(idle_for=HOUR, hibernate_only=True)
    assert _acted(report) == {("hibernate", a.id)} and report.failed == []
    assert orch.backend.inspect(container) is None
    info = orch.describe(a.id)
    assert info.status is SessionStatus.HIBERNATED and info.variables == 1 and not info.checkpoint_damaged
    assert orch.describe(b.id).status is SessionStatus.RUNNING
    # Hibernated already: nothing more to do for it.
    assert _acted(orch.prune(idle_for=HOUR, hibernate_only=True, now=time.time() + 3 * HOUR)) == {("hibernate", b.id)}
    assert _acted(orch.prune(idle_for=HOUR, hibernate_only=True, now=time.time() + 3 * HOUR)) == set()
    assert a.execute("v").return_value == "'a'" and b.execute("v").return_value == "'b'"


def test_a_busy_session_a_prune_would_remove_is_reported_as_skipped(settings_for, make_orch, new_session) -> None:
    """``prune --older-than`` over a session that is old enough but in a call: it is left alone, and the report
    says so ("skip", as ``PruneAction.action`` documents for busy sessions), so the operator learns why it stayed."""
    orch = make_orch(settings_for())
    s = new_session(orch)
    assert s.execute("import time").ok
    caller = threading.Thread(target=s.execute, args=("time.sleep(2)",))
    caller.start()
    try:
        deadline = time.monotonic() + 10
        while orch.describe(s.id).status is not SessionStatus.BUSY:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        report = orch.prune(older_than=HOUR, now=time.time() + 2 * HOUR)
    finally:
        caller.join(30)
    assert orch.store.exists(s.id)
    assert [(a.action, a.target) for a in report.actions] == [("skip", s.id)], report.to_json()


# ---------------------------------------------------------------- racing an execute


@pytest.mark.parametrize("gap", [0.0, 0.02], ids=["back-to-back", "with-gaps"])
def test_a_prune_racing_execute_never_loses_an_acknowledged_call(settings_for, make_orch, new_session, gap) -> None:
    """Calls ``n += 1`` run in a loop while prunes run with the clock far ahead (every idle moment is stale).

    Either a prune removed the session between two calls (then the caller got a typed error, and nothing of
    the session is left), or it never found it idle and ``n`` is exactly the number of acknowledged calls,
    also after a restore from the checkpoint.
    """
    orch = make_orch(settings_for())
    s = new_session(orch)
    assert s.execute("n = 0").ok
    acked, outcome = 0, {}
    stop = threading.Event()

    def calls() -> None:
        nonlocal acked
        rng = random.Random(7)
        while not stop.is_set():
            try:
                r = s.execute("n += 1")
            except TYPED as exc:
                outcome["typed"] = exc
                return
            except Exception as exc:
                outcome["unexpected"] = exc
                return
            if not r.ok:
                outcome["unexpected"] = r.error
                return
            acked += 1
            if gap:
                time.sleep(rng.uniform(0, gap))

    caller = threading.Thread(target=calls)
    caller.start()
    reports = []
    try:
        rng = random.Random(3)
        ends = time.monotonic() + 2.5
        while time.monotonic() < ends and caller.is_alive():
            reports.append(orch.prune(idle_for=1, now=time.time() + 1e6))
            time.sleep(rng.uniform(0, 0.03))
    finally:
        stop.set()
        caller.join(60)
    assert "unexpected" not in outcome, outcome
    assert all(r.failed == [] for r in reports), [r.to_json() for r in reports if r.failed]
    removed = any(("remove", s.id) in _acted(r) for r in reports)
    if "typed" in outcome:
        assert removed, f"the call failed with {outcome['typed']!r} but no prune removed the session"
        assert _gone(orch, s.id)
    else:
        assert not removed, "a prune removed the session but its caller was never told"
        assert acked > 0
        assert s.execute("n").return_value == str(acked)
        kill_and_wait(orch, s.container_id)
        assert s.execute("n").return_value == str(acked), "an acknowledged call was not in the checkpoint"
        assert s.restore_failures == {}


# ---------------------------------------------------------------- dry run and orphans


def test_a_dry_run_changes_nothing_then_every_orphan_is_removed(settings_for, make_orch, new_session) -> None:
    settings = settings_for()
    orch = make_orch(settings)
    sessions_dir = settings.state_dir / "sessions"

    stale = new_session(orch)
    assert stale.execute("x = 1").ok
    stale.detach()
    _date_back(orch, stale.id, 2 * HOUR)

    keeper = new_session(orch)  # not stale; carries orphan blobs and temp files
    assert keeper.execute("kept = list(range(100))\nother = 'o' * 100").ok
    real_blobs = sorted(p.name for p in (sessions_dir / keeper.id / "blobs").iterdir())
    junk = [
        sessions_dir / keeper.id / "blobs" / ("0" * 64),
        sessions_dir / keeper.id / "blobs" / ".tmp-unfinished",
        sessions_dir / keeper.id / ".tmp-meta",
    ]
    for path in junk:
        path.write_bytes(b"junk" * 100)

    ghost = new_session(orch)  # orphan container: its record is gone
    assert ghost.execute("y = 2").ok
    ghost.detach()
    ghost_container = orch.containers(ghost.id)[0]
    shutil.rmtree(sessions_dir / ghost.id)

    wreck = new_session(orch)  # orphan record: its container and a blob are gone
    assert wreck.execute("z = 'data'").ok
    wreck_container = wreck.container_id
    wreck.detach()
    orch.backend.remove(wreck_container)
    next((sessions_dir / wreck.id / "blobs").iterdir()).unlink()

    empty_dir = sessions_dir / "zz-empty-dir"  # a session directory without a record (a crashed create)
    empty_dir.mkdir(mode=0o700)
    _age_path(empty_dir)
    old_sandbox = settings.runtime_dir / "sb-0123456789ab"  # a channel directory whose container is gone
    old_sandbox.mkdir(mode=0o700)
    (old_sandbox / "secret").write_bytes(b"s")
    _age_path(old_sandbox / "secret")
    _age_path(old_sandbox)
    young_sandbox = settings.runtime_dir / "sb-ba9876543210"  # may belong to a sandbox starting now
    young_sandbox.mkdir(mode=0o700)
    live_sandbox = settings.runtime_dir / str(keeper.sandbox_id)
    _age_path(live_sandbox)  # old, but its container runs

    before = (tree_snapshot(settings.state_dir), _containers(orch), _sandbox_dirs(orch))
    dry = orch.prune(idle_for=HOUR, dry_run=True)
    assert dry.dry_run and dry.failed == [], dry.to_json()
    expected = {
        ("remove", stale.id),
        ("remove-orphan-blobs", keeper.id),
        ("remove-orphan-container", ghost_container.name),
        ("remove-orphan-record", wreck.id),
        ("remove-orphan-record", str(empty_dir)),
        ("remove-orphan-sandbox-dir", str(old_sandbox)),
    }
    assert _acted(dry) == expected, dry.to_json()
    assert all(a.describe(True).startswith("would ") for a in dry.actions)
    assert next(a for a in dry.actions if a.action == "remove-orphan-blobs").freed_bytes == 3 * 400
    after = (tree_snapshot(settings.state_dir), _containers(orch), _sandbox_dirs(orch))
    assert after == before, "the dry run changed records, blobs, containers or sandbox directories"

    report = orch.prune(idle_for=HOUR)
    assert report.failed == [], report.to_json()
    assert _acted(report) == expected, "the dry run did not say what the prune then did"
    assert _gone(orch, stale.id)
    assert orch.backend.inspect(ghost_container.id) is None and _gone(orch, ghost.id)
    assert not (settings.runtime_dir / str(ghost_container.labels.get("orchestrator.sandbox-id"))).exists()
    assert _gone(orch, wreck.id)
    assert not empty_dir.exists() and not old_sandbox.exists()
    assert young_sandbox.exists() and live_sandbox.exists()
    assert not any(path.exists() for path in junk)
    assert sorted(p.name for p in (sessions_dir / keeper.id / "blobs").iterdir()) == real_blobs
    assert {s.id for s in orch.list_sessions()} == {keeper.id}
    assert _acted(orch.prune(idle_for=HOUR)) == set(), "a second prune found more to do"
    # The keeper is whole: it answers, and after losing its container it restores completely.
    assert keeper.execute("len(kept), len(other)").return_value == "(100, 100)"
    kill_and_wait(orch, keeper.container_id)
    assert keeper.execute("len(kept), len(other)").return_value == "(100, 100)"
    assert keeper.restore_failures == {}


def test_an_unreadable_record_is_quarantined_without_a_failure(settings_for, make_orch) -> None:
    """A record that cannot be read: ``list_sessions`` says broken, the dry run says it would be quarantined, and
    the prune moves it aside whole (kept, not deleted). It must not fail every prune from then on (``orchestrator
    prune`` and the janitor would exit non-zero for ever), and it is acted on once."""
    orch = make_orch(settings_for())
    directory = orch.settings.state_dir / "sessions" / "bad-record"
    (directory / "blobs").mkdir(parents=True)
    (directory / "meta.json").write_text("{not json")
    assert [s.status for s in orch.list_sessions()] == [SessionStatus.BROKEN]
    assert _acted(orch.prune(dry_run=True)) == {("quarantine-record", "bad-record")}
    report = orch.prune()
    assert report.failed == [], report.to_json()
    assert _acted(report) == {("quarantine-record", "bad-record")}
    assert "no container of it runs" in report.actions[0].reason
    assert not directory.exists()
    (kept,) = (orch.settings.state_dir / "quarantine").iterdir()
    assert (kept / "meta.json").read_text() == "{not json"
    assert orch.list_sessions() == []
    assert _acted(orch.prune()) == set()


def test_observing_a_session_does_not_reset_its_idle_time(settings_for, make_orch, new_session) -> None:
    """A session without an activity file (stored before there was one, or never attached since) is idle since
    its record's ``last_used_at``. Listing it, or a prune looking at it, is not a use: the listing must not
    restart its idle clock, and a prune must remove it when it is stale rather than skip it as "used meanwhile"."""
    orch = make_orch(settings_for())
    listed, pruned = new_session(orch), new_session(orch)
    for s in (listed, pruned):
        assert s.execute("x = 1").ok
        s.detach()
    time.sleep(1.5)
    for s in (listed, pruned):
        orch.store.activity_path(s.id).unlink()

    first = orch.describe(listed.id).idle_seconds
    assert first > 1.2, f"listing the session shows it idle {first:.2f} s: looking at it created its activity file"
    second = orch.describe(listed.id).idle_seconds
    assert second >= first, f"looking at the session restarted its idle clock ({first:.2f} s, then {second:.2f} s)"

    report = orch.prune(idle_for=1)
    assert ("remove", pruned.id) in _acted(report), report.to_json()
    assert _gone(orch, pruned.id)


def test_a_session_removed_between_listing_and_reading_is_not_an_error(
    settings_for, make_orch, new_session, monkeypatch
) -> None:
    """Another process (a prune, an ``rm``, a close) removes a session after ``list_sessions`` or a prune listed the
    store's ids and before it read that record. The listing shows the others; the prune goes on (this is the
    window two prunes at once hit, and ``orchestrator ls`` beside the janitor)."""
    orch = make_orch(settings_for())
    kept = new_session(orch)
    assert kept.execute("x = 1").ok
    gone = new_session(orch)
    assert gone.execute("y = 2").ok
    listed = list(orch.store.ids())
    gone.close()
    monkeypatch.setattr(orch.store, "ids", lambda: iter(listed))
    assert [info.id for info in orch.list_sessions()] == [kept.id]
    report = orch.prune(idle_for=HOUR)
    assert report.failed == [] and _acted(report) == set()
    assert kept.execute("x").return_value == "1"


# ---------------------------------------------------------------- prunes side by side


def _stale_store(orch: Orchestrator, new_session: Callable[..., Session], count: int) -> tuple[set[str], str]:
    """``count`` idle sessions nobody holds, and an orphan container; returns their ids and its name."""
    ids = set()
    for i in range(count):
        s = new_session(orch)
        assert s.execute(f"x = {i}").ok
        s.detach()
        ids.add(s.id)
    ghost = new_session(orch)
    ghost.detach()
    name = orch.containers(ghost.id)[0].name
    shutil.rmtree(orch.settings.state_dir / "sessions" / ghost.id)
    return ids, name


def _check_side_by_side(orch: Orchestrator, reports: list[dict[str, Any]], ids: set[str], ghost: str) -> None:
    for r in reports:
        assert r["failed"] == 0, reports
    removed = [a["target"] for r in reports for a in r["actions"] if a["action"] == "remove" and a["ok"]]
    assert sorted(removed) == sorted(ids), f"each stale session must be removed by exactly one prune: {reports}"
    assert any(a["target"] == ghost for r in reports for a in r["actions"] if a["ok"]), reports
    assert all(_gone(orch, sid) for sid in ids)
    assert orch.containers() == [] and orch.list_sessions() == []


def test_two_prunes_at_once_in_two_threads(settings_for, make_orch, new_session) -> None:
    settings = settings_for()
    orch = make_orch(settings)
    ids, ghost = _stale_store(orch, new_session, 3)
    pruners = [make_orch(settings), make_orch(settings)]
    barrier = threading.Barrier(2)
    reports: list[dict[str, Any]] = []

    def prune(o: Orchestrator) -> None:
        barrier.wait(10)
        reports.append(o.prune(idle_for=1, now=time.time() + HOUR).to_json())

    threads = [threading.Thread(target=prune, args=(o,)) for o in pruners]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(reports) == 2
    _check_side_by_side(orch, reports, ids, ghost)


PRUNE_AT = """
def main(orch, args):
    time.sleep(max(0.0, args["at"] - time.time()))
    return orch.prune(idle_for=1, now=time.time() + 3600).to_json()
"""


def test_two_prunes_at_once_in_two_processes(settings_for, make_orch, new_session, script) -> None:
    settings = settings_for()
    orch = make_orch(settings)
    ids, ghost = _stale_store(orch, new_session, 3)
    at = time.time() + 3.0  # both processes are up by then
    processes = [script(settings, PRUNE_AT, {"at": at}) for _ in range(2)]
    reports = [p.result(timeout=90) for p in processes]
    _check_side_by_side(orch, reports, ids, ghost)
