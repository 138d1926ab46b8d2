"""A two-turn persistent RLM conversation, ours against the peer: wall time and the time spent in the environment.

The same scripted root model (a ``ScriptedOpenAIServer`` on loopback, reached through rlms'
``openai`` backend and the real ``openai`` client) plays both conversations: per turn, five
iterations of one ``repl`` block each (define and inspect variables, one ``llm_query``, then the
answer cell). Ours is ``orchestrator.rlm.RLM(environment="docker", persistent=True)``; the peer
is plain ``rlm.RLM`` with rlms' own ``DockerREPL`` on an image with the same base
(``bench/peer.py``). The runs alternate, ours first, after one untimed warm-up turn on rlms'
local REPL (rlms' and openai's one-time imports would otherwise fall on whoever runs first).

The environment's time is measured by wrapping its methods: its construction (rlms makes it in
the first completion), then ``execute_code``, ``add_context``, ``add_history`` and
``update_handler_address``, outermost calls only (the peer's ``add_context`` runs
``execute_code`` inside). Everything else in the wall time is rlms' loop and the scripted
model, the same for both: a few ms per model call, and up to 0.5 s per turn that rlms'
``LMHandler.stop()`` waits for its server's poll loop. A run fails when a cell writes to
stderr, when other than 10 cells ran, or when the two systems' answers differ.

    python bench/rlm_conversation.py [--reps N] [--context-bytes N] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peer import PeerImageError, ensure_peer_image

from orchestrator import Orchestrator, Settings

ROOT_MODEL = "scripted-root"
TURNS = ("turn-1", "turn-2")
CELLS_PER_TURN = 5
ENV_METHODS = ("execute_code", "add_context", "add_history", "update_handler_address")
SETUP = "setup"
CELLS = "execute_code"

# The root model's cells, turn by turn: four working cells (the third calls llm_query), then the answer.
SCRIPT: dict[str, list[str]] = {
    "turn-1": [
        "records = context_0.splitlines()\nprint(len(records), records[0][:40])",
        "counts = {}\n"
        "for record in records:\n"
        "    for word in record.split()[2:]:\n"
        "        counts[word] = counts.get(word, 0) + 1\n"
        "top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]\n"
        "print(top)",
        "summary = llm_query(f'Summarise these word counts in one line: {top}')\nprint(summary)",
        "facts = {'records': len(records), 'words': len(counts), 'top': top[0][0]}\nprint(SHOW_VARS())",
        "answer['content'] = f\"{facts['records']} records, {facts['words']} words, top {facts['top']}; {summary}\"\n"
        "answer['ready'] = True",
    ],
    "turn-2": [
        "print(len(history_0), len(context_1), facts)",
        "new_records = context_1.splitlines()\n"
        "shared = sorted({w for r in new_records for w in r.split()[2:]} & set(counts))[:3]\n"
        "print(shared)",
        "facts['records'] += len(new_records)\nfacts['shared'] = shared\nprint(facts)",
        "follow_up = llm_query(f'Compare the two documents: {facts}')\nprint(follow_up)",
        "answer['content'] = f\"{facts['records']} records in all, shared {shared}; {follow_up}\"\n"
        "answer['ready'] = True",
    ],
}
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu")


def document(size: int, seed: int) -> str:
    """About ``size`` characters of records ``record <n>: <words>``, the same every run."""
    lines, total, n = [], 0, 0
    while total < size:
        words = " ".join(WORDS[(n * 7 + i * (seed + 3)) % len(WORDS)] for i in range(8))
        line = f"record {n}: {words}"
        lines.append(line)
        total += len(line) + 1
        n += 1
    return "\n".join(lines)


def sub_reply(prompt: str) -> str:
    return f"(a sub-model's reply to {len(prompt)} characters)"


def scripted_model(messages: list[dict[str, Any]], model: str) -> str:
    """The root model plays SCRIPT by turn and iteration; an llm_query sub-call (one user message) gets sub_reply."""
    if not messages or messages[0].get("role") != "system":
        return sub_reply(str(messages[-1].get("content", "")) if messages else "")
    iteration = sum(1 for m in messages if m.get("role") == "assistant")
    for turn in TURNS:
        if any(f"Answer the following: {turn}" in str(m.get("content")) for m in messages[:3]):
            cells = SCRIPT[turn]
            return f"Next step.\n```repl\n{cells[min(iteration, len(cells) - 1)]}\n```\n"
    raise ValueError("a root request of no known turn")


# --------------------------------------------------------------------------- measuring


class Meter:
    """Seconds spent in an environment, by method; nested calls count once, for the outermost method."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.stderr: list[str] = []
        self._local = threading.local()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        started = time.perf_counter()
        try:
            yield
        finally:
            took = time.perf_counter() - started
            self._local.depth = depth
            if depth == 0:
                with self._lock:
                    self.seconds[name] = self.seconds.get(name, 0.0) + took
                    self.calls[name] = self.calls.get(name, 0) + 1

    def instrument(self, env: Any) -> None:
        """Wrap the environment's methods on the instance (rlms calls them through it)."""
        for name in ENV_METHODS:
            method = getattr(env, name)

            def timed(*args: Any, _name: str = name, _method: Callable[..., Any] = method, **kwargs: Any) -> Any:
                with self.span(_name):
                    result = _method(*args, **kwargs)
                stderr = getattr(result, "stderr", None)
                if _name == CELLS and stderr:
                    self.stderr.append(str(stderr))
                return result

            setattr(env, name, functools.wraps(method)(timed))

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


@contextlib.contextmanager
def metered_environments(meter: Meter) -> Iterator[list[Any]]:
    """While open, every environment rlms makes is timed (construction included) and instrumented."""
    core = importlib.import_module("rlm.core.rlm")
    original: Callable[[str, dict[str, Any]], Any] = getattr(core, "get_environment")  # noqa: B009 (rlms is untyped)
    made: list[Any] = []

    def get_environment(environment: str, environment_kwargs: dict[str, Any]) -> Any:
        with meter.span(SETUP):
            env = original(environment, environment_kwargs)
        meter.instrument(env)
        made.append(env)
        return env

    setattr(core, "get_environment", get_environment)  # noqa: B010
    try:
        yield made
    finally:
        setattr(core, "get_environment", original)  # noqa: B010


@dataclass
class Sample:
    """One conversation of one system."""

    system: str
    wall: float
    environment: float
    by_method: dict[str, float]
    calls: dict[str, int]
    close: float
    answers: list[str]
    environment_class: str

    @property
    def share(self) -> float:
        return self.environment / self.wall if self.wall else 0.0


def converse(system: str, make_rlm: Callable[[], Any], contexts: list[str]) -> Sample:
    """Two ``completion`` calls on one persistent RLM, metered; the RLM is closed after (timed apart)."""
    meter = Meter()
    rlm = make_rlm()
    answers: list[str] = []
    made: list[Any] = []
    try:
        started = time.perf_counter()
        with metered_environments(meter) as made:
            for turn, context in zip(TURNS, contexts, strict=True):
                answers.append(rlm.completion(context, root_prompt=turn).response)
        wall = time.perf_counter() - started
    finally:
        close_started = time.perf_counter()
        rlm.close()
        close = time.perf_counter() - close_started
    if len(made) != 1:
        raise RuntimeError(f"{system}: {len(made)} environments were made, expected one persistent REPL")
    if meter.stderr:
        raise RuntimeError(f"{system}: a cell failed: {meter.stderr[0][-500:]}")
    cells = meter.calls.get(CELLS, 0)
    if cells != len(TURNS) * CELLS_PER_TURN:
        raise RuntimeError(f"{system}: {cells} cells ran, expected {len(TURNS) * CELLS_PER_TURN}")
    env_class = f"{type(made[0]).__module__}.{type(made[0]).__qualname__}"
    return Sample(system, wall, meter.total, dict(meter.seconds), dict(meter.calls), close, answers, env_class)


@dataclass
class Comparison:
    """Both systems' samples, and the setup they ran on."""

    ours: list[Sample] = field(default_factory=list)
    peer: list[Sample] = field(default_factory=list)
    setup: dict[str, Any] = field(default_factory=dict)

    def median(self, system: str, value: Callable[[Sample], float]) -> float:
        return statistics.median(value(s) for s in (self.ours if system == "ours" else self.peer))

    def rows(self) -> list[tuple[str, str, float, float]]:
        """(key, label, ours, peer): medians over the repetitions, in seconds (share: a fraction)."""
        grouped = {
            "setup": lambda s: s.by_method.get(SETUP, 0.0),
            "cells": lambda s: s.by_method.get(CELLS, 0.0),
            "state": lambda s: sum(s.by_method.get(m, 0.0) for m in ENV_METHODS if m != CELLS),
        }
        spec: list[tuple[str, str, Callable[[Sample], float]]] = [
            ("wall", "conversation wall time (2 turns, 10 cells)", lambda s: s.wall),
            ("environment", "time in the environment", lambda s: s.environment),
            ("share", "environment share of wall time", lambda s: s.share),
            ("setup", "  environment setup (first turn)", grouped["setup"]),
            ("cells", "  10 cells (execute_code)", grouped["cells"]),
            ("state", "  add_context/add_history/update_handler_address", grouped["state"]),
            ("outside", "outside the environment (rlms loop, model)", lambda s: s.wall - s.environment),
            ("close", "close() (not in the wall time)", lambda s: s.close),
        ]
        return [(key, label, self.median("ours", f), self.median("peer", f)) for key, label, f in spec]

    def to_json(self) -> dict[str, Any]:
        return {
            "setup": self.setup,
            "medians": {
                key: {"ours": o, "peer": p, "ours_over_peer": o / p if p else None} for key, _, o, p in self.rows()
            },
            "samples": {
                "ours": [dataclasses.asdict(s) for s in self.ours],
                "peer": [dataclasses.asdict(s) for s in self.peer],
            },
        }


@contextlib.contextmanager
def peer_workspace() -> Iterator[Path]:
    """rlms' DockerREPL mounts a host directory (default ``./.rlm_workspace``): keep it under /tmp, removed after.

    Inside a workspace already set (``run.py``'s peer runner), so that runner finds any container left.
    """
    before = os.environ.get("RLM_DOCKER_WORKSPACE_DIR")
    workspace = Path(tempfile.mkdtemp(prefix="rlm-peer-ws-", dir=before or "/tmp"))
    os.environ["RLM_DOCKER_WORKSPACE_DIR"] = str(workspace)
    try:
        yield workspace
    finally:
        if before is None:
            os.environ.pop("RLM_DOCKER_WORKSPACE_DIR", None)
        else:
            os.environ["RLM_DOCKER_WORKSPACE_DIR"] = before
        shutil.rmtree(workspace, ignore_errors=True)


def compare(settings: Settings, reps: int, context_bytes: int) -> Comparison:
    """Run the conversation ``reps`` times with each system, alternating; ``settings`` are ours (private dirs).

    Raises:
        PeerImageError: the peer image could not be built.
        RuntimeError: a conversation went wrong (a cell failed, the answers of the two differ).
    """
    import rlm as rlms  # the peer, as its users import it

    from orchestrator.rlm import RLM, registered
    from orchestrator.rlm.testing import ScriptedOpenAIServer

    if registered():
        raise RuntimeError("orchestrator.rlm.register() is active: the peer run would use our DockerREPL")
    with Orchestrator(settings) as orch:
        our_image = orch.build_image()  # before timing: a first build is not part of a conversation
        peer_image = ensure_peer_image(orch.backend.client, settings.base_image)
        engine = orch.backend.client.version()
    contexts = [document(context_bytes, seed) for seed in (1, 2)]
    comparison = Comparison(
        setup={
            "base_image": settings.base_image,
            "our_image": our_image,
            "peer_image": peer_image,
            "context_chars": [len(c) for c in contexts],
            "reps": reps,
            "engine": f"{engine.get('Version')} (API {engine.get('ApiVersion')})",
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        }
    )
    with ScriptedOpenAIServer(scripted_model) as server, peer_workspace():
        backend_kwargs = {"model_name": ROOT_MODEL, "base_url": server.base_url, "api_key": "bench"}

        def ours() -> Any:
            return RLM(
                backend="openai",
                backend_kwargs=backend_kwargs,
                environment="docker",
                environment_kwargs={"settings": settings},
                persistent=True,
                max_iterations=CELLS_PER_TURN + 1,
            )

        def peer() -> Any:
            return rlms.RLM(
                backend="openai",
                backend_kwargs=backend_kwargs,
                environment="docker",
                environment_kwargs={"image": peer_image},
                persistent=True,
                max_iterations=CELLS_PER_TURN + 1,
            )

        warm_up(rlms.RLM, backend_kwargs, contexts[0])
        for i in range(reps):
            print(f"  rlm conversation {i + 1}/{reps}: ours ...", file=sys.stderr, flush=True)
            comparison.ours.append(converse("ours", ours, contexts))
            print(f"  rlm conversation {i + 1}/{reps}: peer ...", file=sys.stderr, flush=True)
            comparison.peer.append(converse("peer", peer, contexts))
        if server.errors:
            raise RuntimeError(f"the scripted model failed: {server.errors[0]}")
    _check(comparison)
    return comparison


def warm_up(rlm_class: Any, backend_kwargs: dict[str, Any], context: str) -> None:
    """One untimed turn on rlms' in-process local REPL: rlms' loop, the openai client and its
    response types do their one-time imports and set-up here, not in the first system measured."""
    print("  warming up rlms and the openai client (local REPL, untimed) ...", file=sys.stderr, flush=True)
    with rlm_class(backend="openai", backend_kwargs=backend_kwargs, environment="local") as rlm:
        rlm.completion(context, root_prompt=TURNS[0])


def _check(comparison: Comparison) -> None:
    """Both systems ran the environment they should and gave the same answers, with the sub-calls' replies."""
    for sample in comparison.ours:
        if not sample.environment_class.startswith("orchestrator.rlm."):
            raise RuntimeError(f"ours ran {sample.environment_class}")
    for sample in comparison.peer:
        if sample.environment_class != "rlm.environments.docker_repl.DockerREPL":
            raise RuntimeError(f"the peer ran {sample.environment_class}, not rlms' DockerREPL")
    answers = {tuple(s.answers) for s in comparison.ours + comparison.peer}
    if len(answers) != 1:
        raise RuntimeError(f"the conversations' answers differ: {sorted(answers)}")
    if not all("sub-model's reply" in answer for answer in next(iter(answers))):
        raise RuntimeError(f"an answer lacks its llm_query reply: {answers}")


# --------------------------------------------------------------------------- report


def _fmt(key: str, value: float) -> str:
    if key == "share":
        return f"{value * 100:.0f}%"
    return f"{value * 1000:.0f} ms" if value < 1.0 else f"{value:.2f} s"


def print_table(comparison: Comparison) -> None:
    header = ("measure", "ours", "peer", "ours/peer")
    rows = [
        (label, _fmt(key, o), _fmt(key, p), f"{o / p:.2f}" if p and key != "share" else "")
        for key, label, o, p in comparison.rows()
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join("-" * w for w in widths)
    print(line)
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print(line)
    for row in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))))
    print(line)
    setup = comparison.setup
    print(
        f"median of {setup['reps']} conversation(s) each, alternating; contexts {setup['context_chars']} chars; "
        f"base {setup['base_image']}; peer image {setup['peer_image']}"
    )


def private_settings(root: Path) -> Settings:
    """``Settings.from_env()`` with state and runtime directories under ``root`` (short: socket paths)."""
    return Settings.from_env().replace(state_dir=root / "state", runtime_dir=root / "run")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="conversations per system (default 3; median reported)")
    parser.add_argument("--context-bytes", type=int, default=1_000_000, help="size of each turn's context")
    parser.add_argument("--json", metavar="PATH", type=Path, help="also write the samples as JSON")
    args = parser.parse_args(argv)
    if args.reps < 1 or args.context_bytes < 100:
        parser.error("--reps must be >= 1 and --context-bytes >= 100")
    root = Path(tempfile.mkdtemp(prefix="orch-", dir="/tmp"))
    try:
        settings = private_settings(root)
        try:
            comparison = compare(settings, args.reps, args.context_bytes)
        except (PeerImageError, ImportError) as exc:
            print(f"rlm_conversation: cannot run: {exc}", file=sys.stderr)
            return 2
    finally:
        with contextlib.suppress(Exception), Orchestrator(private_settings(root)) as orch:
            for container in orch.containers():  # anything of ours a failed run left
                orch.backend.remove(container.id)
        shutil.rmtree(root, ignore_errors=True)
    print()
    print_table(comparison)
    if args.json:
        args.json.write_text(json.dumps(comparison.to_json(), indent=1))
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
