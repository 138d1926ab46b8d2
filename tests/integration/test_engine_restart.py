"""The Docker engine restarted under running sessions: they come back on their next call.

Restarting the engine stops every container on it (other tests' too), so this module does it only
where that is known to be safe: as root, with a ``dockerd`` started by ``scripts/setup-engine`` (a
plain process, not a systemd unit). Elsewhere it is skipped with the reason, unless
``ORCH_TEST_ENGINE_RESTART=1``. The engine is started again (``scripts/setup-engine``) even when the
test fails. Run it on its own, last.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.ops.survey import SessionStatus

pytestmark = pytest.mark.docker

SETUP_ENGINE = Path(__file__).resolve().parents[2] / "scripts" / "setup-engine"


def _dockerd_pids() -> list[int]:
    try:
        out = subprocess.run(["pidof", "dockerd"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [int(p) for p in out.split()]


def _restart_problem() -> str | None:
    """Why restarting the engine here is not known to be safe (None when it is)."""
    if os.environ.get("ORCH_TEST_ENGINE_RESTART") == "1":
        return None
    if os.geteuid() != 0:
        return "not root"
    if not SETUP_ENGINE.is_file():
        return f"{SETUP_ENGINE} is missing"
    pids = _dockerd_pids()
    if len(pids) != 1:
        return f"expected one local dockerd process, found {len(pids)} (a remote or rootless engine?)"
    cgroups = Path(f"/proc/{pids[0]}/cgroup").read_text()
    if ".service" in cgroups:
        return f"dockerd runs in a service unit ({cgroups.strip().splitlines()[0]})"
    needed = {"dockerd": shutil.which("dockerd"), "debootstrap": shutil.which("debootstrap")}
    needed["compose"] = shutil.which("docker-compose") or (
        subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30).returncode == 0
    )
    if not all(needed.values()):
        missing = ", ".join(name for name, found in needed.items() if not found)
        return f"scripts/setup-engine would install packages ({missing}) before starting the engine"
    if shutil.which("systemctl"):
        active = subprocess.run(["systemctl", "is-active", "docker"], capture_output=True, timeout=10)
        if active.returncode == 0:
            return "dockerd is managed by systemd (systemctl is-active docker)"
    return None


def _gone(pid: int) -> bool:
    """The process has exited (a zombie counts: the init here may not reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _engine_answers() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


def _start_engine() -> None:
    """``scripts/setup-engine`` (it starts dockerd in its own session, so nothing of ours holds it), then wait."""
    subprocess.run([str(SETUP_ENGINE)], check=True, timeout=180, start_new_session=True, capture_output=True)
    deadline = time.monotonic() + 60
    while not _engine_answers():
        assert time.monotonic() < deadline, "the engine did not answer within 60 s of setup-engine"
        time.sleep(0.5)


def _stop_engine() -> None:
    [pid] = _dockerd_pids()
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 90
    while not _gone(pid):
        assert time.monotonic() < deadline, f"dockerd ({pid}) did not exit within 90 s of SIGTERM"
        time.sleep(0.2)


@pytest.fixture
def engine_restart():
    """A function that stops the engine and starts it again; the engine is up again after the test whatever happens."""
    problem = _restart_problem()
    if problem is not None:
        pytest.skip(
            f"restarting the Docker engine is not known to be safe here: {problem}; "
            "set ORCH_TEST_ENGINE_RESTART=1 to do it anyway"
        )

    def restart() -> None:
        _stop_engine()
        _start_engine()

    try:
        yield restart
    finally:
        if not _engine_answers():
            _start_engine()


def test_sessions_come_back_on_the_next_call_after_an_engine_restart(
    settings_for, make_orch, new_session, engine_restart
) -> None:
    """One session held by this controller and one nobody holds; the engine stops (and with it their containers)
    and starts again. The orchestrator's engine client reconnects by itself; the held session's next call
    restores it transparently, and the other comes back on attach. No old container is left running."""
    orch = make_orch(settings_for())
    held = new_session(orch)
    assert held.execute("x = 'held'\ndata = list(range(1000))").ok
    loose = new_session(orch)
    assert loose.execute("y = {'k': 'detached'}").ok
    before = {held.container_id, loose.container_id}
    loose.detach()

    engine_restart()

    # The same Orchestrator, with the same engine client as before the restart, sees the engine again.
    if not orch.backend.client.info().get("LiveRestoreEnabled"):
        for container in before:
            state = orch.backend.inspect(container)
            assert state is None or not state.running, "a container outlived the engine without live-restore"
    result = held.execute("x, len(data)")
    assert result.error is None and result.return_value == "('held', 1000)"
    assert held.restore_failures == {}
    again = orch.attach(loose.id)
    assert again.execute("y['k']").return_value == "'detached'"
    after = {held.container_id, again.container_id}
    assert after.isdisjoint(before) or all(orch.backend.inspect(c).running for c in after)
    statuses = {info.id: info.status for info in orch.list_sessions()}
    assert statuses == {held.id: SessionStatus.RUNNING, loose.id: SessionStatus.RUNNING}
    running = {c.id for c in orch.containers() if c.running}
    assert running == after, "a container of the sessions from before the restart is running beside the new one"
    again.close()
