"""Worker replacement ends every process of the worker's uid (confinement.end_processes_of), wherever it went: one in
a session of its own, one that keeps forking, one that spins on ``kill(-1)`` to get the sweeper first. Real processes
of an unused uid on this machine, so root only; the container's case is tests/integration/test_pinned_blobs.py."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable

import pytest

from orchestrator.agent import confinement

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="becoming another uid needs root")

UID = 1_987_654_321  # no account's: kill(-1) as this uid reaches only what the test starts


def _as_uid(body: Callable[[], None]) -> int:
    """A child of ours that becomes ``UID`` and runs ``body`` (forked: nothing to exec); its pid once it runs."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(UID, UID, UID)
            os.setresuid(UID, UID, UID)
            os.write(ready_w, b"x")
            body()
        finally:
            os._exit(0)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"x"
    os.close(ready_r)
    return pid


def _detached(body: Callable[[], None]) -> Callable[[], None]:
    """``body`` in a grandchild in a session of its own (out of its parent's process group), its parent gone."""

    def run() -> None:
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                body()
            os._exit(0)
        time.sleep(3600)

    return run


def _breed() -> None:
    while True:
        try:
            if os.fork() == 0:
                time.sleep(3600)
        except OSError:
            pass
        time.sleep(0.02)


def _spin() -> None:
    while True:
        with contextlib.suppress(OSError):
            os.kill(-1, signal.SIGKILL)


def _of_uid() -> list[int]:
    alive = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except (OSError, NotADirectoryError):
            continue
        if str(UID) in fields["Uid"].split() and not fields["State"].strip().startswith(("Z", "X")):
            alive.append(int(entry))
    return alive


def test_every_process_of_the_uid_goes_however_it_hides() -> None:
    children = [_as_uid(_detached(lambda: time.sleep(3600))), _as_uid(_detached(_breed))]
    try:
        time.sleep(0.2)
        assert len(_of_uid()) >= 4
        children.append(_as_uid(_spin))  # it kills the others of its uid, and would kill a sweeper of that uid
        logged: list[str] = []
        confinement.end_processes_of(UID, logged.append)
        assert logged == [] and _of_uid() == []
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
