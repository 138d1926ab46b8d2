"""Host calls and the session scaffold against a real engine (docs/protocol.md, "The scaffold" and "Host calls").

Cell code reaches the controller only through the scaffold's ``host_call``: the scaffold of
these tests puts ``ask(p)`` (the ``echo`` handler) and ``call(name, payload, timeout=None)``
into the session namespace before every cell. What a call gave is read back as the cell's
trailing expression, ``(type name, value or message)``, so an error in the sandbox is data
the test can compare. Handlers that block wait on events that every test releases in
``finally``, so no host thread outlives its test for long.
"""

from __future__ import annotations

import ast
import json
import resource
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support import kill_and_wait

from orchestrator import (
    ConfigError,
    ExecutionTimeout,
    Orchestrator,
    SandboxCrashed,
    SandboxError,
    Session,
    Settings,
)
from orchestrator.agent import protocol
from orchestrator.runtime.hostcalls import HostCallError, HostCalls

pytestmark = pytest.mark.docker

SCAFFOLD = """
cells = 0

def before_cell(ns):
    global cells
    cells += 1
    ns["ask"] = lambda payload, timeout=None: host_call("echo", payload, timeout)
    ns["call"] = host_call

def after_cell(ns):
    return {"cells": cells, "ask_is_ours": getattr(ns.get("ask"), "__module__", None) == __name__}
"""
NAMES = ("ask", "call")
ENDED = "the cell that made this host call has ended"


def outcome(expr: str) -> str:
    """Cell code whose value is ("ok", value of ``expr``) or (exception type name, message)."""
    return f"try:\n    _got = ('ok', {expr})\nexcept Exception as _e:\n    _got = (type(_e).__name__, str(_e))\n_got"


def run(session: Session, code: str, calls: HostCalls | None = None, timeout: float | None = None) -> Any:
    """Run ``code`` and return its trailing value as a Python literal (the cell must not raise)."""
    result = session.execute(code, timeout=timeout, host_calls=calls)
    assert result.ok, f"{result.error}\n{result.stderr}"
    assert result.return_value is not None, result
    return ast.literal_eval(result.return_value)


def echo(payload: Any) -> Any:
    return payload


class Gate:
    """A blocking handler: notes that it started, waits until released (or ``hold`` s), returns ``result``."""

    def __init__(self, result: Any = "released", hold: float = 10.0) -> None:
        self.result = result
        self.hold = hold
        self.started = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()

    def __call__(self, payload: Any) -> Any:
        self.started.set()
        self.release.wait(self.hold)
        self.finished.set()
        return self.result


class Peak:
    """A handler that sleeps ``seconds`` (or calls ``then``) and records how many of its calls ran at once."""

    def __init__(self, seconds: float = 0.0, then: Callable[[Any], Any] | None = None) -> None:
        self.seconds = seconds
        self.then = then
        self.lock = threading.Lock()
        self.running = 0
        self.peak = 0
        self.calls = 0

    def __call__(self, payload: Any) -> Any:
        with self.lock:
            self.running += 1
            self.calls += 1
            self.peak = max(self.peak, self.running)
        try:
            if self.then is not None:
                return self.then(payload)
            time.sleep(self.seconds)
            return {"echo": payload}
        finally:
            with self.lock:
                self.running -= 1


@pytest.fixture
def scaffolded(session: Session) -> Session:
    session.set_scaffold(SCAFFOLD, names=NAMES)
    return session


@pytest.fixture
def gates() -> Iterator[list[Gate]]:
    """Gates made by a test; all released at its end so no handler thread keeps blocking."""
    made: list[Gate] = []
    try:
        yield made
    finally:
        for gate in made:
            gate.release.set()


def gate(gates: list[Gate], **kwargs: Any) -> Gate:
    gates.append(Gate(**kwargs))
    return gates[-1]


# ---------------------------------------------------------------------------------------- 1. answers


PAYLOADS: list[Any] = [
    "héllo wörld ✓ 𝄞 日本語 \u0000 \n\t\"'\\",
    "",
    {"a": [1, 2.5, None, True, False, {"b": "c", "ü": [], "nested": {"deeper": [[[]]]}}], "n": -7},
    [[1, [2, [3, ["four"]]]], {}],
    None,
    0,
    -12345678901234567890,
    3.25,
    -1e300,
    True,
]


def test_a_host_call_returns_the_handlers_json_result(scaffolded: Session) -> None:
    received: list[Any] = []

    def record(payload: Any) -> Any:
        received.append(payload)
        return {"got": payload, "type": type(payload).__name__}

    calls = HostCalls({"echo": echo, "record": record})
    assert run(scaffolded, outcome("ask('ping')"), calls) == ("ok", "ping")
    assert run(scaffolded, outcome("call('record', [1, 'two'])"), calls) == ("ok", {"got": [1, "two"], "type": "list"})
    assert received == [[1, "two"]]


def test_payloads_and_results_round_trip_as_json(scaffolded: Session) -> None:
    received: list[Any] = []

    def record(payload: Any) -> Any:
        received.append(payload)
        return payload

    text = json.dumps(PAYLOADS)
    code = (
        "import json\n"
        f"payloads = json.loads({text!r})\n"
        "results = [call('record', p) for p in payloads]\n"
        "[type(r).__name__ for r in results] == [type(p).__name__ for p in payloads], json.dumps(results)"
    )
    same_types, returned = run(scaffolded, code, HostCalls({"record": record}))
    assert same_types is True
    assert json.loads(returned) == PAYLOADS
    assert returned == json.dumps(PAYLOADS)  # ints stay ints, floats floats, the text byte for byte
    assert received == PAYLOADS
    assert [type(p) for p in received] == [type(p) for p in PAYLOADS]


# ---------------------------------------------------------------------------------------- 2. concurrency

THREADED = """
import threading, time
answers = {{}}
def _one(i):
    try:
        answers[i] = call("slow", i)
    except Exception as e:
        answers[i] = repr(e)
_threads = [threading.Thread(target=_one, args=(i,)) for i in range({n})]
_started = time.monotonic()
for t in _threads:
    t.start()
for t in _threads:
    t.join(30)
del _threads, t
time.monotonic() - _started, sorted(answers.items())
"""


def test_calls_from_threads_of_a_cell_run_concurrently_on_the_host(scaffolded: Session) -> None:
    slow = Peak(0.5)
    took, answers = run(scaffolded, THREADED.format(n=5), HostCalls({"slow": slow}))
    assert answers == [(i, {"echo": i}) for i in range(5)]
    assert slow.calls == 5
    assert slow.peak == 5, "all five calls were in flight at once"
    assert took < 2.0, f"five calls of 0.5 s took {took:.2f} s: they did not run concurrently"


def test_max_concurrent_caps_the_handlers_running_at_once(scaffolded: Session) -> None:
    slow = Peak(0.3)
    took, answers = run(scaffolded, THREADED.format(n=6), HostCalls({"slow": slow}, max_concurrent=2))
    assert answers == [(i, {"echo": i}) for i in range(6)], "the calls past the cap waited, none failed"
    assert slow.calls == 6
    assert slow.peak == 2
    assert took > 0.8, f"six calls of 0.3 s two at a time took only {took:.2f} s"


# ---------------------------------------------------------------------------------------- 3. errors


def test_a_host_call_error_in_the_handler_reaches_the_cell_with_its_message(scaffolded: Session) -> None:
    def refuse(payload: Any) -> Any:
        raise HostCallError(f"no, not {payload!r} ✗")

    assert run(scaffolded, outcome("call('refuse', 'that')"), HostCalls({"refuse": refuse})) == (
        "HostCallError",
        "no, not 'that' ✗",
    )
    # The class is reachable from the exception itself: a cell needs no import to name or catch it.
    code = (
        "try:\n    call('refuse', 1)\nexcept Exception as e:\n    caught = e\n"
        "try:\n    call('refuse', 2)\nexcept type(caught) as again:\n    second = str(again)\n"
        "type(caught).__name__, isinstance(caught, Exception), second"
    )
    assert run(scaffolded, code, HostCalls({"refuse": refuse})) == ("HostCallError", True, "no, not 2 ✗")


def test_any_other_handler_exception_names_the_handler_and_its_type(scaffolded: Session) -> None:
    def broken(payload: Any) -> Any:
        raise KeyError("missing-key")

    kind, message = run(scaffolded, outcome("call('broken', {})"), HostCalls({"broken": broken}))
    assert kind == "HostCallError"
    assert "'broken'" in message
    assert "KeyError" in message
    assert "missing-key" in message


def test_an_unknown_name_lists_the_accepted_ones(scaffolded: Session) -> None:
    calls = HostCalls({"echo": echo, "lookup": echo})
    kind, message = run(scaffolded, outcome("call('nosuch', 1)"), calls)
    assert kind == "HostCallError"
    assert "'nosuch'" in message
    assert "echo" in message and "lookup" in message


def test_a_cell_run_without_host_calls_gets_a_clear_error(scaffolded: Session) -> None:
    kind, message = run(scaffolded, outcome("ask('anyone?')"))
    assert kind == "HostCallError"
    assert "without host calls" in message
    # The same session answers once a cell is given handlers.
    assert run(scaffolded, outcome("ask('now')"), HostCalls({"echo": echo})) == ("ok", "now")


def test_a_payload_that_is_not_json_fails_in_the_sandbox(scaffolded: Session) -> None:
    seen = Peak()
    calls = HostCalls({"echo": seen})
    for payload in ("object()", "{1, 2}", "b'bytes'", "{'k': lambda: 1}", "{(1, 2): 'tuple key'}"):
        kind, message = run(scaffolded, outcome(f"call('echo', {payload})"), calls)
        assert kind == "HostCallError", payload
        assert "not JSON-serializable" in message, message
    assert seen.calls == 0, "the payloads never reached the host"


def test_a_payload_over_max_bytes_is_refused(scaffolded: Session) -> None:
    seen = Peak()
    calls = HostCalls({"echo": seen}, max_bytes=1000)
    kind, message = run(scaffolded, outcome("call('echo', 'x' * 2000)"), calls)
    assert kind == "HostCallError"
    assert "1000" in message and "limit" in message
    assert seen.calls == 0
    assert run(scaffolded, outcome("call('echo', 'x' * 900)"), calls) == ("ok", {"echo": "x" * 900})


def test_a_result_that_is_not_json_is_an_error(scaffolded: Session) -> None:
    calls = HostCalls({"set": lambda p: {1, 2}, "obj": lambda p: object()})
    for name in ("set", "obj"):
        kind, message = run(scaffolded, outcome(f"call({name!r}, None)"), calls)
        assert kind == "HostCallError"
        assert "not JSON-serializable" in message, message


def test_a_result_over_max_bytes_is_an_error(scaffolded: Session) -> None:
    calls = HostCalls({"big": lambda p: "y" * p}, max_bytes=1000)
    kind, message = run(scaffolded, outcome("call('big', 2000)"), calls)
    assert kind == "HostCallError"
    assert "1000" in message and "limit" in message
    assert run(scaffolded, outcome("len(call('big', 500))"), calls) == ("ok", 500)


def test_a_result_over_the_sandboxs_own_limit_is_an_error(scaffolded: Session) -> None:
    """The host allows more than the agent (16 MiB by default): the answer is refused by the controller."""
    limit = protocol.HOST_CALL_MAX_BYTES
    calls = HostCalls({"big": lambda p: "z" * p, "echo": echo}, max_bytes=2 * limit)
    kind, message = run(scaffolded, outcome(f"call('big', {limit + 100})"), calls)
    assert kind == "HostCallError"
    assert str(limit) in message and "limit" in message
    assert run(scaffolded, outcome("ask('still fine')"), calls) == ("ok", "still fine")


def test_a_handler_calling_back_into_its_own_session_fails_instead_of_deadlocking(
    orch: Orchestrator, scaffolded: Session, new_session: Callable[..., Session]
) -> None:
    other = new_session(orch)
    calls = HostCalls(
        {
            "same": lambda code: scaffolded.execute(code).return_value,
            "other": lambda code: other.execute(code).return_value,
        }
    )
    started = time.monotonic()
    kind, message = run(scaffolded, outcome("call('same', '1 + 1')"), calls, timeout=30)
    assert time.monotonic() - started < 10.0
    assert kind == "HostCallError"
    assert "ConfigError" in message and "called back into" in message, message
    assert run(scaffolded, outcome("call('other', '6 * 7')"), calls) == ("ok", "42"), "another session serves"


# ---------------------------------------------------------------------------------------- 4. time


def test_a_handler_past_the_call_timeout_is_answered_with_an_error(scaffolded: Session, gates: list[Gate]) -> None:
    stuck = gate(gates, hold=5.0)
    calls = HostCalls({"stuck": stuck, "echo": echo}, timeout=0.2)
    timed = "import time\n_t = time.monotonic()\n" + outcome("call('stuck', None)")
    code = timed + "[0], _got[1], time.monotonic() - _t"
    kind, message, took = run(scaffolded, code, calls)
    assert stuck.started.is_set()
    assert kind == "HostCallError"
    assert "'stuck'" in message and "0.2" in message
    assert took < 3.0, f"the sandbox waited {took:.2f} s for a call limited to 0.2 s"
    assert run(scaffolded, outcome("ask('after')"), calls) == ("ok", "after")


def test_a_call_waiting_for_a_slot_past_the_timeout_is_answered_with_an_error(
    scaffolded: Session, gates: list[Gate]
) -> None:
    """The second call waits behind a handler that holds the only slot for 5 s; its own time limit still holds."""
    stuck = gate(gates, hold=5.0)
    calls = HostCalls({"stuck": stuck}, timeout=0.5, max_concurrent=1)
    took, answers = run(scaffolded, THREADED.replace('call("slow", i)', 'call("stuck", i)').format(n=2), calls)
    messages = [message for _, message in answers]
    assert all("HostCallError" in m and "'stuck'" in m and "longer than 0.5 s" in m for m in messages), messages
    assert took < 3.0, f"two calls limited to 0.5 s took {took:.2f} s"


def test_max_concurrent_holds_while_handlers_past_their_timeout_still_run(
    scaffolded: Session, gates: list[Gate]
) -> None:
    stuck = gate(gates, hold=3.0)
    running = Peak(then=stuck)

    staggered = THREADED.replace('call("slow", i)', 'time.sleep(0.25 * i) or call("stuck", i)').format(n=4)
    answers = run(scaffolded, staggered, HostCalls({"stuck": running}, timeout=0.3, max_concurrent=1))[1]
    assert all("took longer" in message or "waited longer" in message for _, message in answers), answers
    assert running.peak <= 1, f"{running.peak} handlers ran at once with max_concurrent=1"


def test_a_call_timeout_in_the_sandbox(scaffolded: Session, gates: list[Gate]) -> None:
    stuck = gate(gates, hold=5.0)
    kind, message = run(scaffolded, outcome("call('stuck', None, timeout=0.3)"), HostCalls({"stuck": stuck}))
    assert kind == "HostCallError"
    assert "0.3" in message


def test_a_cell_timeout_during_a_host_call_keeps_the_state(scaffolded: Session, gates: list[Gate]) -> None:
    stuck = gate(gates, hold=10.0)
    calls = HostCalls({"stuck": stuck, "echo": echo})
    assert scaffolded.execute("before = 'kept'").ok
    started = time.monotonic()
    with pytest.raises(ExecutionTimeout) as info:
        scaffolded.execute("during = 'kept too'\ncall('stuck', None)\nafter = 'never'", timeout=1.0, host_calls=calls)
    assert time.monotonic() - started < 8.0
    assert stuck.started.is_set()
    assert info.value.restored is False, "the interrupt stopped the waiting cell; no restore was needed"
    assert run(scaffolded, "before, during, 'after' in globals()") == ("kept", "kept too", False)
    assert run(scaffolded, outcome("ask('next cell')"), calls) == ("ok", "next cell")
    assert {"before", "during"} <= set(scaffolded.variables)


# ---------------------------------------------------------------------------------------- 5. after the cell

LEFT_BEHIND = """
import threading, time
{var} = []
def _later():
    time.sleep({delay})
    try:
        {var}.append(('ok', call({name!r}, 'late')))
    except Exception as e:
        {var}.append((type(e).__name__, str(e)))
threading.Thread(target=_later, daemon=True).start()
"""


def test_a_call_from_a_thread_left_running_after_its_cell_gets_an_error(scaffolded: Session) -> None:
    seen = Peak()
    calls = HostCalls({"echo": seen})
    assert scaffolded.execute(LEFT_BEHIND.format(var="late", delay=0.3, name="echo"), host_calls=calls).ok
    time.sleep(1.5)  # the thread calls between cells
    ((kind, message),) = run(scaffolded, "late", calls)
    assert kind == "HostCallError"
    assert "no cell is running" in message
    assert seen.calls == 0, "the call never reached the host"
    assert run(scaffolded, outcome("ask('fine')"), HostCalls({"echo": echo})) == ("ok", "fine")


def test_a_handler_that_finishes_after_its_cell_does_not_reach_a_later_cell(
    scaffolded: Session, gates: list[Gate]
) -> None:
    slow = gate(gates, result="LATE-RESULT", hold=1.5)
    calls = HostCalls({"slow": slow, "echo": echo})
    result = scaffolded.execute(
        LEFT_BEHIND.format(var="late", delay=0, name="slow") + "time.sleep(0.5)", host_calls=calls
    )
    assert result.ok, result
    assert slow.started.is_set(), "the call was in flight when its cell ended"
    assert not slow.finished.is_set()
    # The next cell runs while the handler finishes: its answer is dropped, not given to this cell.
    code = "time.sleep(2.0)\nlist(late), ask('fresh'), [ask(i) for i in range(3)]"
    late, fresh, more = run(scaffolded, code, calls)
    assert slow.finished.is_set(), "the handler finished while the later cell ran"
    assert late == [("HostCallError", ENDED)]
    assert (fresh, more) == ("fresh", [0, 1, 2])
    again = scaffolded.execute("list(late)", host_calls=calls)
    assert "LATE-RESULT" not in (again.return_value or "") + again.stdout + again.stderr


def test_a_thread_left_by_one_cell_calling_during_the_next_cell_is_served_by_that_cell(scaffolded: Session) -> None:
    """docs/protocol.md: the link carries no thread identity; a call made while a cell runs is that cell's."""
    seen = Peak()
    calls = HostCalls({"echo": seen})
    code = (
        "import threading\ngo = threading.Event()\nfrom_before = []\n"
        "def _later():\n    go.wait(30)\n    try:\n        from_before.append(('ok', call('echo', 'stale')))\n"
        "    except Exception as e:\n        from_before.append((type(e).__name__, str(e)))\n"
        "threading.Thread(target=_later, daemon=True).start()\n"
    )
    assert scaffolded.execute(code, host_calls=calls).ok
    later = "import time\ngo.set()\n_t = time.monotonic()\nwhile not from_before and time.monotonic() - _t < 5:\n"
    later += "    time.sleep(0.05)\nfrom_before"
    ((kind, _),) = run(scaffolded, later, calls)
    assert kind == "ok"
    assert seen.calls == 1


SLOW_TO_PICKLE = """
class Slow:
    def __reduce__(self):
        import time
        time.sleep(1.0)
        return (int, ())
slow = Slow()
"""


def test_a_call_made_while_the_checkpoint_runs_gets_an_error(scaffolded: Session) -> None:
    """A thread of the cell calls after the cell ended, while the worker pickles a slow value."""
    seen = Peak()
    calls = HostCalls({"echo": seen})
    code = SLOW_TO_PICKLE + LEFT_BEHIND.format(var="late", delay=0.3, name="echo")
    result = scaffolded.execute(code, host_calls=calls)
    assert result.ok, result
    assert result.checkpoint_duration > 0.5, "the checkpoint ran while the thread called"
    ((kind, message),) = run(scaffolded, "del slow\nlate", calls)
    assert (kind, message) == ("HostCallError", ENDED)
    assert seen.calls == 0


# ---------------------------------------------------------------------------------------- 6. container killed


def test_container_killed_during_a_host_call(orch: Orchestrator, scaffolded: Session, gates: list[Gate]) -> None:
    assert scaffolded.execute("kept = [1, 2, 3]").ok
    old = scaffolded.container_id
    stuck = gate(gates, hold=15.0)

    def kill_then_hang(payload: Any) -> Any:
        kill_and_wait(orch, old)
        return stuck(payload)

    calls = HostCalls({"kill": kill_then_hang, "echo": echo})
    started = time.monotonic()
    with pytest.raises(SandboxError) as info:
        scaffolded.execute("kept.append('lost')\ncall('kill', None)", timeout=30, host_calls=calls)
    took = time.monotonic() - started
    assert isinstance(info.value, SandboxCrashed), f"{type(info.value).__name__}: {info.value}"
    assert info.value.restored is True
    assert took < 12.0, f"the death was seen after {took:.1f} s"
    assert not stuck.finished.is_set(), "the call did not wait for the handler"
    assert scaffolded.container_id not in (None, old)
    assert run(scaffolded, outcome("ask('new container')") + "[1], kept", calls) == ("new container", [1, 2, 3])


# ---------------------------------------------------------------------------------------- 7. the scaffold


def test_before_cell_runs_before_every_cell_and_after_cell_is_the_result(scaffolded: Session) -> None:
    calls = HostCalls({"echo": echo})
    first = scaffolded.execute("ask = 'overwritten'\nother = 1", host_calls=calls)
    assert first.ok
    assert first.scaffold == {"cells": 1, "ask_is_ours": False}
    second = scaffolded.execute(outcome("ask('restored')"), host_calls=calls)
    assert ast.literal_eval(second.return_value or "") == ("ok", "restored")
    assert second.scaffold == {"cells": 2, "ask_is_ours": True}
    third = scaffolded.execute("1 / 0")
    assert third.error is not None and third.error.type == "ZeroDivisionError"
    assert third.scaffold == {"cells": 3, "ask_is_ours": True}, "after_cell runs after a cell that raised too"


def test_scaffold_names_are_never_checkpointed(scaffolded: Session) -> None:
    assert scaffolded.execute("x = 1").ok
    assert "x" in scaffolded.variables
    assert not set(NAMES) & set(scaffolded.variables)
    assert scaffolded.execute("ask = [1, 2, 3]\ncall = 'mine'\ny = 2").ok
    assert {"x", "y"} <= set(scaffolded.variables)
    assert not set(NAMES) & set(scaffolded.variables), "names the scaffold owns stay out even when a cell set them"


FAILING_HOOKS = """
_before, _after = before_cell, after_cell

def before_cell(ns):
    _before(ns)
    if ns.get("fail_before"):
        raise ValueError("before broke")

def after_cell(ns):
    if ns.get("fail_after"):
        raise LookupError("after broke")
    if ns.get("odd_after"):
        return {"not json": object()}
    return _after(ns)
"""


def test_a_failing_hook_is_reported_in_stderr_and_the_cell_still_runs(session: Session) -> None:
    scaffold = SCAFFOLD + FAILING_HOOKS
    session.set_scaffold(scaffold, names=NAMES)
    calls = HostCalls({"echo": echo})
    result = session.execute("fail_before = True\n'ran'", host_calls=calls)
    assert result.return_value == "'ran'"
    result = session.execute("'ran too', ask('still there')", host_calls=calls)
    assert result.return_value == "('ran too', 'still there')"
    assert "before_cell" in result.stderr and "ValueError: before broke" in result.stderr
    assert result.scaffold == {"cells": 2, "ask_is_ours": True}
    assert session.execute("fail_before = False").ok  # its before_cell still saw fail_before set
    result = session.execute("fail_after = True\n'after'", host_calls=calls)
    assert result.return_value == "'after'"
    assert "after_cell" in result.stderr and "LookupError: after broke" in result.stderr
    assert "before_cell" not in result.stderr
    assert result.scaffold is None
    result = session.execute("fail_after = False\nodd_after = True\n'odd'", host_calls=calls)
    assert result.return_value == "'odd'"
    assert "after_cell" in result.stderr, "a result that is not JSON is reported too"
    assert result.scaffold is None
    assert session.execute("odd_after = False").scaffold == {"cells": 6, "ask_is_ours": True}


def test_a_scaffold_that_raises_is_a_config_error_and_the_session_goes_on(session: Session) -> None:
    assert session.execute("kept = 'yes'").ok
    with pytest.raises(ConfigError, match="ZeroDivisionError"):
        session.set_scaffold("x = 1\n1 / 0\n", names=["x"])
    assert run(session, "kept, 'host_call' in globals(), 'x' in globals()") == ("yes", False, False)
    assert session.execute("1").scaffold is None


def test_a_scaffold_that_raises_leaves_the_previous_one(scaffolded: Session) -> None:
    assert scaffolded.execute("kept = 'yes'").ok
    with pytest.raises(ConfigError, match="ZeroDivisionError"):
        scaffolded.set_scaffold("def before_cell(ns):\n    ns['ask'] = None\n1 / 0\n", names=NAMES)
    calls = HostCalls({"echo": echo})
    assert run(scaffolded, outcome("ask('previous')") + "[1], kept", calls) == ("previous", "yes")


def test_scaffold_names_must_be_identifiers(session: Session) -> None:
    bad_names: list[list[Any]] = [["not ok"], ["1st"], [""], [3]]
    for names in bad_names:
        with pytest.raises(ConfigError):
            session.set_scaffold("pass", names=names)
    with pytest.raises(ConfigError):
        session.set_scaffold(b"pass")  # type: ignore[arg-type]
    assert session.execute("1 + 1").return_value == "2"


def test_the_scaffold_is_reinstalled_after_a_worker_crash(scaffolded: Session) -> None:
    calls = HostCalls({"echo": echo})
    assert scaffolded.execute("kept = 41").ok
    with pytest.raises(SandboxCrashed):
        scaffolded.execute("import os\nos._exit(1)", host_calls=calls)
    result = scaffolded.execute(outcome("ask('back')") + "[1], kept + 1", host_calls=calls)
    assert ast.literal_eval(result.return_value or "") == ("back", 42)
    assert result.scaffold == {"cells": 1, "ask_is_ours": True}, "a fresh worker, with the scaffold run again"


def test_the_scaffold_is_reinstalled_after_a_container_kill(orch: Orchestrator, scaffolded: Session) -> None:
    calls = HostCalls({"echo": echo})
    assert scaffolded.execute("kept = 41").ok
    old = scaffolded.container_id
    kill_and_wait(orch, old)
    result = scaffolded.execute(outcome("ask('back')") + "[1], kept + 1", host_calls=calls)
    assert ast.literal_eval(result.return_value or "") == ("back", 42)
    assert result.scaffold == {"cells": 1, "ask_is_ours": True}
    assert scaffolded.container_id not in (None, old)


# ---------------------------------------------------------------------------------------- 8. a hostile cell

# The worker's end of the host-call link its calls and output go on now: its data channel's own link (K,
# docs/design/one-hop.md).
CALL_FD = "next(o for o in __import__('gc').get_objects() if type(o).__name__ == 'Worker').calls._sock.fileno()"


def assert_link_closed_then_healed(session: Session, hostile: str, *, warm: bool = True) -> None:
    """Cell code writes ``hostile`` on the call link; ``warm``: a call was made before (its reply reader runs)."""
    calls = HostCalls({"echo": echo})
    if warm:
        assert run(session, outcome("ask('before')"), calls) == ("ok", "before")
    assert session.execute("kept = 41").ok
    container = session.container_id
    started = time.monotonic()
    result = session.execute(f"import os\nos.write({CALL_FD}, {hostile})\n'written'", host_calls=calls, timeout=30)
    assert result.return_value == "'written'", result
    assert time.monotonic() - started < 5.0, "the bad frame stalled the cell"
    time.sleep(0.2)
    for _ in range(2):
        kind, message = run(session, outcome("ask('after')"), calls)
        assert kind == "HostCallError", message
        assert "unavailable" in message or "could not be sent" in message, message
    assert run(session, "kept + 1") == 42, "the session itself goes on"
    assert session.container_id == container, "only the link closed; the sandbox was not recycled"
    with pytest.raises(SandboxCrashed):
        session.execute("import os\nos._exit(1)")
    assert run(session, outcome("ask('healed')") + "[1], kept + 1", calls) == ("healed", 42)


@pytest.mark.parametrize("warm", [True, False], ids=["after-a-call", "before-any-call"])
def test_garbage_on_the_call_link_closes_it_until_the_next_worker(scaffolded: Session, warm: bool) -> None:
    assert_link_closed_then_healed(scaffolded, "b'\\x00garbage, not a frame\\xff' * 64", warm=warm)


def test_a_host_call_frame_declaring_a_huge_body_closes_the_link(scaffolded: Session) -> None:
    header = json.dumps({"type": "host_call", "call": 1, "name": "echo"}).encode()
    frame = struct.pack("!4sII", b"ORC1", len(header), 0xFFFFFFF0) + header
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert_link_closed_then_healed(scaffolded, repr(frame))
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 200, f"the controller's peak memory grew by {grown_mib:.0f} MiB"


def test_a_host_call_frame_declaring_a_huge_header_closes_the_link(scaffolded: Session) -> None:
    frame = struct.pack("!4sII", b"ORC1", 0x7FFFFFFF, 0) + b"{"
    assert_link_closed_then_healed(scaffolded, repr(frame))


FORGED_BETWEEN_CELLS = """
import json, os, struct, threading, time
forged = []
def _forge(fd):
    time.sleep(0.3)
    head = json.dumps({'type': 'host_call', 'call': 10 ** 6, 'name': 'echo'}).encode()
    os.write(fd, struct.pack('!4sII', b'ORC1', len(head), 4) + head + b'null')
    forged.append(os.read(fd, 4096))  # no call was made: no reader of the worker's takes the answer
threading.Thread(target=_forge, args=(%s,), daemon=True).start()
"""


def test_a_call_forged_on_the_link_between_cells_is_answered_and_nothing_else_happens(scaffolded: Session) -> None:
    """Cell code bypasses the worker's own refusal and writes a call on the link after its cell ended: it is
    answered by the controller before the next call, never served, and the session, its worker and its link go on."""
    seen = Peak()
    calls = HostCalls({"echo": seen})
    assert scaffolded.execute(FORGED_BETWEEN_CELLS % CALL_FD + "kept = 41", host_calls=calls).ok
    container = scaffolded.container_id
    time.sleep(1.0)  # the thread writes between cells
    waited = "import time\n_t = time.monotonic()\nwhile not forged and time.monotonic() - _t < 10:\n"
    answer = run(scaffolded, waited + "    time.sleep(0.01)\nforged[0].decode('utf-8', 'replace')", calls)
    assert protocol.CALL_NO_CELL in answer, answer
    assert seen.calls == 0, "the forged call never reached a handler"
    assert run(scaffolded, outcome("ask('after')") + "[1], kept + 1", HostCalls({"echo": echo})) == ("after", 42)
    assert scaffolded.container_id == container


FLOOD = """
import json, os, struct, threading
def _flood(fd):
    head = json.dumps({'type': 'host_call', 'call': 1, 'name': 'echo'}).encode()
    frame = struct.pack('!4sII', b'ORC1', len(head), 4) + head + b'null'
    try:
        while True:
            os.write(fd, frame * 64)
    except OSError:
        pass
threading.Thread(target=_flood, args=(%s,), daemon=True).start()
"""


def test_a_flood_of_calls_whose_answers_are_never_read_closes_the_link(scaffolded: Session) -> None:
    """Cell code sends calls on the link for ever and reads no answer (no call was made, so no reader runs): the
    link closes and the session goes on (the controller reads no call while answers wait, and the cell's end finds
    them never taken)."""
    calls = HostCalls({"echo": echo})
    assert scaffolded.execute("kept = 41").ok
    container = scaffolded.container_id
    before = resident_bytes()
    result = scaffolded.execute(FLOOD % CALL_FD + "import time\ntime.sleep(0.5)\n'flooding'", host_calls=calls)
    assert result.return_value == "'flooding'", result
    kind, message = run(scaffolded, outcome("ask('after')"), calls)
    assert kind == "HostCallError", message
    assert "unavailable" in message or "could not be sent" in message, message
    grown_mib = (resident_bytes() - before) / (1 << 20)
    assert grown_mib < 64, f"the flood grew the controller by {grown_mib:.0f} MiB"
    assert run(scaffolded, "kept + 1") == 42
    assert scaffolded.container_id == container, "only the link closed; the sandbox was not recycled"


TRICKLE = """
import os, struct, threading, time
def _trickle(fd):
    for byte in struct.pack('!4sII', b'ORC1', 40, 0) + b' ' * 1000:
        os.write(fd, bytes([byte]))
        time.sleep(0.3)
threading.Thread(target=_trickle, args=(%s,), daemon=True).start()
time.sleep(60)
"""


def test_a_frame_trickled_on_the_call_link_does_not_stop_the_cells_timeout(
    settings: Settings,
    settings_for: Callable[..., Settings],
    make_orch: Callable[[Settings], Orchestrator],
    new_session: Callable[..., Session],
) -> None:
    s = new_session(make_orch(settings_for(timeouts=settings.timeouts.replace(frame=1.0, reply_margin=3.0))))
    s.set_scaffold(SCAFFOLD, names=NAMES)
    assert s.execute("kept = 41").ok
    container = s.container_id
    with pytest.raises(ExecutionTimeout) as info:  # the control: these settings stop a plain sleep by interrupt
        s.execute("import time\ntime.sleep(60)", timeout=2.0, host_calls=HostCalls({"echo": echo}))
    assert info.value.restored is False
    started = time.monotonic()
    with pytest.raises(ExecutionTimeout) as info:
        s.execute(TRICKLE % CALL_FD, timeout=2.0, host_calls=HostCalls({"echo": echo}))
    took = time.monotonic() - started
    assert info.value.restored is False, f"the supervisor's interrupt did not stop the cell ({info.value})"
    assert took < 6.0
    assert s.container_id == container
    assert run(s, "kept + 1") == 42


def resident_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize()


def test_calls_the_sandbox_gave_up_on_do_not_pile_up_on_the_host(scaffolded: Session, gates: list[Gate]) -> None:
    stuck = gate(gates, hold=10.0)
    baseline = resident_bytes()
    peak = [baseline]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            peak[0] = max(peak[0], resident_bytes())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    code = (
        "p = 'x' * (4 << 20)\ngave_up = 0\nfor i in range(60):\n"
        "    try:\n        call('stuck', p, timeout=0.005)\n    except Exception:\n        gave_up += 1\n"
        "del p\ngave_up"
    )
    try:
        assert run(scaffolded, code, HostCalls({"stuck": stuck}, max_concurrent=1), timeout=60) == 60
    finally:
        done.set()
        sampler.join()
    grown_mib = (peak[0] - baseline) / (1 << 20)
    assert grown_mib < 64, f"60 abandoned calls of 4 MiB grew the controller by {grown_mib:.0f} MiB"


# ---------------------------------------------------------------------------------------- 9. set_value


def test_set_value_stores_values_that_survive_a_container_kill(orch: Orchestrator, session: Session) -> None:
    limits: list[Any] = [1, 2, {"deep": None}]
    config = {"model": "m-1", "limits": limits, "ratio": 0.5}
    items: list[Any] = ["a", 1, [2.5, None]]
    session.set_value("text", "héllo ✓ 𝄞", aliases=["text_alias"])
    session.set_value("raw", b"\x00\xff binary")
    session.set_value("config", config, aliases=["cfg"])
    session.set_value("items", items)
    limits.append("changed on the host")  # the sandbox holds a copy
    items.clear()
    expected = (
        "héllo ✓ 𝄞",
        "héllo ✓ 𝄞",
        b"\x00\xff binary",
        {"model": "m-1", "limits": [1, 2, {"deep": None}], "ratio": 0.5},
        {"model": "m-1", "limits": [1, 2, {"deep": None}], "ratio": 0.5},
        ["a", 1, [2.5, None]],
    )
    check = "text, text_alias, raw, config, cfg, items"
    assert run(session, check) == expected
    assert {"text", "text_alias", "raw", "config", "cfg", "items"} <= set(session.variables)
    assert run(session, "type(raw).__name__, type(config).__name__, type(items).__name__") == ("bytes", "dict", "list")
    old = session.container_id
    kill_and_wait(orch, old)
    assert run(session, check) == expected
    assert session.container_id not in (None, old)


def test_set_value_rejects_bad_names_and_payloads(session: Session) -> None:
    for name, aliases in (("1abc", ()), ("a-b", ()), ("", ()), ("ok", ("not ok",)), ("ok", ("",))):
        with pytest.raises(ConfigError):
            session.set_value(name, "v", aliases=aliases)
    with pytest.raises(ConfigError):
        session.set_value(5, "v")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        session.set_value("bad", {1, 2})  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        session.set_value("bad", {"k": object()})
    assert run(session, "[n for n in ('ok', 'bad', 'a') if n in globals()]") == []
    assert not {"ok", "bad"} & set(session.variables)


def test_set_value_replaces_a_value_and_is_seen_by_the_next_cell(session: Session) -> None:
    session.set_value("v", [1])
    assert run(session, "v.append(2); v") == [1, 2]
    session.set_value("v", "now a str")
    assert run(session, "v") == "now a str"
