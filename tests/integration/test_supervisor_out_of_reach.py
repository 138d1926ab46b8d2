"""A cell cannot touch its supervisor, plant code in a later worker, or use up another sandbox's per-uid limits.

The supervisor runs as root with SETUID, SETGID, SETPCAP and KILL only; the worker (which runs the
cells) as the sandbox's own uid, with no group and no capability (docs/identity.md). From a cell:

- ``ptrace`` (PTRACE_ATTACH, PTRACE_SEIZE), ``/proc/<supervisor>/mem`` (read and write), ``environ``
  and ``fd/``, and signals (SIGKILL, SIGSTOP, SIGUSR1, SIGINT) aimed at the supervisor or init all
  fail with EPERM / EACCES, while the same moves on the cell's own child work (the control);
- the secret, the sandbox directory and the channel socket are closed to it;
- the agent's code is not writable, on a read-only root and on a writable one;
- modules planted where a fresh worker could import them (the working directory, a package named like
  the agent's, ``dill``, ``sitecustomize``, ``usercustomize``, a ``.pth`` in a user site) never run in
  the worker that replaces a crashed or timed-out one, and the session's state comes back;
- every sandbox has a worker uid of its own (its label says which): one sandbox holding every inotify
  instance its uid may have leaves a second sandbox free to make one;
- a controller that is not root (a laptop user in the engine's group) gets the same: its channel
  files are its own and its group's, the supervisor gets that group, the cell neither.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from conftest import TEST_LABEL
from support import ATTEMPT_SOURCE, CONNECT_SOURCE

from orchestrator import ExecutionTimeout, Orchestrator, SandboxCrashed, Session, Settings
from orchestrator.backends.base import SUPERVISOR_CAPABILITIES, WORKER_UID

pytestmark = pytest.mark.docker


def value(session: Session, code: str) -> object:
    """The cell's last expression, as the Python value its repr spells."""
    result = session.execute(code)
    assert result.error is None, str(result.error)
    assert result.return_value is not None
    return ast.literal_eval(result.return_value)


def worker_uid(orch: Orchestrator, session: Session) -> int:
    assert session.container_id
    state = orch.backend.inspect(session.container_id)
    assert state is not None
    return int(state.labels[WORKER_UID])


ATTEMPT = (
    "import ctypes, errno, os, signal, socket, subprocess\n"
    + ATTEMPT_SOURCE
    + """\
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.ptrace.restype = ctypes.c_long
PTRACE_ATTACH, PTRACE_DETACH, PTRACE_SEIZE = 16, 17, 0x4206
def trace(request, pid):
    if libc.ptrace(request, pid, None, None) == 0:
        libc.ptrace(PTRACE_DETACH, pid, None, None)
        return 'allowed'
    return errno.errorcode[ctypes.get_errno()]
def proc_file(pid, name, mode):
    return lambda: open('/proc/%d/%s' % (pid, name), mode).close()  # the access check is the open's
supervisor = os.getppid()
"""
)


@pytest.fixture(scope="module")
def victim(orch: Orchestrator, run_id: str) -> Iterator[Session]:
    s = orch.create_session(labels={TEST_LABEL: run_id})
    try:
        assert s.execute("kept = 41\n" + ATTEMPT).ok
        yield s
    finally:
        s.close()


def assert_usable(session: Session) -> None:
    assert value(session, "kept += 1\nkept") == 42
    assert value(session, "kept -= 1\nkept") == 41


def test_a_cell_runs_as_the_sandbox_uid_with_no_capability_and_the_supervisor_as_root(
    victim: Session, orch: Orchestrator, settings: Settings
) -> None:
    uid = worker_uid(orch, victim)
    low, high = settings.confinement.worker_uids
    assert low <= uid <= high
    assert value(victim, "os.getuid(), os.geteuid(), os.getgid(), os.getegid(), os.getgroups()") == (
        uid,
        uid,
        uid,
        uid,
        [],
    )
    capabilities = value(
        victim,
        "dict(line.split(':\\t') for line in open('/proc/self/status').read().splitlines() if line.startswith('Cap'))",
    )
    assert capabilities == {name: "0" * 16 for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
    status = value(victim, "open('/proc/%d/status' % supervisor).read()")
    assert isinstance(status, str)
    assert "\nUid:\t0\t0\t0\t0\n" in status, status
    container = orch.backend.client.containers.get(victim.container_id)
    assert container.attrs["Config"]["User"] == "0:0"
    assert sorted(container.attrs["HostConfig"]["CapAdd"]) == sorted(SUPERVISOR_CAPABILITIES)
    assert container.attrs["HostConfig"]["CapDrop"] == ["ALL"]


def test_ptrace_of_the_supervisor_is_refused_and_of_the_cells_own_child_allowed(victim: Session) -> None:
    outcome = value(
        victim,
        "child = subprocess.Popen(['sleep', '30'])\n"
        "try:\n"
        "    mine = [trace(PTRACE_SEIZE, child.pid), attempt(proc_file(child.pid, 'mem', 'rb'))]\n"
        "finally:\n"
        "    child.kill(); child.wait()\n"
        "del child\n"
        "[trace(PTRACE_ATTACH, supervisor), trace(PTRACE_SEIZE, supervisor), trace(PTRACE_SEIZE, 1)], mine",
    )
    assert outcome == (["EPERM", "EPERM", "EPERM"], ["allowed", "allowed"])
    assert_usable(victim)


def test_the_supervisors_proc_files_are_closed(victim: Session) -> None:
    outcome = value(
        victim,
        "[attempt(proc_file(supervisor, 'mem', 'rb')), attempt(proc_file(supervisor, 'mem', 'r+b')),\n"
        " attempt(proc_file(supervisor, 'environ', 'rb')), attempt(lambda: os.listdir('/proc/%d/fd' % supervisor)),\n"
        " attempt(lambda: os.readlink('/proc/%d/cwd' % supervisor)), attempt(proc_file(1, 'environ', 'rb'))]",
    )
    assert isinstance(outcome, list)
    assert set(outcome) == {"PermissionError"}, outcome
    assert_usable(victim)


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGSTOP", "SIGUSR1", "SIGINT"])
def test_signals_to_the_supervisor_and_init_are_refused(victim: Session, signal_name: str) -> None:
    outcome = value(
        victim,
        f"number = signal.{signal_name}\n"
        "[attempt(lambda: os.kill(supervisor, number)), attempt(lambda: os.kill(1, number)),"
        " attempt(lambda: os.killpg(os.getpgid(supervisor), number))]",
    )
    assert outcome == ["PermissionError"] * 3
    assert_usable(victim)


def test_the_secret_the_directory_and_the_channel_socket_are_closed_to_a_cell(victim: Session) -> None:
    outcome = value(
        victim,
        CONNECT_SOURCE + "[attempt(lambda: open('/run/orchestrator/secret', 'rb').read()),"
        " attempt(lambda: os.listdir('/run/orchestrator')),"
        " attempt(lambda: connect('/run/orchestrator/channel.sock'))]",
    )
    assert outcome == ["PermissionError"] * 3
    value(victim, "del connect\n1")
    assert_usable(victim)


WRITE_AGENT = """\
import orchestrator_agent, os
agent_dir = os.path.dirname(orchestrator_agent.__file__)
def append():
    with open(os.path.join(agent_dir, 'worker.py'), 'a') as fh:
        fh.write('# planted')
def create():
    with open(os.path.join(agent_dir, 'planted.py'), 'w') as fh:
        fh.write('planted = True')
[attempt(append), attempt(create), attempt(lambda: os.rename(agent_dir, agent_dir + '-moved')), agent_dir]
"""


def test_the_agents_code_is_not_writable_from_a_cell(victim: Session) -> None:
    outcome = value(victim, WRITE_AGENT)
    assert isinstance(outcome, list)
    assert outcome[:3] == ["OSError"] * 3 or set(outcome[:3]) <= {"OSError", "PermissionError"}, outcome
    assert outcome[3] == "/opt/orchestrator/orchestrator_agent"
    assert_usable(victim)


def test_the_agents_code_is_not_writable_even_on_a_writable_root(
    settings, settings_for, make_orch, run_id: str
) -> None:
    """Without the read-only root (a loosening), the agent's files still belong to root: the worker's uid
    cannot write them."""
    orch = make_orch(settings_for(confinement=settings.confinement.replace(read_only=False)))
    s = orch.create_session(labels={TEST_LABEL: run_id})
    try:
        assert s.execute(ATTEMPT).ok
        assert value(s, WRITE_AGENT)[:3] == ["PermissionError"] * 3  # type: ignore[index]
    finally:
        s.close()


PLANT = """\
import os, site, sys
MARK = "open('/tmp/planted-ran', 'a').write(__name__ + '\\\\n')\\n"
def plant(path, text=MARK):
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'w') as fh:
            fh.write(text)
        return path
    except OSError:
        return None
version = 'python%d.%d' % sys.version_info[:2]
user_sites = {site.getusersitepackages(), '/tmp/.local/lib/%s/site-packages' % version}
planted = [plant(p) for p in [
    '/tmp/dill.py', '/tmp/orchestrator_agent/__init__.py', '/tmp/orchestrator_agent/worker.py',
    '/tmp/worker.py', '/tmp/protocol.py', '/tmp/checkpoint.py', '/tmp/cells.py', '/tmp/capture.py',
    '/tmp/sitecustomize.py', '/tmp/usercustomize.py', '/tmp/pickle.py', '/tmp/json.py', '/tmp/traceback.py',
    '/workspace/dill.py', '/workspace/orchestrator_agent/worker.py', '/workspace/json.py',  # the working directory
    '/workspace/sitecustomize.py', '/workspace/worker.py', '/workspace/pickle.py',
]]
planted += [plant(os.path.join(d, 'planted.pth'), 'import os; ' + MARK) for d in user_sites]
planted += [plant(os.path.join(d, 'sitecustomize.py')) for d in user_sites]
planted += [plant(os.path.join(d, 'usercustomize.py')) for d in user_sites]
os.environ['HOME'] = '/tmp'  # this worker's own environment: the next worker's comes from the supervisor
os.environ['PYTHONPATH'] = '/tmp'
del plant, MARK, version, user_sites
[p for p in planted if p]
"""
CHECK = (
    "import dill, os, sys, orchestrator_agent.worker as agent_worker\n"
    "(os.path.exists('/tmp/planted-ran'), dill.__file__.startswith(('/tmp', '/workspace')), agent_worker.__file__,"
    " [p for p in sys.path if not p.startswith('/') or p.startswith(('/tmp', '/workspace'))], kept)"
)


@pytest.fixture
def planted(orch: Orchestrator, run_id: str) -> Iterator[Session]:
    s = orch.create_session(labels={TEST_LABEL: run_id})
    try:
        assert s.execute("kept = 41").ok
        paths = value(s, PLANT)
        assert isinstance(paths, list)
        assert {"/tmp/dill.py", "/tmp/orchestrator_agent/worker.py", "/workspace/dill.py"} <= set(paths)
        assert any(p.endswith("planted.pth") for p in paths), paths
        yield s
    finally:
        s.close()


def assert_nothing_planted_ran(s: Session) -> None:
    ran, shadowed, worker_file, writable, _ = value(s, CHECK)  # type: ignore[misc]
    assert (ran, shadowed, writable) == (False, False, []), (ran, shadowed, writable)
    assert worker_file.startswith("/opt/orchestrator/")


def test_modules_planted_before_a_crash_never_run_in_the_next_worker(planted: Session) -> None:
    container = planted.container_id
    with pytest.raises(SandboxCrashed) as info:
        planted.execute("kept = 'lost'\nimport os\nos._exit(3)")
    assert info.value.restored is True
    assert planted.container_id == container, "a fresh worker in the same container, with /tmp as the cell left it"
    assert_nothing_planted_ran(planted)
    assert value(planted, "kept") == 41


def test_modules_planted_before_a_timeout_never_run_in_the_next_worker(planted: Session) -> None:
    container = planted.container_id
    with pytest.raises(ExecutionTimeout) as info:
        planted.execute(
            "kept = 'lost'\nimport signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass",
            timeout=1,
        )
    assert info.value.restored is True
    assert planted.container_id == container
    assert_nothing_planted_ran(planted)
    assert value(planted, "kept") == 41


INOTIFY = """\
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
def inotify_instance():
    fd = libc.inotify_init1(0)
    return fd if fd >= 0 else errno.errorcode[ctypes.get_errno()]
"""
EXHAUST = """\
held = []
while True:
    got = inotify_instance()
    if not isinstance(got, int):
        break
    held.append(got)
    if len(held) > 100000:
        break
len(held), got, open('/proc/sys/fs/inotify/max_user_instances').read().strip()
"""


def test_each_sandbox_has_a_uid_of_its_own_and_its_own_per_uid_limits(orch: Orchestrator, run_id: str) -> None:
    first = orch.create_session(labels={TEST_LABEL: run_id})
    second = orch.create_session(labels={TEST_LABEL: run_id})
    try:
        uids = [worker_uid(orch, s) for s in (first, second)]
        assert uids[0] != uids[1]
        assert [value(s, "import os\nos.getuid()") for s in (first, second)] == uids
        assert first.execute(INOTIFY).ok and second.execute(INOTIFY).ok
        count, last, limit = value(first, EXHAUST)  # type: ignore[misc]
        assert last == "EMFILE" and 0 < count <= int(limit), (count, last, limit)
        # The limit is the uid's: another process of the first sandbox is refused too...
        again = value(
            first,
            "import subprocess, sys\nsubprocess.run([sys.executable, '-c', "
            + repr(INOTIFY + "print(inotify_instance())")
            + "], capture_output=True, text=True).stdout.strip()",
        )
        assert again == "EMFILE"
        # ... and the second sandbox, another uid, is not.
        assert isinstance(value(second, "inotify_instance()"), int)
    finally:
        first.close()
        second.close()


CONTROLLER_USER = 12345
NOT_ROOT_CELL = (
    "import os\n"
    + ATTEMPT_SOURCE
    + CONNECT_SOURCE
    + """\
[os.getuid(), attempt(lambda: open('/run/orchestrator/secret').read()),
 attempt(lambda: os.listdir('/run/orchestrator')), attempt(lambda: connect('/run/orchestrator/channel.sock'))]
"""
)
NOT_ROOT_CONTROLLER = """\
import json, os, shutil, stat, sys, tempfile
from orchestrator import Orchestrator, SandboxCrashed, Settings
from orchestrator.backends.base import WORKER_UID

labels = {%(label)r: %(run)r}
CELL = %(cell)r


def session_round(settings):
    report = {}
    with Orchestrator(settings) as orch:
        s = orch.create_session(labels=labels)
        try:
            assert s.execute('kept = 41').ok
            report['cell'] = s.execute(CELL).return_value
            try:
                s.execute('import os\\nos._exit(1)')
            except SandboxCrashed as exc:
                report['restored'] = exc.restored
            report['kept'] = s.execute('kept').return_value
            container = orch.backend.client.containers.get(s.container_id)
            report['label'] = container.labels[WORKER_UID]
            report['group_add'] = container.attrs['HostConfig']['GroupAdd']
            directory = settings.runtime_dir / s.sandbox_id
            report['files'] = {
                name: [stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid]
                for name, st in (('dir', os.lstat(directory)), ('secret', os.lstat(directory / 'secret')),
                                 ('socket', os.lstat(directory / 'channel.sock')))
            }
        finally:
            s.close()
    shutil.rmtree(settings.state_dir, ignore_errors=True)
    shutil.rmtree(settings.runtime_dir, ignore_errors=True)
    return report


def private_settings():
    return Settings.from_env().replace(  # the image named: its tag is a digest of files only root may read
        image=sys.argv[2],
        state_dir=tempfile.mkdtemp(prefix='os-', dir='/tmp'),
        runtime_dir=tempfile.mkdtemp(prefix='or-', dir='/tmp'),
    )


session_round(private_settings())  # as root: every module the round needs is imported while we may read them
os.setgroups([int(sys.argv[1])])  # the engine's socket group (docker)
os.setgid(%(user)d)
os.setuid(%(user)d)
print(json.dumps(dict(session_round(private_settings()), euid=os.geteuid(), egid=os.getegid())))
"""


def docker_socket_group() -> int | None:
    """The group that may use the local engine's socket (read and write), if there is one besides root's."""
    try:
        st = os.stat("/var/run/docker.sock")
    except OSError:
        return None
    return st.st_gid if st.st_gid and st.st_mode & 0o060 == 0o060 else None


def test_a_controller_that_is_not_root_keeps_the_cell_out_of_the_channel(run_id: str, image: str) -> None:
    """A controller in the engine's group (a laptop): the channel files stay its own and its group's (0710, 0440,
    0660); the supervisor gets that group, the cell (no group) gets neither the secret nor the socket."""
    group = docker_socket_group()
    if os.geteuid() != 0 or group is None or "DOCKER_HOST" in os.environ:
        pytest.skip("needs root (to become another user) and the local engine socket open to its group")
    script = NOT_ROOT_CONTROLLER % {"label": TEST_LABEL, "run": run_id, "user": CONTROLLER_USER, "cell": NOT_ROOT_CELL}
    done = subprocess.run(
        [sys.executable, "-c", script, str(group), image], capture_output=True, text=True, timeout=300, cwd="/"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    uid = int(report["label"])
    assert (report["euid"], report["egid"]) == (CONTROLLER_USER, CONTROLLER_USER)
    assert ast.literal_eval(report["cell"]) == [uid, "PermissionError", "PermissionError", "PermissionError"]
    assert report["restored"] is True and report["kept"] == "41"
    assert report["group_add"] == [str(CONTROLLER_USER)]
    owner = [CONTROLLER_USER, CONTROLLER_USER]
    assert report["files"] == {"dir": [0o710, *owner], "secret": [0o440, *owner], "socket": [0o660, *owner]}
