"""Restore cannot be poisoned by one bad value, and fits in the sandbox's memory.

A value whose *unpickling* raises, exits the interpreter or sleeps for ever is skipped and named
(in ``ExecResult.restore_failures`` and ``Session.restore_failures``); every other value comes
back and the session keeps working. The bad values are dropped from the checkpoint, so a later
restore does not meet them again. A session holding a large share of its memory limit can be
restored after a kill.
"""

from __future__ import annotations

import time

import pytest
from support import kill_and_wait

pytestmark = pytest.mark.docker

# Each bad class is bound under its own name, so dill pickles it by value; each instance pickles
# to a call that misbehaves only when it is *unpickled* (the pickling itself succeeds).
POISON = """\
import os, time
class Exits:
    def __reduce__(self):
        return (os._exit, (3,))
class Raises:
    def __reduce__(self):
        return (int, ('not a number',))
class Sleeps:
    def __reduce__(self):
        return (time.sleep, (3600,))
exits, raises, sleeps = Exits(), Raises(), Sleeps()
"""
GOOD = """\
good = {'a': [1, 2, 3]}
text = 'kept'
def total():
    return sum(good['a'])
class Point:
    def __init__(self, x):
        self.x = x
point = Point(5)
"""
CHECK = "good, text, total(), point.x, isinstance(point, Point)"
EXPECTED = "({'a': [1, 2, 3]}, 'kept', 6, 5, True)"
BAD = {"exits", "raises", "sleeps"}


def test_bad_values_are_skipped_named_and_dropped(make_orch, settings, settings_for, new_session) -> None:
    """Kill the container: the next call restores the good values, names the three bad ones, and runs.

    Restore has a time limit per value (``restore_value_timeout``), so the sleeping value costs about
    that long, not for ever. The names are reported on the result of the call that restored and on the
    session; they are gone from the namespace and from the checkpoint, so the next kill restores
    without meeting them again.
    """
    settings = settings_for(timeouts=settings.timeouts.replace(restore_value=2.0, interrupt_grace=1.0))
    orch = make_orch(settings)
    s = new_session(orch)
    first = s.execute(GOOD + POISON)
    assert first.error is None, first.error
    assert not set(first.unsaved) & BAD, f"pickling must succeed: {first.unsaved}"
    assert set(s.variables) >= BAD

    kill_and_wait(orch, s.container_id)
    started = time.monotonic()
    result = s.execute(CHECK + ", [n for n in ('exits', 'raises', 'sleeps') if n in globals()]")
    took = time.monotonic() - started
    assert result.error is None, result.error
    assert result.return_value == EXPECTED[:-1] + ", [])"
    assert set(result.restore_failures) == BAD, result.restore_failures
    assert all(isinstance(reason, str) and reason for reason in result.restore_failures.values())
    assert set(s.restore_failures) == BAD
    assert not BAD & set(s.variables), "the bad values are dropped from the checkpoint"
    assert {"good", "text", "total", "point", "Point", "Exits", "Raises", "Sleeps"} <= set(s.variables)
    assert took < 30, f"restore took {took:.1f} s"

    # The session goes on; a later restore does not meet the bad values again.
    assert s.execute("good['a'].append(4)").ok
    kill_and_wait(orch, s.container_id)
    started = time.monotonic()
    again = s.execute(CHECK)
    assert again.return_value == "({'a': [1, 2, 3, 4]}, 'kept', 10, 5, True)"
    assert again.restore_failures == {}
    assert s.restore_failures == {}
    assert time.monotonic() - started < 15


def test_a_bad_value_found_when_attaching_is_reported_and_skipped(
    make_orch, settings, settings_for, new_session
) -> None:
    """A restore through ``attach`` (no container left) skips the bad value too and says so on the session."""
    settings = settings_for(timeouts=settings.timeouts.replace(restore_value=2.0, interrupt_grace=1.0))
    orch = make_orch(settings)
    s = new_session(orch)
    assert s.execute(
        GOOD + "import os\nclass Exits:\n    def __reduce__(self):\n        return (os._exit, (3,))\nexits = Exits()"
    ).ok
    container = s.container_id
    assert container is not None
    s.detach()
    orch.backend.remove(container)
    s2 = make_orch(settings).attach(s.id)
    try:
        assert set(s2.restore_failures) == {"exits"}
        assert s2.execute(CHECK).return_value == EXPECTED
    finally:
        s2.close()


def test_a_session_near_its_memory_limit_is_restored(make_orch, settings, settings_for, new_session) -> None:
    """150 MB of state in a 512 MiB sandbox: checkpointed, killed, restored (restore holds no extra copies)."""
    orch = make_orch(settings_for(limits=settings.limits.replace(memory="512m")))
    s = new_session(orch)
    result = s.execute("big = 'x' * 150_000_000\nsmall = [1, 2]", timeout=120)
    assert result.error is None and "big" not in result.unsaved, result
    assert "big" in s.variables
    kill_and_wait(orch, s.container_id)
    result = s.execute("len(big), big[-1], small", timeout=120)
    assert result.return_value == "(150000000, 'x', [1, 2])"
    assert result.restore_failures == {}
    # Still room to work after the restore.
    assert s.execute("small.append(3)\nlen(small)").return_value == "3"


def _damage(orch, s, size: int) -> None:
    s.execute(f"damaged = bytearray(b'd' * {size})\nkept = [1, 2, 3]")
    path = orch.store.blob_path(s.id, orch.store.load(s.id).variables["damaged"])
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a flipped byte in the middle: still a pickle, with other content
    path.write_bytes(bytes(data))
    kill_and_wait(orch, s.container_id)


def test_a_damaged_blob_file_is_reported_and_skipped(orch, new_session) -> None:
    """The controller checks each stored blob against its digest as it sends it (the agent then need not): a blob
    file damaged on disk is named in ``restore_failures`` and dropped, and everything else comes back."""
    s = new_session(orch)
    _damage(orch, s, 100)
    result = s.execute("kept, 'damaged' in globals()")
    assert result.return_value == "([1, 2, 3], False)"
    assert set(result.restore_failures) == {"damaged"}
    assert "damaged" in result.restore_failures["damaged"]
    assert "damaged" not in s.variables


def test_a_damaged_deferred_blob_fails_at_its_first_use(orch, new_session) -> None:
    """A blob of 1 MiB or more is deferred (loaded on first use): its damage shows at that use, by name, and the
    value leaves the session; the restore itself and a call that does not use it go on."""
    s = new_session(orch)
    _damage(orch, s, 3_000_000)
    assert s.execute("kept").return_value == "[1, 2, 3]"
    result = s.execute("len(damaged)")
    assert result.error is not None and result.error.type == "DeferredValueLost"
    assert "damaged" in result.error.message and "digest" in result.error.message
    assert result.restore_failures == {}
    assert "damaged" not in s.variables and "kept" in s.variables
