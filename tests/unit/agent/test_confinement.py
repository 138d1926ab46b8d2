"""The agent's confinement rules: which import-path entries a worker uid could write, and the worker's environment."""

from __future__ import annotations

import os
from typing import Any

import pytest

from orchestrator.agent import confinement

WORKER = 1_234_567
TREE = {  # path -> (owner, group, mode)
    "/": (0, 0, 0o755),
    "/opt": (0, 0, 0o755),
    "/opt/app": (0, 0, 0o755),
    "/opt/app/lib": (0, 0, 0o755),
    "/opt/mine": (WORKER, WORKER, 0o755),
    "/opt/mine/lib": (0, 0, 0o755),
    "/opt/shared": (0, WORKER, 0o775),
    "/opt/team": (0, 4242, 0o775),
    "/opt/open": (0, 0, 0o777),
    "/tmp": (0, 0, 0o1777),
    "/home": (0, 0, 0o755),
    "/home/app": (1000, 1000, 0o755),
}


REAL_STAT = os.stat
REAL_REALPATH = os.path.realpath


@pytest.fixture(autouse=True)
def fake_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    """``os.stat`` answers for the paths of ``TREE``; every other path (none of them exists here) is the real one's."""

    def fake_stat(path: Any, *args: Any, **kwargs: Any) -> Any:
        if path not in TREE:
            return REAL_STAT(path, *args, **kwargs)
        uid, gid, mode = TREE[path]
        return os.stat_result((0o040000 | mode, 0, 0, 1, uid, gid, 0, 0, 0, 0))

    monkeypatch.setattr(os, "stat", fake_stat)


@pytest.mark.parametrize(
    "path",
    [
        "",  # the working directory
        "lib",  # relative: follows the working directory
        "/tmp",
        "/tmp/lib",  # missing, in a directory anyone may write
        "/opt/mine",
        "/opt/mine/lib",  # root's, but in a directory of the worker's
        "/opt/shared",  # group-writable, the worker's gid
        "/opt/open/x",
    ],
)
def test_what_the_worker_could_write_is_writable(path: str) -> None:
    assert confinement.writable_by(path, WORKER)


@pytest.mark.parametrize("path", ["/opt/app/lib", "/opt/app/missing", "/home/app", "/opt/team", "/"])
def test_what_only_others_could_write_is_not(path: str) -> None:
    assert not confinement.writable_by(path, WORKER)


def test_the_worker_environment_keeps_the_images_path_and_loses_the_rest() -> None:
    logged: list[str] = []
    environ = {
        "PYTHONPATH": "/opt/app/lib::/tmp:rel:/home/app",
        "ORCH_SECRET_FILE": "/run/orchestrator/secret",
        "ORCH_CHANNEL": "/run/orchestrator/channel.sock",
        "HOME": "/root",
    }
    env = confinement.worker_environment(environ, WORKER, logged.append)
    assert env == {"PYTHONPATH": "/opt/app/lib:/home/app", "HOME": "/root", "PYTHONNOUSERSITE": "1"}
    assert len(logged) == 3 and all("out of the import path" in line for line in logged), logged
    only_writable = confinement.worker_environment({"PYTHONPATH": "/tmp"}, WORKER, logged.append)
    assert "PYTHONPATH" not in only_writable


def test_a_worker_of_our_own_uid_loses_only_relative_entries() -> None:
    env = confinement.worker_environment({"PYTHONPATH": "/tmp:rel:/opt/app/lib"}, None, print)
    assert env["PYTHONPATH"] == "/tmp:/opt/app/lib"


def test_the_worker_identity_has_no_supplementary_group() -> None:
    assert confinement.worker_identity(WORKER) == {"user": WORKER, "group": WORKER, "extra_groups": []}
    assert confinement.worker_identity(None) == {}


def test_a_link_into_a_writable_directory_is_writable(monkeypatch: pytest.MonkeyPatch) -> None:
    """``/opt/app/lib`` (root's) as a symbolic link to ``/tmp/lib``: the worker can make the target."""

    def fake_realpath(path: Any, *args: Any, **kwargs: Any) -> Any:
        return "/tmp/lib" if path == "/opt/app/lib" else REAL_REALPATH(path, *args, **kwargs)

    monkeypatch.setattr(os.path, "realpath", fake_realpath)
    assert confinement.writable_by("/opt/app/lib", WORKER)
    assert not confinement.writable_by("/opt/app", WORKER)
