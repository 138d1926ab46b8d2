"""Fork and rewind against a real engine: equal state in every fork, independent futures, rewind after damage."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator import GenerationNotFound, Orchestrator, Session

pytestmark = pytest.mark.docker

SETUP = """
import math
def area(r):
    return math.pi * r * r
class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
    def norm(self):
        return (self.x ** 2 + self.y ** 2) ** 0.5
p = Point(3, 4)
big = 'x' * (8 << 20)
numbers = list(range(1000))
"""

CHECK = "area(1) == math.pi, p.norm(), type(p) is Point, len(big), sum(numbers), context"


def _blob_inodes(directory: Path) -> dict[str, int]:
    return {entry.name: entry.stat().st_ino for entry in os.scandir(directory / "blobs")}


def test_forks_have_equal_state_and_independent_futures(orch: Orchestrator, session: Session) -> None:
    assert session.execute(SETUP).ok
    session.add_context("the document")
    ctx = session.create_context(context_id="side")
    ctx.execute("y = 'side'")
    session.execute("import socket\nunpicklable = socket.socket()")
    assert "unpicklable" in session.unsaved
    expected = session.execute(CHECK).return_value

    forks = orch.fork(session.id, count=3)
    try:
        for fork in forks:
            assert fork.forked_from == (session.id, session.generation)
            assert fork.generation == session.generation
            assert "unpicklable" in fork.unsaved  # what the fork did not get, until its own first call
            assert "unpicklable" in fork.history()[-1].unsaved
            assert fork.execute(CHECK).return_value == expected
            assert fork.context("side").execute("y").return_value == "'side'"
            assert fork.execute("'unpicklable' in globals()").return_value == "False"
        forks[0].execute("numbers.append(-1)\np.x = 0")
        forks[1].execute("del big")
        assert forks[0].execute("sum(numbers), p.norm()").return_value == "(499499, 4.0)"
        assert forks[1].execute("'big' in globals()").return_value == "False"
        assert forks[2].execute("sum(numbers), p.norm(), len(big)").return_value == f"(499500, 5.0, {8 << 20})"
        assert session.execute("sum(numbers), p.norm(), len(big)").return_value == f"(499500, 5.0, {8 << 20})"

        # Shared, not copied: the fork's blob files are the source's (same inodes), the 8 MiB one among them.
        state = orch.settings.state_dir / "sessions"
        source_blobs = _blob_inodes(state / session.id)
        fork_blobs = _blob_inodes(state / forks[2].id)
        common = source_blobs.keys() & fork_blobs.keys()
        assert all(source_blobs[name] == fork_blobs[name] for name in common)
        biggest = max(common, key=lambda name: (state / session.id / "blobs" / name).stat().st_size)
        assert (state / session.id / "blobs" / biggest).stat().st_nlink >= 3  # the source, forks 0 and 2
    finally:
        for fork in forks:
            fork.close()


def test_a_fork_survives_its_source_and_a_kill(
    orch: Orchestrator, new_session: Callable[..., Session], kill_container: Callable[[Session], None]
) -> None:
    source = new_session(orch)
    source.execute("data = bytes(range(256)) * 40000\nhalf = data[:1000]")
    fork = source.fork()
    try:
        source.close()
        kill_container(fork)
        assert fork.execute("len(data), half == data[:1000]").return_value == "(10240000, True)"
        assert orch.describe(fork.id).checkpoint_damaged is False
    finally:
        fork.close()


def test_a_fork_of_a_busy_session_has_its_last_committed_state(orch: Orchestrator, session: Session) -> None:
    import threading

    session.execute("n = 1")
    started = threading.Event()
    running = threading.Thread(
        target=lambda: (started.set(), session.execute("import time\ntime.sleep(3)\nn = 2")), daemon=True
    )
    running.start()
    started.wait()
    fork = orch.fork(session.id)[0]
    try:
        assert fork.execute("n").return_value == "1"
        running.join()
        assert session.execute("n").return_value == "2"
    finally:
        fork.close()


def test_rewind_brings_back_deleted_and_corrupted_variables(session: Session) -> None:
    session.execute("data = {'a': [1, 2, 3]}\ndef total():\n    return sum(data['a'])")
    good = session.generation
    session.execute("del total\ndata['a'] = None\nextra = 1")
    assert session.execute("'total' in globals(), data").return_value == "(False, {'a': None})"

    rewound = session.rewind(good)
    assert rewound.current and rewound.rewound_from == good and rewound.generation > good
    assert set(rewound.changed) == {"total", "data", "extra"}
    assert session.execute("total(), 'extra' in globals()").return_value == "(6, False)"

    history = session.history()
    assert [g.generation for g in history] == sorted(g.generation for g in history)
    assert history[-1].generation == session.generation
    # The damaged generation is kept too: a rewind can be undone.
    damaged = next(g for g in history if "extra" in g.changed and g.rewound_from is None)
    session.rewind(damaged.generation)
    assert session.execute("extra").return_value == "1"


def test_rewind_and_fork_at_refuse_a_generation_that_is_not_kept(orch: Orchestrator, session: Session) -> None:
    session.execute("x = 1")
    with pytest.raises(GenerationNotFound, match="keeps no generation 999"):
        session.rewind(999)
    with pytest.raises(GenerationNotFound, match="keeps no generation 999"):
        orch.fork(session.id, at=999)


def test_fork_at_an_older_generation(orch: Orchestrator, session: Session) -> None:
    session.execute("step = 1")
    first = session.generation
    session.execute("step = 2")
    fork = session.fork(at=first)
    try:
        assert fork.execute("step").return_value == "1"
        assert session.execute("step").return_value == "2"
        assert fork.forked_from == (session.id, first)
    finally:
        fork.close()


def test_rewind_of_a_hibernated_session_takes_effect_at_its_next_call(orch: Orchestrator, session: Session) -> None:
    session.execute("v = 'old'")
    old = session.generation
    session.execute("v = 'new'")
    session.hibernate()
    session.rewind(old)
    assert session.execute("v").return_value == "'old'"
