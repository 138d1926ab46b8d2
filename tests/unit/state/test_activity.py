"""The activity file: who is busy with a session, when it was last used, and waiting for a held session."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from orchestrator import SessionBusy, SessionNotFound
from orchestrator.state.activity import Activity, is_busy, last_active, quiet


@pytest.fixture
def activity_path(tmp_path: Path) -> Path:
    session_dir = tmp_path / "sessions" / "s-activity"
    session_dir.mkdir(parents=True)
    return session_dir / "activity"


def _age(path: Path) -> float:
    return time.time() - path.stat().st_mtime


def _push_into_the_past(path: Path, seconds: float = 3600.0) -> None:
    past = time.time() - seconds
    os.utime(path, (past, past))


def test_a_call_is_busy_for_everyone_else_and_two_calls_share(activity_path):
    a, b = Activity(activity_path, wait=1.0), Activity(activity_path, wait=1.0)
    try:
        assert not is_busy(activity_path)
        with a:
            assert is_busy(activity_path)
            with quiet(activity_path) as still:
                assert still is False
            with b:  # another handle's call (shared lock): does not wait for the first
                assert is_busy(activity_path)
            assert is_busy(activity_path), "the second call ending must not release the first one's lock"
        assert not is_busy(activity_path)
        with quiet(activity_path) as still:
            assert still is True
    finally:
        a.close()
        b.close()


def test_a_call_marks_the_last_use_when_it_ends(activity_path):
    a = Activity(activity_path, wait=1.0)
    try:
        _push_into_the_past(activity_path)
        assert _age(activity_path) > 3000
        with a:
            _push_into_the_past(activity_path)
        assert _age(activity_path) < 2, "a call ending is a use"
        assert abs(last_active(activity_path, 0.0) - time.time()) < 2
        # Nested calls mark the use once, when the outer one ends.
        with a:
            with a:
                pass
            _push_into_the_past(activity_path)
        assert _age(activity_path) < 2
    finally:
        a.close()


def test_calls_nest_in_one_handle(activity_path):
    a = Activity(activity_path, wait=1.0)
    try:
        with a:
            with a:
                assert is_busy(activity_path)
            assert is_busy(activity_path), "leaving the inner call released the outer one's lock"
        assert not is_busy(activity_path)
    finally:
        a.close()


def test_an_exception_in_a_call_releases_the_lock(activity_path):
    a = Activity(activity_path, wait=1.0)
    try:
        with pytest.raises(RuntimeError), a:
            raise RuntimeError("boom")
        assert not is_busy(activity_path)
    finally:
        a.close()


def test_a_held_session_makes_a_call_wait_then_raise_session_busy(activity_path):
    a = Activity(activity_path, wait=0.3)
    try:
        with quiet(activity_path) as still:
            assert still is True
            started = time.monotonic()
            with pytest.raises(SessionBusy, match="pruned or hibernated"), a:
                pytest.fail("a call began while the session was held still")
            assert 0.25 <= time.monotonic() - started < 3
            assert not a._depth
        with a:  # released: the handle works again
            assert is_busy(activity_path)
    finally:
        a.close()


def test_a_call_waits_for_a_short_hold_to_end(activity_path):
    a = Activity(activity_path, wait=5.0)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with quiet(activity_path) as still:
            assert still
            held.set()
            release.wait(5)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(5)
        threading.Timer(0.3, release.set).start()
        started = time.monotonic()
        with a:
            waited = time.monotonic() - started
        assert 0.2 <= waited < 4, waited
    finally:
        release.set()
        holder.join(5)
        a.close()


def test_quiet_in_one_process_excludes_a_second_quiet(activity_path):
    """Two prunes (or a prune and a hibernate) in one process: flock is per open file, so only one holds it."""
    with quiet(activity_path) as first, quiet(activity_path) as second:
        assert (first, second) == (True, False)
    with quiet(activity_path) as again:
        assert again is True


def test_closing_inside_a_call_keeps_the_lock_until_the_call_ends(activity_path):
    a = Activity(activity_path, wait=1.0)
    with a:
        a.close()
        assert is_busy(activity_path), "closing the handle mid-call dropped the call's lock"
    assert not is_busy(activity_path)
    assert a._fd is None, "the deferred close did not happen when the call ended"
    # A closed handle's calls do not lock (its own state check refuses them) and do not mark a use.
    _push_into_the_past(activity_path)
    with a:
        assert not is_busy(activity_path)
    assert _age(activity_path) > 3000
    a.close()  # twice is fine


def test_a_gone_session_directory(tmp_path):
    path = tmp_path / "sessions" / "gone" / "activity"
    with pytest.raises(SessionNotFound):
        Activity(path, wait=1.0)
    with pytest.raises(SessionNotFound), quiet(path):
        pass
    assert is_busy(path) is False
    assert last_active(path, 123.0) == 123.0


def test_a_call_on_a_deleted_session_still_ends_cleanly(activity_path):
    """A prune may delete the session's directory while a handle holds its activity file open."""
    a = Activity(activity_path, wait=1.0)
    activity_path.unlink()
    activity_path.parent.rmdir()
    with a:
        pass
    a.close()


def test_quiet_creates_no_file_outside_the_session_directory(activity_path):
    with quiet(activity_path):
        pass
    assert sorted(p.name for p in activity_path.parent.iterdir()) == ["activity"]
    assert activity_path.stat().st_mode & 0o777 == 0o600
