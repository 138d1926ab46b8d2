"""A session a live controller holds is never taken without force; a dead controller's is taken at once.

Two real processes: the session's owner and an operator's ``python -m orchestrator`` (or a script
process). The owner holds its session with a lease it renews; the operator's ``exec``, ``shell``,
``resume`` and ``rm`` are refused (one line naming the holder, exit 5) and leave the owner's call and
handle alone; with ``--force`` they take it over as documented (the owner's call stopped and not
kept, its handle stale). A SIGKILLed owner's session is taken without force.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import TEST_LABEL
from lifecycle_support import ScriptProcess, script_processes
from support import cli_env

from orchestrator import Session, SessionAttachedElsewhere, SessionHeld, Settings
from orchestrator.api.events import Event, InputRequest
from orchestrator.api.session import SessionState

pytestmark = pytest.mark.docker


@pytest.fixture
def store(settings_for: Callable[..., Settings], image: str) -> Settings:
    return settings_for()


def cli(store: Settings, *argv: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *argv],
        input=stdin,
        capture_output=True,
        text=True,
        env=cli_env(store),
        timeout=120,
    )


def refused(done: subprocess.CompletedProcess[str], pid: int) -> None:
    """Exit 5, nothing on stdout, one line on stderr naming the holder and what to do."""
    assert (done.returncode, done.stdout) == (5, ""), done
    line = done.stderr
    assert line.count("\n") == 1 and line.startswith("orchestrator: ") and "SessionHeld: " in line, line
    assert f"pid {pid} on host {socket.gethostname()}, since " in line and "--force" in line


class CallInInput:
    """A call of the owner that waits in ``input()`` until the test answers: in a call for as long as needed."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.asked = threading.Event()
        self.request: InputRequest | None = None
        self.outcome: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        assert self.asked.wait(60), "the cell never asked for input"

    def _on_output(self, event: Event) -> None:
        if isinstance(event, InputRequest):
            self.request = event
            self.asked.set()

    def _run(self) -> None:
        try:
            self.outcome["result"] = self.session.execute(
                "x = input('go? ')\n'done'", timeout=120, on_output=self._on_output
            )
        except Exception as exc:
            self.outcome["error"] = exc
        finally:
            self.asked.set()

    def answer(self, text: str) -> dict[str, Any]:
        assert self.request is not None
        self.session.submit_input(self.request.request_id, text)
        self.thread.join(60)
        return self.outcome


def test_operator_commands_leave_a_live_owners_call_and_handle_alone(store, make_orch, new_session) -> None:
    orch = make_orch(store)
    s = new_session(orch)
    assert s.execute("x = 'one'").ok
    epoch, container = s.epoch, s.container_id
    call = CallInInput(s)
    for argv, stdin in (
        (["exec", s.id, "x", "--no-wait"], ""),
        (["shell", s.id, "--no-wait"], "x\n"),
        (["resume", s.id], ""),
        (["rm", s.id], ""),
    ):
        refused(cli(store, *argv, stdin=stdin), os.getpid())
    outcome = call.answer("two")
    assert "error" not in outcome, outcome
    assert outcome["result"].return_value == "'done'"
    assert (s.state, s.epoch, s.container_id) == (SessionState.READY, epoch, container)
    assert s.execute("x").return_value == "'two'"
    assert orch.describe(s.id).status.value == "running"


def test_with_force_the_operator_takes_the_session_over(store, make_orch, new_session) -> None:
    orch = make_orch(store)
    s = new_session(orch)
    assert s.execute("x = 'one'").ok
    call = CallInInput(s)
    done = cli(store, "exec", s.id, "x + '!'", "--force")
    assert (done.returncode, done.stdout) == (0, "'one!'\n"), done
    call.thread.join(60)
    assert isinstance(call.outcome.get("error"), SessionAttachedElsewhere), call.outcome  # stopped and not kept
    assert s.state is SessionState.DETACHED
    s.close()  # a stale handle lets go without raising, and leaves the session alone
    assert cli(store, "exec", s.id, "x").stdout == "'one'\n"  # the operator detached: no force needed now
    again = orch.attach(s.id)
    assert again is not s and again.epoch > s.epoch
    assert cli(store, "rm", s.id, "--force").stdout == f"{s.id}: removed\n"
    assert s.id not in orch.sessions()


@pytest.fixture
def script() -> Iterator[Callable[..., ScriptProcess]]:
    with script_processes() as start:
        yield start


HOLD = """
import threading

def main(orch, args):
    s = orch.create_session(labels={args["label_key"]: args["label"]})
    assert s.execute("x = 'kept'").ok
    threading.Thread(target=s.execute, args=("import time\\ntime.sleep(600)",), daemon=True).start()
    time.sleep(0.5)
    emit({"id": s.id, "pid": os.getpid()})
    time.sleep(600)
"""


def test_a_killed_owners_session_is_taken_without_force(store, make_orch, script, run_id) -> None:
    """On this host a dead owner is seen at once (its pid is gone): no wait for its lease to lapse."""
    owner = script(store, HOLD, {"label_key": TEST_LABEL, "label": run_id})
    held = owner.next(timeout=90)
    orch = make_orch(store)
    with pytest.raises(SessionHeld) as refusal:
        orch.attach(held["id"])
    assert (refusal.value.pid, refusal.value.host) == (held["pid"], socket.gethostname())
    refused(cli(store, "exec", held["id"], "x", "--no-wait"), held["pid"])

    owner.proc.send_signal(signal.SIGKILL)
    assert owner.proc.wait(30) == -signal.SIGKILL
    done = cli(store, "exec", held["id"], "x")
    assert (done.returncode, done.stdout) == (0, "'kept'\n"), done
    taken = orch.attach(held["id"])
    assert taken.execute("x").return_value == "'kept'"
    taken.close()


def test_one_orchestrator_gives_its_handle_and_another_in_the_process_is_refused(store, make_orch, new_session) -> None:
    first, second = make_orch(store), make_orch(store)
    s = new_session(first)
    assert s.execute("x = 1").ok
    assert first.attach(s.id) is s
    with pytest.raises(SessionHeld, match=rf"pid {os.getpid()} on host"):
        second.attach(s.id)
    assert s.execute("x + 1").return_value == "2" and s.state is SessionState.READY
    s.detach()
    taken = second.attach(s.id)  # let go of: no force needed
    assert taken.execute("x").return_value == "1"
    assert taken.epoch == s.epoch + 1
