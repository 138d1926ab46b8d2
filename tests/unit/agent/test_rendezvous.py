"""The sandbox-directory primitives shared by the controller's endpoint and the node relay (agent/rendezvous.py).

The controller's behaviour on top of them is tests/unit/wire/test_endpoint.py; here: their own
exception and its kinds, that the controller keeps no copy of them, and that they (and the
relay) run in the sandbox image: standard library only, Python 3.9 syntax.
"""

from __future__ import annotations

import ast
import inspect
import os
import shutil
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.agent import bridge, handshake, rendezvous
from orchestrator.agent import node_relay as relay
from orchestrator.backends.swarm.relay_client import RelayEndpoint
from orchestrator.errors import ConfigError
from orchestrator.wire import endpoint as endpoint_module
from orchestrator.wire.endpoint import Endpoint, UnixSocketEndpoint

SID = "sb-0123456789ab"
SETTING = "ORCH_TEST_DIR"
AGENT_DIR = Path(rendezvous.__file__).parent


@pytest.fixture
def base() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="rv-", dir="/tmp"))
    yield directory / "run"
    shutil.rmtree(directory, ignore_errors=True)


def test_create_take_over_and_remove(base):
    made = rendezvous.create(base, SID, None, None, SETTING)
    try:
        assert made.directory == base / SID
        assert handshake.parse_secret((made.directory / rendezvous.SECRET_NAME).read_bytes()) == made.secret
        assert rendezvous.socket_file(made.directory) == made.socket_file
        assert made.listener.getblocking() is False
        taken = rendezvous.take_over(base, SID, None, None, SETTING)
        try:
            assert taken.secret == made.secret
            assert rendezvous.socket_file(made.directory) == taken.socket_file != made.socket_file
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.connect(str(made.directory / rendezvous.SOCKET_NAME))
            client.close()
            time.sleep(0.05)
            taken.listener.accept()[0].close()  # the new listener got it
        finally:
            taken.listener.close()
    finally:
        made.listener.close()
    rendezvous.remove_tree(made.directory)
    assert not os.path.lexists(made.directory)
    assert stat.S_IMODE(os.lstat(base).st_mode) == 0o700


def test_failures_are_rendezvous_errors_with_a_kind_and_the_callers_setting(base):
    with pytest.raises(rendezvous.RendezvousError) as invalid:
        rendezvous.create(base, "../x", None, None, SETTING)
    assert invalid.value.kind == "invalid"
    made = rendezvous.create(base, SID, None, None, SETTING)
    made.listener.close()
    with pytest.raises(rendezvous.RendezvousError, match="already exists") as exists:
        rendezvous.create(base, SID, None, None, SETTING)
    assert exists.value.kind == "exists"
    with pytest.raises(rendezvous.RendezvousError, match="is gone") as missing:
        rendezvous.take_over(base, "sb-gone", None, None, SETTING)
    assert missing.value.kind == "missing"
    (base / SID / rendezvous.SECRET_NAME).unlink()
    with pytest.raises(rendezvous.RendezvousError, match="secret") as unusable:
        rendezvous.take_over(base, SID, None, None, SETTING)
    assert unusable.value.kind == "unusable"
    base.chmod(0o755)
    with pytest.raises(rendezvous.RendezvousError, match=f"chmod 700.*{SETTING}"):
        rendezvous.create(base, "sb-new", None, None, SETTING)
    assert not issubclass(rendezvous.RendezvousError, ConfigError)  # the agent side knows nothing of the controller


def test_the_controller_translates_them_into_config_errors(base):
    with pytest.raises(ConfigError, match="plain name") as caught:
        UnixSocketEndpoint.create(base, "../x", sandbox_uid=None, sandbox_gid=None, max_header=1, max_body=1)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_the_controller_keeps_no_copy_of_the_directory_work():
    source = inspect.getsource(endpoint_module)
    for sign in ("os.mkdir", "O_NOFOLLOW", "fchown", "secrets.token", "rmtree", "os.lstat", "parse_secret"):
        assert sign not in source, sign
    assert endpoint_module._SANDBOX_ID is rendezvous.SANDBOX_ID
    assert (endpoint_module.SOCKET_NAME, endpoint_module.SECRET_NAME) == (
        rendezvous.SOCKET_NAME,
        rendezvous.SECRET_NAME,
    )


def test_every_endpoint_says_where_its_sandbox_must_run(base):
    local = UnixSocketEndpoint.create(base, SID, sandbox_uid=None, sandbox_gid=None, max_header=1, max_body=1)
    try:
        assert local.constraints() == []
    finally:
        local.remove()
    members = {"sandbox_id", "secret", "accept", "mounts", "environment", "constraints", "close", "remove"}
    declared = set(Endpoint.__annotations__) | {n for n in vars(Endpoint) if not n.startswith("_")}
    assert members <= declared
    for implementation in (UnixSocketEndpoint, RelayEndpoint):
        for name in members - {"sandbox_id", "secret"}:
            assert callable(getattr(implementation, name)), (implementation, name)


@pytest.mark.parametrize("module", [rendezvous, relay, bridge], ids=["rendezvous", "relay", "bridge"])
def test_runs_in_the_sandbox_image_stdlib_only_python_3_9(module):
    source = Path(module.__file__).read_text()
    tree = ast.parse(source, feature_version=(3, 9))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:  # within the agent package (orchestrator_agent)
            modules = [node.module] if node.module else [alias.name for alias in node.names]
            assert all((AGENT_DIR / f"{name}.py").exists() for name in modules), modules
        elif isinstance(node, ast.ImportFrom):
            assert node.module in sys.stdlib_module_names or node.module == "__future__", node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                assert alias.name.split(".")[0] in sys.stdlib_module_names, alias.name
    # Nothing that Python 3.9 lacks at run time (annotations are strings there, so only code counts).
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("#"))
    for newer in ("TaskGroup", "asyncio.timeout(", "strict=", "| None)", "ExceptionGroup", "except*"):
        assert newer not in code, newer
