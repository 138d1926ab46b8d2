"""A dying worker or container: a typed exception with restored=True, the state back, the next call working."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import docker
import pytest

from orchestrator import (
    AgentStartTimeout,
    Orchestrator,
    SandboxCrashed,
    SandboxError,
    SandboxOutOfMemory,
    Session,
    Settings,
)
from orchestrator.backends.base import WORKER_UID

pytestmark = pytest.mark.docker

STATE = "import math\nnums = list(range(10))\ndef total():\n    return sum(nums)\n"
CHECK = "total(), math.sqrt(16)"
EXPECTED = "(45, 4.0)"


@pytest.fixture
def stateful(session: Session) -> Session:
    assert session.execute(STATE).ok
    return session


def assert_state_back(session: Session) -> None:
    assert session.execute(CHECK).return_value == EXPECTED
    assert session.execute("nums.append(10); total()").return_value == "55"


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("import os\nos._exit(1)", "exited with status 1"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "SIGKILL"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", "SIGSEGV"),
        ("import ctypes\nctypes.string_at(0)", "SIGSEGV"),
    ],
    ids=["os-exit", "sigkill", "sigsegv", "null-pointer"],
)
def test_worker_death_is_sandbox_crashed(stateful: Session, code: str, reason: str) -> None:
    container = stateful.container_id
    generation = stateful.generation
    with pytest.raises(SandboxCrashed) as info:
        stateful.execute("nums.append('lost')\n" + code)
    exc = info.value
    assert type(exc) is SandboxCrashed
    assert exc.restored is True
    assert exc.generation == generation == stateful.generation
    assert reason in str(exc)
    assert "restored" in str(exc)
    assert stateful.container_id == container  # only the worker died; the agent restarted it
    assert_state_back(stateful)


def test_a_cell_cannot_kill_the_agent_and_a_dead_agent_is_a_crash_with_restore(stateful: Session) -> None:
    """The worker's parent is the supervisor, another uid: a cell's SIGKILL is refused. Killed from outside (a root
    process in the container, which holds its KILL capability), the container ends and the session comes back."""
    old = stateful.container_id
    result = stateful.execute("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)")
    assert result.error is not None and result.error.type == "PermissionError", result
    assert stateful.container_id == old
    assert stateful.execute(CHECK).return_value == EXPECTED
    supervisor = int(stateful.execute("os.getppid()").return_value or "0")
    assert supervisor > 1
    killed, crash = _kill_during_a_call(stateful, supervisor, as_worker=False)
    assert killed.exit_code in (0, 137), killed.output  # 137: the container ended with its supervisor first
    assert crash.restored is True
    assert stateful.container_id != old
    assert_state_back(stateful)


def test_worker_death_between_calls_is_transparent(stateful: Session) -> None:
    # A thread of the worker kills it after the call returned: the next call is restored and runs.
    stateful.execute("import os, threading\nthreading.Timer(0.2, os._exit, (3,)).start()")
    time.sleep(1.0)
    assert_state_back(stateful)


@pytest.mark.parametrize("call", ["execute", "add_context", "reset"])
def test_worker_death_between_calls_never_fails_the_next_request(stateful: Session, call: str) -> None:
    """The next request had not run when the agent found its worker dead: it is restored and sent again."""
    stateful.execute("import os, threading\nthreading.Timer(0.2, os._exit, (3,)).start()")
    time.sleep(1.0)
    if call == "execute":
        assert stateful.execute("nums.append(10); total()").return_value == "55"
    elif call == "add_context":
        assert stateful.add_context("after the death") == 0
        assert stateful.execute("context, total()").return_value == "('after the death', 45)"
    else:
        stateful.reset()
        assert stateful.execute("'nums' in globals()").return_value == "False"


def test_out_of_memory(orch: Orchestrator, settings: Settings, make_orch, new_session) -> None:
    small = make_orch(settings.replace(limits=settings.limits.replace(memory="256m")))
    s = new_session(small)
    assert s.execute(STATE).ok
    generation = s.generation
    with pytest.raises(SandboxOutOfMemory) as info:
        s.execute("hog = []\nwhile True:\n    hog.append(b'x' * (16 << 20))", timeout=60)
    exc = info.value
    assert isinstance(exc, SandboxCrashed) and isinstance(exc, MemoryError)
    assert exc.restored is True
    assert exc.generation == generation
    assert "memory" in str(exc)
    assert_state_back(s)
    assert s.execute("'hog' in globals()").return_value == "False"


def test_container_killed_between_calls(stateful: Session, kill_container: Callable[[Session], None]) -> None:
    old = stateful.container_id
    kill_container(stateful)
    assert_state_back(stateful)
    assert stateful.container_id != old


def test_container_removed_between_calls(orch: Orchestrator, stateful: Session) -> None:
    old = stateful.container_id
    assert old is not None
    orch.backend.remove(old)
    assert_state_back(stateful)
    assert stateful.container_id not in (None, old)
    assert [c.id for c in orch.containers(stateful.id)] == [stateful.container_id]


def test_container_stopped_between_calls_with_docker_sdk(stateful: Session) -> None:
    client = docker.from_env()
    try:
        client.containers.get(stateful.container_id).stop(timeout=1)
    finally:
        client.close()
    assert_state_back(stateful)


def _in_background(action: Callable[[], None], delay: float) -> threading.Thread:
    thread = threading.Timer(delay, action)
    thread.start()
    return thread


def _kill_during_a_call(session: Session, pid: int, *, as_worker: bool) -> tuple[Any, SandboxCrashed]:
    """SIGKILL ``pid`` from a process exec'd in the session's container (as root, or as the worker's uid, outside
    the agent) a second into a ten-second cell: the exec's result and the SandboxCrashed that the cell raised."""
    client = docker.from_env()
    try:
        container = client.containers.get(session.container_id)
        uid = container.labels[WORKER_UID] if as_worker else "0"
        kill = ["python3", "-c", f"import os; os.kill({pid}, 9)"]
        results: list[Any] = []
        timer = _in_background(lambda: results.append(container.exec_run(kill, user=f"{uid}:{uid}")), 1.0)
        try:
            with pytest.raises(SandboxCrashed) as info:
                session.execute("import time\ntime.sleep(10)", timeout=30)
        finally:
            timer.join()
    finally:
        client.close()
    return results[0], info.value


@pytest.mark.parametrize("how", ["kill", "remove"])
def test_container_dies_during_a_call(orch: Orchestrator, stateful: Session, how: str) -> None:
    old = stateful.container_id
    assert old is not None
    action = {"kill": lambda: orch.backend.kill(old), "remove": lambda: orch.backend.remove(old)}[how]
    timer = _in_background(action, 1.0)
    started = time.monotonic()
    try:
        with pytest.raises(SandboxCrashed) as info:
            stateful.execute("import time\nnums.append('lost')\ntime.sleep(10)\n'finished'", timeout=30)
    finally:
        timer.join()
    took = time.monotonic() - started
    exc = info.value
    assert type(exc) is SandboxCrashed
    assert isinstance(exc, SandboxError)
    assert exc.restored is True
    assert took < 9, "the death was noticed at once, not at the end of the sleep"
    # A removal is seen either as a missing container or as one being removed.
    assert ("remov" if how == "remove" else "exit code 137") in str(exc)
    assert stateful.container_id != old
    assert_state_back(stateful)
    assert len(orch.containers(stateful.id)) == 1


def test_worker_killed_from_outside_during_a_call(orch: Orchestrator, stateful: Session) -> None:
    stateful.execute("import os\nworker_pid = os.getpid()")
    pid = int(stateful.execute("worker_pid").return_value or "0")
    assert pid > 1
    killed, crash = _kill_during_a_call(stateful, pid, as_worker=True)  # a process of the worker's own uid
    # The killer is of the worker's uid too: when the worker's replacement ends every process of that uid before
    # the killer has exited, it goes as well (SIGKILL, 137), as a cell's own processes do.
    assert killed.exit_code in (0, 137), killed.output
    assert crash.restored is True
    assert "SIGKILL" in str(crash)
    assert_state_back(stateful)


def test_an_agent_that_never_connects_is_agent_start_timeout(settings: Settings, make_orch, run_id: str) -> None:
    """A container that starts but whose agent never connects: a typed error, and nothing left behind."""
    never = ("python3", "-c", "import time; time.sleep(60)")
    quiet = make_orch(settings.replace(agent_command=never, timeouts=settings.timeouts.replace(start=2)))
    started = time.monotonic()
    with pytest.raises(AgentStartTimeout, match="did not connect within 2 s"):
        quiet.create_session(labels={"orchestrator.test.run": run_id})
    assert time.monotonic() - started < 15
    assert quiet.containers() == []
    assert quiet.sessions() == []
