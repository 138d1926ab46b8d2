"""Run a short controller script in a fresh Python process, for the lifecycle tests (another process, or a new one).

A script is Python source that defines ``main(orch, args)``; it runs with an ``Orchestrator`` on
``Settings.from_env()`` (the test's settings, passed as ``ORCH_*`` variables) and its return value
comes back as JSON. ``emit(value)`` sends a line before ``main`` returns (to say "ready" to a test
that will SIGKILL the process). Leaving ``main`` closes the orchestrator, which closes the sessions
it still holds: a script detaches the sessions it wants to leave behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shlex
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from orchestrator import Settings
from orchestrator.config import ENV_VARIABLES

_RUNNER = textwrap.dedent(
    """
    import json, os, sys, time, traceback
    from orchestrator import Orchestrator, OrchestratorError, Settings

    def emit(value):
        sys.stdout.write(json.dumps(value) + "\\n")
        sys.stdout.flush()

    exec(compile(os.environ["LIFECYCLE_SCRIPT"], "<lifecycle-script>", "exec"))
    orch = Orchestrator(Settings.from_env())
    try:
        try:
            emit({"result": main(orch, json.loads(os.environ["LIFECYCLE_ARGS"]))})
        except Exception as exc:
            emit({"exc": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()})
    finally:
        orch.close()
        orch.backend.client.close()
    """
)


def settings_env(settings: Settings) -> dict[str, str]:
    """``ORCH_*`` variables that make ``Settings.from_env()`` in another process equal ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    for variable in ENV_VARIABLES:
        value = variable.value(settings)
        if value is None:
            continue
        if variable.name == "ORCH_AGENT_COMMAND":
            text = shlex.join(value)  # type: ignore[arg-type]
        elif variable.name == "ORCH_WORKER_UIDS":
            text = "{}-{}".format(*value)  # type: ignore[str-format]
        elif variable.name == "ORCH_SWARM_CONSTRAINTS":
            text = ",".join(value)  # type: ignore[arg-type]
        elif isinstance(value, bool):
            text = "1" if value else "0"
        else:
            text = str(value)
        env[variable.name] = text
    return env


class ScriptProcess:
    """A script running in its own process; ``next()`` reads its next JSON line."""

    def __init__(self, settings: Settings, script: str, args: Any = None) -> None:
        env = settings_env(settings)
        env["LIFECYCLE_SCRIPT"] = textwrap.dedent(script)
        env["LIFECYCLE_ARGS"] = json.dumps(args)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _RUNNER],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=str(Path(__file__).parent),
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        self._threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self._lines.put), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self._stderr.append), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    @staticmethod
    def _pump(stream: Any, put: Any) -> None:
        for line in stream:
            put(line)
        put(None)

    def next(self, timeout: float = 60.0) -> Any:
        """The next value the script emitted (raises AssertionError if it failed, exited or went quiet)."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the script did not answer within {timeout} s; stderr:\n{self.stderr}") from None
        if line is None:
            raise AssertionError(f"the script exited (status {self.proc.wait(10)}); stderr:\n{self.stderr}")
        return json.loads(line)

    def result(self, timeout: float = 60.0) -> Any:
        """What ``main`` returned; an exception it raised becomes an AssertionError with its traceback."""
        answer = self.next(timeout)
        assert "result" in answer, f"the script raised {answer.get('exc')}: {answer.get('traceback')}\n{self.stderr}"
        self.proc.wait(timeout)
        return answer["result"]

    def outcome(self, timeout: float = 60.0) -> dict[str, Any]:
        """The raw answer: ``{"result": ...}`` or ``{"exc": name, "message": ...}``."""
        answer: dict[str, Any] = self.next(timeout)
        self.proc.wait(timeout)
        return answer

    @property
    def stderr(self) -> str:
        return "".join(line for line in self._stderr if line)[-8000:]

    def stop(self) -> None:
        """Kill the process if it still runs, and close its pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        for thread in self._threads:
            thread.join(5)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def run_script(settings: Settings, script: str, args: Any = None, timeout: float = 90.0) -> Any:
    """Run a script to its end in a fresh process and return what its ``main`` returned."""
    process = ScriptProcess(settings, script, args)
    try:
        return process.result(timeout)
    finally:
        process.stop()


@contextlib.contextmanager
def script_processes() -> Iterator[Callable[..., ScriptProcess]]:
    """A factory of script processes; those still running are stopped at the end."""
    started: list[ScriptProcess] = []

    def start(settings: Settings, source: str, args: Any = None) -> ScriptProcess:
        started.append(ScriptProcess(settings, source, args))
        return started[-1]

    try:
        yield start
    finally:
        for process in started:
            process.stop()
