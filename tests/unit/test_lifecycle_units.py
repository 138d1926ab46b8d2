"""The lifecycle's pieces without an engine: durations, the new Settings fields, the activity file, prune's rules."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from orchestrator import Capacity, ConfigError, SessionBusy, SessionNotFound, Settings
from orchestrator.config import DEFAULT_BASE_IMAGE, DEFAULTS_FILE, parse_duration, save_default_base_image
from orchestrator.ops.prune import PruneAction, PruneReport, _stale
from orchestrator.ops.survey import SessionInfo, SessionStatus
from orchestrator.state.activity import Activity, is_busy, last_active, quiet
from orchestrator.units import describe_duration as describe_age

# ---------------------------------------------------------------- parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("0", 0.0),
        ("2.5", 2.5),
        ("30s", 30.0),
        ("30m", 1800.0),
        ("24h", 86400.0),
        ("7d", 7 * 86400.0),
        ("1h30m", 5400.0),
        ("1h 30m", 5400.0),
        ("1d2h3m4s", 86400 + 7200 + 180 + 4.0),
        ("1.5h", 5400.0),
        (" 10M ", 600.0),
        ("2H", 7200.0),
        (45, 45.0),
        (0.25, 0.25),
    ],
)
def test_parse_duration_reads_seconds_and_units(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", " ", "soon", "5x", "m", "1h30", "h1", "30 minutes", "1w", "-5", "-1m", "nan"])
def test_parse_duration_refuses_what_is_not_a_duration(text):
    with pytest.raises(ConfigError, match="duration"):
        parse_duration(text)


def test_parse_duration_refuses_negative_numbers_and_booleans():
    with pytest.raises(ConfigError, match="negative"):
        parse_duration(-1)
    with pytest.raises(ConfigError, match="not a duration"):
        parse_duration(True)  # type: ignore[arg-type]


# ---------------------------------------------------------------- Settings


def test_lifecycle_settings_are_off_by_default():
    s = Settings().capacity
    assert s.hibernate_after is None
    assert s.max_running is None
    assert s.policy == "hibernate"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"hibernate_after": 0}, "hibernate_after"),
        ({"hibernate_after": -3.0}, "hibernate_after"),
        ({"hibernate_after": float("nan")}, "hibernate_after"),
        ({"max_running": 0}, "max_running"),
        ({"max_running": -1}, "max_running"),
        ({"policy": "evict"}, "policy"),
        ({"policy": ""}, "policy"),
    ],
)
def test_lifecycle_settings_are_validated(changes, field):
    with pytest.raises(ConfigError, match=field):
        Capacity(**changes)
    with pytest.raises(ConfigError, match=field):
        Settings().capacity.replace(**changes)


def test_lifecycle_settings_accept_valid_values():
    s = Capacity(hibernate_after=2.5, max_running=1, policy="refuse")
    assert (s.hibernate_after, s.max_running, s.policy) == (2.5, 1, "refuse")


def test_from_env_reads_the_lifecycle_fields(tmp_path):
    s = Settings.from_env(
        {
            "ORCH_STATE_DIR": str(tmp_path),
            "ORCH_HIBERNATE_AFTER": "10m",
            "ORCH_MAX_RUNNING": "4",
            "ORCH_CAPACITY_POLICY": "refuse",
        }
    ).capacity
    assert (s.hibernate_after, s.max_running, s.policy) == (600.0, 4, "refuse")
    ninety = Settings.from_env({"ORCH_STATE_DIR": str(tmp_path), "ORCH_HIBERNATE_AFTER": "90"})
    assert ninety.capacity.hibernate_after == 90.0
    empty = Settings.from_env({"ORCH_STATE_DIR": str(tmp_path), "ORCH_HIBERNATE_AFTER": "", "ORCH_MAX_RUNNING": " "})
    assert empty.capacity.hibernate_after is None and empty.capacity.max_running is None


@pytest.mark.parametrize(
    "env",
    [
        {"ORCH_MAX_RUNNING": "many"},
        {"ORCH_MAX_RUNNING": "0"},
        {"ORCH_CAPACITY_POLICY": "evict"},
        {"ORCH_HIBERNATE_AFTER": "0"},
    ],
)
def test_from_env_refuses_bad_lifecycle_values(env, tmp_path):
    with pytest.raises(ConfigError, match=r"ORCH_|max_running|policy|hibernate_after"):
        Settings.from_env({"ORCH_STATE_DIR": str(tmp_path), **env})


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"ORCH_HIBERNATE_AFTER": "soon"}, "duration"),
        ({"ORCH_HIBERNATE_AFTER": "-5m"}, "duration"),
        ({"ORCH_MAX_RUNNING": "many"}, "int"),
    ],
)
def test_a_bad_lifecycle_variable_gets_a_useful_message(tmp_path, env, expected):
    """The message names the variable and what it should hold, not the field's default type ("NoneType")."""
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"ORCH_STATE_DIR": str(tmp_path), **env})
    message = str(caught.value)
    assert next(iter(env)) in message
    assert expected in message, message
    assert "NoneType" not in message, message


# ---------------------------------------------------------------- the recorded default base image


def test_a_recorded_base_image_is_the_default_of_later_settings(tmp_path):
    state = tmp_path / "state"
    path = save_default_base_image(state, "orchestrator-base:recorded-1")
    assert path == state / DEFAULTS_FILE and path.is_file()
    assert json.loads(path.read_text()) == {"base_image": "orchestrator-base:recorded-1"}
    assert Settings.from_env({"ORCH_STATE_DIR": str(state)}).base_image == "orchestrator-base:recorded-1"
    # Recording again replaces it, and leaves no temp file behind.
    save_default_base_image(state, "orchestrator-base:recorded-2")
    assert Settings.from_env({"ORCH_STATE_DIR": str(state)}).base_image == "orchestrator-base:recorded-2"
    assert sorted(p.name for p in state.iterdir()) == [DEFAULTS_FILE]


def test_the_environment_overrides_the_recorded_base_image(tmp_path):
    save_default_base_image(tmp_path, "orchestrator-base:recorded-1")
    env = {"ORCH_STATE_DIR": str(tmp_path), "ORCH_BASE_IMAGE": "mine:2"}
    assert Settings.from_env(env).base_image == "mine:2"
    # An explicit sandbox image wins too: the recorded base is not applied beside it.
    chosen = Settings.from_env({"ORCH_STATE_DIR": str(tmp_path), "ORCH_IMAGE": "sandbox:3"})
    assert chosen.image == "sandbox:3" and chosen.base_image == DEFAULT_BASE_IMAGE


def test_the_recorded_default_is_read_from_the_default_state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    save_default_base_image(tmp_path / "orchestrator", "recorded:1")
    assert Settings.from_env({}).base_image == "recorded:1"


@pytest.mark.parametrize(
    "content",
    ["not json", "[1, 2]", '"a string"', '{"base_image": 7}', '{"base_image": ""}', '{"other": "x"}', ""],
)
def test_a_foreign_or_broken_defaults_file_counts_as_nothing_recorded(tmp_path, content):
    (tmp_path / DEFAULTS_FILE).write_text(content)
    assert Settings.from_env({"ORCH_STATE_DIR": str(tmp_path)}).base_image == DEFAULT_BASE_IMAGE


def test_the_defaults_file_sets_nothing_but_the_base_image(tmp_path):
    (tmp_path / DEFAULTS_FILE).write_text(json.dumps({"base_image": "b:1", "mem_limit": "1k", "network_mode": "host"}))
    s = Settings.from_env({"ORCH_STATE_DIR": str(tmp_path)})
    assert s.base_image == "b:1"
    assert s.limits.memory == Settings().limits.memory and s.confinement.network_mode == "none"


def test_no_defaults_file_means_the_built_in_default(tmp_path):
    assert Settings.from_env({"ORCH_STATE_DIR": str(tmp_path / "absent")}).base_image == DEFAULT_BASE_IMAGE


# ---------------------------------------------------------------- the activity file


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


# ---------------------------------------------------------------- prune's rules


def _info(*, status=SessionStatus.RUNNING, idle=0.0, age=0.0, **changes) -> SessionInfo:
    fields = {
        "id": "s-info",
        "status": status,
        "image": "img",
        "created_at": 1000.0,
        "last_active_at": 1000.0,
        "age_seconds": age,
        "idle_seconds": idle,
        "generation": 1,
        "variables": 1,
        "checkpoint_bytes": 10,
        "epoch": 1,
        "sandbox_id": None,
        "container_id": None,
        "container_status": None,
        "memory_bytes": None,
        "hibernated_at": None,
        "problem": None,
    }
    fields.update(changes)
    return SessionInfo(**fields)


def test_without_criteria_nothing_is_stale():
    assert _stale(_info(idle=1e9, age=1e9), None, None) is None


def test_idle_criterion():
    assert _stale(_info(idle=59), 60, None) is None
    assert _stale(_info(idle=60), 60, None) == "idle 1m"
    assert _stale(_info(idle=7300), 3600, None) == "idle 2h 1m"


def test_age_criterion():
    assert _stale(_info(age=10), None, 60) is None
    assert _stale(_info(age=90000), None, 86400) == "created 1d 1h ago"


def test_criteria_are_anded():
    idle_not_old = _info(idle=7200, age=100)
    old_not_idle = _info(idle=5, age=7200)
    both = _info(idle=7200, age=90000)
    assert _stale(idle_not_old, 3600, 3600) is None
    assert _stale(old_not_idle, 3600, 3600) is None
    assert _stale(both, 3600, 3600) == "idle 2h, created 1d 1h ago"


@pytest.mark.parametrize("status", [SessionStatus.RUNNING, SessionStatus.HIBERNATED, SessionStatus.BROKEN])
def test_any_status_but_busy_can_be_stale(status):
    assert _stale(_info(status=status, idle=100, age=100), 10, 10) is not None


def test_a_busy_session_is_judged_like_any_other():
    """The criteria alone decide (a busy session's idle time is 0); the pruner then reports it as skipped."""
    assert _stale(_info(status=SessionStatus.BUSY, idle=0, age=1e9), 1, 1) is None
    assert _stale(_info(status=SessionStatus.BUSY, idle=0, age=1e9), None, 1) is not None


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.9, "0s"),
        (40, "40s"),
        (59.99, "59s"),
        (60, "1m"),
        (61, "1m 1s"),
        (12 * 60 + 3, "12m 3s"),
        (3600, "1h"),
        (2 * 3600 + 5 * 60, "2h 5m"),
        (2 * 3600 + 59, "2h"),
        (86400, "1d"),
        (3 * 86400 + 4 * 3600 + 59 * 60, "3d 4h"),
        (400 * 86400, "400d"),
    ],
)
def test_describe_age(seconds, text):
    assert describe_age(seconds) == text


def test_prune_report_to_json():
    report = PruneReport(
        [
            PruneAction("remove", "s-one", "idle 2h", freed_bytes=42),
            PruneAction("skip", "s-two", "in a call now"),
            PruneAction("remove-orphan-container", "orch-x-sb-1", "no record", ok=False, error="engine said no"),
        ],
        dry_run=False,
    )
    data = report.to_json()
    assert json.loads(json.dumps(data)) == data, "not JSON-ready"
    assert data["dry_run"] is False and data["failed"] == 1
    assert [a["action"] for a in data["actions"]] == ["remove", "skip", "remove-orphan-container"]
    assert data["actions"][0] == {
        "action": "remove",
        "target": "s-one",
        "reason": "idle 2h",
        "ok": True,
        "error": None,
        "freed_bytes": 42,
    }
    assert data["actions"][2]["ok"] is False and data["actions"][2]["error"] == "engine said no"
    assert [a.target for a in report.failed] == ["orch-x-sb-1"]
    assert PruneReport([], dry_run=True).to_json() == {"dry_run": True, "actions": [], "failed": 0}


def test_prune_action_describe():
    done = PruneAction("remove-orphan-blobs", "s-one", "2 file(s) no checkpoint names")
    assert done.describe(False) == "remove orphan blobs s-one (2 file(s) no checkpoint names)"
    assert done.describe(True) == "would remove orphan blobs s-one (2 file(s) no checkpoint names)"
    failed = PruneAction("remove", "s-two", "idle 1h", ok=False, error="boom")
    assert failed.describe(False) == "remove s-two (idle 1h): FAILED: boom"
