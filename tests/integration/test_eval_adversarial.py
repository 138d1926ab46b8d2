"""``orchestrator eval`` against hostile submissions: each ends with its outcome, the run goes on, nothing is left.

All the submissions run in ONE evaluation (jobs=2) next to a plain passing one, on a store of
their own. Then: no container of the run (by its labels), no process of the sandbox user that
belongs to the run (processes are told apart by their container's cgroup, so sandboxes of
other tests or other runs on the same engine do not count), no sandbox directory in the
runtime dir and no scratch directory of the run in the temp dir.

The network case first starts a listener container of the test's own on a user-defined bridge
network it creates (and proves with a second container that the listener answers); the
submission tries that address, which must fail without a packet leaving the sandbox.

"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import docker
import docker.errors
import pytest
from support import PORT, closing_orch, listener_on_a_bridge

from orchestrator import Orchestrator, Settings
from orchestrator.evaluation import EvalOptions, EvalReport, EvalResult, Status

pytestmark = pytest.mark.docker

EVAL_LABELS = ("orchestrator.role=eval", f"orchestrator.controller-pid={os.getpid()}")
"""Labels of every container an evaluation run by this process starts (sandboxes and network slots)."""
TIMEOUT = 2.0

NETWORK = """\
import json, socket
devices = open('/proc/net/dev').read().splitlines()[2:]
interfaces = sorted(line.split(':')[0].strip() for line in devices if line.strip())
routes = [line.split() for line in open('/proc/net/route').read().splitlines()[1:] if line.strip()]
print(json.dumps({'interfaces': interfaces, 'routes': routes}), flush=True)
connection = socket.create_connection((%(host)r, %(port)d), timeout=3)
print('connected', connection.recv(16))
"""

FILL = """\
import os
os.makedirs(%(folder)r, exist_ok=True)
with open(os.path.join(%(folder)r, 'fill'), 'wb') as handle:
    while True:
        handle.write(b'x' * 2**20)
        handle.flush()
"""


def submissions(listener_ip: str, secret_path: Path) -> list[dict[str, Any]]:
    return [
        {"id": "plain", "code": "print('plain')", "tests": "assert True", "expected_stdout": "plain\n"},
        {"id": "infinite-loop", "code": "print('looping', flush=True)\nwhile True:\n    pass", "timeout": TIMEOUT},
        {
            "id": "sleep-forever",
            "code": "import time\nprint('sleeping', flush=True)\ntime.sleep(10**9)",
            "timeout": TIMEOUT,
        },
        {
            "id": "fork-bomb",
            "code": "import os\nprint('forking', flush=True)\nwhile True:\n    os.fork()",
            "timeout": 5,
        },
        {
            "id": "thread-bomb",
            "code": (
                "import threading, time\n"
                "while True:\n"
                "    threading.Thread(target=time.sleep, args=(10**6,), daemon=True).start()"
            ),
            "timeout": 5,
        },
        {"id": "memory-bomb", "code": "hoard = []\nwhile True:\n    hoard.append(bytearray(16 * 2**20))"},
        {"id": "fill-tmp", "code": FILL % {"folder": "/tmp/filler"}},
        {"id": "fill-workspace", "code": "import os\n" + FILL % {"folder": "workspace-filler"}},
        {
            "id": "print-1gb",
            "code": "import sys\nchunk = 'y' * 2**20\nfor _ in range(1024):\n    sys.stdout.write(chunk)",
            "timeout": 60,
        },
        {
            "id": "bad-bytes",
            "code": (
                "import sys\n"
                "sys.stdout.buffer.write(b'bin:\\xff\\xfe\\x00end\\n')\n"
                "sys.stdout.buffer.flush()\n"
                "print('text:\\x00nul')\n"
                "sys.stderr.buffer.write(b'err:\\xc3\\x28\\n')"
            ),
        },
        {"id": "network", "code": NETWORK % {"host": listener_ip, "port": PORT}},
        {
            "id": "kill-own-interpreter",
            "code": "import os\nprint('last words', flush=True)\nos.kill(os.getpid(), 9)",
        },
        {"id": "kill-sandbox-init", "code": "import os\nos.kill(1, 9)\nprint('still here')"},
        {
            "id": "kill-everything",
            "code": "import os, time\nprint('going', flush=True)\ntime.sleep(0.2)\nos.kill(-1, 9)\ntime.sleep(5)",
        },
        {
            "id": "background-process",
            "code": (
                "import subprocess, sys, threading, time\n"
                "sleeper = [sys.executable, '-c', 'import os, time; os.setsid(); time.sleep(10**6)']\n"
                "child = subprocess.Popen(sleeper, start_new_session=True)\n"
                "threading.Thread(target=time.sleep, args=(10**6,), daemon=True).start()\n"
                "print('left behind', child.pid > 0)"
            ),
        },
        {"id": "host-path", "code": f"print(open({str(secret_path)!r}).read())"},
        {"id": "input-without-stdin", "code": "name = input('name? ')\nprint('hello', name)"},
        {
            "id": "ignores-interrupt",
            "code": (
                "import time\n"
                "print('stubborn', flush=True)\n"
                "while True:\n"
                "    try:\n"
                "        time.sleep(1)\n"
                "    except BaseException:\n"
                "        pass"
            ),
            "timeout": TIMEOUT,
        },
    ]


EXPECTED = {
    "plain": Status.PASSED,
    "infinite-loop": Status.TIMEOUT,
    "sleep-forever": Status.TIMEOUT,
    # The sandbox's pids limit makes fork() fail with EAGAIN: the code raises BlockingIOError.
    "fork-bomb": Status.ERROR,
    "thread-bomb": Status.ERROR,
    "memory-bomb": Status.OOM,
    "fill-tmp": Status.ERROR,
    "fill-workspace": Status.ERROR,
    "print-1gb": Status.OUTPUT_LIMIT,
    "bad-bytes": Status.PASSED,
    "network": Status.ERROR,
    "kill-own-interpreter": Status.CRASHED,
    # Signals from inside a pid namespace to its init (docker-init) are dropped by the kernel: nothing happens.
    # init and the agent's supervisor are another uid (root): out of the code's reach.
    "kill-sandbox-init": Status.ERROR,
    # kill(-1) reaches every other process of the worker's uid: there is none; the supervisor is out of reach.
    # kill(-1) reaches the submission's own uid only: its interpreter S and the grading harness it was forked
    # from (the worker); the supervisor and init are another uid, so the agent says what happened.
    "kill-everything": Status.CRASHED,
    "background-process": Status.PASSED,
    "host-path": Status.ERROR,
    "input-without-stdin": Status.ERROR,
    "ignores-interrupt": Status.TIMEOUT,
}


# What the run leaves on the host.


def sandbox_uid(settings: Settings) -> range:
    """The uids the sandboxes' workers (and whatever they start) run as: one of ``worker_uids`` each."""
    low, high = settings.confinement.worker_uids
    return range(low, high + 1)


def user_processes(uid: range) -> dict[tuple[int, int], str]:
    """(pid, start time) -> container id ("" outside any container) of every process of a ``uid`` on this host."""
    found: dict[tuple[int, int], str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
            if not any(int(one) in uid for one in uids):
                continue
            stat = (entry / "stat").read_text()
            started = int(stat[stat.rindex(")") + 2 :].split()[19])
            cgroup = (entry / "cgroup").read_text()
        except (OSError, StopIteration, ValueError, IndexError):
            continue  # gone meanwhile
        match = re.search(r"[0-9a-f]{64}", cgroup)
        found[(int(entry.name), started)] = match.group(0) if match else ""
    return found


def cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return "(gone)"


def run_containers(client: docker.DockerClient) -> list[Any]:
    """Containers of evaluations of this process (running or not)."""
    return client.containers.list(all=True, filters={"label": list(EVAL_LABELS)}, sparse=True)


@dataclass
class Run:
    report: EvalReport
    settings: Settings
    junit: Path
    out: Path
    secret: str
    seconds: float = 0.0
    processes_before: dict[tuple[int, int], str] = field(default_factory=dict)
    containers_seen: set[str] = field(default_factory=set)
    processes_seen: int = 0
    sandbox_dirs_seen: set[str] = field(default_factory=set)
    scratch_dirs: list[str] = field(default_factory=list)
    scratch_seen: bool = False
    listener_logs: str = ""
    control_peer: str = ""
    callback_errors: list[BaseException] = field(default_factory=list)

    def result(self, key: str) -> EvalResult:
        (found,) = [r for r in self.report.results if r.id == key]
        return found


@pytest.fixture(scope="module")
def private_orch(settings_for: Callable[..., Settings], image: str) -> Iterator[Orchestrator]:
    """An orchestrator on a store and runtime dir of its own (so the runtime dir holds only this run's sandboxes)."""
    with closing_orch(Orchestrator(settings_for())) as orch:
        yield orch


@pytest.fixture(scope="module")
def hostile(
    private_orch: Orchestrator, image: str, run_id: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Run]:
    """One evaluation of every hostile submission with a plain one, jobs=2, watched from the host while it runs."""
    orch = private_orch
    client = orch.backend.client
    folder = tmp_path_factory.mktemp("eval-hostile")
    secret = "host-secret-" + secrets.token_hex(16)
    secret_path = tmp_path_factory.mktemp("host-only") / "secret.txt"
    secret_path.write_text(secret)
    secret_path.chmod(0o644)
    uid = sandbox_uid(orch.settings)
    run = Run(
        report=EvalReport(),
        settings=orch.settings,
        junit=folder / "report.xml",
        out=folder / "out.jsonl",
        secret=secret,
    )
    lock = threading.Lock()

    def on_result(result: EvalResult) -> None:
        """Called before the result's sandbox is removed: what exists now is what must be gone afterwards."""
        try:
            ours = {c.id for c in run_containers(client)}
            mine = [cid for cid in user_processes(uid).values() if cid in ours]
            with lock:
                run.containers_seen |= ours
                run.processes_seen = max(run.processes_seen, len(mine))
                if result.sandbox_id and (orch.settings.runtime_dir / result.sandbox_id).exists():
                    run.sandbox_dirs_seen.add(result.sandbox_id)
                run.scratch_seen = run.scratch_seen or any(Path(p).is_dir() for p in run.scratch_dirs)
        except BaseException as exc:  # a raising callback would stop the run: keep it for the test
            run.callback_errors.append(exc)

    real_mkdtemp = tempfile.mkdtemp

    def recording_mkdtemp(*args: Any, **kwargs: Any) -> str:
        path = real_mkdtemp(*args, **kwargs)
        run.scratch_dirs.append(path)
        return path

    with listener_on_a_bridge(client, image, run_id) as listener, pytest.MonkeyPatch.context() as patch:
        # An earlier evaluation's last removal may still be finishing in the engine (it answers "in progress").
        ends = time.monotonic() + 15
        while run_containers(client) and time.monotonic() < ends:
            time.sleep(0.2)
        left = [(c.name, c.status) for c in run_containers(client)]
        assert left == [], f"an earlier evaluation of this process left containers: {left}"
        run.processes_before = user_processes(uid)
        patch.setattr(tempfile, "mkdtemp", recording_mkdtemp)
        started = time.monotonic()
        run.report = orch.evaluate(
            submissions(listener["ip"], secret_path),
            out=run.out,
            junit=run.junit,
            on_result=on_result,
            options=EvalOptions(jobs=2, timeout=10),
        )
        run.seconds = time.monotonic() - started
        patch.undo()
        run.listener_logs = listener["listener"].logs().decode(errors="replace")
        run.control_peer = listener["control_ip"]
        yield run


def test_each_hostile_submission_ends_with_its_outcome_and_the_run_goes_on(hostile: Run) -> None:
    report = hostile.report
    assert hostile.callback_errors == []
    assert {r.id: r.status for r in report.results} == EXPECTED, {r.id: r.message for r in report.results}
    assert report.counts[Status.INFRA_ERROR] == 0 and report.invalid == []
    plain = hostile.result("plain")
    assert plain.passed and plain.stdout == "plain\n"
    assert report.exit_code == 1
    print(f"hostile evaluation: {hostile.seconds:.1f} s for {len(report.results)} submissions")


def test_endless_code_times_out_with_its_output_kept(hostile: Run) -> None:
    for key, said in (("infinite-loop", "looping"), ("sleep-forever", "sleeping")):
        result = hostile.result(key)
        assert result.stdout == said + "\n", (key, result.stdout)
        assert result.limits["timeout"] == TIMEOUT
        assert TIMEOUT * 0.9 <= result.durations["code"] < TIMEOUT + hostile.settings.timeouts.interrupt_grace + 3, (
            result.durations
        )


def test_a_submission_that_ignores_the_interrupt_is_killed_at_its_timeout(hostile: Run) -> None:
    result = hostile.result("ignores-interrupt")
    assert result.stdout == "stubborn\n"
    assert "killed" in result.message, result.message
    assert result.durations["code"] < TIMEOUT + hostile.settings.timeouts.interrupt_grace + 4, result.durations


def test_process_bombs_hit_the_pids_limit(hostile: Run) -> None:
    forks = hostile.result("fork-bomb")
    assert forks.error is not None and forks.error["type"] == "BlockingIOError", forks.message
    assert forks.stdout == "forking\n" and forks.durations["code"] < 5
    threads = hostile.result("thread-bomb")
    assert threads.error is not None and threads.error["type"] == "RuntimeError", threads.message
    assert "thread" in threads.error["message"]


def test_a_memory_bomb_is_oom(hostile: Run) -> None:
    result = hostile.result("memory-bomb")
    assert result.phase == "code" and result.durations["code"] < 10


def test_filling_the_disk_raises_enospc(hostile: Run) -> None:
    for key in ("fill-tmp", "fill-workspace"):
        error = hostile.result(key).error
        assert error is not None and error["type"] == "OSError", (key, error)
        assert "[Errno 28] No space left on device" in error["message"], (key, error)


def test_printing_a_gigabyte_is_cut_off_quickly(hostile: Run) -> None:
    result = hostile.result("print-1gb")
    assert result.output_truncated is True
    assert result.durations["code"] < 5, "stopped at the output limit, not at a timeout"
    limit = result.limits["output"]
    assert 0 < len(result.stdout.encode()) <= limit + 1024 and result.stdout.startswith("y" * 4096)


def test_invalid_utf8_and_nul_bytes_are_kept_readably(hostile: Run) -> None:
    result = hostile.result("bad-bytes")
    assert result.stdout == "bin:\ufffd\ufffd\x00end\ntext:\x00nul\n", repr(result.stdout)
    assert result.stderr == "err:\ufffd(\n", repr(result.stderr)
    lines = hostile.out.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) - 1 == len(EXPECTED)
    records = {record["id"]: record for record in (json.loads(line) for line in lines[:-1])}
    assert records["bad-bytes"]["stdout"] == result.stdout
    suite = ElementTree.parse(hostile.junit).getroot()
    assert suite.get("tests") == str(len(EXPECTED))
    assert suite.get("failures") == "0"
    assert suite.get("errors") == str(sum(1 for s in EXPECTED.values() if s is not Status.PASSED))
    (case,) = [c for c in suite.findall("testcase") if c.get("name") == "bad-bytes"]
    out = case.find("system-out")
    assert out is not None and (out.text or "").startswith("bin:\ufffd\ufffd")


def test_the_network_is_loopback_only_and_nothing_reaches_the_listener(hostile: Run) -> None:
    result = hostile.result("network")
    seen = json.loads(result.stdout.splitlines()[0])
    assert seen["interfaces"] == ["lo"], seen
    assert [route for route in seen["routes"] if route[1] == "00000000"] == [], "a default route"
    assert seen["routes"] == [], seen
    assert "connected" not in result.stdout
    assert result.error is not None and result.error["type"] == "OSError", result.error
    assert "unreachable" in result.error["message"].lower(), result.error
    peers = [line.split()[1] for line in hostile.listener_logs.splitlines() if line.startswith("peer ")]
    assert peers == [hostile.control_peer], f"the listener saw {peers}: {hostile.listener_logs}"


def test_killing_the_interpreter_is_crashed(hostile: Run) -> None:
    result = hostile.result("kill-own-interpreter")
    assert "SIGKILL" in result.message, result.message


def test_killing_the_interpreter_keeps_what_it_printed_and_flushed_before(hostile: Run) -> None:
    """``print(..., flush=True)`` then SIGKILL: the flushed line is in the crashed record's stdout (a streamed
    cell's flush sends at once, not at the next 20 ms tick)."""
    result = hostile.result("kill-own-interpreter")
    assert result.stdout == "last words\n", repr(result.stdout)


def test_killing_the_sandbox_init_does_nothing(hostile: Run) -> None:
    result = hostile.result("kill-sandbox-init")
    assert result.stdout == "" and "PermissionError" in result.message, result.message


def test_killing_every_process_of_the_sandbox_leaves_the_agent(hostile: Run) -> None:
    result = hostile.result("kill-everything")
    assert result.stdout == "going\n" and result.status is Status.CRASHED, result.message
    assert "killed by SIGKILL" in result.message  # the supervisor, still there, reported its worker's end


def test_a_process_left_running_in_the_background_does_not_hold_the_result(hostile: Run) -> None:
    """Its processes go with the sandbox (``test_no_process_of_the_run_is_left``)."""
    result = hostile.result("background-process")
    assert result.stdout == "left behind True\n"


def test_host_paths_are_not_there(hostile: Run) -> None:
    result = hostile.result("host-path")
    assert result.error is not None and result.error["type"] == "FileNotFoundError", result.error
    assert hostile.secret not in json.dumps(result.to_json())
    assert hostile.secret.encode() not in hostile.out.read_bytes()
    assert hostile.secret.encode() not in hostile.junit.read_bytes()


def test_input_without_stdin_is_eof(hostile: Run) -> None:
    result = hostile.result("input-without-stdin")
    assert result.error is not None and result.error["type"] == "EOFError", result.error
    assert result.stdout == "name? "


def test_no_container_of_the_run_is_left(hostile: Run, private_orch: Orchestrator) -> None:
    assert hostile.containers_seen, "the watcher never saw a container of the run"
    assert run_containers(private_orch.backend.client) == []
    assert (
        private_orch.backend.find({"orchestrator.role": "eval", "orchestrator.controller-pid": str(os.getpid())}) == []
    )
    left = {c.id for c in private_orch.backend.client.containers.list(all=True, sparse=True)} & hostile.containers_seen
    assert left == set()


def test_no_process_of_the_run_is_left(hostile: Run) -> None:
    assert hostile.processes_seen > 0, "the watcher never saw a process of the run's sandboxes"
    uid = sandbox_uid(hostile.settings)
    ends = time.monotonic() + 10
    while True:
        new = {key: cid for key, cid in user_processes(uid).items() if key not in hostile.processes_before}
        left = {key: cid for key, cid in new.items() if cid in hostile.containers_seen or not cid}
        if not left or time.monotonic() > ends:
            break
        time.sleep(0.2)
    assert left == {}, f"processes of uid {uid} left by the run: {[cmdline(pid) for pid, _ in left]}"


def test_no_file_of_the_run_is_left(hostile: Run) -> None:
    runtime_dir = hostile.settings.runtime_dir
    sandbox_ids = {r.sandbox_id for r in hostile.report.results if r.sandbox_id}
    assert len(sandbox_ids) == len(EXPECTED)
    assert hostile.sandbox_dirs_seen, "the watcher never saw a sandbox directory of the run"
    left = sorted(p.name for p in runtime_dir.iterdir()) if runtime_dir.exists() else []
    assert [name for name in left if name in sandbox_ids or name.startswith("sb-")] == [], left

    assert hostile.scratch_dirs == [], "a run makes no temp directory (output stays in memory, bounded)"


# Forged verdicts: wrong solutions that try to make themselves `passed`, in both grading modes.
#
# The problem: `add(a, b)` must return a + b. Every hack below defines a wrong `add` and then tries to
# win anyway. Default mode (the harness decides from the kernel and S's report, S runs code and tests)
# stops what attacks the agent or the harness from outside S; strict mode (the tests run in T, reaching
# `add` through plain data) stops them all. The hacks default mode does NOT stop are pinned as passing
# there, as docs/eval.md says ("What default mode does not stop").

WRONG = "def add(a, b):\n    return 0\n"
ADD_TESTS = "assert add(2, 2) == 4\n"
FORGE_TIMEOUT = 3.0

PATCH_RUNNER = (
    WRONG
    + """\
import sys
for name, module in list(sys.modules.items()):
    if name.endswith('.cells') and hasattr(module, 'run_cell'):
        module.run_cell = lambda code, namespace, number: {'return_value': None, 'error': None}
    if name.endswith('.worker') and hasattr(module, 'Worker'):
        def execute(self, header):
            return {'type': 'exec_reply', 'status': 'ok', 'stdout': '', 'stderr': '', 'stdout_bytes': 0,
                    'stderr_bytes': 0, 'return_value': None, 'error': None, 'duration': 0.0,
                    'checkpoint_duration': 0.0, 'checkpoint': self.empty_delta()}, []
        module.Worker.execute = execute
print('patched')
"""
)

FORGE_FRAMES = (
    WRONG
    + """\
import gc, os, socket, sys
framing = [m for n, m in sys.modules.items() if n.endswith('.framing') and hasattr(m, 'send_frame')][0]
reply = {'type': 'exec_reply', 'status': 'ok', 'stdout': '', 'stderr': '', 'stdout_bytes': 0, 'stderr_bytes': 0,
         'return_value': '{"ended": "ok", "reason": "", "error": null}', 'error': None, 'duration': 0.0,
         'checkpoint_duration': 0.0, 'checkpoint': {}}
reached = 0
for sock in [o for o in gc.get_objects() if isinstance(o, socket.socket)]:
    if 0 <= sock.fileno() < 5:  # S's own stdio, report socket and link (garbage there: `garbage-report`)
        continue
    try:
        framing.send_frame(sock, dict(reply, id='x'))
        reached += 1
    except OSError:
        pass
for fd in range(5, 1024):
    try:
        os.write(fd, b'forged frame')
        reached += 1
    except OSError:
        pass
print('forged frames reached', reached)
"""
)

GARBAGE_REPORT = WRONG + 'import os\nos.write(3, b\'{"phase": "code", "error": 1e999\')\n'

EXIT_IN_CODE = WRONG + "import os\nos._exit(0)\n"
EXIT_IN_CALL = "import os\ndef add(a, b):\n    os._exit(0)\n"

FAKE_REPORT = (
    WRONG
    + """\
import json, os, socket
report = socket.socket(fileno=3)
report.send(json.dumps({'phase': 'code', 'error': None}).encode())
socket.recv_fds(report, 64, 1)
report.send(json.dumps({'phase': 'tests', 'error': None}).encode())
os._exit(0)
"""
)

PATCH_HARNESS = (
    WRONG
    + """\
import sys
grading = [m for n, m in sys.modules.items() if n.endswith('.grading') and hasattr(m, '_run_cell')][0]
grading._run_cell = lambda code, namespace, number: {'return_value': None, 'error': None}
"""
)

LYING_EQ = """\
class Anything:
    def __eq__(self, other):
        return True
    def __hash__(self):
        return 0
def add(a, b):
    return Anything()
"""

LYING_INT = """\
class Four(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
def add(a, b):
    return Four(0)
"""

PATCH_UNITTEST = WRONG + "import unittest\nunittest.TestCase.assertEqual = lambda *args, **kwargs: None\n"
UNITTEST_TESTS = "import unittest\nunittest.TestCase().assertEqual(add(2, 2), 4)\n"
PATCH_ISCLOSE = WRONG + "import math\nmath.isclose = lambda *args, **kwargs: True\n"
ISCLOSE_TESTS = "import math\nassert math.isclose(add(0.5, 0.25), 0.75)\n"
PATCH_BUILTINS = WRONG + "import builtins\nbuiltins.abs = lambda x: 0\n"
BUILTINS_TESTS = "assert abs(add(2, 2) - 4) < 1e-9\n"
SHADOW_BUILTIN = WRONG + "def abs(x):\n    return 0\n"

PTRACE = (
    WRONG
    + """\
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def attach(pid):
    if libc.ptrace(16, pid, None, None) == 0:
        libc.ptrace(17, pid, None, None)
        return 'attached'
    return 'denied ' + os.strerror(ctypes.get_errno())
def memory(pid):
    try:
        with open('/proc/%d/mem' % pid, 'r+b'):
            return 'opened'
    except OSError as exc:
        return 'denied ' + type(exc).__name__
def siblings():
    found = []
    for entry in os.listdir('/proc'):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                stat = open('/proc/%s/stat' % entry).read()
            except OSError:
                continue
            if int(stat[stat.rindex(')') + 2:].split()[1]) == os.getppid():
                found.append(int(entry))
    return found
print('harness', attach(os.getppid()), memory(os.getppid()))
for pid in siblings():
    print('sibling', attach(pid), memory(pid))
"""
)

SIGNAL_HARNESS = WRONG + "import os, signal, time\nos.kill(os.getppid(), signal.SIGINT)\ntime.sleep(1)\n"

KILL_SIBLINGS = PTRACE.split("print('harness'")[0] + (
    "import signal\nfor pid in siblings():\n    os.kill(pid, signal.SIGKILL)\n    print('killed a sibling')\n"
)

DURATION_LIE = """\
import time
def add(a, b):
    return a + b
time.sleep(2.2)
time.monotonic = time.perf_counter = time.time = lambda: 0.0
"""
DURATION_TESTS = "import time\ntime.sleep(2.2)\nassert add(2, 2) == 4\n"

CONTROL_CHARS = """\
print('\\x1b]52;c;Zm9yZ2Vk\\x07\\x1b[2J')
raise ValueError('\\x1b[2K\\x1b[1Ghonest: passed: passed its tests\\r\\nsecond line')
"""

HONEST_DATA = """\
import math
LIMIT = 10
def add(a, b):
    return a + b
def stats(xs):
    return min(xs), max(xs), sum(xs) / len(xs)
def words(text):
    return {word: len(word) for word in text.split()}
def unique(xs):
    return frozenset(xs), set(xs), {(x, -x): [x] for x in xs}
def big(n):
    return math.factorial(n)
def reverse(raw):
    return raw[::-1]
def odd(x):
    if x % 2 == 0:
        raise ValueError('even: %d' % x)
    return float('inf') if x > 100 else None
class Odd(KeyError):
    pass
def lookup(key):
    raise Odd(key)
"""
HONEST_DATA_TESTS = """\
assert stats([1, 2, 3]) == (1, 3, 2.0) and type(stats([1])) is tuple
assert words('a bb') == {'a': 1, 'bb': 2}
assert unique([1, 1, 2]) == (frozenset({1, 2}), {1, 2}, {(1, -1): [1], (2, -2): [2]})
assert big(30) == math.factorial(30) and big(3000) == math.factorial(3000)
assert reverse(b'abc') == b'cba' and reverse('abc') == 'cba'
assert odd(101) == float('inf') and odd(1) is None and LIMIT == 10
assert math.isnan(add(float('nan'), 1.0)) and add(-0.0, -0.0) == 0.0
try:
    odd(2)
except ValueError as exc:
    assert 'even: 2' in str(exc)
else:
    raise AssertionError('no ValueError')
try:
    lookup('k')
except KeyError:
    pass
else:
    raise AssertionError('no KeyError')
"""

P, F, E, C, T = Status.PASSED, Status.FAILED, Status.ERROR, Status.CRASHED, Status.TIMEOUT


@dataclass(frozen=True)
class Hack:
    """A forged submission (its code, its tests, a timeout of its own if any) and the verdicts it must get."""

    code: str
    expected: tuple[Status, Status]  # (default mode, strict mode)
    tests: str = ADD_TESTS
    timeout: float | None = None


HACKS: dict[str, Hack] = {
    "honest": Hack("def add(a, b):\n    return a + b\n", (P, P)),
    "honest-data": Hack(HONEST_DATA, (P, P), tests=HONEST_DATA_TESTS),
    "wrong": Hack(WRONG, (F, F)),
    # S's runner was bound before the code ran; the worker never ran the code
    "patch-runner": Hack(PATCH_RUNNER, (F, F)),
    "forge-frames": Hack(FORGE_FRAMES, (F, F)),  # S holds no descriptor of the worker's or the supervisor's
    "garbage-report": Hack(GARBAGE_REPORT, (C, C)),  # a report that is not one: the submission broke its grading
    "exit-in-code": Hack(EXIT_IN_CODE, (C, C)),  # the kernel says S exited before its report
    "exit-in-call": Hack(EXIT_IN_CALL, (C, F)),  # strict: the stub's call fails in T, an assertion failure
    # The limits of default mode (docs/eval.md): S answers for its own tests there.
    "fake-report": Hack(FAKE_REPORT, (P, T), timeout=FORGE_TIMEOUT),  # strict: T's call to S is never answered
    "patch-harness": Hack(PATCH_HARNESS, (P, F)),
    "lying-eq": Hack(LYING_EQ, (P, F)),
    "lying-int": Hack(LYING_INT, (P, F)),
    "patch-unittest": Hack(PATCH_UNITTEST, (P, F), tests=UNITTEST_TESTS),
    "patch-isclose": Hack(PATCH_ISCLOSE, (P, F), tests=ISCLOSE_TESTS),
    "patch-builtins": Hack(PATCH_BUILTINS, (P, F), tests=BUILTINS_TESTS),
    # strict: a top-level name of the code's never replaces a builtin of the tests'
    "shadow-builtin": Hack(SHADOW_BUILTIN, (P, F), tests=BUILTINS_TESTS),
    "ptrace": Hack(PTRACE, (F, F)),  # the harness (and T) are not dumpable: no ptrace, no /proc/<pid>/mem
    "signal-harness": Hack(SIGNAL_HARNESS, (C, C)),  # an interrupt that the harness did not expect is not a pass
    "kill-siblings": Hack(KILL_SIBLINGS + WRONG, (F, C)),  # strict: T killed before it reported
    # the tests' budget is the timeout less the host's clock of the code
    "duration-lie": Hack(DURATION_LIE, (T, T), tests=DURATION_TESTS, timeout=FORGE_TIMEOUT),
    "control-chars": Hack(CONTROL_CHARS, (E, E)),
}


def forged_submissions() -> list[dict[str, Any]]:
    return [
        {"id": f"{key}/{mode}", "grading": mode, "code": hack.code, "tests": hack.tests}
        | ({} if hack.timeout is None else {"timeout": hack.timeout})
        for key, hack in HACKS.items()
        for mode in ("default", "strict")
    ]


@pytest.fixture(scope="module")
def forged(private_orch: Orchestrator, tmp_path_factory: pytest.TempPathFactory) -> Run:
    folder = tmp_path_factory.mktemp("eval-forged")
    run = Run(
        report=EvalReport(),
        settings=private_orch.settings,
        junit=folder / "report.xml",
        out=folder / "out.jsonl",
        secret="",
    )
    run.report = private_orch.evaluate(
        forged_submissions(), out=run.out, junit=run.junit, options=EvalOptions(jobs=2, timeout=10)
    )
    return run


def test_forged_verdicts_are_not_passed_and_the_known_hacks_fail_in_strict_mode(forged: Run) -> None:
    got = {r.id: r.status for r in forged.report.results}
    expected = {
        f"{key}/{mode}": hack.expected[index]
        for key, hack in HACKS.items()
        for index, mode in enumerate(("default", "strict"))
    }
    assert got == expected, {r.id: r.message for r in forged.report.results if got[r.id] != expected[r.id]}
    assert {r.id: r.grading for r in forged.report.results} == {key: key.split("/")[1] for key in expected}


def test_strict_mode_passes_honest_solutions_with_every_plain_type(forged: Run) -> None:
    for mode in ("default", "strict"):
        result = forged.result(f"honest-data/{mode}")
        assert result.passed, (mode, result.message, result.error)


def test_a_patched_runner_changes_nothing(forged: Run) -> None:
    for mode in ("default", "strict"):
        result = forged.result(f"patch-runner/{mode}")
        assert result.stdout == "patched\n" and result.phase == "tests", result.message
        assert "assert add(2, 2) == 4" in result.message, result.message


def test_forged_frames_reach_nothing_of_the_worker_or_the_supervisor(forged: Run) -> None:
    for mode in ("default", "strict"):
        result = forged.result(f"forge-frames/{mode}")
        assert result.stdout == "forged frames reached 0\n", (mode, result.stdout)
        assert forged.result(f"garbage-report/{mode}").message.startswith("the code broke the grading protocol"), mode


def test_an_exit_before_the_asserts_is_not_a_pass(forged: Run) -> None:
    assert "exited with status 0" in forged.result("exit-in-code/default").message
    assert "exited with status 0" in forged.result("exit-in-call/default").message
    strict = forged.result("exit-in-call/strict")
    assert strict.phase == "tests" and "ended during a call" in strict.message, strict.message


def test_values_that_lie_are_refused_at_the_boundary(forged: Run) -> None:
    for key, name in (("lying-eq", "Anything"), ("lying-int", "Four")):
        result = forged.result(f"{key}/strict")
        assert f"a {name} is not plain data" in result.message, result.message


def test_the_harness_and_the_tests_interpreter_cannot_be_traced(forged: Run) -> None:
    for mode in ("default", "strict"):
        lines = forged.result(f"ptrace/{mode}").stdout.splitlines()
        assert lines[0].startswith("harness denied") and "opened" not in lines[0], lines
        siblings = [line for line in lines if line.startswith("sibling")]
        assert len(siblings) == (1 if mode == "strict" else 0), lines
        assert all("attached" not in line and "opened" not in line for line in siblings), lines


def test_the_tests_budget_comes_from_the_hosts_clock(forged: Run) -> None:
    for mode in ("default", "strict"):
        result = forged.result(f"duration-lie/{mode}")
        assert result.phase == "tests" and result.durations["code"] >= 2.2, (result.message, result.durations)


def test_control_characters_of_a_submission_never_reach_the_terminal_raw(
    forged: Run, settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    """The CLI's line per result shows a message's control characters as escapes (and --strict reaches the run)."""
    import subprocess
    import sys

    from support import cli_env

    suite = forged.junit.read_text(encoding="utf-8")
    assert "\x1b" not in suite and "\\x1b" in suite
    line = json.dumps({"id": "noisy", "code": CONTROL_CHARS, "tests": ADD_TESTS})
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "eval", "-", "--out", str(tmp_path / "out.jsonl"), "--strict"],
        input=line + "\n",
        capture_output=True,
        text=True,
        timeout=180,
        env=cli_env(settings_for()),
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "\x1b" not in done.stderr and "\r" not in done.stderr, repr(done.stderr)
    assert [line for line in done.stderr.splitlines() if line.startswith("honest")] == [], done.stderr
    (note,) = [line for line in done.stderr.splitlines() if line.startswith("noisy: error: ")]
    assert "\\x1b[2K\\x1b[1Ghonest: passed" in note, note
    (record,) = [json.loads(raw) for raw in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert record["grading"] == "strict" and record["status"] == "error"
