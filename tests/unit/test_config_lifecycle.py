"""Settings for the lifecycle: durations, the idle and prune fields, and the recorded default base image."""

from __future__ import annotations

import json

import pytest

from orchestrator import Capacity, ConfigError, Settings
from orchestrator.config import DEFAULT_BASE_IMAGE, DEFAULTS_FILE, defaults_path, save_default_base_image
from orchestrator.units import parse_duration

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


def test_a_recorded_base_image_is_the_default_of_later_settings():
    path = save_default_base_image("orchestrator-base:recorded-1")
    assert path == defaults_path() and path.is_file()
    assert json.loads(path.read_text()) == {"base_image": "orchestrator-base:recorded-1"}
    assert Settings.from_env({}).base_image == "orchestrator-base:recorded-1"
    # Recording again replaces it, and leaves no temp file behind.
    save_default_base_image("orchestrator-base:recorded-2")
    assert Settings.from_env({}).base_image == "orchestrator-base:recorded-2"
    assert sorted(p.name for p in path.parent.iterdir()) == [DEFAULTS_FILE]


def test_the_defaults_file_is_the_users_not_the_state_dirs(tmp_path, monkeypatch):
    """A new state dir (a test's, a second store) starts on the recorded base image, with no variable and offline."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert defaults_path() == tmp_path / "config" / "orchestrator" / DEFAULTS_FILE
    save_default_base_image("orchestrator-base:recorded-1")
    for state in ("a", "b"):
        assert Settings.from_env({"ORCH_STATE_DIR": str(tmp_path / state)}).base_image == "orchestrator-base:recorded-1"
    assert not (tmp_path / "a").exists()
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert defaults_path() == tmp_path / "home" / ".config" / "orchestrator" / DEFAULTS_FILE


def test_the_environment_overrides_the_recorded_base_image():
    save_default_base_image("orchestrator-base:recorded-1")
    assert Settings.from_env({"ORCH_BASE_IMAGE": "mine:2"}).base_image == "mine:2"
    # An explicit sandbox image wins too: the recorded base is not applied beside it.
    chosen = Settings.from_env({"ORCH_IMAGE": "sandbox:3"})
    assert chosen.image == "sandbox:3" and chosen.base_image == DEFAULT_BASE_IMAGE


@pytest.mark.parametrize(
    "content",
    ["not json", "[1, 2]", '"a string"', '{"base_image": 7}', '{"base_image": ""}', '{"other": "x"}', ""],
)
def test_a_foreign_or_broken_defaults_file_counts_as_nothing_recorded(content):
    defaults_path().parent.mkdir(parents=True)
    defaults_path().write_text(content)
    assert Settings.from_env({}).base_image == DEFAULT_BASE_IMAGE


def test_the_defaults_file_sets_nothing_but_the_base_image():
    defaults_path().parent.mkdir(parents=True)
    defaults_path().write_text(json.dumps({"base_image": "b:1", "mem_limit": "1k", "network_mode": "host"}))
    s = Settings.from_env({})
    assert s.base_image == "b:1"
    assert s.limits.memory == Settings().limits.memory and s.confinement.network_mode == "none"


def test_no_defaults_file_means_the_built_in_default():
    assert not defaults_path().exists()
    assert Settings.from_env({}).base_image == DEFAULT_BASE_IMAGE
