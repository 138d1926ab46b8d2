"""Bounded checkpoints and checkpoint timing.

- A per-session checkpoint quota: a value that would take the stored checkpoint past it is named in
  ``unsaved`` (with "quota" in the reason) and everything else is saved; neither the reported
  ``checkpoint_bytes`` nor the bytes on the host's disk ever exceed it, however values churn.
- A value that could not be saved once is saved as soon as it can be (no rebinding needed).
- Checkpoint time is not cell time: a fast cell beside a slow-to-pickle value is not timed out,
  and ``checkpoint_duration`` reports the pickling time apart from ``duration``; a checkpoint
  over ``checkpoint_timeout`` names the values it could not save.
- More than 1024 file descriptors in the controller process do not break a session.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import kill_and_wait, tree_bytes

from orchestrator import ExecutionTimeout, Session, Settings

pytestmark = pytest.mark.docker

QUOTA = 20_000_000
SLACK = 64 << 10  # meta.json, the lock file: the record around the blobs


@pytest.fixture(scope="module")
def quota_settings(settings, settings_for) -> Settings:
    return settings_for(limits=settings.limits.replace(checkpoint_quota=QUOTA))


def session_dir(settings: Settings, session: Session) -> Path:
    return settings.state_dir / "sessions" / session.id


def test_a_value_over_the_quota_is_named_and_the_rest_is_saved(make_orch, quota_settings, new_session) -> None:
    orch = make_orch(quota_settings)
    s = new_session(orch)
    first = s.execute("a = b'x' * 8_000_000")
    assert first.ok and "a" not in first.unsaved
    assert "a" in s.variables
    second = s.execute("b = b'y' * 15_000_000\nsmall = 'fits'")
    assert second.ok, second.error
    assert "b" in second.unsaved and "quota" in second.unsaved["b"], second.unsaved
    assert "a" not in second.unsaved and "small" not in second.unsaved
    assert {"a", "small"} <= set(s.variables) and "b" not in s.variables
    assert s.checkpoint_bytes <= QUOTA
    assert tree_bytes(session_dir(quota_settings, s)) <= QUOTA + SLACK
    # The value lives on in memory, and is reported again on every call while it does not fit.
    again = s.execute("len(b)")
    assert again.return_value == "15000000" and "b" in again.unsaved

    kill_and_wait(orch, s.container_id)
    result = s.execute("len(a), a[:1], small, 'b' in globals()")
    assert result.return_value == "(8000000, b'x', 'fits', False)"
    assert result.restore_failures == {}


def test_churning_values_never_takes_the_checkpoint_past_the_quota(make_orch, quota_settings, new_session) -> None:
    """Replace and add several-MB values call after call: the store (reported and on disk) stays under the quota."""
    orch = make_orch(quota_settings)
    s = new_session(orch)
    directory = session_dir(quota_settings, s)
    refused = 0
    for i in range(12):
        result = s.execute(f"v{i % 5} = bytes([{i}]) * 4_500_000\nstep = {i}")
        assert result.ok, result.error
        assert "step" not in result.unsaved
        refused += any("quota" in reason for reason in result.unsaved.values())
        assert s.checkpoint_bytes <= QUOTA, f"call {i}: {s.checkpoint_bytes} B stored"
        on_disk = tree_bytes(directory)
        assert on_disk <= QUOTA + SLACK, f"call {i}: {on_disk} B on the host's disk"
    assert refused, "five 4.5 MB values cannot all fit in 20 MB: some must have been refused"
    kill_and_wait(orch, s.container_id)
    restored = s.execute("step")
    assert restored.return_value == "11"
    assert restored.restore_failures == {}
    assert tree_bytes(directory) <= QUOTA + SLACK


def test_a_once_unsaveable_value_is_saved_when_it_can_be(session: Session, kill_container) -> None:
    """``d`` holds a generator (unsaved); after ``d.pop('g')`` (no rebinding) it is saved and survives a kill."""
    first = session.execute("d = {'g': (i for i in []), 'k': 1}")
    assert "d" in first.unsaved
    assert "d" not in session.variables
    second = session.execute("d.pop('g')\nd['k'] += 1")
    assert "d" not in second.unsaved
    assert "d" in session.variables
    kill_container(session)
    assert session.execute("d").return_value == "{'k': 2}"


SLOW = """\
import time
class Slow:
    def __reduce__(self):
        time.sleep(3)
        return (Slow, ())
slow = Slow()
"""


def test_checkpoint_time_is_not_cell_time(session: Session) -> None:
    """A value that takes 3 s to pickle beside cells with a 1 s timeout: no timeout, the time reported apart."""
    result = session.execute(SLOW + "fast = 1", timeout=1)
    assert result.ok, result.error
    assert {"slow", "Slow", "fast"} <= set(session.variables)
    assert result.checkpoint_duration >= 3, result
    assert result.duration < 1, result
    # The next fast cell re-pickles the (mutable) value again, still outside its 1 s.
    result = session.execute("fast += 1\nfast", timeout=1)
    assert result.return_value == "2"
    assert result.duration < 1


def test_a_checkpoint_past_its_timeout_names_what_it_did_not_save(
    make_orch, settings, settings_for, new_session
) -> None:
    """``checkpoint_timeout`` 1 s and a 3 s value: the call succeeds, the slow value is named unsaved."""
    orch = make_orch(settings_for(timeouts=settings.timeouts.replace(checkpoint=1.0, interrupt_grace=1.0)))
    s = new_session(orch)
    assert s.execute("kept = [1, 2]").ok
    result = s.execute(SLOW + "kept.append(3)", timeout=5)
    assert result.ok, result.error
    assert "slow" in result.unsaved, result.unsaved
    assert "slow" not in s.variables
    assert result.checkpoint_duration < 1 + 1 + 2
    assert s.execute("del slow\nkept").return_value == "[1, 2, 3]"
    kill_and_wait(orch, s.container_id)
    assert s.execute("kept").return_value == "[1, 2, 3]"


@pytest.fixture
def many_fds() -> Iterator[list[int]]:
    """Over 1024 open file descriptors in this process, so every socket the controller opens is numbered past 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the hard limit of open files is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    fds: list[int] = []
    try:
        while len(fds) < 1100:
            fds.append(os.open("/dev/null", os.O_RDONLY))
        assert max(fds) > 1024
        yield fds
    finally:
        for fd in fds:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_session_works_past_1024_file_descriptors(many_fds, make_orch, settings_for, new_session) -> None:
    """Create, use, crash-restore and close a session while the process holds more than 1024 descriptors."""
    orch = make_orch(settings_for())
    s = new_session(orch)
    probe = os.open("/dev/null", os.O_RDONLY)
    os.close(probe)
    assert probe > 1024, "new descriptors are numbered past 1024"
    assert s.execute("x = 41").ok
    assert s.execute("x + 1").return_value == "42"
    kill_and_wait(orch, s.container_id)
    result = s.execute("x += 1\nx", timeout=30)
    assert result.return_value == "42"
    with pytest.raises(ExecutionTimeout):
        s.execute("import time\ntime.sleep(5)", timeout=1)
    assert s.execute("x").return_value == "42"
