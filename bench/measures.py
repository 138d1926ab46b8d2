"""How each metric is measured: the repetition counts (``Reps``) and one ``measure_*`` function per metric.

Each ``measure_*(runner, reps)`` runs against any ``Runner`` and returns its samples by row key
(``Measured``); ``measure_rlm_conversation`` runs both systems at once, alternating.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import gc
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from runners import OURS, PEER, OrchestratorRunner, Runner, session

MB = 1_000_000
STATE_SIZES = (1 * MB, 10 * MB, 100 * MB)
"""Sizes of the unchanged state beside a cell, and of the contexts added."""
RESTORE_SIZES = (10 * MB, 100 * MB)
RESTORE_PAUSE = 1.0
"""Seconds before each kill in the restore rows."""
BATCH_PROMPTS = 8
RLM_CONTEXT_BYTES = 1_000_000
FILLER_FDS = 1100
"""Descriptors held open during the idle-sessions metric, so every socket is past fd 1,024 (where select() fails)."""
OPEN_THREADS = 4
"""Threads that open (and close) the idle sessions; the timed probe is always alone."""


def mb(size: int) -> str:
    return f"{size // MB}mb"


@dataclass(frozen=True)
class Count:
    """A repetition count per system: the peer's calls take 100-1000x longer, so it gets fewer (still >= 3 in full)."""

    ours: int
    peer: int

    def of(self, runner: Runner) -> int:
        return self.ours if runner.name == OURS else self.peer


@dataclass(frozen=True)
class Reps:
    """How many times each metric repeats; ``--quick`` uses far fewer."""

    new_session: Count = Count(10, 8)
    pooled: int = 8
    pool_pause: float = 2.0
    """Seconds between two sessions from the warm pool, so it has refilled."""
    trivial: Count = Count(200, 30)
    trivial_warmup: Count = Count(20, 2)
    beside: Count = Count(50, 5)
    beside_warmup: Count = Count(5, 1)
    add_context: Count = Count(7, 5)
    """Samples of the 1 MB and 10 MB contexts, each into a fresh session."""
    add_context_100mb: Count = Count(3, 3)
    restore: Count = Count(5, 3)
    batched: Count = Count(20, 10)
    idle_steps: tuple[int, ...] = (0, 10, 25, 50, 100)
    idle_probes: int = 3
    idle_budget: Count = Count(600, 150)
    """Seconds a system may spend opening idle sessions; a step that would exceed it is not taken."""
    rlm_conversation: int = 3
    fork: Count = Count(5, 2)
    """Forks of 100 MB into 8 (each sample: the 8 children)."""
    rewind: Count = Count(5, 3)
    """Rewinds of 100 MB, of each kind."""


FULL = Reps()
QUICK = Reps(
    new_session=Count(3, 2),
    pooled=2,
    pool_pause=1.5,
    trivial=Count(30, 5),
    trivial_warmup=Count(5, 1),
    beside=Count(10, 1),
    beside_warmup=Count(2, 0),
    add_context=Count(2, 1),
    add_context_100mb=Count(1, 1),
    restore=Count(1, 1),
    batched=Count(3, 2),
    idle_steps=(0, 5, 10),
    idle_probes=2,
    idle_budget=Count(120, 30),
    rlm_conversation=1,
    fork=Count(1, 1),
    rewind=Count(1, 1),
)


@dataclass
class Measured:
    """What one metric measured for one system: samples by row key, and facts for the report and the JSON."""

    samples: dict[str, list[float]] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    """A row's shown value when a number alone would mislead (``>= 100``: the limit was not reached)."""


def timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def repeated(runner: Runner, handle: Any, code: str, warmup: int, count: int) -> list[float]:
    """Seconds per ``execute(code)``, ``count`` times after ``warmup`` untimed runs."""
    for _ in range(warmup):
        runner.execute(handle, code)
    return [timed(lambda: runner.execute(handle, code)) for _ in range(count)]


def expect(what: str, got: object, wanted: object) -> None:
    if got != wanted:
        raise RuntimeError(f"{what}: got {got!r}, expected {wanted!r}")


def new_sessions(runner: Runner, count: int) -> list[float]:
    """Seconds of ``create`` until the session takes calls, ``count`` times after one untimed warm-up; each closed."""
    samples = []
    for i in range(count + 1):
        started = time.perf_counter()
        handle = runner.create()
        took = time.perf_counter() - started
        runner.close(handle)
        if i:
            samples.append(took)
    return samples


def measure_new_session(runner: Runner, reps: Reps) -> Measured:
    """Wall time of ``create`` until the session takes calls; closed in between; one untimed warm-up."""
    return Measured({"new_session": new_sessions(runner, reps.new_session.of(runner))})


def measure_pooled(runner: Runner, reps: Reps) -> Measured:
    """``create_session()`` from a warm pool of 2 (``Settings.capacity.pool_size``), after a pause that refills it."""
    if not isinstance(runner, OrchestratorRunner):
        raise TypeError(f"runner {runner.name} has no warm pool")
    samples = []
    with runner.pooled(pool_size=2) as orch:
        for i in range(reps.pooled + 1):  # the first session starts the pool: untimed
            time.sleep(reps.pool_pause if i else 0.0)
            started = time.perf_counter()
            handle = orch.create_session()
            took = time.perf_counter() - started
            try:
                if i == 1:
                    expect("a pooled session's 1 + 1", runner.evaluate(handle, "1 + 1"), "2")
            finally:
                handle.close()
            if i:
                samples.append(took)
    return Measured({"pooled_session": samples}, facts={"pool_size": 2, "pause_seconds": reps.pool_pause})


def measure_trivial(runner: Runner, reps: Reps) -> Measured:
    """``execute("1")`` in a fresh session, repeated after a warm-up."""
    with session(runner) as handle:
        samples = repeated(runner, handle, "1", reps.trivial_warmup.of(runner), reps.trivial.of(runner))
    return Measured({"trivial": samples})


def measure_beside_state(runner: Runner, reps: Reps) -> Measured:
    """``y = 1`` beside 1, 10 and 100 MB of unchanged state (a session each); ``n = n + 1`` beside the 100 MB."""
    out = Measured()
    warmup, count = reps.beside_warmup.of(runner), reps.beside.of(runner)
    for size in STATE_SIZES:
        with session(runner) as handle:
            runner.execute(handle, f'big = "x" * {size}\nn = 0')
            out.samples[f"beside_{mb(size)}"] = repeated(runner, handle, "y = 1", warmup, count)
            if size == STATE_SIZES[-1]:
                out.samples[f"change_beside_{mb(size)}"] = repeated(runner, handle, "n = n + 1", warmup, count)
                expect("n after the increments", runner.evaluate(handle, "n"), str(warmup + count))
                out.facts[f"container_memory_holding_{mb(size)}"] = runner.memory(handle)
    return out


def measure_add_context(runner: Runner, reps: Reps) -> Measured:
    """``add_context(payload, 0)`` of a distinct str of 1, 10 and 100 MB, each sample into a fresh, empty session;
    then 10 MB strs into new indices of one session that holds 100 MB already (the peer reloads and re-saves it)."""
    out = Measured()
    for size in STATE_SIZES:
        count = (reps.add_context_100mb if size >= 100 * MB else reps.add_context).of(runner)
        samples = []
        for i in range(count):
            payload = f"{i:08d}".ljust(size, "c")  # distinct each time: nothing can be reused
            with session(runner) as handle:
                samples.append(timed(functools.partial(runner.add_context, handle, payload, 0)))
                if i == 0:
                    expect(
                        f"len(context_0) after add_context of {size}",
                        runner.evaluate(handle, "len(context_0)"),
                        str(size),
                    )
            del payload
        out.samples[f"add_context_{mb(size)}"] = samples
    with session(runner) as handle:  # a later turn: the session already holds a big context
        runner.execute(handle, f'big = "x" * {100 * MB}')
        payloads = [f"{i:08d}".ljust(10 * MB, "c") for i in range(reps.add_context.of(runner))]
        out.samples["add_context_10mb_beside_100mb"] = [
            timed(functools.partial(runner.add_context, handle, payload, i + 1)) for i, payload in enumerate(payloads)
        ]
    return out


def measure_restore(runner: Runner, reps: Reps) -> Measured:
    """``docker kill`` a session holding 10 or 100 MB; time from there until ``len(big)`` is answered again."""
    out = Measured()
    with runner.for_restarts() as restarting:
        for size in RESTORE_SIZES:
            out.samples[f"restore_{mb(size)}"] = restores(restarting, size, reps.restore.of(restarting))
    return out


def restores(runner: Runner, size: int, count: int, pause: float = RESTORE_PAUSE) -> list[float]:
    """Seconds from a kill of the sandbox of a session holding ``size`` bytes until ``len(big)`` is answered,
    ``count`` times, ``pause`` seconds before each kill."""
    samples = []
    handle = runner.create()
    try:
        runner.execute(handle, f'big = "x" * {size}')
        for _ in range(count):
            time.sleep(pause)  # a warm pool refills meanwhile, as it would between crashes
            runner.kill(handle)
            started = time.perf_counter()
            fresh = runner.recover(handle)
            value = runner.evaluate(fresh, "len(big)")
            samples.append(time.perf_counter() - started)
            if fresh is not handle:
                runner.close(handle)
                handle = fresh
            expect("len(big) after the kill", value, str(size))
    finally:
        runner.close(handle)
    return samples


BATCH_CELL = (
    "import json\n"
    f"answers = llm_query_batched([f'question {{i}}' for i in range({BATCH_PROMPTS})])\n"
    "print(json.dumps(answers))"
)


def instant_reply(prompt: object) -> str:
    return f"instant answer to {prompt}"


def instant_lm() -> Any:
    """A ``BaseLM`` that answers at once, with no network (rlms' LMHandler serves it)."""
    from rlm.clients.base_lm import BaseLM
    from rlm.core.types import ModelUsageSummary, UsageSummary

    class InstantLM(BaseLM):  # type: ignore[misc]  # rlms is untyped
        def __init__(self) -> None:
            super().__init__(model_name="instant")
            self.calls = 0

        def completion(self, prompt: str | dict[str, Any]) -> str:
            self.calls += 1
            return instant_reply(prompt)

        async def acompletion(self, prompt: str | dict[str, Any]) -> str:
            return self.completion(prompt)

        def get_usage_summary(self) -> UsageSummary:
            return UsageSummary(model_usage_summaries={self.model_name: self.get_last_usage()})

        def get_last_usage(self) -> ModelUsageSummary:
            return ModelUsageSummary(total_calls=self.calls, total_input_tokens=0, total_output_tokens=0)

    return InstantLM()


def measure_batched(runner: Runner, reps: Reps) -> Measured:
    """A cell calling ``llm_query_batched`` with 8 prompts, rlms' LMHandler with an instant client on 127.0.0.1."""
    from rlm.core.lm_handler import LMHandler

    wanted = [instant_reply(f"question {i}") for i in range(BATCH_PROMPTS)]
    handler = LMHandler(instant_lm(), host="127.0.0.1")
    address = handler.start()
    samples = []
    try:
        env = runner.rlm_environment(address)
        try:
            for i in range(reps.batched.of(runner) + 1):  # one untimed warm-up
                started = time.perf_counter()
                result = env.execute_code(BATCH_CELL)
                took = time.perf_counter() - started
                if result.stderr:
                    raise RuntimeError(f"the llm_query_batched cell failed: {result.stderr[-500:]}")
                lines = result.stdout.strip().splitlines()
                expect("the batch's answers", json.loads(lines[-1]) if lines else None, wanted)
                if i:
                    samples.append(took)
        finally:
            env.cleanup()
    finally:
        handler.stop()
    return Measured({"batched": samples})


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _rss_bytes() -> int:
    """This process's resident memory after a collection and ``malloc_trim`` (freed memory back to the system)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS:"))


def _open_used(runner: Runner, count: int) -> list[Any]:
    """``count`` new sessions, each used once (``1 + 1``), opened by a few threads; all closed if one fails."""

    def one() -> Any:
        handle = runner.create()
        try:
            expect("an idle session's 1 + 1", runner.evaluate(handle, "1 + 1"), "2")
        except BaseException:
            runner.close(handle)
            raise
        return handle

    with ThreadPoolExecutor(OPEN_THREADS) as pool:
        futures = [pool.submit(one) for _ in range(count)]
    handles, errors = [], []
    for future in futures:
        try:
            handles.append(future.result())
        except Exception as exc:
            errors.append(exc)
    if errors:
        close_all(runner, handles)
        raise errors[0]
    return handles


def close_all(runner: Runner, handles: Sequence[Any]) -> None:
    """Close every handle, a few threads at a time; one that fails does not stop the others (the run's end sweeps
    any container left)."""
    with ThreadPoolExecutor(OPEN_THREADS * 2) as pool:
        for future in [pool.submit(runner.close, h) for h in handles]:
            with contextlib.suppress(Exception):
                future.result()


def measure_idle(runner: Runner, reps: Reps) -> Measured:
    """Open idle sessions in steps and time one more session at each step; memory per idle session at the end.

    Every socket is past fd 1,024 (``FILLER_FDS`` descriptors are held open), and each idle
    session ran one cell. The sessions of a step are opened by ``OPEN_THREADS`` threads (untimed);
    the probe (create, timed; then close) runs alone. A step whose opening would take the
    system's total past ``reps.idle_budget`` is not taken.
    """
    out = Measured()
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(FILLER_FDS)]
    handles: list[Any] = []
    budget = reps.idle_budget.of(runner)
    try:
        fds, rss = _open_fds(), _rss_bytes()
        opening = 0.0
        baseline: float | None = None
        held: int | None = None
        reached = 0
        medians: dict[int, float] = {}
        for step in reps.idle_steps:
            need = step - len(handles)
            if need > 0 and handles and opening + need * opening / len(handles) > budget:
                out.facts["stopped"] = (
                    f"stopped before {step} idle sessions: opening them would take the {len(handles)} already open "
                    f"({opening:.0f} s so far) past the budget of {budget:.0f} s"
                )
                break
            if need > 0:
                started = time.perf_counter()
                handles += _open_used(runner, need)
                opening += time.perf_counter() - started
                time.sleep(0.5)  # let the engine settle before the probe
            probes = []
            for _ in range(reps.idle_probes):
                started = time.perf_counter()
                probe = runner.create()
                probes.append(time.perf_counter() - started)
                runner.close(probe)
            out.samples[f"idle_probe_{step}"] = probes
            medians[step] = statistics.median(probes)
            if baseline is None:
                baseline = medians[step]
            elif held is None and medians[step] >= 2 * baseline:
                held = reached
            reached = step
        if handles:
            memories = [m for m in (runner.memory(h) for h in handles) if m is not None]
            out.samples["idle_memory"] = [float(m) for m in memories]
            out.samples["idle_rss"] = [(_rss_bytes() - rss) / len(handles)]
            out.facts["controller_fds_per_session"] = (_open_fds() - fds) / len(handles)
        out.samples["idle_held"] = [float(reached if held is None else held)]
        out.texts["idle_held"] = f">= {reached}" if held is None else f"{held}"
        out.facts.update(
            reached=reached,
            opening_seconds=opening,
            probe_medians=medians,
            doubled=held is not None,
            open_threads=OPEN_THREADS,
        )
    finally:
        close_all(runner, handles)
        for fd in filler:
            os.close(fd)
    return out


def measure_rlm_conversation(runners: dict[str, Runner | None], reps: Reps) -> dict[str, Measured]:
    """A two-turn persistent RLM conversation (10 cells, 2 llm_query) with ours and with the peer, alternating.

    rlms' own loop against the same scripted model on loopback; ours on ``orchestrator.rlm``, the
    peer on rlms' ``DockerREPL`` (``rlm_conversation.py``, which also runs alone).
    """
    import rlm_conversation  # a sibling module; it imports rlms only when it runs

    ours = runners[OURS]
    if not isinstance(ours, OrchestratorRunner):
        raise TypeError("the RLM conversation runs ours on orchestrator.rlm, with the OrchestratorRunner's settings")
    comparison = rlm_conversation.compare(ours.settings, reps.rlm_conversation, RLM_CONTEXT_BYTES)

    def measured(samples: list[rlm_conversation.Sample]) -> Measured:
        return Measured(
            {
                "rlm_wall": [s.wall for s in samples],
                "rlm_environment": [s.environment for s in samples],
                "rlm_cells": [s.by_method.get(rlm_conversation.CELLS, 0.0) for s in samples],
                "rlm_setup": [s.by_method.get(rlm_conversation.SETUP, 0.0) for s in samples],
            },
            facts={"setup": comparison.setup, "samples": [dataclasses.asdict(s) for s in samples]},
        )

    return {OURS: measured(comparison.ours), PEER: measured(comparison.peer)}
