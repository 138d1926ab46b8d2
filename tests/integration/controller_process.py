"""A second controller in its own process, driven line by line over stdin/stdout (JSON), for the ownership tests.

Run as ``python controller_process.py``. Settings come from the environment (``ORCH_STATE_DIR``,
``ORCH_RUNTIME_DIR``, ``ORCH_BASE_IMAGE``, ... via ``Settings.from_env``). Each stdin line is one
command object with an ``op``; each answer is one JSON line on stdout:
``{"ok": true, ...}`` when the call returned, ``{"ok": false, "exc": "<type>", "message": ...}`` when it
raised. Ops:

- ``ping``: answers once the orchestrator is up (so a later ``delay`` is measured from a ready process).
- ``attach {sid, delay?, force?}``: (after ``delay`` seconds) ``Orchestrator.attach``; the handle becomes current.
- ``execute {code, timeout?, delay?}``: ``execute`` on the current handle.
- ``call {method}``: ``close`` / ``detach`` / ``reset`` on the current handle.
- ``race {sid, seconds, code, timeout?, seed?, force?}``: for ``seconds``, attach and run ``code`` over and over,
  re-attaching when taken over and now and then on purpose; answers how many calls succeeded and how others failed.
- ``quit``: detach the current handle if it is still ours (never close it), close the orchestrator, exit.

Nothing here closes a session unless told to: ``quit`` must leave the session to the test.
"""

from __future__ import annotations

import contextlib
import json
import random
import sys
import time
import traceback
from collections import Counter
from typing import Any

from orchestrator import Orchestrator, OrchestratorError, Session, SessionAttachedElsewhere, Settings
from orchestrator.api.session import SessionState


def describe(session: Session) -> dict[str, Any]:
    return {
        "epoch": getattr(session, "epoch", None),
        "generation": session.generation,
        "container_id": session.container_id,
        "sandbox_id": getattr(session, "sandbox_id", None),
        "restore_failures": dict(session.restore_failures),
        "variables": sorted(session.variables),
    }


def failure(exc: BaseException) -> dict[str, Any]:
    return {
        "ok": False,
        "exc": type(exc).__name__,
        "message": str(exc)[:2000],
        "restored": getattr(exc, "restored", None),
        "orchestrator_error": isinstance(exc, OrchestratorError),
    }


def race(
    orch: Orchestrator, sid: str, seconds: float, code: str, timeout: float, seed: int, force: bool
) -> dict[str, Any]:
    """Attach and execute ``code`` for ``seconds``; count what each call was told."""
    rng = random.Random(seed)
    ends = time.monotonic() + seconds
    session: Session | None = None
    successes = 0
    attaches = 0
    slowest_attach = 0.0
    containers: set[str] = set()
    failures: Counter[str] = Counter()
    while time.monotonic() < ends:
        if session is None:
            started = time.monotonic()
            try:
                session = orch.attach(sid, force=force)
                attaches += 1
                containers.add(str(session.container_id))
            except SessionAttachedElsewhere:
                failures["attach:SessionAttachedElsewhere"] += 1
                continue
            except OrchestratorError as exc:
                failures[f"attach:{type(exc).__name__}: {str(exc)[:200]}"] += 1
                time.sleep(0.05)
                continue
            finally:
                slowest_attach = max(slowest_attach, time.monotonic() - started)
        try:
            result = session.execute(code, timeout=timeout)
        except SessionAttachedElsewhere:
            failures["execute:SessionAttachedElsewhere"] += 1
            session = None
            continue
        except OrchestratorError as exc:
            # Not part of the contract for a takeover race: reported, and the call counts as not kept.
            failures[f"execute:{type(exc).__name__}: restored={getattr(exc, 'restored', None)}: {str(exc)[:200]}"] += 1
            session = None
            continue
        if result.error is not None:
            failures[f"execute:user-error:{result.error.type}: {result.error.message[:200]}"] += 1
        else:
            successes += 1
        if rng.random() < 0.3:
            session.detach()  # let go on purpose and take it back (from the other racer if it came first)
            session = None
        time.sleep(rng.random() * 0.02)
    if session is not None:
        with contextlib.suppress(SessionAttachedElsewhere):
            session.detach()
    return {
        "ok": True,
        "successes": successes,
        "attaches": attaches,
        "slowest_attach": round(slowest_attach, 3),
        "containers": sorted(containers),
        "failures": dict(failures),
    }


def main() -> None:
    settings = Settings.from_env()
    orch = Orchestrator(settings)
    current: Session | None = None
    out = sys.stdout
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            command = json.loads(line)
            op = command["op"]
            if op == "quit":
                break
            time.sleep(command.get("delay", 0))
            answer: dict[str, Any]
            try:
                if op == "ping":
                    answer = {"ok": True}
                elif op == "attach":
                    current = orch.attach(command["sid"], force=command.get("force", False))
                    answer = {"ok": True, **describe(current)}
                elif op == "execute":
                    assert current is not None, "no session attached"
                    result = current.execute(command["code"], timeout=command.get("timeout"))
                    answer = {
                        "ok": True,
                        "return_value": result.return_value,
                        "stdout": result.stdout,
                        "error": None if result.error is None else f"{result.error.type}: {result.error.message}",
                        "unsaved": dict(result.unsaved),
                        "restore_failures": dict(getattr(result, "restore_failures", {}) or {}),
                        **describe(current),
                    }
                elif op == "call":
                    assert current is not None, "no session attached"
                    getattr(current, command["method"])()
                    answer = {"ok": True, "state": current.state.name}
                elif op == "race":
                    answer = race(
                        orch,
                        command["sid"],
                        command["seconds"],
                        command["code"],
                        command.get("timeout", 30.0),
                        command.get("seed", 0),
                        command.get("force", False),
                    )
                else:
                    answer = {"ok": False, "exc": "UnknownOp", "message": op}
            except Exception as exc:
                answer = failure(exc)
                if not isinstance(exc, OrchestratorError):
                    answer["traceback"] = traceback.format_exc()
            out.write(json.dumps(answer) + "\n")
            out.flush()
    finally:
        try:
            if current is not None and current.state is SessionState.READY:
                with contextlib.suppress(SessionAttachedElsewhere):
                    current.detach()
        finally:
            orch.close()
            client = getattr(orch.backend, "client", None)
            if client is not None:
                client.close()


if __name__ == "__main__":
    main()
