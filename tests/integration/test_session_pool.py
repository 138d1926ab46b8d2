"""Sessions from a warm pool (``Settings.capacity.pool_size``): fresh sandboxes handed out once, tracked by their
session's record (a pooled container has no session label), cleaned up by close and, for a killed controller, by
prune."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator

import pytest
from lifecycle_support import settings_env
from support import closing_orch, kill_and_wait

from orchestrator import Capacity, CapacityExceeded, Orchestrator, Settings
from orchestrator.backends.base import SESSION_ID, STORE_ID
from orchestrator.state.controllers import CONTROLLER_PID, ROLE

pytestmark = pytest.mark.docker


@pytest.fixture
def pooled(settings_for: Callable[..., Settings], image: str) -> Iterator[Orchestrator]:
    with closing_orch(Orchestrator(settings_for(capacity=Capacity(pool_size=2)))) as orch:
        yield orch


def _spares(orch: Orchestrator) -> list[str]:
    recorded = orch.store.recorded_containers()
    return [c.id for c in orch.backend.find({STORE_ID: orch.store.store_id, ROLE: "pool"}) if c.id not in recorded]


def _wait_for(predicate: Callable[[], bool], seconds: float = 60.0) -> None:
    ends = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < ends, "timed out waiting"
        time.sleep(0.1)


def test_sessions_from_the_pool_get_fresh_sandboxes_never_handed_out_twice(pooled: Orchestrator) -> None:
    sessions = [pooled.create_session() for _ in range(4)]
    seen = {s.container_id for s in sessions}
    assert len(seen) == 4
    for n, s in enumerate(sessions):
        assert s.execute(f"x = {n}; 'seen' in globals(), x").return_value == f"(False, {n})"
    container = pooled.containers(sessions[0].id)
    assert [c.id for c in container] == [sessions[0].container_id]
    assert SESSION_ID not in container[0].labels  # from the pool: its record names it
    _wait_for(lambda: len(_spares(pooled)) == 2)  # refilled in the background
    assert seen.isdisjoint(_spares(pooled))
    sessions[0].close()
    assert pooled.backend.inspect(next(iter(container)).id) is None
    for s in sessions[1:]:
        s.close()
    pooled.close()
    assert pooled.backend.find({STORE_ID: pooled.store.store_id}) == []


def test_a_session_with_its_own_labels_starts_its_own_sandbox(pooled: Orchestrator) -> None:
    s = pooled.create_session(labels={"orchestrator.test.team": "a"})
    (container,) = pooled.containers(s.id)
    assert container.labels["orchestrator.test.team"] == "a" and container.labels[SESSION_ID] == s.id
    assert container.id not in _spares(pooled)


def test_a_pooled_session_restarts_from_the_pool_with_its_state(pooled: Orchestrator) -> None:
    s = pooled.create_session()
    s.execute("import math\nbig = 'x' * 10_000_000\nroot = math.sqrt(2)")
    first = s.container_id
    _wait_for(lambda: len(_spares(pooled)) == 2)
    spares = set(_spares(pooled))
    kill_and_wait(pooled, first)  # between calls: the next one restarts it
    assert s.execute("len(big), round(root, 3)").return_value == "(10000000, 1.414)"
    assert s.container_id in spares and s.container_id != first
    assert pooled.backend.inspect(first) is None


def test_hibernate_resume_and_remove_find_a_pooled_container_by_its_record(pooled: Orchestrator) -> None:
    s = pooled.create_session()
    s.execute("kept = 7")
    container = s.container_id
    s.detach()
    assert pooled.hibernate(s.id)
    assert pooled.backend.inspect(container) is None
    attached = pooled.attach(s.id)
    assert attached.execute("kept").return_value == "7"
    attached.detach()
    pooled.remove(s.id)
    assert pooled.containers(s.id) == [] and s.id not in pooled.sessions()


def test_the_running_cap_counts_pooled_sessions_but_not_spares(settings_for: Callable[..., Settings]) -> None:
    settings = settings_for(capacity=Capacity(pool_size=2, max_running=1, policy="refuse"))
    with closing_orch(Orchestrator(settings)) as orch:
        first = orch.create_session()
        _wait_for(lambda: len(_spares(orch)) == 2)
        with pytest.raises(CapacityExceeded):
            orch.create_session()
        first.close()
        assert orch.create_session().execute("1").return_value == "1"


CONTROLLER = textwrap.dedent(
    """
    import json, sys, time
    from orchestrator import Orchestrator, Settings
    orch = Orchestrator(Settings.from_env())
    s = orch.create_session()
    s.execute("kept = 'by the dead controller'")
    print(json.dumps({"sid": s.id, "container": s.container_id}), flush=True)
    time.sleep(600)
    """
)


def test_prune_removes_a_killed_controllers_spares_but_not_its_sessions(
    settings_for: Callable[..., Settings], image: str
) -> None:
    settings = settings_for(capacity=Capacity(pool_size=2))
    env = {**settings_env(settings), "ORCH_POOL_SIZE": "2"}
    process = subprocess.Popen([sys.executable, "-c", CONTROLLER], env=env, stdout=subprocess.PIPE, text=True)
    with closing_orch(Orchestrator(settings.replace(capacity=settings.capacity.replace(pool_size=0)))) as orch:
        try:
            assert process.stdout is not None
            made = json.loads(process.stdout.readline())
            mine = {ROLE: "pool", CONTROLLER_PID: str(process.pid)}
            _wait_for(lambda: len(orch.backend.find(mine)) == 3)  # its session's container and two spares
            assert orch.prune().actions == []  # its controller lives: spares are its own
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait()
            process.stdout.close()  # type: ignore[union-attr]
        removed = [a for a in orch.prune().actions if a.action == "remove-orphan-container"]
        assert len(removed) == 2
        assert [c.id for c in orch.backend.find(mine)] == [made["container"]]
        s = orch.attach(made["sid"])
        assert s.container_id == made["container"]  # taken over, not restarted
        assert s.execute("kept").return_value == "'by the dead controller'"
        s.close()
        assert orch.backend.find({STORE_ID: orch.store.store_id}) == []
