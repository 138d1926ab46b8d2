"""Close and prune are total and careful (issue 22, item 8).

``Orchestrator.close`` closes every session even when some fail and names each failure; prune never removes
a session because its record is unreadable (the record is quarantined, its running container left alone);
a container created but never started is removed by its creator, and by prune when its creator could not.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import docker
import pytest
import requests.exceptions
from conftest import RUN_ID, TEST_LABEL

from orchestrator import Capacity, EngineError, EngineUnavailable, Orchestrator, Session, SessionsNotClosed, Settings
from orchestrator.backends.base import MANAGED, SANDBOX_ID, SESSION_ID, STORE_ID, SandboxSpec
from orchestrator.backends.docker import DockerBackend
from orchestrator.ops.pool import SandboxPool, SandboxTemplate
from orchestrator.ops.prune import PruneReport
from orchestrator.state.controllers import ROLE
from orchestrator.state.store import QUARANTINE_DIR, QUARANTINE_NOTE, new_sandbox_id

pytestmark = pytest.mark.docker


@pytest.fixture
def engine() -> Iterator[docker.DockerClient]:
    client = docker.from_env()
    try:
        yield client
    finally:
        client.close()


def _acted(report: PruneReport) -> set[tuple[str, str]]:
    return {(a.action, a.target) for a in report.actions if a.ok}


def _spoil(orch: Orchestrator, session_id: str) -> None:
    (orch.settings.state_dir / "sessions" / session_id / "meta.json").write_text("{not json")


def _named(client: docker.DockerClient, name: str) -> list[str]:
    return [c.status for c in client.containers.list(all=True, filters={"name": f"^/{name}$"})]


def _spec(image: str, network_of: str | None = None) -> SandboxSpec:
    return SandboxSpec(
        name=f"orch-zt-{new_sandbox_id()}",
        image=image,
        labels={TEST_LABEL: RUN_ID},
        command=("sleep", "60"),
        network_of=network_of,
    )


# ---------------------------------------------------------------- close


def test_close_closes_every_session_and_names_every_failure(
    settings_for: Callable[..., Settings], make_orch: Callable[[Settings], Orchestrator], engine: docker.DockerClient
) -> None:
    settings = settings_for(capacity=Capacity(pool_size=1))
    orch = make_orch(settings)
    sessions: list[Session] = [orch.create_session(labels={TEST_LABEL: RUN_ID}) for _ in range(5)]
    for s in sessions:
        assert s.execute("x = 1").ok
    spoiled = {sessions[0].id, sessions[3].id}
    for session_id in spoiled:
        _spoil(orch, session_id)
    orch.backend.remove(str(sessions[2].container_id))  # removed underneath: closing it is no failure
    containers = {s.id: str(s.container_id) for s in sessions}

    with pytest.raises(SessionsNotClosed) as failed:
        orch.close()

    assert set(failed.value.failures) == spoiled
    for session_id in spoiled:
        assert session_id in str(failed.value)
    for s in sessions:
        assert s.state.value == "closed"
    store_id = orch.store.store_id
    left = {
        c.labels.get(SESSION_ID) for c in engine.containers.list(all=True, filters={"label": f"{STORE_ID}={store_id}"})
    }
    assert left == spoiled, "every session that could be closed was, the pool's spare included"
    assert all(engine.containers.get(containers[sid]).status == "running" for sid in spoiled)
    assert not engine.containers.list(all=True, filters={"label": [f"{STORE_ID}={store_id}", f"{ROLE}=pool"]})


# ---------------------------------------------------------------- quarantine


def test_prune_quarantines_an_unreadable_record_and_leaves_its_running_container(
    settings_for: Callable[..., Settings], make_orch: Callable[[Settings], Orchestrator], new_session
) -> None:
    settings = settings_for()
    orch = make_orch(settings)
    session = new_session(orch)
    assert session.execute("kept = 41").ok
    container = str(session.container_id)
    name = orch.backend.inspect(container).name  # type: ignore[union-attr]
    session.detach()
    _spoil(orch, session.id)
    record_dir = settings.state_dir / "sessions" / session.id

    dry = orch.prune(idle_for=0.0, dry_run=True)
    assert _acted(dry) == {("quarantine-record", session.id)}, dry.to_json()
    assert record_dir.exists()

    report = orch.prune(idle_for=0.0)
    assert report.failed == [], report.to_json()
    assert _acted(report) == {("quarantine-record", session.id)}, report.to_json()
    (action,) = report.actions
    assert f"its running container {name} was left alone" in action.reason
    assert "not deleted" in action.reason
    assert report.to_json()["actions"][0]["action"] == "quarantine-record"
    assert "1 quarantine record" in report.summary()

    state = orch.backend.inspect(container)
    assert state is not None and state.running, "the container of an unreadable record was touched"
    assert not record_dir.exists()
    (kept,) = (settings.state_dir / QUARANTINE_DIR).iterdir()
    assert kept.name.startswith(f"{session.id}.")
    assert (kept / "meta.json").read_text() == "{not json", "the record was kept as it was"
    assert any((kept / "blobs").iterdir()), "its checkpoint was kept"
    assert "unreadable" in (kept / QUARANTINE_NOTE).read_text()

    again = orch.prune(idle_for=0.0)
    assert _acted(again) == set(), again.to_json()
    state = orch.backend.inspect(container)
    assert state is not None and state.running, "a later prune took the quarantined session's container"
    orch.backend.remove(container)


# ---------------------------------------------------------------- created, never started


def test_prune_removes_a_container_created_but_never_started(
    settings_for: Callable[..., Settings],
    make_orch: Callable[[Settings], Orchestrator],
    engine: docker.DockerClient,
    image: str,
) -> None:
    settings = settings_for()
    orch = make_orch(settings)
    store_id = orch.store.store_id
    sandbox_id = new_sandbox_id()
    ours = engine.containers.create(
        image,
        command=["sleep", "60"],
        name=f"orch-{store_id}-{sandbox_id}",
        labels={MANAGED: "true", STORE_ID: store_id, SANDBOX_ID: sandbox_id, TEST_LABEL: RUN_ID},
    )
    foreign = engine.containers.create(
        image,
        command=["sleep", "60"],
        labels={MANAGED: "true", STORE_ID: "0123456789ab", TEST_LABEL: RUN_ID},
    )
    try:
        assert _acted(orch.prune()) == set(), "a container created a moment ago may be starting now"
        # A start takes at most start_timeout; past twice that, a container still "created" never will be.
        quick = make_orch(settings.replace(timeouts=settings.timeouts.replace(start=1.0)))
        while time.time() - _created_at(engine, ours.id) <= 2.5:
            time.sleep(0.2)
        report = quick.prune()
        assert report.failed == [], report.to_json()
        assert _acted(report) == {("remove-unstarted-container", ours.name)}, report.to_json()
        assert "never started" in report.actions[0].reason
        assert _named(engine, ours.name) == []
        assert engine.containers.get(foreign.id).status == "created", "another store's container was touched"
    finally:
        for container in (ours, foreign):
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)


def _created_at(engine: docker.DockerClient, container_id: str) -> float:
    (listed,) = engine.api.containers(all=True, filters={"id": container_id})
    return float(listed["Created"])


def test_the_creator_removes_a_container_whose_start_fails(engine: docker.DockerClient, image: str) -> None:
    """A real start failure: joining the network namespace of a container that does not run (a gone pool slot)."""
    backend = DockerBackend()
    try:
        holder = engine.containers.create(image, command=["sleep", "60"], labels={TEST_LABEL: RUN_ID})
        try:
            spec = _spec(image, network_of=holder.id)
            with pytest.raises(EngineError, match="starting sandbox container"):
                backend.run_sandbox(spec, Settings())
            assert _named(engine, spec.name) == [], "the container whose start failed was left behind"
        finally:
            holder.remove(force=True)
    finally:
        backend.close()


class _Interrupted(DockerBackend):
    """Start fails with a KeyboardInterrupt (a Ctrl-C between create and start)."""

    def __init__(self) -> None:
        super().__init__()

        def interrupt(*args: object, **kwargs: object) -> None:
            raise KeyboardInterrupt

        self.client.api.start = interrupt  # type: ignore[method-assign]


def test_the_creator_removes_its_container_on_a_keyboard_interrupt_between_create_and_start(
    engine: docker.DockerClient, image: str
) -> None:
    backend = _Interrupted()
    try:
        spec = _spec(image)
        with pytest.raises(KeyboardInterrupt):
            backend.run_sandbox(spec, Settings())
        assert _named(engine, spec.name) == []
    finally:
        backend.close()


def test_a_pool_whose_network_slot_died_leaves_no_created_container(
    orch: Orchestrator, settings: Settings, image: str, engine: docker.DockerClient
) -> None:
    """The path that left "created" containers in CI: a sandbox joining a network slot whose holder is gone."""
    labels = {TEST_LABEL: RUN_ID, "orchestrator.test.case": new_sandbox_id()}
    pool = SandboxPool(orch.backend, settings, SandboxTemplate(image, "zt-slot", labels), size=0)
    try:
        first = pool.take()
        holder = pool._slot_of[first.sandbox_id]  # the slot whose holder this test kills
        engine.containers.get(holder).kill()
        pool.discard(first)
        with pytest.raises(EngineError):
            pool.take()
        with pool.sandbox() as fresh:  # the dead slot was dropped: the next sandbox gets a new one
            fresh.connection.check_idle()
    finally:
        pool.close()
    left = engine.containers.list(all=True, filters={"label": [f"{k}={v}" for k, v in labels.items()]})
    assert [(c.name, c.status) for c in left] == []


def test_a_with_block_keeps_its_own_exception_when_some_session_cannot_be_closed(
    settings_for: Callable[..., Settings],
) -> None:
    orch = Orchestrator(settings_for())
    with pytest.raises(LookupError, match="the block's own"), orch:
        session = orch.create_session(labels={TEST_LABEL: RUN_ID})
        _spoil(orch, session.id)
        raise LookupError("the block's own error")
    assert session.state.value == "closed"


class _LostAnswer(DockerBackend):
    """The engine creates the container but its answer never arrives (a read timeout under load)."""

    def __init__(self) -> None:
        super().__init__()
        create = self.client.api.create_container

        def created_then_lost(*args: object, **kwargs: object) -> None:
            create(*args, **kwargs)
            raise requests.exceptions.ReadTimeout("read timed out")

        self.client.api.create_container = created_then_lost  # type: ignore[method-assign]


def test_a_container_whose_create_answer_was_lost_is_found_by_name_and_labels_and_removed(
    engine: docker.DockerClient, image: str
) -> None:
    backend = _LostAnswer()
    try:
        spec = _spec(image)
        with pytest.raises(EngineUnavailable):
            backend.run_sandbox(spec, Settings())
        assert _named(engine, spec.name) == []
    finally:
        backend.close()
