"""Fork and rewind (issue 25): a session holding 100 MB branched into 8 children, and brought back to an earlier state.

``measure_fork(runner, reps)`` and ``measure_rewind(runner, reps)`` run against any ``Runner``, like the metrics
of ``measures.py``; ``rows.py`` lists their rows. The peer has neither: its user copies its state file
(``PeerRunner.fork``, ``PeerRunner.mark`` and ``PeerRunner.rewind`` say how).

- fork: a source session holds ``big = "x" * 100_000_000`` and ``n = 0``. Each sample forks it into 8
  (ours: ``Orchestrator.fork(source, 8)`` on a warm pool of 8, full before each sample), then each child's
  first call, ``1 + 1`` (which does not touch ``big``), runs in a thread of its own, all at once. A child's
  time runs from the fork call until its first call answered. Then the host's bytes of the source and its
  8 children (every file under their state directories, allocated blocks, each inode once: a blob
  hard-linked into a fork is one copy), against the source's alone before the first fork.
- rewind: a session holds the same; ``mark`` (ours: its generation), a cell, then the rewind to the mark is
  timed. Two cells: one that changes a small name (``n = n + 1``), one that replaces the 100 MB value
  (``big = "y" * 100_000_000``). The first sample of each is checked: ``n``, ``big``'s first character and
  length are back.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from measures import MB, Measured, Reps, close_all, expect, timed
from runners import Runner, session

FORK_SIZE = 100 * MB
FORK_CHILDREN = 8
FIRST_CALL = "1 + 1"
"""Each child's first call: it does not touch the 100 MB value."""
STATE = f'big = "x" * {FORK_SIZE}\nn = 0'
REWIND_CELLS = (
    ("rewind_small", "n = n + 1"),
    ("rewind_replaced", f'big = "y" * {FORK_SIZE}'),
)
"""Row key and the cell that the rewind undoes."""
REWOUND = "(n, big[:1], len(big))"


def disk_bytes(paths: Iterable[Path]) -> int:
    """Bytes the files and directories under ``paths`` take on disk (allocated blocks, as ``du`` counts them), each
    inode counted once: a file hard-linked into several of them is one copy."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root in paths:
        for directory, _, files in os.walk(root):
            for path in (directory, *(os.path.join(directory, name) for name in files)):
                try:
                    info = os.lstat(path)
                except FileNotFoundError:  # a temporary file that went away meanwhile
                    continue
                if (info.st_dev, info.st_ino) not in seen:
                    seen.add((info.st_dev, info.st_ino))
                    total += info.st_blocks * 512
    return total


def first_calls(runner: Runner, handles: list[Any]) -> list[float]:
    """Each handle's ``FIRST_CALL``, all at once (a thread each): the ``perf_counter`` at which each answered."""

    def one(handle: Any) -> float:
        value = runner.evaluate(handle, FIRST_CALL)
        answered = time.perf_counter()
        expect(f"a fork's {FIRST_CALL}", value, "2")
        return answered

    with ThreadPoolExecutor(len(handles)) as pool:
        return list(pool.map(one, handles))


def measure_fork(runner: Runner, reps: Reps) -> Measured:
    """Fork a session holding 100 MB into 8; each child's first call at once; the host's bytes of all nine."""
    out = Measured()
    calls: list[float] = []
    children: list[float] = []
    slowest: list[float] = []
    stored: list[float] = []
    copies: list[float] = []
    with runner.for_forks(FORK_CHILDREN) as forking, session(forking) as source:
        forking.execute(source, STATE)
        one_copy = disk_bytes(forking.state_paths(source))
        for i in range(reps.fork.of(forking)):
            forking.settle([source])
            started = time.perf_counter()
            forks = forking.fork(source, FORK_CHILDREN)
            try:
                returned = time.perf_counter()
                times = [answered - started for answered in first_calls(forking, forks)]
                calls.append(returned - started)
                children += times
                slowest.append(max(times))
                paths = forking.state_paths(source) + [path for fork in forks for path in forking.state_paths(fork)]
                stored.append(float(disk_bytes(paths)))
                copies.append(stored[-1] / one_copy)
                if i == 0:
                    expect("a fork's len(big)", forking.evaluate(forks[-1], "len(big)"), str(FORK_SIZE))
            finally:
                close_all(forking, forks)
    out.samples.update(
        fork_call=calls, fork_first_call=children, fork_slowest=slowest, fork_bytes=stored, fork_copies=copies
    )
    out.facts.update(children=FORK_CHILDREN, one_copy_bytes=one_copy, first_call=FIRST_CALL)
    return out


def measure_rewind(runner: Runner, reps: Reps) -> Measured:
    """Rewind a session holding 100 MB after a cell that changed a small name, and after one that replaced the
    100 MB value; the rewind alone is timed (and, apart, what keeping the state to go back to cost)."""
    out = Measured()
    with session(runner) as handle:
        runner.execute(handle, STATE)
        for key, cell in REWIND_CELLS:
            samples, keeping = [], []
            for i in range(reps.rewind.of(runner)):
                started = time.perf_counter()
                mark = runner.mark(handle)
                keeping.append(time.perf_counter() - started)
                runner.execute(handle, cell)
                samples.append(timed(functools.partial(runner.rewind, handle, mark)))
                if i == 0:
                    expect(f"{REWOUND} after the rewind", runner.evaluate(handle, REWOUND), f"(0, 'x', {FORK_SIZE})")
            out.samples[key] = samples
            out.facts[f"{key}_mark_seconds"] = keeping
    return out
