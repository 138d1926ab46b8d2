"""A cell that keeps the descriptor of a blob the host handed its worker, in a process of its own (issue 34, 3 and 9).

The worker is handed blobs as descriptors (the descriptors carrier): a deferred value's blob and a value file
(``set_value``). The attacker wraps the agent's ``hostcall.map_file`` in memory to keep a
copy of each, reads what it says (``fstat``, ``readlink``), tries to change it, hides it in a process that left the
worker's process group (``setsid``); then the session deletes the blob (history keeps no generation)
and the worker crashes. What must hold: the descriptor is no stored file (another inode, no path, no
link count), and no process of the worker's uid outlives the worker (docs/protocol.md, "One hop").
"""

from __future__ import annotations

import ast
import contextlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from support import passes_descriptors

from orchestrator import Orchestrator, SandboxCrashed, Session, Settings

pytestmark = pytest.mark.docker

BIG = 8 << 20  # a deferred value, a value file: both at least 1 MiB
ATTACKER = """\
import os, time
from orchestrator_agent import hostcall
real_map = hostcall.map_file
kept = []
def keep(fd, size):
    kept.append(os.dup(fd))
    return real_map(fd, size)
hostcall.map_file = keep
def described():
    st = os.fstat(kept[-1])
    return st.st_dev, st.st_ino, st.st_nlink, os.readlink('/proc/self/fd/%d' % kept[-1])
def attempts():
    import mmap
    fd, outcomes = kept[-1], []
    for attempt in (lambda: os.write(fd, b'x'), lambda: os.fchmod(fd, 0o666), lambda: os.ftruncate(fd, 1),
                    lambda: os.open('/proc/self/fd/%d' % fd, os.O_RDWR),
                    lambda: mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)):
        try:
            attempt()
            outcomes.append('changed')
        except OSError as exc:
            outcomes.append(type(exc).__name__)
    return outcomes
def hide():
    child = os.fork()
    if child == 0:
        os.setsid()
        if os.fork() == 0:
            for fd in [int(name) for name in os.listdir('/proc/self/fd')]:
                if fd > 2 and fd not in kept:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            time.sleep(3600)
        os._exit(0)
    os.waitpid(child, 0)
def others():
    found = []
    for entry in os.listdir('/proc'):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open('/proc/%s/status' % entry) as status:
                fields = dict(line.split(':', 1) for line in status if ':' in line)
        except OSError:
            continue
        if str(os.getuid()) in fields['Uid'].split() and not fields['State'].strip().startswith('Z'):
            found.append((int(entry), fields['Name'].strip()))
    return found
"""


@pytest.fixture
def forgetful_settings(settings: Settings, settings_for: Callable[..., Settings]) -> Settings:
    """No history: a blob the current record stops naming is deleted at once."""
    return settings_for(limits=settings.limits.replace(history_generations=0))


@pytest.fixture
def forgetful(
    forgetful_settings: Settings,
    make_orch: Callable[[Settings], Orchestrator],
    new_session: Callable[..., Session],
) -> Session:
    return new_session(make_orch(forgetful_settings))


def stored_blob(settings: Settings, s: Session, name: str) -> Path:
    return settings.state_dir / "sessions" / s.id / "blobs" / s._ledger.record.variables[name]


def assert_not_the_stored_file(s: Session, settings: Settings, blob: Path) -> None:
    """The descriptor the cell kept last is not ``blob``'s inode and shows no host path and no link count."""
    dev, ino, links, name = ast.literal_eval(s.execute("described()").return_value or "")
    found = blob.stat()
    assert (dev, ino) != (found.st_dev, found.st_ino)
    assert links == 0, links  # a memfd's: never the number of forks that share a blob
    assert str(settings.state_dir) not in name and blob.name not in name, name
    assert "changed" not in (s.execute("attempts()").return_value or "changed")  # write, fchmod, truncate, reopen, map


def holders(inode: tuple[int, int]) -> list[int] | None:
    """The processes on this machine (the engine's containers' among them) with a descriptor of ``inode`` (device,
    number), deleted or not; None when this test may not look at other processes' descriptors (not root)."""
    if not os.access("/proc/1/fd", os.R_OK):
        return None
    found = []
    for pid in [entry for entry in os.listdir("/proc") if entry.isdigit()]:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    opened = os.stat(f"/proc/{pid}/fd/{fd}")
                    if (opened.st_dev, opened.st_ino) == inode:
                        found.append(int(pid))
    return found


def assert_nothing_outlives_the_worker(s: Session, blob: Path, rebind: Callable[[], None]) -> None:
    """Hide the kept descriptors in a ``setsid`` process, have the host delete ``blob``: nothing keeps it allocated;
    crash the worker: no process of the worker's uid is left but the new worker."""
    assert s.execute("hide()").ok
    assert s.execute("len(others())").return_value == "1"  # the hidden process
    inode = (blob.stat().st_dev, blob.stat().st_ino)
    rebind()
    assert not blob.exists()  # the host deleted it
    assert holders(inode) in ([], None)  # and no process holds it: its blocks are free
    with pytest.raises(SandboxCrashed):
        s.execute("import os\nos._exit(1)")
    assert s.execute(ATTACKER + "others()").return_value == "[]"


def test_a_kept_deferred_blob_is_no_stored_file_and_dies_with_the_worker(
    forgetful: Session, forgetful_settings: Settings, kill_container: Callable[[Session], None]
) -> None:
    s = forgetful
    assert s.execute(f"big = 'x' * {BIG}").ok
    blob = stored_blob(forgetful_settings, s, "big")
    kill_container(s)
    assert s.execute(ATTACKER).ok  # restored: big is deferred
    if not passes_descriptors(s):
        pytest.skip("the relayed carrier: a deferred value's blob comes as the body")
    assert s.execute("len(big)").return_value == str(BIG)
    assert_not_the_stored_file(s, forgetful_settings, blob)
    assert_nothing_outlives_the_worker(s, blob, lambda: s.execute("big = 'y'"))
    assert s.execute("big").return_value == "'y'"


def test_a_kept_value_file_is_no_stored_file_and_dies_with_the_worker(
    forgetful: Session, forgetful_settings: Settings
) -> None:
    s = forgetful
    if not passes_descriptors(s):
        pytest.skip("the relayed carrier: a value goes as the request's body")
    assert s.execute(ATTACKER).ok
    s.set_value("value", b"v" * BIG)
    assert s.execute("len(value), len(kept)").return_value == f"({BIG}, 1)"  # it came as a file
    blob = stored_blob(forgetful_settings, s, "value")
    assert_not_the_stored_file(s, forgetful_settings, blob)
    assert_nothing_outlives_the_worker(s, blob, lambda: s.set_value("value", b"w"))
    assert s.execute("value").return_value == "b'w'"
