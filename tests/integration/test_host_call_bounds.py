"""Host calls bounded per cell and per session, against a real sandbox whose cell floods them (issue 22, item 5).

The host counts which handlers ran (each records its invocations): past a bound a call is refused at once
in the sandbox, a call still waiting when its cell ends never starts, handlers left running by ended cells
count against the session's bound until they return, nothing starts after the session closed, and the
controller's threads and memory stay bounded while the session stays usable.
"""

from __future__ import annotations

import ast
import resource
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from orchestrator import ExecutionTimeout, Orchestrator, Session, Settings
from orchestrator.runtime.hostcalls import HostCalls

pytestmark = pytest.mark.docker

SCAFFOLD = "def before_cell(ns):\n    ns['call'] = host_call\n"


class Handler:
    """``llm_query`` on the host: records every invocation, blocks until released (or 60 s)."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.invoked = 0
        self.returned = 0
        self.release = threading.Event()

    def __call__(self, payload: Any) -> Any:
        with self.lock:
            self.invoked += 1
            self.lock.notify_all()
        self.release.wait(60)
        with self.lock:
            self.returned += 1
            self.lock.notify_all()
        return "answer"

    def wait_for(self, invoked: int) -> Any:
        """A handler for the cell: returns once ``invoked`` handlers have started (so the cell knows they run)."""
        with self.lock:
            assert self.lock.wait_for(lambda: self.invoked >= invoked, timeout=60), (self.invoked, invoked)
        return self.invoked

    def wait_returned(self) -> None:
        with self.lock:
            assert self.lock.wait_for(lambda: self.returned == self.invoked, timeout=60)


@pytest.fixture
def llm() -> Iterator[Handler]:
    handler = Handler()
    try:
        yield handler
    finally:
        handler.release.set()


@pytest.fixture
def bounded(
    settings: Settings,
    settings_for: Callable[..., Settings],
    make_orch: Callable[[Settings], Orchestrator],
    new_session,
) -> Callable[..., Session]:
    def make(per_cell: int, per_session: int) -> Session:
        limits = settings.limits.replace(max_host_calls_per_cell=per_cell, max_host_calls_per_session=per_session)
        orch = make_orch(settings_for(limits=limits))
        session: Session = new_session(orch)
        session.set_scaffold(SCAFFOLD, names=("call",))
        return session

    return make


def resident_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize()


def value(session: Session, code: str, calls: HostCalls) -> Any:
    result = session.execute(code, host_calls=calls, timeout=120)
    assert result.ok, f"{result.error}\n{result.stderr}"
    assert result.return_value is not None
    return ast.literal_eval(result.return_value)


FLOOD = """
import threading, time
stop = threading.Event()
refused, lock = [], threading.Lock()
def flood():
    while not stop.is_set():
        try:
            call('llm_query', 'prompt')
        except Exception as e:
            with lock:
                refused.append((type(e).__name__, str(e)))
threads = [threading.Thread(target=flood, daemon=True) for _ in range(100)]
for t in threads:
    t.start()
started = time.monotonic()
while len(refused) < 3000 and time.monotonic() - started < 100:
    time.sleep(0.01)
stop.set()
len(refused), sorted({kind for kind, _ in refused}), refused[0][1]
"""


def test_a_flood_of_llm_queries_from_threads_is_bounded_and_cancelled_when_the_cell_ends(
    bounded: Callable[..., Session], llm: Handler
) -> None:
    session = bounded(per_cell=32, per_session=48)
    calls = HostCalls({"llm_query": llm}, max_concurrent=8)
    threads_before, memory_before = threading.active_count(), resident_bytes()
    peak = {"threads": threads_before, "memory": memory_before}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            peak["threads"] = max(peak["threads"], threading.active_count())
            peak["memory"] = max(peak["memory"], resident_bytes())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        refused, kinds, message = value(session, FLOOD, calls)
    finally:
        done.set()
        sampler.join()
    # The cell ended early with 8 handlers running and 24 calls waiting: the waiting ones never start.
    assert refused >= 3000
    assert kinds == ["HostCallError"]
    assert "Settings.limits.max_host_calls_per_cell" in message
    assert llm.invoked == 8, "only the handlers running when the cell ended ran"
    llm.release.set()
    llm.wait_returned()
    assert value(session, "call('echo', 'still usable')", HostCalls({"echo": lambda p: p})) == "still usable"
    assert llm.invoked == 8, "a call of the ended cell started later"
    assert peak["threads"] - threads_before <= 48 + 2, peak  # the handler threads, the sampler
    grown_mib = (peak["memory"] - memory_before) / (1 << 20)
    assert grown_mib < 64, f"the flood grew the controller by {grown_mib:.0f} MiB"


LEAVE_RUNNING = """
import threading
def _stuck():
    try:
        call('llm_query', 'p')
    except Exception:
        pass
for _ in range(4):
    threading.Thread(target=_stuck, daemon=True).start()
call('started', {total})
"""

ONE_MORE = """
import threading, time
results = []
def _one():
    try:
        results.append(('ok', call('llm_query', 'p')))
    except Exception as e:
        results.append((type(e).__name__, str(e)))
for _ in range(2):
    threading.Thread(target=_one, daemon=True).start()
while not results:
    time.sleep(0.01)
results
"""


def test_handlers_left_running_by_ended_cells_hold_the_sessions_bound_until_they_return(
    bounded: Callable[..., Session], llm: Handler
) -> None:
    session = bounded(per_cell=8, per_session=13)
    calls = HostCalls({"llm_query": llm, "started": llm.wait_for}, max_concurrent=8)
    threads_before = threading.active_count()
    for cell in range(1, 4):  # each cell ends with 4 handlers still running
        assert value(session, LEAVE_RUNNING.format(total=4 * cell), calls) == 4 * cell
    assert llm.invoked == 12
    # 12 held by cells that ended: one more may run, the next is refused at once, not queued.
    (only,) = value(session, ONE_MORE, calls)
    assert only[0] == "HostCallError"
    assert "Settings.limits.max_host_calls_per_session" in only[1]
    assert llm.invoked == 13
    assert threading.active_count() - threads_before <= 13
    llm.release.set()
    llm.wait_returned()
    assert value(session, "call('llm_query', 'p')", calls) == "answer"
    assert llm.invoked == 14, "a refused call ran after all"


def test_nothing_starts_after_the_session_closed(bounded: Callable[..., Session], llm: Handler) -> None:
    session = bounded(per_cell=64, per_session=64)
    calls = HostCalls({"llm_query": llm}, max_concurrent=2)
    code = (
        "import threading, time\n"
        "def _ask():\n    try:\n        call('llm_query', 'p')\n    except Exception:\n        pass\n"
        "for _ in range(20):\n    threading.Thread(target=_ask, daemon=True).start()\n"
        "time.sleep(120)\n"
    )
    ran: dict[str, Any] = {}

    def run_cell() -> None:
        try:
            ran["result"] = session.execute(code, host_calls=calls, timeout=200)
        except Exception as exc:
            ran["error"] = exc

    cell = threading.Thread(target=run_cell)
    cell.start()
    llm.wait_for(2)
    pool = session._sandbox._host_calls  # the session's handler pool, to see what it still holds
    assert pool is not None
    while pool.held < 20:  # the cell's 18 other calls are queued
        llm.release.wait(0.01)
    assert session.interrupt()
    session.close()  # waits for the interrupted cell, then closes with its handlers still running
    cell.join(60)
    assert not cell.is_alive()
    assert isinstance(ran.get("error"), ExecutionTimeout), ran  # stopped by the caller
    assert pool.closed and pool.held == 2
    llm.release.set()
    llm.wait_returned()
    assert llm.invoked == 2, "a queued call started after its cell ended or the session closed"
    assert pool.held == 0


FORGED_PAYLOADS = """
import json, types
import orchestrator_agent.hostcall as link
errors = []
try:
    call('llm_query', float('nan'))  # an honest cell: refused in the sandbox, nothing sent
except Exception as e:
    errors.append(type(e).__name__)
for forged in ('{"p": NaN}', '{"p": 1, "p": 2}', '[' * 100 + ']' * 100, '{"n": ' + '9' * 5000 + '}'):
    link.json = types.SimpleNamespace(dumps=lambda *a, _f=forged, **k: _f, loads=json.loads)  # the agent patched
    try:
        call('llm_query', 'x')
    except Exception as e:
        errors.append(type(e).__name__ + ': ' + str(e)[:80])
link.json = json
errors
"""


def test_a_payload_that_is_not_strict_json_never_reaches_a_handler(
    bounded: Callable[..., Session], llm: Handler
) -> None:
    session = bounded(per_cell=32, per_session=48)
    llm.release.set()
    calls = HostCalls({"llm_query": llm})
    errors = value(session, FORGED_PAYLOADS, calls)
    assert errors[0] == "HostCallError" and len(errors) == 5
    assert all(e.startswith("HostCallError: host call 'llm_query' failed: ProtocolViolation") for e in errors[1:]), (
        errors
    )
    assert llm.invoked == 0
    assert value(session, "call('llm_query', 'fine')", calls) == "answer" and llm.invoked == 1
