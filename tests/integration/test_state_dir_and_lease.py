"""The host's state as a local user would attack it: the state dir's base, and a session's lease.

- A state dir another local user made before the controller's first start (open to all, theirs) is refused with a
  ``ConfigError`` naming it and what to do, and nothing is written into it; one the controller makes is 0700.
- A lease dated in the future (another host's clock far ahead, or a file written by hand: a second process here)
  does not hold a session that no controller holds: ``attach`` takes it without force.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator import ConfigError, Orchestrator, Settings

pytestmark = pytest.mark.docker

OTHER_UID = 4321


def make_dir_as_other_user(path: Path) -> None:
    """A second process, as another local user (``OTHER_UID``), makes ``path`` open to all."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(OTHER_UID)
            os.setuid(OTHER_UID)
            os.mkdir(path)
            os.chmod(path, 0o777)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.stat(path).st_uid == OTHER_UID


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's process takes root")
def test_a_state_dir_another_user_made_first_is_refused(settings: Settings) -> None:
    parent = Path(tempfile.mkdtemp(prefix="orch-shared-"))
    try:
        os.chmod(parent, 0o1777)  # like /tmp: anyone may make a directory in it first
        state = parent / "state"
        make_dir_as_other_user(state)
        with pytest.raises(ConfigError) as info:
            Orchestrator(settings.replace(state_dir=state))
        assert str(state) in str(info.value) and f"belongs to uid {OTHER_UID}" in str(info.value)
        assert "ORCH_STATE_DIR" in str(info.value)
        assert os.listdir(state) == []  # nothing of ours went into it
    finally:
        shutil.rmtree(parent)


def test_a_state_dir_the_controller_makes_is_private(settings: Settings, tmp_path_factory, make_orch) -> None:
    state = tmp_path_factory.mktemp("fresh") / "deeper" / "state"
    make_orch(settings.replace(state_dir=state))
    for made in (state, state.parent):
        info = os.stat(made)
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (os.geteuid(), 0o700), made


def test_a_lease_dated_in_the_future_does_not_hold_a_session(
    settings_for: Callable[..., Settings], make_orch, new_session
) -> None:
    store = settings_for()
    first = make_orch(store)
    session = new_session(first)
    assert session.execute("kept = 41").ok
    session.detach()
    directory = Path(store.state_dir) / "sessions" / session.id
    owner = json.loads((directory / "meta.json").read_bytes())["owner"]
    forged = {
        "owner": owner, "epoch": 0, "host": "elsewhere", "boot_id": "b", "pid": 1, "pid_start": "",
        "since": time.time(), "renewed": time.time() + 10 * 365 * 86400,
    }  # fmt: skip
    writer = "import sys; open(sys.argv[1], 'w').write(sys.argv[2])"  # a second process writes the lease file
    subprocess.run([sys.executable, "-c", writer, str(directory / "lease"), json.dumps(forged)], check=True)
    attached = make_orch(store).attach(session.id)  # no force: the lease proves no live holder
    assert attached.execute("kept + 1").return_value == "42"
