"""Settings: defaults, environment parsing and validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import ConfigError, Settings


def test_secure_defaults():
    s = Settings()
    assert s.network_mode == "none" and s.read_only and s.cap_drop_all and s.no_new_privileges
    assert s.user == "0:0" and s.separate_worker and s.pids_limit > 0 and s.mem_limit
    assert 65535 < s.worker_uids[0] <= s.worker_uids[1]


def test_worker_uids_from_the_environment_and_their_bounds():
    assert Settings.from_env({"ORCH_WORKER_UIDS": " 200000 - 299999 "}).worker_uids == (200000, 299999)
    assert Settings(worker_uids=[7, 7]).worker_uids == (7, 7)  # type: ignore[arg-type]
    for raw in ("200000", "a-b", "1-2-3", "-5-7", ""):
        with pytest.raises(ConfigError, match="ORCH_WORKER_UIDS"):
            Settings.from_env({"ORCH_WORKER_UIDS": raw})
    for bad in ((0, 10), (10, 9), (1, 1 << 31), (1,), (1.0, 2), (True, 5)):
        with pytest.raises(ConfigError, match="worker_uids"):
            Settings(worker_uids=bad)  # type: ignore[arg-type]
    assert not Settings(user="65534:65534").separate_worker and Settings(user="root").separate_worker


def test_from_env_reads_typed_values():
    s = Settings.from_env(
        {"ORCH_EXEC_TIMEOUT": "5", "ORCH_READ_ONLY": "false", "ORCH_PIDS_LIMIT": "64", "ORCH_STATE_DIR": "/x"}
    )
    assert s.exec_timeout == 5.0 and s.read_only is False and s.pids_limit == 64 and s.state_dir == Path("/x")


@pytest.mark.parametrize("env", [{"ORCH_EXEC_TIMEOUT": "soon"}, {"ORCH_READ_ONLY": "maybe"}, {"ORCH_PIDS_LIMIT": "0"}])
def test_bad_values_name_the_variable(env):
    with pytest.raises(ConfigError, match=r"ORCH_|pids_limit"):
        Settings.from_env(env)


def test_replace_validates():
    with pytest.raises(ConfigError, match="interrupt_grace"):
        Settings().replace(interrupt_grace=0)


def test_checkpoint_quota_follows_the_memory_limit():
    assert Settings(mem_limit="512m").checkpoint_quota_bytes == 2 << 30
    assert Settings(checkpoint_quota=1000).checkpoint_quota_bytes == 1000
    assert Settings.from_env({"ORCH_CHECKPOINT_QUOTA": "20m"}).checkpoint_quota == 20 << 20
    with pytest.raises(ConfigError, match="not a size"):
        Settings(mem_limit="lots")


def test_agent_command_is_split_like_a_shell_line():
    assert Settings.from_env({"ORCH_AGENT_COMMAND": "python3 -c 'print(1)'"}).agent_command == (
        "python3",
        "-c",
        "print(1)",
    )
    with pytest.raises(ConfigError, match="agent_command"):
        Settings(agent_command=("",))


def test_pool_size_is_a_non_negative_integer() -> None:
    assert Settings().pool_size == 0
    assert Settings(pool_size=3).pool_size == 3
    assert Settings.from_env({"ORCH_POOL_SIZE": "2", "ORCH_BASE_IMAGE": "x"}).pool_size == 2
    for bad in (-1, True, 1.5, "2"):
        with pytest.raises(ConfigError, match="pool_size"):
            Settings(pool_size=bad)  # type: ignore[arg-type]


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
    assert settings.swarm_constraints == ("node.role==worker", "node.labels.zone==eu")
    assert (settings.swarm_relay_port, str(settings.swarm_node_dir)) == (9443, "/srv/relay")
    assert Settings(user="1000:2000").sandbox_uid_gid == (1000, 2000)
    assert Settings(user="root").sandbox_uid_gid == (None, None)
    with pytest.raises(ConfigError, match="numeric"):  # its uid is the image's: the channel files cannot be its
        Settings(user="nobody")
    for bad in ({"backend": "k8s"}, {"swarm_relay_port": 0}, {"swarm_node_dir": "relative"}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            Settings(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 0, -1.0])
@pytest.mark.parametrize("name", ["exec_timeout", "checkpoint_timeout", "input_timeout", "reply_margin"])
def test_time_limits_are_finite_and_positive(name, value):
    """Every wait has a finite deadline: a time limit of inf or nan would be one without."""
    with pytest.raises(ConfigError, match=name):
        Settings(**{name: value})
