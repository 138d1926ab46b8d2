"""Keeping the supervisor out of the worker's reach: identities, capabilities and import paths.

The supervisor starts as root holding only SETUID, SETGID, SETPCAP and KILL (the controller's
``backends.base.SUPERVISOR_CAPABILITIES``); each worker runs as the sandbox's own uid (gid the same
number, no supplementary group), so the worker holds no capability and cannot ptrace, signal or
read the supervisor, its secret or its socket. Here:

- ``confine_supervisor``: the supervisor becomes non-dumpable (no core, no ptrace, its /proc
  files root's), empties the capability bounding set every later exec inherits (a file with
  capabilities gives the worker none), and drops from its own import path every directory the
  worker could write (the ``-m`` start put the working directory, /tmp, first).
- ``worker_identity`` and ``worker_environment``: the arguments that start a worker as its uid,
  with a ``PYTHONPATH`` that holds nothing the worker could write and no user site
  (``PYTHONNOUSERSITE``; the worker also runs with ``-s`` and drops '' from ``sys.path`` first).
- ``end_processes_of``: when a worker is replaced, every process of its uid goes with it, not only
  its process group: one a cell started in a session of its own would otherwise keep what the old
  worker was handed (a blob's descriptor) and run on beside the new one.

Standard library only, Python 3.9+ (``subprocess.Popen``'s ``user``, ``group``, ``extra_groups``).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any, Callable, Dict, List, Mapping, Optional

MAX_WORKER_UID = (1 << 31) - 2
"""The highest worker uid: above it some tools take a uid for negative, and (uid_t)-1 means "no change"."""
DEFAULT_WORKER_UID = 65534
"""nobody: the worker's uid under a root supervisor that was given none (``ORCH_WORKER_UID``)."""
SWEEPER_UID = MAX_WORKER_UID + 1
"""The real and saved uid of the process that ends a worker's processes (``end_processes_of``): no worker's, so none
of them can signal it (a signal needs the sender's real or effective uid to be the target's real or saved one)."""
_SWEEP_SECONDS = 5.0
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
_CAP_LAST_CAP = "/proc/sys/kernel/cap_last_cap"


def writable_by(path: str, uid: int) -> bool:
    """Whether ``uid`` (gid the same number, no other group) could change what ``path`` holds.

    True when ``path`` or any directory above it that exists belongs to ``uid`` or is writable by
    it through its group or others' bits (a path that does not exist yet can be made in a writable
    parent), as written or with its symbolic links resolved. Relative paths count as writable:
    they follow the working directory.
    """
    if not os.path.isabs(path):
        return True
    return any(_chain_writable_by(candidate, uid) for candidate in {os.path.normpath(path), os.path.realpath(path)})


def _chain_writable_by(path: str, uid: int) -> bool:
    while True:
        try:
            st = os.stat(path)
        except OSError:
            st = None
        if st is not None and (st.st_uid == uid or st.st_mode & 0o002 or (st.st_gid == uid and st.st_mode & 0o020)):
            return True
        parent = os.path.dirname(path)
        if parent == path:
            return False
        path = parent


def safe_path(entries: List[str], uid: int, log: Callable[[str], None]) -> List[str]:
    """``entries`` without those ``uid`` could write (``writable_by``), each left out named in the log."""
    kept = []
    for entry in entries:
        if writable_by(entry, uid):
            log("left %r out of the import path: uid %d could write there" % (entry, uid))
        else:
            kept.append(entry)
    return kept


def worker_identity(worker_uid: Optional[int]) -> Dict[str, Any]:
    """``subprocess.Popen`` arguments that start the worker as ``worker_uid`` with gid the same and no other group;
    none when the worker runs as the supervisor's own user (``worker_uid`` None)."""
    if worker_uid is None:
        return {}
    return {"user": worker_uid, "group": worker_uid, "extra_groups": []}


def worker_environment(
    environ: Mapping[str, str], worker_uid: Optional[int], log: Callable[[str], None]
) -> Dict[str, str]:
    """The worker's environment: no ORCH_* variable (nothing that names the secret or the channel), no user site,
    and a ``PYTHONPATH`` without what the worker (``worker_uid``; None: ours) could write, nor a relative entry."""
    env = {key: value for key, value in environ.items() if not key.startswith("ORCH_")}
    env["PYTHONNOUSERSITE"] = "1"
    if env.get("PYTHONPATH"):
        entries = env["PYTHONPATH"].split(os.pathsep)
        if worker_uid is None:  # the worker is our own uid: it could change our files anyway; no relative entry
            kept = [entry for entry in entries if os.path.isabs(entry)]
        else:
            kept = safe_path(entries, worker_uid, log)
        if kept:
            env["PYTHONPATH"] = os.pathsep.join(kept)
        else:
            del env["PYTHONPATH"]
    return env


def confine_supervisor(worker_uid: Optional[int], log: Callable[[str], None]) -> None:
    """Make this process (the supervisor) non-dumpable, empty the bounding set the worker inherits (when root),
    and drop from ``sys.path`` what the worker could write (when it is another uid). Best effort: each step that
    the kernel or the container refuses is logged, and the others still happen."""
    if worker_uid is not None:  # quietly: the working directory is expected there, and nobody chose it
        sys.path[:] = safe_path(sys.path, worker_uid, lambda line: None)
    try:
        import ctypes
    except ImportError:  # a Python built without ctypes: the uid boundary still holds
        log("no ctypes: the supervisor stays dumpable and the bounding set full")
        return
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    if prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        log("could not make the supervisor non-dumpable: %s" % os.strerror(ctypes.get_errno()))
    if os.geteuid() != 0:
        return
    try:
        with open(_CAP_LAST_CAP) as fh:
            last = int(fh.read())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        if prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            log("could not empty the capability bounding set: %s" % os.strerror(ctypes.get_errno()))
            return


def end_processes_of(uid: int, log: Callable[[str], None]) -> None:
    """Kill every process of ``uid`` in this container (our pid namespace), whatever its process group or session.

    A child of ours takes ``uid`` as its effective uid (real and saved ``SWEEPER_UID``, so that they cannot kill it
    first) and sends SIGKILL to every process it may signal (``kill(-1)``: exactly those of ``uid``, but itself), again
    until /proc shows none alive (a zombie has closed its descriptors) or ``_SWEEP_SECONDS`` passed, and exits; we wait
    for it. Needs SETUID and SETGID, which the supervisor keeps for starting workers (its KILL is not used: the
    kernel's own rule picks exactly ``uid``'s processes, one of which may fork meanwhile).
    """
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = _sweep(uid)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if status:
        log("processes of uid %d may outlive their worker (the sweep ended with status %#x)" % (uid, status))


def _sweep(uid: int) -> int:
    """The child of ``end_processes_of``: 0 once no process of ``uid`` is alive, 1 if one still is at the deadline."""
    os.setgroups([])
    os.setresgid(SWEEPER_UID, SWEEPER_UID, SWEEPER_UID)
    os.setresuid(SWEEPER_UID, uid, SWEEPER_UID)
    deadline = time.monotonic() + _SWEEP_SECONDS
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:  # none to signal, not even a zombie
            return 0
        if not _alive_of(uid):
            return 0
        if time.monotonic() > deadline:
            return 1
        time.sleep(0.001)


def _alive_of(uid: int) -> bool:
    """Whether a process of ``uid`` (real, effective or saved) other than this one is alive: not a zombie."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open("/proc/%s/status" % entry) as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except (OSError, ValueError):  # gone meanwhile
            continue
        uids = fields.get("Uid", "").split()[:3]
        if str(uid) in uids and not fields.get("State", "").strip().startswith(("Z", "X")):
            return True
    return False
