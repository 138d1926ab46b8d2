"""A session owner's proof of life: a lease its controller renews, which every process can read.

``sessions/<id>/lease`` beside the record (JSON, replaced whole with ``files.replace_file``)
names the handle that holds the session (its owner token and epoch, as in the record) and the
process behind it: host, boot id, pid and the pid's start time, since when it holds the
session and when it last renewed. The owning ``Orchestrator`` renews the leases of the
sessions it holds every ``RENEW_EVERY`` seconds; ``detach``, ``close`` and a takeover end them.

A lease proves a live holder (``is_live``) while it names the record's current owner, was
renewed in the last ``LEASE_TTL`` seconds (and not later than ``CLOCK_SKEW`` seconds ahead of
this host's clock: a lease dated in the future, by a clock far ahead or by hand, would otherwise
stay live until the clock caught up) and, when its holder ran on this host, its process
still runs (a pid that is gone, or that now belongs to a process started at another time, is
a dead holder at once: a killed controller's session is free in the time of one check). Writes
of the lease take ``sessions/<id>/lease.lock`` (never held for more than a read and a write);
a takeover takes it inside the store lock, a renewal alone, so a long commit never delays a
renewal and a renewal from a handle that lost the session never overwrites the new owner's.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ..checks import is_count, is_number
from ..errors import CheckpointError, OrchestratorError, SessionNotFound
from ..files import replace_file
from .activity import lock_within

logger = logging.getLogger(__name__)

LEASE_FILE = "lease"
LEASE_LOCK = "lease.lock"
RENEW_EVERY = 1.0
"""Seconds between two renewals of a held session's lease."""
LEASE_TTL = 8.0
"""A lease not renewed for this long proves nothing: its holder is taken for dead (another host's, or a hung one)."""
CLOCK_SKEW = 2.0
"""A lease renewed further ahead of this host's clock than this proves nothing (its holder's clock or its file lies)."""
_LOCK_WAIT = 10.0

ProcessProbe = Callable[[int], str | None]
"""pid -> its start time as the kernel counts it ("" when it cannot be read), or None when no such process runs."""


@dataclass(frozen=True)
class Lease:
    """Who holds a session, and when they last said so."""

    owner: str
    """The holder's owner token (``SessionRecord.owner``); a lease naming another token is an old one."""
    epoch: int
    host: str
    boot_id: str
    """The kernel's boot id ("" when unknown): with ``host``, tells whether a pid can be checked here."""
    pid: int
    pid_start: str
    """The holder process's start time (``/proc/<pid>/stat`` field 22; "" when unknown): a reused pid differs."""
    since: float
    renewed: float

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: Any) -> Lease:
        """Parse a stored lease; ValueError when it is not one."""
        if not isinstance(data, dict) or set(data) != {f.name for f in fields(cls)}:
            raise ValueError("not a lease")
        lease = cls(**data)
        text = (lease.owner, lease.host, lease.boot_id, lease.pid_start)
        if not (all(isinstance(v, str) for v in text) and is_count(lease.epoch) and is_count(lease.pid)):
            raise ValueError("invalid lease fields")
        if not (is_number(lease.since) and is_number(lease.renewed)):
            raise ValueError("invalid lease times")
        return lease

    def describe(self, now: float) -> str:
        """``pid 123 on host h, since 2026-11-26 09:41:02 UTC, renewed 0.4 s ago`` (for messages)."""
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since))
        return f"pid {self.pid} on host {self.host}, since {since}, renewed {max(0.0, now - self.renewed):.1f} s ago"


def is_live(
    lease: Lease | None, *, owner: str, now: float, ttl: float, here: tuple[str, str], probe: ProcessProbe
) -> bool:
    """Whether ``lease`` proves that the handle holding ``owner`` (the record's owner token) is alive.

    ``here`` is this machine's (host, boot id); ``probe`` looks a pid up on it.
    """
    if lease is None or lease.owner != owner or not -CLOCK_SKEW <= now - lease.renewed <= ttl:
        return False  # none, an old handle's, expired, or dated in the future
    if (lease.host, lease.boot_id) != here or not lease.boot_id:
        return True  # another machine's process: only its renewals tell
    started = probe(lease.pid)
    if started is None:
        return False  # the holder's process is gone
    return not (started and lease.pid_start and started != lease.pid_start)  # else the pid was reused


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` on this machine ("" when unreadable), or None when it does not run."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # it runs, as another user
    except OSError:
        return ""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None if Path("/proc/self/stat").exists() else ""
    except OSError:
        return ""
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses; starttime is field 22.
    after = stat.rpartition(")")[2].split()
    return after[19] if len(after) > 19 else ""


@functools.cache
def this_machine() -> tuple[str, str]:
    """(host name, boot id) of this machine."""
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot_id = ""
    return socket.gethostname(), boot_id


def new_lease(owner: str, epoch: int, *, now: float) -> Lease:
    """A lease for this process, holding the session as ``owner`` at ``epoch`` from ``now``."""
    host, boot_id = this_machine()
    pid = os.getpid()
    return Lease(owner, epoch, host, boot_id, pid, process_start(pid) or "", now, now)


class LeaseFile:
    """The lease of one session on disk (never flushed: after a power loss its holder is gone anyway)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LEASE_FILE
        self._lock_path = directory / LEASE_LOCK

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the lease's lock (short: one read and one write happen under it).

        Raises:
            SessionNotFound: the session's directory is gone.
            SessionBusy: another process held it for ``_LOCK_WAIT`` seconds.
        """
        try:
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            raise SessionNotFound(f"no session at {self._lock_path.parent}") from None
        except OSError as exc:
            raise CheckpointError(f"cannot open {self._lock_path}: {exc}") from exc
        try:
            lock_within(fd, fcntl.LOCK_EX, _LOCK_WAIT, f"{self._lock_path} stayed locked for {_LOCK_WAIT:g} s")
            yield
        finally:
            os.close(fd)

    def read(self) -> Lease | None:
        """The stored lease, or None (none, or unreadable: then it proves nothing, and the next write replaces it)."""
        try:
            return Lease.from_json(json.loads(self.path.read_bytes()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as exc:
            logger.warning("ignoring the unreadable lease %s: %s", self.path, exc)
            return None

    def write(self, lease: Lease) -> None:
        """Replace the lease (call under ``locked``)."""
        try:
            replace_file(self.path, lease.to_json(), mode=0o600)
        except FileNotFoundError:
            raise SessionNotFound(f"no session at {self.path.parent}") from None
        except OSError as exc:
            raise CheckpointError(f"cannot write {self.path}: {exc}") from exc

    def renew(self, owner: str, *, now: float) -> bool:
        """Renew the lease if ``owner`` still holds it; False when another handle holds it now (or none does).

        Raises:
            SessionNotFound: the session was removed.
        """
        with self.locked():
            lease = self.read()
            if lease is None or lease.owner != owner:
                return False
            self.write(Lease(**{**asdict(lease), "renewed": now}))
            return True

    def release(self, owner: str) -> None:
        """End the lease if ``owner`` holds it (a lease another handle took is left to it). Never raises: a lease
        that cannot be removed now is no longer renewed, so it proves nothing after ``LEASE_TTL``."""
        try:
            with self.locked():
                lease = self.read()
                if lease is not None and lease.owner == owner:
                    self.path.unlink(missing_ok=True)
        except SessionNotFound:
            pass  # removed with its session
        except (OrchestratorError, OSError) as exc:
            logger.warning("could not end the lease %s (%s); it lapses in %g s", self.path, exc, LEASE_TTL)
