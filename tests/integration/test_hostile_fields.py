"""A sandbox that lies in every field of its replies: a typed error, the session usable, nothing acknowledged lost.

Cell code writes a reply of its own on the socket its worker replies on (the controller's data channel D) with the
id of the running request, both of which it digs out of the worker's stack: the controller gets it as the worker's
answer (docs/trust.md, "What the host checks"). A lie the JSON can carry (a negative size, a huge duration, 20,000
names for one blob, a name the store could not read back) reaches the controller's validation; one strict JSON cannot
carry (NaN, a key twice, an integer of 5,000 digits, deep nesting) is refused by the controller's strict parser.
An honest cell that makes names the checkpoint cannot hold gets them in ``unsaved``, never an error.
"""

from __future__ import annotations

import json
import time
import tracemalloc

import pytest
from support import kill_and_wait

from orchestrator import (
    CheckpointLimitExceeded,
    CheckpointQuotaExceeded,
    ConfigError,
    Orchestrator,
    ProtocolError,
    Session,
)
from orchestrator.agent import checkpoint_names

pytestmark = pytest.mark.docker

STATE = "kept = {'a': 1}\nname = 'x' * 1000\n"

FORGE = """\
import sys, os, struct, json, time
frame = sys._getframe()
while frame.f_code.co_name != 'handle':
    frame = frame.f_back
fd = frame.f_locals['self'].sock.fileno()
rid = frame.f_locals['header']['id']
reply = {
    'type': 'exec_reply', 'id': rid, 'status': 'ok', 'stdout': 'forged', 'stderr': '', 'stdout_bytes': 6,
    'stderr_bytes': 0, 'return_value': None, 'error': None, 'duration': 0.0, 'checkpoint_duration': 0.0,
    'checkpoint': {'generation': GENERATION, 'blobs': [], 'vars': {}, 'deleted': [], 'unsaved': {}},
}
CHANGES
head = json.dumps(reply).encode()
EDIT
os.write(fd, struct.pack('!4sII', b'ORC1', len(head), 0) + head)
time.sleep(0.3)
"""


def forge(session: Session, changes: str, edit: str = "", next_generation: bool = False) -> str:
    """Cell code that sends a forged ``exec_reply``: ``changes`` edit the dict ``reply``, ``edit`` its bytes."""
    generation = session.generation + (1 if next_generation else 0)
    return "lost = 1\n" + FORGE.replace("GENERATION", str(generation)).replace("CHANGES", changes).replace("EDIT", edit)


@pytest.fixture
def stateful(session: Session) -> Session:
    assert session.execute(STATE).ok
    return session


def assert_intact(session: Session, generation: int, variables: list[str]) -> None:
    """The next call works on exactly what was stored before the hostile one."""
    assert session.generation == generation
    assert session.variables == variables
    result = session.execute("kept['a'] += 1\nkept, len(name), 'lost' in globals()")
    assert result.return_value == "({'a': 2}, 1000, False)", result


LIES = {
    "negative-duration": "reply['duration'] = -1.0",
    "endless-duration": "reply['checkpoint_duration'] = 1e300",
    "negative-size": "reply['stdout_bytes'] = -5",
    "bool-size": "reply['stderr_bytes'] = True",
    "negative-generation": "reply['checkpoint']['generation'] = -1",
    "negative-blob-size": "reply['checkpoint']['blobs'] = [{'digest': 'a' * 32, 'size': -8}]",
    "huge-unsaved": "reply['checkpoint']['unsaved'] = {'v%d' % i: 'r' for i in range(5000)}",
    "long-reason": "reply['checkpoint']['unsaved'] = {'v': 'r' * 100_000}",
    "line-number": "reply['status'] = 'error'\nreply['error'] = {'ename': 'E', 'evalue': '', 'snippet': '', "
    "'traceback': '', 'line': -3}",
}


@pytest.mark.parametrize("lie", list(LIES.values()), ids=list(LIES))
def test_a_lie_in_a_reply_field_is_a_protocol_error(stateful: Session, lie: str) -> None:
    generation, variables = stateful.generation, stateful.variables
    with pytest.raises(ProtocolError) as info:
        stateful.execute(forge(stateful, lie))
    assert info.value.restored is True
    assert not isinstance(info.value, CheckpointQuotaExceeded)
    assert_intact(stateful, generation, variables)


NOT_STRICT = {
    "nan": ("", "head = head.replace(b'\"duration\": 0.0', b'\"duration\": NaN')"),
    "infinity": ("", "head = head.replace(b'\"duration\": 0.0', b'\"duration\": Infinity')"),
    "huge-float": ("", "head = head.replace(b'\"duration\": 0.0', b'\"duration\": 1e999')"),
    "key-twice": ("", 'head = head[:-1] + b\', "status": "error"}\''),
    "int-digits": ("", "head = head[:-1] + b', \"n\": ' + b'9' * 5000 + b'}'"),
    "deep": ("reply['x'] = json.loads('[' * 40 + ']' * 40)", ""),
}


@pytest.mark.parametrize("changes,edit", list(NOT_STRICT.values()), ids=list(NOT_STRICT))
def test_what_strict_json_cannot_carry_is_a_protocol_error(stateful: Session, changes: str, edit: str) -> None:
    generation, variables = stateful.generation, stateful.variables
    container = stateful.container_id
    with pytest.raises(ProtocolError, match="restored") as info:
        stateful.execute(forge(stateful, changes, edit))
    assert info.value.restored is True
    assert stateful.container_id == container, "the supervisor refused it and replaced its worker"
    assert_intact(stateful, generation, variables)


def test_a_reported_duration_is_never_longer_than_the_host_measured(stateful: Session) -> None:
    """A reply that passes every check but claims the cell ran for days: the result says what the host saw."""
    started = time.monotonic()
    result = stateful.execute(forge(stateful, "reply['duration'] = 9e6\nreply['checkpoint_duration'] = 9e6"))
    took = time.monotonic() - started
    assert result.stdout == "forged"
    assert 0 <= result.duration <= took and 0 <= result.checkpoint_duration <= took


def digest_of(session: Session, name: str) -> str:
    return session._ledger.record.variables[name]


def test_twenty_thousand_names_for_one_blob_are_refused_and_nothing_grows(stateful: Session) -> None:
    """Names count against the manifest's bound: the delta is refused, typed, and the record stays as it was."""
    generation, variables = stateful.generation, stateful.variables
    digest = digest_of(stateful, "kept")
    lie = f"reply['checkpoint']['vars'] = {{'v%d' % i: {digest!r} for i in range(20_000)}}"
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointLimitExceeded) as info:
            stateful.execute(forge(stateful, lie, next_generation=True))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    error = info.value
    assert isinstance(error, CheckpointQuotaExceeded) and isinstance(error, ProtocolError)
    assert error.restored is True and (error.unit, error.quota) == ("names", checkpoint_names.MAX_CHECKPOINT_NAMES)
    assert error.held == 20_000 + len(variables)
    assert peak < 64 << 20, f"the controller held {peak} B for a refused delta"
    assert len(stateful._ledger.record.variables) == len(variables)
    assert_intact(stateful, generation, variables)


@pytest.mark.parametrize(
    "name",
    ["'evil\\x1b]52;c;aGk=\\x07'", "'x' * 10_000", "'a b'", "'ghost/x'", "'/x'"],
    ids=["control-characters", "10-KB", "not-an-identifier", "unknown-context", "empty-context"],
)
def test_a_name_the_store_could_not_read_back_is_refused_before_commit(stateful: Session, name: str) -> None:
    generation, variables = stateful.generation, stateful.variables
    digest = digest_of(stateful, "kept")
    lie = f"reply['checkpoint']['vars'] = {{{name}: {digest!r}, 'fine': {digest!r}}}"
    with pytest.raises(ProtocolError) as info:
        stateful.execute(forge(stateful, lie, next_generation=True))
    assert info.value.restored is True
    assert_intact(stateful, generation, variables)
    stateful._ledger.store.load(stateful.id)  # the record reads back


def test_an_honest_cell_with_names_the_checkpoint_cannot_hold_gets_unsaved(
    orch: Orchestrator, stateful: Session
) -> None:
    """Control characters, 10 KB, not identifiers, not a str: named in ``unsaved``, the rest saved and restorable."""
    code = "g = globals()\ng['esc\\x1b[2J'] = 1\ng['y' * 10_000] = 2\ng['a b'] = 3\ng[7] = 4\ngood = 5\n"
    result = stateful.execute(code)
    assert result.ok, result.error
    assert "good" in stateful.variables
    assert result.unsaved["esc\x1b[2J"] == "the name is not a Python identifier"
    assert result.unsaved["a b"] == "the name is not a Python identifier"
    assert result.unsaved["7"] == "the name is not a str"
    assert result.unsaved["y" * checkpoint_names.MAX_NAME_CHARS + "..."].startswith("the name is longer than")
    kill_and_wait(orch, stateful.container_id)
    restored = stateful.execute("good, kept, len(name)")
    assert restored.return_value == "(5, {'a': 1}, 1000)" and restored.restore_failures == {}


def test_a_million_names_for_one_value_are_saved_up_to_the_bound_and_the_rest_named(session: Session) -> None:
    """An honest session past the manifest's bound gets ``unsaved`` (a bounded list), never an error."""
    result = session.execute("globals().update({'v%d' % i: 0 for i in range(1_000_000)})\nkept = 1", timeout=120)
    assert result.ok, result.error
    variables = session.variables
    assert len(variables) == checkpoint_names.MAX_CHECKPOINT_NAMES
    assert len(result.unsaved) == checkpoint_names.MAX_UNSAVED_NAMES
    summary = [key for key in result.unsaved if key.startswith("+")]
    assert len(summary) == 1 and "more names were not saved" in result.unsaved[summary[0]]
    listed = [reason for key, reason in result.unsaved.items() if not key.startswith("+")]
    assert all("at most" in reason and "names" in reason for reason in listed)
    # The session goes on: deleting names makes room, and the checkpoint stays within the bound.
    after = session.execute("for i in range(1_000_000): del globals()['v%d' % i]\ndel i\nkept += 1\nkept", timeout=120)
    assert after.return_value == "2" and after.unsaved == {}
    assert session.variables == ["kept"]
    record = json.loads((session._ledger.store.root / session.id / "meta.json").read_text())
    assert list(record["variables"]) == ["kept"]


@pytest.mark.parametrize("timeout", [float("inf"), float("nan"), 0, -1])
def test_a_call_without_a_finite_deadline_is_refused(stateful: Session, timeout: float) -> None:
    with pytest.raises(ConfigError, match="finite"):
        stateful.execute("1", timeout=timeout)
    assert stateful.execute("kept").return_value == "{'a': 1}"
