"""Settings: defaults, its groups, environment parsing and validation."""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path

import pytest

from orchestrator import Capacity, ConfigError, Confinement, ResourceLimits, Settings, SwarmSettings, Timeouts
from orchestrator.config import ENV_VARIABLES, unknown_variables


def test_secure_defaults():
    c = Settings().confinement
    assert c.network_mode == "none" and c.read_only and c.cap_drop_all and c.no_new_privileges
    assert c.user == "0:0" and c.separate_worker and Settings().limits.pids > 0 and Settings().limits.memory
    assert 65535 < c.worker_uids[0] <= c.worker_uids[1]


def test_worker_uids_from_the_environment_and_their_bounds():
    assert Settings.from_env({"ORCH_WORKER_UIDS": " 200000 - 299999 "}).confinement.worker_uids == (200000, 299999)
    assert Confinement(worker_uids=[7, 7]).worker_uids == (7, 7)  # type: ignore[arg-type]
    for raw in ("200000", "a-b", "1-2-3", "-5-7", ""):
        with pytest.raises(ConfigError, match="ORCH_WORKER_UIDS"):
            Settings.from_env({"ORCH_WORKER_UIDS": raw})
    for bad in ((0, 10), (10, 9), (1, 1 << 31), (1,), (1.0, 2), (True, 5)):
        with pytest.raises(ConfigError, match="worker_uids"):
            Confinement(worker_uids=bad)  # type: ignore[arg-type]
    assert not Confinement(user="65534:65534").separate_worker and Confinement(user="root").separate_worker


def test_from_env_reads_typed_values():
    s = Settings.from_env(
        {"ORCH_EXEC_TIMEOUT": "5", "ORCH_READ_ONLY": "false", "ORCH_PIDS_LIMIT": "64", "ORCH_STATE_DIR": "/x"}
    )
    assert s.timeouts.exec == 5.0 and s.confinement.read_only is False and s.limits.pids == 64
    assert s.state_dir == Path("/x")


@pytest.mark.parametrize("env", [{"ORCH_EXEC_TIMEOUT": "soon"}, {"ORCH_READ_ONLY": "maybe"}, {"ORCH_PIDS_LIMIT": "0"}])
def test_bad_values_name_the_variable(env):
    with pytest.raises(ConfigError, match=next(iter(env))):
        Settings.from_env(env)


def test_replace_validates():
    with pytest.raises(ConfigError, match="interrupt_grace"):
        Settings().timeouts.replace(interrupt_grace=0)
    with pytest.raises(ConfigError, match="Timeouts"):
        Settings().replace(timeouts={"exec": 5})


def test_checkpoint_quota_follows_the_memory_limit():
    assert ResourceLimits(memory="512m").checkpoint_quota_bytes == 2 << 30
    assert ResourceLimits(checkpoint_quota=1000).checkpoint_quota_bytes == 1000
    assert Settings.from_env({"ORCH_CHECKPOINT_QUOTA": "20m"}).limits.checkpoint_quota == 20 << 20
    with pytest.raises(ConfigError, match="must be a size"):
        ResourceLimits(memory="lots")


def test_agent_command_is_split_like_a_shell_line():
    assert Settings.from_env({"ORCH_AGENT_COMMAND": "python3 -c 'print(1)'"}).agent_command == (
        "python3",
        "-c",
        "print(1)",
    )
    with pytest.raises(ConfigError, match="agent_command"):
        Settings(agent_command=("",))


def test_pool_size_is_a_non_negative_integer() -> None:
    assert Settings().capacity.pool_size == 0
    assert Capacity(pool_size=3).pool_size == 3
    assert Settings.from_env({"ORCH_POOL_SIZE": "2", "ORCH_BASE_IMAGE": "x"}).capacity.pool_size == 2
    for bad in (-1, True, 1.5, "2"):
        with pytest.raises(ConfigError, match="pool_size"):
            Capacity(pool_size=bad)  # type: ignore[arg-type]


def test_the_backend_and_its_swarm_settings() -> None:
    assert Settings().backend == "docker"
    env = {
        "ORCH_BACKEND": "swarm",
        "ORCH_SWARM_CONSTRAINTS": "node.role==worker, node.labels.zone==eu",
        "ORCH_SWARM_RELAY_PORT": "9443",
        "ORCH_SWARM_NODE_DIR": "/srv/relay",
        "ORCH_BASE_IMAGE": "x",
    }
    settings = Settings.from_env(env)
    assert settings.backend == "swarm"
    assert settings.swarm.constraints == ("node.role==worker", "node.labels.zone==eu")
    assert (settings.swarm.relay_port, str(settings.swarm.node_dir)) == (9443, "/srv/relay")
    assert Confinement(user="1000:2000").sandbox_uid_gid == (1000, 2000)
    assert Confinement(user="root").sandbox_uid_gid == (None, None)
    with pytest.raises(ConfigError, match="numeric"):  # its uid is the image's: the channel files cannot be its
        Confinement(user="nobody")
    with pytest.raises(ConfigError, match="backend"):
        Settings(backend="k8s")
    for bad in ({"relay_port": 0}, {"node_dir": "relative"}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            SwarmSettings(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 0, -1.0])
@pytest.mark.parametrize("name", ["exec", "checkpoint", "input", "reply_margin"])
def test_time_limits_are_finite_and_positive(name, value):
    """Every wait has a finite deadline: a time limit of inf or nan would be one without."""
    with pytest.raises(ConfigError, match=f"Timeouts.{name}"):
        Timeouts(**{name: value})


# ---------------------------------------------------------------- the groups and their variables

# Every variable of the flat Settings before the groups, and where its value lives now.
VARIABLES = {
    "ORCH_IMAGE": "image",
    "ORCH_BASE_IMAGE": "base_image",
    "ORCH_STATE_DIR": "state_dir",
    "ORCH_RUNTIME_DIR": "runtime_dir",
    "ORCH_AGENT_COMMAND": "agent_command",
    "ORCH_FSYNC": "fsync",
    "ORCH_BACKEND": "backend",
    "ORCH_EXEC_TIMEOUT": "timeouts.exec",
    "ORCH_INTERRUPT_GRACE": "timeouts.interrupt_grace",
    "ORCH_START_TIMEOUT": "timeouts.start",
    "ORCH_REPLY_MARGIN": "timeouts.reply_margin",
    "ORCH_FRAME_TIMEOUT": "timeouts.frame",
    "ORCH_CHECKPOINT_TIMEOUT": "timeouts.checkpoint",
    "ORCH_RESTORE_VALUE_TIMEOUT": "timeouts.restore_value",
    "ORCH_LOCK_TIMEOUT": "timeouts.lock",
    "ORCH_INPUT_TIMEOUT": "timeouts.input",
    "ORCH_MEM_LIMIT": "limits.memory",
    "ORCH_NANO_CPUS": "limits.nano_cpus",
    "ORCH_PIDS_LIMIT": "limits.pids",
    "ORCH_CHECKPOINT_QUOTA": "limits.checkpoint_quota",
    "ORCH_HISTORY_GENERATIONS": "limits.history_generations",
    "ORCH_MAX_OUTPUT_BYTES": "limits.max_output_bytes",
    "ORCH_MAX_OUTPUT_FILE_BYTES": "limits.max_output_file_bytes",
    "ORCH_MAX_OUTPUT_FILES": "limits.max_output_files",
    "ORCH_MAX_HOST_CALLS_PER_CELL": "limits.max_host_calls_per_cell",
    "ORCH_MAX_HOST_CALLS_PER_SESSION": "limits.max_host_calls_per_session",
    "ORCH_MAX_HEADER_BYTES": "limits.max_header_bytes",
    "ORCH_MAX_BODY_BYTES": "limits.max_body_bytes",
    "ORCH_WORKSPACE_BYTES": "limits.workspace_bytes",
    "ORCH_WORKSPACE_FILES": "limits.workspace_files",
    "ORCH_NETWORK_MODE": "confinement.network_mode",
    "ORCH_USER": "confinement.user",
    "ORCH_WORKER_UIDS": "confinement.worker_uids",
    "ORCH_READ_ONLY": "confinement.read_only",
    "ORCH_CAP_DROP_ALL": "confinement.cap_drop_all",
    "ORCH_NO_NEW_PRIVILEGES": "confinement.no_new_privileges",
    "ORCH_WORKSPACE_MOUNT": "confinement.workspace_mount",
    "ORCH_MAX_RUNNING": "capacity.max_running",
    "ORCH_CAPACITY_POLICY": "capacity.policy",
    "ORCH_HIBERNATE_AFTER": "capacity.hibernate_after",
    "ORCH_POOL_SIZE": "capacity.pool_size",
    "ORCH_SWARM_NODE_DIR": "swarm.node_dir",
    "ORCH_SWARM_RELAY_PORT": "swarm.relay_port",
    "ORCH_SWARM_CONSTRAINTS": "swarm.constraints",
    "ORCH_METRICS_ADDRESS": "metrics_address",
    "ORCH_METRICS_TOKEN": "metrics_token",
    "ORCH_CARRIER": "carrier",
}
# A value each variable takes, unlike its default, and what the field then holds.
SAMPLES = {
    "ORCH_IMAGE": ("sandbox:1", "sandbox:1"),
    "ORCH_BASE_IMAGE": ("base:1", "base:1"),
    "ORCH_STATE_DIR": ("/s", Path("/s")),
    "ORCH_RUNTIME_DIR": ("/r", Path("/r")),
    "ORCH_AGENT_COMMAND": ("python3 -m agent", ("python3", "-m", "agent")),
    "ORCH_FSYNC": ("yes", True),
    "ORCH_BACKEND": ("swarm", "swarm"),
    "ORCH_EXEC_TIMEOUT": ("7", 7.0),
    "ORCH_INTERRUPT_GRACE": ("1.5", 1.5),
    "ORCH_START_TIMEOUT": ("31", 31.0),
    "ORCH_REPLY_MARGIN": ("11", 11.0),
    "ORCH_FRAME_TIMEOUT": ("12", 12.0),
    "ORCH_CHECKPOINT_TIMEOUT": ("13", 13.0),
    "ORCH_RESTORE_VALUE_TIMEOUT": ("14", 14.0),
    "ORCH_LOCK_TIMEOUT": ("15", 15.0),
    "ORCH_INPUT_TIMEOUT": ("16", 16.0),
    "ORCH_MEM_LIMIT": ("2g", "2g"),
    "ORCH_NANO_CPUS": ("500000000", 500_000_000),
    "ORCH_PIDS_LIMIT": ("99", 99),
    "ORCH_CHECKPOINT_QUOTA": ("3m", 3 << 20),
    "ORCH_HISTORY_GENERATIONS": ("0", 0),
    "ORCH_MAX_OUTPUT_BYTES": ("1000", 1000),
    "ORCH_MAX_OUTPUT_FILE_BYTES": ("2000", 2000),
    "ORCH_MAX_OUTPUT_FILES": ("3", 3),
    "ORCH_MAX_HOST_CALLS_PER_CELL": ("4", 4),
    "ORCH_MAX_HOST_CALLS_PER_SESSION": ("5", 5),
    "ORCH_MAX_HEADER_BYTES": ("6000", 6000),
    "ORCH_MAX_BODY_BYTES": ("7000", 7000),
    "ORCH_WORKSPACE_BYTES": ("64m", 64 << 20),
    "ORCH_WORKSPACE_FILES": ("500", 500),
    "ORCH_NETWORK_MODE": ("bridge", "bridge"),
    "ORCH_USER": ("1000:1000", "1000:1000"),
    "ORCH_WORKER_UIDS": ("100-200", (100, 200)),
    "ORCH_READ_ONLY": ("0", False),
    "ORCH_CAP_DROP_ALL": ("false", False),
    "ORCH_NO_NEW_PRIVILEGES": ("no", False),
    "ORCH_WORKSPACE_MOUNT": ("tmpfs", "tmpfs"),
    "ORCH_MAX_RUNNING": ("8", 8),
    "ORCH_CAPACITY_POLICY": ("refuse", "refuse"),
    "ORCH_HIBERNATE_AFTER": ("1h30m", 5400.0),
    "ORCH_POOL_SIZE": ("2", 2),
    "ORCH_SWARM_NODE_DIR": ("/srv/n", Path("/srv/n")),
    "ORCH_SWARM_RELAY_PORT": ("9000", 9000),
    "ORCH_SWARM_CONSTRAINTS": ("a==1,b==2", ("a==1", "b==2")),
    "ORCH_METRICS_ADDRESS": ("9464", "9464"),
    "ORCH_METRICS_TOKEN": ("a-token-of-enough-length", "a-token-of-enough-length"),
    "ORCH_CARRIER": ("relayed", "relayed"),
}


def _at(settings: Settings, path: str) -> object:
    value: object = settings
    for part in path.split("."):
        value = getattr(value, part)
    return value


def test_every_variable_maps_to_its_field():
    assert {v.name: (f"{v.group}.{v.field}" if v.group else v.field) for v in ENV_VARIABLES} == VARIABLES
    assert set(SAMPLES) == set(VARIABLES)
    for name, (raw, expected) in SAMPLES.items():
        assert _at(Settings(), VARIABLES[name]) != expected, name
        assert _at(Settings.from_env({name: raw}), VARIABLES[name]) == expected, name


def test_all_variables_at_once_set_every_field_and_nothing_else():
    s = Settings.from_env({name: raw for name, (raw, _) in SAMPLES.items()})
    for name, (_, expected) in SAMPLES.items():
        assert _at(s, VARIABLES[name]) == expected, name
    assert s.confinement.tmpfs == Settings().confinement.tmpfs  # no variable
    assert Settings.from_env({}) == Settings.from_env({"ORCH_UNKNOWN": "x"})


def test_the_default_settings_are_the_defaults_of_each_group(tmp_path):
    s = Settings.from_env({"ORCH_STATE_DIR": str(tmp_path)})
    assert s == Settings(state_dir=tmp_path) and Settings() == Settings()
    assert (s.timeouts, s.limits, s.confinement) == (Timeouts(), ResourceLimits(), Confinement())
    assert (s.capacity, s.swarm) == (Capacity(), SwarmSettings())


def test_a_group_given_in_part_keeps_the_other_defaults():
    s = Settings(limits=ResourceLimits(memory="2g"), timeouts=Timeouts(exec=60))
    assert s.limits.memory == "2g" and s.limits.pids == ResourceLimits().pids
    assert s.timeouts.exec == 60 and s.timeouts.start == Timeouts().start


def test_dataclasses_replace_works_on_settings_and_groups():
    s = Settings()
    changed = dataclasses.replace(s, timeouts=dataclasses.replace(s.timeouts, start=5.0), fsync=True)
    assert changed.timeouts.start == 5.0 and changed.fsync and s.timeouts.start == 30.0 and not s.fsync
    assert changed == s.replace(fsync=True, timeouts=s.timeouts.replace(start=5.0))
    with pytest.raises(ConfigError, match=r"ResourceLimits\.pids"):
        dataclasses.replace(s.limits, pids=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.limits.pids = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ORCH_EXEC_TIMEOUT": "soon"}, "ORCH_EXEC_TIMEOUT='soon': 'soon' is not a duration"),
        ({"ORCH_PIDS_LIMIT": "x"}, "ORCH_PIDS_LIMIT='x' is not a valid int"),
        ({"ORCH_FSYNC": "maybe"}, "ORCH_FSYNC='maybe' is not a valid bool"),
        ({"ORCH_MAX_RUNNING": "many"}, "ORCH_MAX_RUNNING='many' is not a valid integer"),
        ({"ORCH_CHECKPOINT_QUOTA": "lots"}, "ORCH_CHECKPOINT_QUOTA='lots': 'lots' is not a size"),
        ({"ORCH_HIBERNATE_AFTER": "soon"}, "ORCH_HIBERNATE_AFTER='soon': 'soon' is not a duration"),
        ({"ORCH_START_TIMEOUT": "0"}, r"Timeouts.start must be a duration > 0: .*, got 0.0 \(ORCH_START_TIMEOUT\)"),
        ({"ORCH_MEM_LIMIT": "lots"}, r"ResourceLimits.memory must be a size: .*, got 'lots' \(ORCH_MEM_LIMIT\)"),
        ({"ORCH_MEM_LIMIT": "10m"}, r"ResourceLimits.memory must be at least 32 MiB, got '10m': .*\(ORCH_MEM_LIMIT\)"),
        ({"ORCH_MAX_OUTPUT_BYTES": "0"}, r"ResourceLimits.max_output_bytes must be a size > 0.*MAX_OUTPUT_BYTES"),
        ({"ORCH_SWARM_NODE_DIR": "relative"}, r"SwarmSettings.node_dir must be an absolute path.*SWARM_NODE_DIR"),
        ({"ORCH_USER": "nobody"}, r"Confinement.user must be .*\(ORCH_USER\)"),
        ({"ORCH_MAX_OUTPUT_FILES": "0"}, r"ResourceLimits.max_output_files must be a positive integer.*OUTPUT_FILES"),
        ({"ORCH_CAPACITY_POLICY": "evict"}, r"Capacity.policy must be one of hibernate, refuse.*CAPACITY_POLICY"),
        ({"ORCH_SWARM_RELAY_PORT": "70000"}, r"SwarmSettings.relay_port must be a TCP port.*SWARM_RELAY_PORT"),
        ({"ORCH_BACKEND": "k8s"}, r"Settings.backend must be one of docker, swarm, got 'k8s' \(ORCH_BACKEND\)"),
        ({"ORCH_METRICS_ADDRESS": "host:port"}, r"Settings.metrics_address must be PORT.*\(ORCH_METRICS_ADDRESS\)"),
        ({"ORCH_METRICS_TOKEN": "short"}, r"Settings.metrics_token must be at least 16 .*\(ORCH_METRICS_TOKEN\)$"),
        ({"ORCH_WORKSPACE_BYTES": "64k"}, r"ResourceLimits.workspace_bytes must be at least 1 MiB.*WORKSPACE_BYTES"),
        ({"ORCH_WORKSPACE_FILES": "200000"}, r"workspace_files must be an integer from 1 to 100,000.*WORKSPACE_FILES"),
        ({"ORCH_WORKSPACE_BYTES": "1m", "ORCH_WORKSPACE_FILES": "300"}, r"one per 4 KiB .*\(ORCH_WORKSPACE_FILES\)"),
        ({"ORCH_WORKSPACE_MOUNT": "disk"}, r"workspace_mount must be one of auto, image, tmpfs.*WORKSPACE_MOUNT"),
    ],
)
def test_from_env_errors_name_the_variable(env, message):
    with pytest.raises(ConfigError, match=message):
        Settings.from_env(env)


@pytest.mark.parametrize("raw", ["junk", "-1", "0", "1e999", "nan", " "])
def test_every_refused_variable_is_named(raw):
    """Whatever a variable's field refuses, the error names that variable (the one person-facing fix)."""
    for variable in ENV_VARIABLES:
        try:
            Settings.from_env({variable.name: raw})
        except ConfigError as exc:
            assert variable.name in str(exc), (variable.name, str(exc))


@pytest.mark.parametrize(
    ("env", "field", "value"),
    [
        ({"ORCH_EXEC_TIMEOUT": "5m"}, "timeouts.exec", 300.0),
        ({"ORCH_EXEC_TIMEOUT": "90"}, "timeouts.exec", 90.0),
        ({"ORCH_START_TIMEOUT": "1m30s"}, "timeouts.start", 90.0),
        ({"ORCH_INPUT_TIMEOUT": "1.5h"}, "timeouts.input", 5400.0),
        ({"ORCH_HIBERNATE_AFTER": "10m"}, "capacity.hibernate_after", 600.0),
        ({"ORCH_MAX_OUTPUT_BYTES": "64k"}, "limits.max_output_bytes", 64 << 10),
        ({"ORCH_MAX_OUTPUT_BYTES": "65536"}, "limits.max_output_bytes", 64 << 10),
        ({"ORCH_MAX_BODY_BYTES": "2GB"}, "limits.max_body_bytes", 2 << 30),
        ({"ORCH_CHECKPOINT_QUOTA": "1.5g"}, "limits.checkpoint_quota", 3 << 29),
        ({"ORCH_MEM_LIMIT": "512MiB"}, "limits.memory_bytes", 512 << 20),
    ],
)
def test_durations_and_sizes_read_alike_everywhere(env, field, value):
    """One grammar (units.py) for every duration and size variable, and for the same fields given in Python."""
    group, name = field.split(".")
    assert getattr(getattr(Settings.from_env(env), group), name) == value
    if name != "memory_bytes":
        kind = type(getattr(Settings(), group))
        assert getattr(kind(**{name: next(iter(env.values()))}), name) == value


def test_an_unknown_variable_is_warned_about_once_with_the_closest_name(caplog):
    env = {"ORCH_MEM_LIMT": "2g", "ORCH_EXEC_TIMOUT": "5m", "ORCH_NOTHING_LIKE_IT": "1", "ORCH_RELAY_DIR": "/x"}
    with caplog.at_level(logging.WARNING, logger="orchestrator.config"):
        Settings.from_env(env)
        Settings.from_env(env)
    assert [r.getMessage() for r in caplog.records] == [
        "unknown ORCH_ variables, ignored: ORCH_EXEC_TIMOUT (did you mean ORCH_EXEC_TIMEOUT?), ORCH_MEM_LIMT "
        "(did you mean ORCH_MEM_LIMIT?), ORCH_NOTHING_LIKE_IT"
    ]
    assert unknown_variables({"ORCH_POOL_SIZ": "1", "PATH": "/bin", "ORCH_OUTPUT_LIMIT": "9"}) == {
        "ORCH_POOL_SIZ": "ORCH_POOL_SIZE"
    }


def test_every_orch_variable_in_the_repository_is_known():
    """A name the agent, the relay, the janitor's compose file, a script or a test reads is listed in
    ``OTHER_VARIABLES`` (or is a Settings variable), so nobody using it is warned about it."""
    root = Path(__file__).resolve().parents[2]
    found: set[str] = set()
    for path in root.rglob("*"):
        if ".git" in path.parts or not path.is_file() or path.suffix in (".pyc", ".png", ".gz"):
            continue
        found.update(re.findall(r"\bORCH_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")))
    examples = {
        "ORCH_MEM_LIMT",
        "ORCH_MEM_LMIT",
        "ORCH_EXEC_TIMOUT",
        "ORCH_NOTHING_LIKE_IT",
        "ORCH_POOL_SIZ",
        "ORCH_UNKNOWN",
    }
    assert set(unknown_variables(dict.fromkeys(found - examples, ""))) == set()
