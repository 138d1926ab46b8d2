"""A session owner's lease (``state/lease.py``): when it proves a live holder, and its file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.state.lease import Lease, LeaseFile, ProcessProbe, is_live, new_lease, process_start, this_machine

HERE = ("host-a", "boot-1")
LEASE = Lease(owner="tok", epoch=3, host="host-a", boot_id="boot-1", pid=4242, pid_start="777", since=100.0,
              renewed=100.0)  # fmt: skip


def running(start: str | None) -> ProcessProbe:
    """A probe answering the same for any pid."""
    return lambda pid: start


def live(lease: Lease | None, *, now: float = 101.0, here: tuple[str, str] = HERE, start: str | None = "777") -> bool:
    return is_live(lease, owner="tok", now=now, ttl=8.0, here=here, probe=running(start))


def test_a_fresh_lease_of_a_running_process_proves_a_live_holder() -> None:
    assert live(LEASE)


def test_no_lease_or_another_owners_lease_proves_nothing() -> None:
    assert not live(None)
    assert not live(replace(LEASE, owner="older-token"))  # left by a handle that lost the session


def test_a_lease_not_renewed_for_the_ttl_has_expired() -> None:
    assert live(LEASE, now=108.0)
    assert not live(LEASE, now=108.5)
    assert live(replace(LEASE, renewed=108.0), now=108.5)


def test_a_lease_dated_in_the_future_proves_nothing() -> None:
    """Renewed by a clock far ahead of ours, or written by hand: it would stay live until our clock caught up."""
    for here in (HERE, ("host-b", "boot-9")):
        assert live(replace(LEASE, renewed=102.5), now=101.0, here=here)  # within the clocks' skew
        assert not live(replace(LEASE, renewed=103.5), now=101.0, here=here)
        assert not live(replace(LEASE, renewed=1e12), now=101.0, here=here)


def test_on_this_machine_a_gone_pid_is_a_dead_holder_at_once() -> None:
    assert not live(LEASE, start=None)


def test_on_this_machine_a_reused_pid_is_a_dead_holder_at_once() -> None:
    assert not live(LEASE, start="999")  # the pid runs, started at another time: another process
    assert live(LEASE, start="")  # the start time cannot be read: the renewals decide
    assert live(replace(LEASE, pid_start=""), start="999")


def test_another_machines_holder_is_judged_by_its_renewals_only() -> None:
    for there in (("host-b", "boot-1"), ("host-a", "boot-2")):
        assert live(LEASE, here=there, start=None)
        assert not live(LEASE, here=there, now=109.0)
    assert live(replace(LEASE, boot_id=""), here=("host-a", ""), start=None)  # no boot id: no pid check


def test_process_start_tells_a_running_process_from_a_gone_one() -> None:
    mine = process_start(os.getpid())
    assert mine and mine == new_lease("t", 1, now=0.0).pid_start
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert process_start(child.pid) is None
    assert this_machine()[0] == new_lease("t", 1, now=0.0).host


def test_the_lease_file_renews_and_releases_only_for_its_owner(tmp_path: Path) -> None:
    leases = LeaseFile(tmp_path)
    assert leases.read() is None and not leases.renew("tok", now=1.0)
    with leases.locked():
        leases.write(LEASE)
    assert leases.renew("tok", now=150.0) and leases.read() == replace(LEASE, renewed=150.0)
    assert not leases.renew("other", now=160.0)
    leases.release("other")
    assert leases.read() is not None
    leases.release("tok")
    assert leases.read() is None
    leases.release("tok")  # nothing left: fine


@pytest.mark.parametrize("text", [b"{", b"[]", b'{"owner": "tok"}', json.dumps({**LEASE.__dict__, "pid": -1}).encode()])
def test_an_unreadable_lease_proves_nothing(tmp_path: Path, text: bytes) -> None:
    (tmp_path / "lease").write_bytes(text)
    assert LeaseFile(tmp_path).read() is None


def test_a_lease_names_its_holder_for_people() -> None:
    assert LEASE.describe(101.5) == "pid 4242 on host host-a, since 1970-01-01 00:01:40 UTC, renewed 1.5 s ago"
