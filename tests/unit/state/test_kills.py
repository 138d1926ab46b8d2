"""Fork, rewind, commit and removal killed at every step, without an engine: the store stays consistent.

A child process runs one operation on a store in a temp dir and SIGKILLs itself right after its n-th change
of the filesystem (each mkdir, link, rename, unlink, rmdir and file creation), for n = 1, 2, ... until the
operation completes without reaching n. After each kill the parent checks what the issue asks: every record
loads, every blob any record (current manifest or kept generation) names is on disk with its bytes, each new
fork is listed whole or not at all, the source is as before or as after; then ``Orchestrator.prune`` (on the
fake engine) removes the leftovers once they are past ``ORPHAN_GRACE``, and deletes no named blob.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ledger_support
import pytest
from fakes import FakeBackend, fake_settings

from orchestrator import Orchestrator
from orchestrator.errors import SessionNotFound
from orchestrator.ops.prune import ORPHAN_GRACE
from orchestrator.state.ledger import CheckpointLedger
from orchestrator.state.store import SessionStore

D1, D2, D3, D4 = "1" * 32, "2" * 32, "3" * 32, "4" * 32
CONTENT = {D1: b"one" * 100, D2: b"two" * 10, D3: b"three", D4: b"four" * 7}
QUOTA = 10_000
KEEP = 2
MAX_STEPS = 400
_MUTATIONS = ("mkdir", "link", "replace", "rename", "unlink", "rmdir")


def commit(ledger: CheckpointLedger, generation: int, variables: dict[str, str]) -> None:
    ledger_support.commit(ledger, generation, variables, CONTENT)


def owned(store: SessionStore, session_id: str) -> CheckpointLedger:
    """The ledger of the session's owner (its token is in the record: this process plays that controller)."""
    return CheckpointLedger(store, store.load(session_id), QUOTA, keep=KEEP)


def prepare(store: SessionStore) -> None:
    """s-src at generation 3 ({a: D3, b: D2}), keeping 1 ({a: D1}) and 2 ({a: D2}); s-old, its fork at 1."""
    ledger = CheckpointLedger.create(store, ledger_support.new_record("s-src"), QUOTA, keep=KEEP)
    commit(ledger, 1, {"a": D1})
    commit(ledger, 2, {"a": D2})
    commit(ledger, 3, {"a": D3, "b": D2})
    CheckpointLedger.fork(store, "s-src", [ledger_support.new_record("s-old")], QUOTA, at=1, keep=KEEP)


# ---------------------------------------------------------------- the operations, as run in the child


def fork_two(store: SessionStore) -> None:
    CheckpointLedger.fork(
        store, "s-src", [ledger_support.new_record("s-f1"), ledger_support.new_record("s-f2")], QUOTA, keep=KEEP
    )


def fork_at(store: SessionStore) -> None:
    CheckpointLedger.fork(store, "s-src", [ledger_support.new_record("s-f1")], QUOTA, at=2, keep=KEEP)


def rewind(store: SessionStore) -> None:
    owned(store, "s-src").rewind(2)  # generation 1 leaves the history: D1 is the source's to delete


def commit_next(store: SessionStore) -> None:
    commit(owned(store, "s-src"), 4, {"a": D4})  # a new blob; generation 1 leaves the history


def remove_source(store: SessionStore) -> None:
    owned(store, "s-src").delete()


@dataclass(frozen=True)
class Operation:
    run: Callable[[SessionStore], None]
    forks: dict[str, dict[str, str]] = field(default_factory=dict)
    """New sessions it makes: id -> their variables."""
    source_after: dict[str, str] | None = None
    """The source's variables once it is done (None: unchanged; {} with ``removes``: gone)."""
    removes: bool = False


OPERATIONS = {
    "fork": Operation(fork_two, forks={"s-f1": {"a": D3, "b": D2}, "s-f2": {"a": D3, "b": D2}}),
    "fork-at": Operation(fork_at, forks={"s-f1": {"a": D2}}),
    "rewind": Operation(rewind, source_after={"a": D2}),
    "commit": Operation(commit_next, source_after={"a": D4}),
    "remove-source": Operation(remove_source, removes=True),
}


def _die_after(step: int) -> None:
    """From now on, SIGKILL this process right after its ``step``-th change of the filesystem."""
    changes = itertools.count(1)

    def wrap(name: str) -> Callable[..., Any]:
        real = getattr(os, name)

        def changed(*args: Any, **kwargs: Any) -> Any:
            result = real(*args, **kwargs)
            creates = name != "open" or bool(args[1] & os.O_CREAT)
            if creates and next(changes) == step:
                os.kill(os.getpid(), signal.SIGKILL)
            return result

        return changed

    for name in (*_MUTATIONS, "open"):
        setattr(os, name, wrap(name))


def _child(root: Path, operation: str, step: int) -> None:
    store = SessionStore(root)
    _die_after(step)
    OPERATIONS[operation].run(store)


# ---------------------------------------------------------------- what the parent checks


def snapshot(store: SessionStore) -> dict[str, tuple[int, dict[str, str]]]:
    """Every listed session's (generation, variables); each record must load."""
    return {sid: (record.generation, record.variables) for sid in store.ids() for record in [store.load(sid)]}


def assert_every_named_blob_is_there(store: SessionStore) -> None:
    for session_id in store.ids():
        record = store.load(session_id)
        for blob_id in record.named_blobs():
            path = store.blob_path(session_id, blob_id)
            assert path.read_bytes() == CONTENT[blob_id], f"{session_id} lost {blob_id}"


def leftovers(store: SessionStore) -> list[str]:
    """What a crash may leave that prune must remove: directories without a record, unfinished removals, blobs no
    manifest names, temp files."""
    found = [str(d) for d in store.session_dirs() if not (d / "meta.json").exists()]
    found += [str(d) for d in store.unfinished_removals()]
    for session_id in store.ids():
        with store.transaction(session_id) as record:
            found += [str(p) for p in store.stray_files(session_id, record.named_blobs())]
    return found


def age(store: SessionStore) -> None:
    """Date every session directory and unfinished removal back past the orphan grace."""
    past = time.time() - 2 * ORPHAN_GRACE
    for directory in [*store.session_dirs(), *store.unfinished_removals()]:
        os.utime(directory, (past, past))


def check(store: SessionStore, operation: Operation, before: dict[str, tuple[int, dict[str, str]]]) -> str:
    """Assert the store is consistent after a kill; return which outcome it shows ("before", "after", "partial")."""
    now = snapshot(store)
    assert_every_named_blob_is_there(store)
    assert now["s-old"] == before["s-old"]  # an earlier fork is never touched
    made = [sid for sid in operation.forks if sid in now]
    for sid in made:
        record = store.load(sid)
        assert record.variables == operation.forks[sid]
        assert record.forked_from["session_id"] == "s-src"
    if operation.removes:
        assert "s-src" not in now or now["s-src"] == before["s-src"]
        return "after" if "s-src" not in now else "before"
    if operation.source_after is None:
        assert now["s-src"] == before["s-src"]
        return "after" if len(made) == len(operation.forks) else "partial" if made else "before"
    generation, variables = now["s-src"]
    if generation == before["s-src"][0]:
        assert variables == before["s-src"][1]
        return "before"
    assert (generation, variables) == (before["s-src"][0] + 1, operation.source_after)
    return "after"


@pytest.mark.parametrize("operation", OPERATIONS)
def test_a_kill_at_any_step_leaves_a_consistent_store_that_prune_cleans(tmp_path: Path, operation: str) -> None:
    spec = OPERATIONS[operation]
    context = multiprocessing.get_context("fork")
    outcomes: dict[str, int] = {}
    dirty = 0
    for step in range(1, MAX_STEPS):
        settings = fake_settings(tmp_path / str(step))
        store = SessionStore(settings.state_dir)
        prepare(store)
        before = snapshot(store)
        child = context.Process(target=_child, args=(store.base, operation, step))
        child.start()
        child.join(60)
        assert child.exitcode in (0, -signal.SIGKILL), f"step {step}: the child failed ({child.exitcode})"
        outcome = check(store, spec, before)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        left = leftovers(store)
        dirty += bool(left)

        with Orchestrator(settings, backend=FakeBackend()) as orch:
            first = orch.prune()  # within the grace: a directory without a record may be a fork being written
            assert not first.failed
            assert check(store, spec, before) == outcome
            age(store)
            report = orch.prune()
        assert not report.failed, report.summary()
        assert check(store, spec, before) == outcome, f"step {step}: prune changed what the store shows"
        assert leftovers(store) == [], f"step {step}: prune left {leftovers(store)}"

        # What is left can be used: the operation, run again, goes to its end.
        if outcome != "after":
            for sid in spec.forks:
                if store.exists(sid):
                    store.delete(sid)
            spec.run(store)
            assert check(store, spec, before) == "after"
        if child.exitcode == 0:
            break
    else:
        pytest.fail(f"{operation} did not complete within {MAX_STEPS} steps")
    assert step > 3, f"{operation} finished after {step} changes: the kill hook is not reached"
    assert outcomes.get("before") and outcomes.get("after"), outcomes
    assert dirty, "no kill left anything for prune to remove: the steps in between were not reached"


def test_prune_within_the_grace_leaves_a_fork_being_written(tmp_path: Path) -> None:
    """A directory without a record may be a fork its controller is still writing: prune waits ORPHAN_GRACE."""
    settings = fake_settings(tmp_path)
    store = SessionStore(settings.state_dir)
    prepare(store)
    partial = store.root / "s-f1"
    (partial / "blobs").mkdir(parents=True)
    os.link(store.blob_path("s-src", D3), partial / "blobs" / D3)
    with Orchestrator(settings, backend=FakeBackend()) as orch:
        assert not orch.prune().actions
        assert (partial / "blobs" / D3).exists()
        age(store)
        assert [a.action for a in orch.prune().actions] == ["remove-orphan-record"]
    assert not partial.exists()
    assert_every_named_blob_is_there(store)
    with pytest.raises(SessionNotFound):
        store.load("s-f1")


def _churn(root: Path, rounds: int) -> None:
    """Fork the source, check the fork, change the source (a generation leaves the history), remove an old fork."""
    store = SessionStore(root)
    source = owned(store, "s-src")
    cycle = [D1, D2, D3, D4]
    for i in range(rounds):
        (child,) = CheckpointLedger.fork(store, "s-src", [ledger_support.new_record(f"s-c{i}")], QUOTA, keep=KEEP)
        assert child.record.variables == source.record.variables
        for blob_id in child.record.named_blobs():
            assert store.blob_path(child.session_id, blob_id).read_bytes() == CONTENT[blob_id]
        commit(source, source.record.generation + 1, {"a": cycle[i % 4], "b": cycle[(i + 1) % 4]})
        if i >= 2:
            CheckpointLedger(store, store.load(f"s-c{i - 2}"), QUOTA, keep=KEEP).delete()


def _prune_until(settings_root: Path, stop: Any, prunes: Any) -> None:
    with Orchestrator(fake_settings(settings_root), backend=FakeBackend()) as orch:
        while not stop.is_set():
            report = orch.prune()
            assert not report.failed, report.summary()
            prunes.value += 1


def test_forks_commits_and_removals_beside_prunes_in_another_process_lose_nothing(tmp_path: Path) -> None:
    settings = fake_settings(tmp_path)
    store = SessionStore(settings.state_dir)
    prepare(store)
    context = multiprocessing.get_context("fork")
    stop, prunes = context.Event(), context.Value("i", 0)
    pruner = context.Process(target=_prune_until, args=(tmp_path, stop, prunes))
    pruner.start()
    churn = context.Process(target=_churn, args=(store.base, 60))
    churn.start()
    churn.join(120)
    stop.set()
    pruner.join(120)
    assert (churn.exitcode, pruner.exitcode) == (0, 0)
    assert prunes.value > 0
    assert sorted(store.ids()) == ["s-c58", "s-c59", "s-old", "s-src"]
    assert_every_named_blob_is_there(store)
    assert leftovers(store) == []
