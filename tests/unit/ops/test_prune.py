"""Prune's rules without an engine: which sessions are stale, and the report."""

from __future__ import annotations

import json

import pytest

from orchestrator.ops.prune import PruneAction, PruneReport, _stale
from orchestrator.ops.survey import SessionInfo, SessionStatus
from orchestrator.units import describe_duration as describe_age


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
