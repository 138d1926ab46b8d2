"""Ops lifecycle speed: resume of a hibernated session, `orchestrator ls` over a large store, prune of many sessions.

The peer (rlms' DockerREPL) has none of these (no hibernation, no listing, no pruning), so
this table has no ratio column; the targets are issue 8's.

- resume: a session holding 10 MB of state (``big = "x" * 10_000_000``) is hibernated (its
  container removed), then ``execute("len(big)")`` is timed: new container, restore, cell.
- ls: a store with 500 sessions (a few running, the rest hibernated records with a checkpoint
  blob each), timed through the API (``list_sessions``) and as the command a person types
  (``python -m orchestrator ls --json``, interpreter start-up included).
- prune: 200 stale sessions (a few with running containers) removed by one
  ``prune(idle_for=60, now=<an hour later>)``.

    python bench/lifecycle.py [--reps N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator import Orchestrator, Settings
from orchestrator.state.ledger import new_owner_token
from orchestrator.state.store import SessionRecord

LS_SESSIONS = 500
PRUNE_SESSIONS = 200
RUNNING = 5
STATE = 'big = "x" * 10_000_000'


def timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def fill_store(orch: Orchestrator, count: int, running: int) -> list[str]:
    """``count`` sessions: ``running`` real ones (containers), the rest hibernated records with one opaque blob."""
    ids = []
    for _ in range(running):
        session = orch.create_session()
        session.execute("x = list(range(1000))")
        session.detach()
        ids.append(session.id)
    now = time.time()
    for _ in range(count - running):
        blob = secrets.token_bytes(4096)
        digest = secrets.token_hex(16)
        record = SessionRecord(
            session_id=f"b{secrets.token_hex(6)}",
            image=orch.default_image,
            created_at=now,
            last_used_at=now,
            generation=1,
            variables={"x": digest},
            blob_sizes={digest: len(blob)},
            owner=new_owner_token(),
            epoch=1,
            hibernated_at=now,
        )
        orch.store.create(record)
        orch.store.write_blobs(record.session_id, {digest: blob})
        ids.append(record.session_id)
    return ids


def bench_resume(orch: Orchestrator, reps: int) -> dict[str, Any]:
    samples = []
    with orch.create_session() as session:
        session.execute(STATE)
        for _ in range(reps):
            session.hibernate()
            samples.append(timed(lambda: session.execute("len(big)")))
    return {"metric": "resume, 10 MB state", "samples": samples, "target": 1.0}


def bench_ls(settings: Settings, reps: int) -> list[dict[str, Any]]:
    with Orchestrator(settings) as orch:
        try:
            fill_store(orch, LS_SESSIONS, RUNNING)
            api = [timed(orch.list_sessions) for _ in range(reps)]
            env = {
                **os.environ,
                "ORCH_STATE_DIR": str(settings.state_dir),
                "ORCH_RUNTIME_DIR": str(settings.runtime_dir),
            }
            command = [sys.executable, "-m", "orchestrator", "ls", "--json"]
            cli = [
                timed(lambda: subprocess.run(command, env=env, check=True, capture_output=True)) for _ in range(reps)
            ]
        finally:  # the detached sessions' containers outlive the temporary state dir otherwise
            orch.prune(older_than=0)
    return [
        {"metric": f"list_sessions(), {LS_SESSIONS} sessions", "samples": api, "target": 1.0},
        {"metric": f"`orchestrator ls --json`, {LS_SESSIONS} sessions", "samples": cli, "target": 1.0},
    ]


def bench_prune(settings: Settings) -> dict[str, Any]:
    with Orchestrator(settings) as orch:
        try:
            fill_store(orch, PRUNE_SESSIONS, RUNNING)
            seconds = timed(lambda: orch.prune(idle_for=60, now=time.time() + 3600))
            left = len(orch.sessions())
        finally:
            orch.prune(older_than=0)
    if left:
        raise RuntimeError(f"prune left {left} sessions behind")
    return {"metric": f"prune of {PRUNE_SESSIONS} stale sessions ({RUNNING} running)", "samples": [seconds]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="repetitions of the resume and ls rows")
    parser.add_argument("--json", metavar="PATH", type=Path, help="also write the samples as JSON")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp:
        base = Settings.from_env()
        for name in ("resume", "ls", "prune"):
            settings = base.replace(state_dir=Path(tmp) / name / "state", runtime_dir=Path(tmp) / name / "run")
            if name == "resume":
                with Orchestrator(settings) as orch:
                    orch.build_image()
                    rows.append(bench_resume(orch, args.reps))
            elif name == "ls":
                rows.extend(bench_ls(settings, args.reps))
            else:
                rows.append(bench_prune(settings))
    print(f"{'metric':<48} {'median':>9} {'min':>9} {'max':>9} {'target':>8}")
    for row in rows:
        samples = row["samples"]
        target = row.get("target")
        verdict = "" if target is None else ("ok" if statistics.median(samples) < target else "MISSED")
        print(
            f"{row['metric']:<48} {statistics.median(samples):>8.3f}s {min(samples):>8.3f}s {max(samples):>8.3f}s "
            f"{'' if target is None else f'< {target:g} s':>8} {verdict}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
