"""The ops CLI against the real engine: ``python -m orchestrator ...`` as a subprocess on a private state dir."""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import cli_env

from orchestrator import Orchestrator, Session, Settings
from orchestrator.config import DEFAULTS_FILE

pytestmark = pytest.mark.docker


@pytest.fixture
def store(settings_for: Callable[..., Settings], image: str) -> Settings:
    """A store of its own for each test, so ``ls`` and ``prune`` see only this test's sessions."""
    return settings_for()


@pytest.fixture
def cli(store: Settings) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(*argv: str, input: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "orchestrator", *argv],
            input=input,
            capture_output=True,
            text=True,
            env=cli_env(store, **env),
            timeout=120,
        )

    return run


@pytest.fixture
def make(
    store: Settings, make_orch: Callable[[Settings], Orchestrator], new_session: Callable[..., Session]
) -> Callable[..., str]:
    """A session on the test's store, set up by ``code`` and detached (as a caller that went away leaves it)."""
    orch = make_orch(store)

    def create(code: str = "x = 41") -> str:
        session = new_session(orch)
        session.execute(code)
        session.detach()
        return session.id

    return create


def one_line(stderr: str, error: str) -> None:
    assert stderr.count("\n") == 1 and stderr.startswith(f"orchestrator: {error}: "), stderr


def test_ls_inspect_exec_and_state_across_commands(cli, make):
    sid = make("x = 41\nblob = 'a' * 100_000")
    listed = cli("ls")
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()  # no rule line under the header
    assert header.split() == ["ID", "STATE", "IMAGE", "AGE", "IDLE", "CPU", "MEMORY", "CHECKPOINT"]
    assert row.split()[:2] == [sid, "running"] and "KiB" in row and "MiB" in row and row.split()[5].endswith("%")
    (entry,) = json.loads(cli("ls", "--json").stdout)
    assert entry["id"] == sid and entry["status"] == "running" and entry["checkpoint_bytes"] > 100_000

    done = cli("exec", sid, "y = x + 1\nprint('y is', y)\ny * 2")
    assert (done.returncode, done.stdout, done.stderr) == (0, "y is 42\n84\n", "")
    raised = cli("exec", sid, "def f():\n    return 1 / 0\nf()")
    assert raised.returncode == 1 and raised.stdout == ""
    assert raised.stderr.startswith("Traceback (most recent call last):") and "ZeroDivisionError" in raised.stderr
    piped = cli("exec", sid, "-", "--json", input="import sys\nsys.stderr.write('e')\ny\n")
    document = json.loads(piped.stdout)
    assert piped.returncode == 0 and document["return_value"] == "42" and document["stderr"] == "e"

    shown = cli("inspect", sid, "--json")
    assert json.loads(shown.stdout)["status"] == "running" and json.loads(shown.stdout)["generation"] >= 3
    text = cli("inspect", sid).stdout
    assert f"id                  {sid}" in text and "container status    running" in text
    assert cli("exec", sid, "x, y").stdout == "(41, 42)\n"  # each exec detached: the session kept running


def test_each_command_attaches_and_detaches_and_the_worker_keeps_its_memory(cli, store, make_orch, new_session):
    """Every ``exec`` takes the sandbox over and lets it go; what no checkpoint holds (a generator) lives on in the
    worker: the command's data channel closes with it and the idle worker goes back to its supervisor for the next
    command (docs/design/one-hop.md, "Takeover, detach and a lost controller")."""
    session = new_session(make_orch(store))
    session.execute("gen = iter(range(10))\nnext(gen)")
    session.detach()
    for expected in ("1", "2", "3"):
        done = cli("exec", session.id, "next(gen)")
        assert (done.returncode, done.stdout, done.stderr) == (0, f"{expected}\n", ""), done


def test_errors_are_one_line_with_their_exit_status(cli, store):
    missing = cli("exec", "nope-nope", "1")
    assert missing.returncode == 4 and missing.stdout == ""
    one_line(missing.stderr, "SessionNotFound")
    missing = cli("inspect", "nope-nope", "--json")
    assert missing.returncode == 4 and json.loads(missing.stdout)["error"]["type"] == "SessionNotFound"
    usage = cli("prune", "--idle", "soon")
    assert usage.returncode == 2
    one_line(usage.stderr, "UsageError")
    no_engine = cli("create", DOCKER_HOST=f"unix://{store.runtime_dir}/no-engine.sock")
    assert no_engine.returncode == 6
    one_line(no_engine.stderr, "EngineUnavailable")
    empty = cli("ls", DOCKER_HOST=f"unix://{store.runtime_dir}/no-engine.sock")  # nothing stored: nothing to ask
    assert empty.returncode == 0 and empty.stderr.startswith("orchestrator: no sessions (state dir ")


def test_exec_timeout_exits_7_and_the_session_goes_on(cli, make):
    sid = make()
    late = cli("exec", sid, "import time\nprint('started', flush=True)\ntime.sleep(30)", "--timeout", "1")
    assert late.returncode == 7 and late.stdout == "started\n"
    one_line(late.stderr, "ExecutionTimeout")
    assert cli("exec", sid, "x").stdout == "41\n"


def test_exec_interrupted_exits_130_and_the_call_is_not_kept(cli, make, store):
    sid = make()
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "exec", sid, "import time\ntime.sleep(30)\nz = 1"],
        preexec_fn=as_at_a_terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(store),
    )
    deadline = time.monotonic() + 60
    while json.loads(cli("inspect", sid, "--json").stdout)["status"] != "busy":
        assert time.monotonic() < deadline, "the call never started"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    *_, last = err.splitlines()  # Ctrl-C stops the cell: the session keeps what it did before
    assert last.startswith(f"orchestrator: KeyboardInterrupt: the cell was interrupted; session {sid} keeps what")
    assert cli("exec", sid, "'z' in globals(), x").stdout == "(False, 41)\n"


def test_hibernate_logs_resume_rm(cli, make):
    sid = make()
    assert cli("logs", sid).returncode == 0
    slept = cli("hibernate", sid, "--json")
    assert slept.returncode == 0 and json.loads(slept.stdout) == [
        {"id": sid, "ok": True, "result": "hibernated", "error": None}
    ]
    assert cli("hibernate", sid).stdout == f"{sid}: already hibernated\n"
    assert json.loads(cli("inspect", sid, "--json").stdout)["status"] == "hibernated"
    gone = cli("logs", sid)
    assert gone.returncode == 2
    one_line(gone.stderr, "ConfigError")

    woke = cli("resume", sid)
    assert (woke.returncode, woke.stdout) == (0, f"{sid}: running\n"), woke.stderr
    assert json.loads(cli("inspect", sid, "--json").stdout)["status"] == "running"
    assert cli("resume", sid).stdout == f"{sid}: already running\n"
    assert cli("exec", sid, "x").stdout == "41\n"

    removed = cli("rm", sid, "nope-nope")
    assert removed.returncode == 3 and removed.stdout == f"{sid}: removed\n"
    one_line(removed.stderr, "nope-nope: SessionNotFound")
    assert json.loads(cli("ls", "--json").stdout) == []


def test_prune_dry_run_then_for_real(cli, make):
    stale, fresh = make(), make()
    time.sleep(2.5)
    assert cli("exec", fresh, "x").returncode == 0
    dry = cli("prune", "--idle", "2s", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"would remove {stale} (" in dry.stdout and fresh not in dry.stdout
    assert dry.stdout.splitlines()[-1].startswith("dry run, would do: 1 remove;")
    assert {s["id"] for s in json.loads(cli("ls", "--json").stdout)} == {stale, fresh}

    assert cli("exec", fresh, "x").returncode == 0  # the CLI calls above may have taken it past 2 s idle (busy CI)
    done = cli("prune", "--idle", "2s", "--json", "--yes")
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["dry_run"] is False and report["failed"] == 0
    assert [(a["action"], a["target"]) for a in report["actions"]] == [("remove", stale)]
    assert [s["id"] for s in json.loads(cli("ls", "--json").stdout)] == [fresh]


def test_list_is_ls(cli, make):
    sid = make()
    assert [s["id"] for s in json.loads(cli("list", "--json").stdout)] == [sid]


def test_a_misspelt_variable_is_one_line_on_stderr_and_a_bad_value_names_its_variable(cli):
    listed = cli("ls", "--json", ORCH_MEM_LMIT="2g", ORCH_RELAY_DIR="/x")  # the relay's variable is known: not named
    assert listed.returncode == 0 and json.loads(listed.stdout) == []
    assert listed.stderr == (
        "WARNING orchestrator.config: unknown ORCH_ variable, ignored: ORCH_MEM_LMIT (did you mean ORCH_MEM_LIMIT?)\n"
    )
    refused = cli("ls", ORCH_EXEC_TIMEOUT="5 min")
    assert refused.returncode != 0 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith("orchestrator: ConfigError: ORCH_EXEC_TIMEOUT='5 min': '5 min' is not a duration")
    assert cli("ls", ORCH_EXEC_TIMEOUT="5m", ORCH_MAX_OUTPUT_BYTES="64k").returncode == 0


def test_image_build_make_default(cli, store, image, tmp_path):
    """The recorded base is the user's, not the state dir's: a new state dir starts a session on it with no
    variable naming it (nothing is pulled: the image is here)."""
    config_home = str(tmp_path / "config")
    built = cli("image", "build", "--make-default", "--json", XDG_CONFIG_HOME=config_home)
    assert built.returncode == 0, built.stderr
    assert json.loads(built.stdout) == {
        "image": image,
        "base_image": store.base_image,
        "default_recorded": str(tmp_path / "config" / "orchestrator" / DEFAULTS_FILE),
    }
    env = cli_env(store, XDG_CONFIG_HOME=config_home, ORCH_STATE_DIR=str(tmp_path / "a new state dir"))
    del env["ORCH_BASE_IMAGE"]
    env.pop("ORCH_IMAGE", None)
    started = subprocess.run(
        [sys.executable, "-c", NEW_STATE_DIR_SESSION],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert started.returncode == 0, started.stderr
    assert started.stdout.split() == [store.base_image, image, "42"]


NEW_STATE_DIR_SESSION = """
from orchestrator import Orchestrator
with Orchestrator() as orch:
    print(orch.settings.base_image, orch.default_image)
    session = orch.create_session()
    try:
        print(session.execute("print(6 * 7)").stdout.strip())
    finally:
        orch.remove(session.id)
"""


# ---------------------------------------------------------------------------- shell


def test_shell_from_a_pipe_and_state_across_shells(cli, make):
    sid = make()
    first = cli(
        "shell",
        sid,
        input="def f(a):\n    b = a + 1\n\n    return b\nprint(f(x))\nfor i in range(2):\n    i\n\n1 / 0\ny = f(1)\n",
    )
    assert first.returncode == 0, first.stderr
    assert first.stdout == "42\n" and "ZeroDivisionError: division by zero" in first.stderr
    again = cli("shell", sid, input="f(x), y, i\n")
    assert (again.returncode, again.stdout) == (0, "(42, 2, 1)\n")


def as_at_a_terminal() -> None:
    """Ctrl-C as a person's shell gives it: a test run started in the background (``cmd &`` without job control)
    hands its children SIGINT ignored, and Python keeps an ignored SIGINT (no KeyboardInterrupt, ever)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Terminal:
    """A subprocess on a pseudo-terminal: what a person at a shell sees and types."""

    def __init__(self, argv: list[str], env: dict[str, str], columns: int | None = None) -> None:
        self.master, child = os.openpty()
        if columns is not None:  # a terminal of that width (else the size is unknown: 0 x 0)
            fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
        self.proc = subprocess.Popen(
            argv, stdin=child, stdout=child, stderr=child, env=env, close_fds=True, preexec_fn=as_at_a_terminal
        )
        os.close(child)
        self.seen = ""
        self.position = 0

    def expect(self, text: str, timeout: float = 60.0) -> str:
        """Wait until ``text`` appears after what earlier calls matched; return what came before it."""
        deadline = time.monotonic() + timeout
        while (found := self.seen.find(text, self.position)) < 0:
            left = deadline - time.monotonic()
            assert left > 0, f"waited {timeout} s for {text!r}; the terminal shows {self.seen[self.position :]!r}"
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:  # EIO: the child closed the terminal
                    chunk = b""
                assert chunk, f"the program ended before {text!r}: {self.seen[self.position :]!r}"
                self.seen += chunk.decode(errors="replace").replace("\r\n", "\n")
        before, self.position = self.seen[self.position : found], found + len(text)
        return before

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def interrupt_line(self) -> str:
        """Ctrl-C while a line is being typed at the prompt; return what came before the next prompt.

        CPython's readline sees a SIGINT only when it interrupts readline's own wait for a key: one that
        the kernel hands to another thread of the process (the shell has several) sets Python's flag but
        wakes nothing, and that key press is lost, as it can be at the interpreter's own prompt. So, like a
        person, press Ctrl-C again when no new prompt came within a few seconds.
        """
        for _ in range(3):
            self.proc.send_signal(signal.SIGINT)
            try:
                return self.expect(">>> ", timeout=5.0)
            except AssertionError:
                continue
        self.proc.send_signal(signal.SIGINT)
        return self.expect(">>> ")

    def close(self) -> int:
        try:
            return self.proc.wait(timeout=60)
        finally:
            os.close(self.master)


@pytest.fixture
def terminal(store: Settings) -> Iterator[Callable[..., Terminal]]:
    opened: list[Terminal] = []

    def open_(*argv: str, columns: int | None = None) -> Terminal:
        opened.append(Terminal([sys.executable, "-m", "orchestrator", *argv], cli_env(store, TERM="dumb"), columns))
        return opened[-1]

    yield open_
    for t in opened:
        if t.proc.poll() is None:
            t.proc.kill()
            t.close()


def test_shell_on_a_terminal(terminal, make, store, cli):
    sid = make()
    t = terminal("shell", sid, columns=80)
    assert f"session {sid}" in t.expect(">>> ")
    t.type("def g(n):\n")
    t.expect("... ")
    t.type("    return n * x\n")
    t.expect("... ")
    t.type("\n")
    t.expect(">>> ")
    t.type("g(2)\n")
    assert t.expect(">>> ").endswith("82\n")
    t.type("half typed")
    t.expect("half typed")
    assert "KeyboardInterrupt" in t.interrupt_line()  # Ctrl-C drops the line being typed
    t.type("import time; time.sleep(30); w = 1\n")
    time.sleep(1.5)
    t.proc.send_signal(signal.SIGINT)  # ... and abandons a running call
    assert "the call was abandoned" in t.expect(">>> ")
    t.type("'w' in globals(), g(1)\n")
    assert t.expect(">>> ").endswith("(False, 41)\n")
    t.type("\x04")  # Ctrl-D
    t.expect(f"detached from {sid}")
    assert t.close() == 0
    history = Path(store.state_dir) / "shell-history"
    assert "return n * x" in history.read_text() and oct(history.stat().st_mode & 0o777) == "0o600"
    assert cli("exec", sid, "g(3)").stdout == "123\n"


# ---------------------------------------------------------------------------- text from the sandbox

HOSTILE_CELL = r"""
import os, sys
osc52, clear, bidi = '\x1b]52;c;cm0gLXJmIH4=\x07', '\x1b[2J\x1b[H', 'evil\u202etxt.exe'
print('before' + osc52 + clear)
print('\rorchestrator: all good, nothing to see')
print('orchestrator: InfoLeak: a forged note of ours')
print(bidi)
print(clear + 'on stderr', file=sys.stderr)
os.write(2, (osc52 + '\norchestrator: in the container log\n').encode())  # the worker's fd 2
globals()['g' + clear + '\norchestrator: saved'] = (i for i in [])  # a name that cannot be saved
bidi
"""


def no_control(text: str) -> bool:
    return all(c.isprintable() or c in "\n\t" for c in text)


def test_sandbox_text_is_escaped_on_request_raw_to_a_pipe_and_our_notes_always(cli, make):
    sid = make()
    escaped = cli("exec", sid, HOSTILE_CELL, "--escape")
    assert escaped.returncode == 0, escaped.stderr
    assert no_control(escaped.stdout) and no_control(escaped.stderr)
    assert "before\\x1b]52;c;cm0gLXJmIH4=\\x07\\x1b[2J\\x1b[H" in escaped.stdout
    assert "\\rorchestrator: all good" in escaped.stdout
    assert "[sandbox] orchestrator: InfoLeak" in escaped.stdout and "evil\\u202etxt.exe" in escaped.stdout
    ours = [line for line in escaped.stderr.splitlines() if line.startswith("orchestrator")]
    assert ours == [
        "orchestrator: not saved (lost if the sandbox restarts): g\\x1b[2J\\x1b[H\\norchestrator: saved: "
        + ours[0].split(": saved: ", 1)[1]
    ]
    sid = make()  # a session where the name fails for the first time: the note is said once per name
    piped = cli("exec", sid, HOSTILE_CELL)  # a pipe: the program's own bytes, our note still escaped
    assert "before\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\x1b[H\n" in piped.stdout
    (note,) = [line for line in piped.stderr.splitlines() if line.startswith("orchestrator: not saved")]
    assert no_control(note)
    assert cli("exec", sid, HOSTILE_CELL, "--raw").stdout == piped.stdout


def test_a_raised_exception_and_the_container_log_are_escaped(cli, make):
    sid = make()
    raised = cli("exec", sid, "raise ValueError('\\x1b]52;c;aGk=\\x07\\rorchestrator: fine')", "--escape")
    assert raised.returncode == 1 and no_control(raised.stderr)
    assert "ValueError: \\x1b]52;c;aGk=\\x07\\rorchestrator: fine" in raised.stderr
    assert cli("exec", sid, HOSTILE_CELL).returncode == 0
    logs = cli("logs", sid, "--tail", "all")  # escaped even to a pipe
    assert logs.returncode == 0 and no_control(logs.stdout)
    assert "\\x1b]52;c;cm0gLXJmIH4=\\x07" in logs.stdout
    assert "[sandbox] orchestrator: in the container log" in logs.stdout
    assert "\x1b]52;c;cm0gLXJmIH4=\x07" in cli("logs", sid, "--tail", "all", "--raw").stdout


def test_exec_on_a_terminal_shows_escapes_and_nothing_a_terminal_obeys(terminal, make):
    sid = make()
    t = terminal("exec", sid, HOSTILE_CELL)
    t.expect("the name is not a Python identifier\n")  # our note comes last
    assert t.close() == 0
    assert "\x1b" not in t.seen and "\u202e" not in t.seen and "\r" not in t.seen
    assert "before\\x1b]52;c;cm0gLXJmIH4=\\x07" in t.seen and "[sandbox] orchestrator: InfoLeak" in t.seen


# ---------------------------------------------------------------------------- exec: streaming, Ctrl-C, big output


def test_exec_streams_as_the_cell_prints_and_ctrl_c_stops_only_the_cell(terminal, make, cli):
    sid = make()
    t = terminal(
        "exec", sid, "import sys, time\nprint('out', flush=True)\nprint('err', file=sys.stderr)\ntime.sleep(60)\nz = 1"
    )
    t.expect("out\n")  # while the cell still sleeps: it came as it was printed
    t.expect("err\n")
    t.proc.send_signal(signal.SIGINT)
    t.expect(f"orchestrator: KeyboardInterrupt: the cell was interrupted; session {sid} keeps what")
    assert t.close() == 130
    assert cli("exec", sid, "'z' in globals(), x").stdout == "(False, 41)\n"


def test_exec_to_a_file_gets_the_whole_output_or_exits_9(cli, make, store):
    sid = make()
    whole = cli("exec", sid, "print('x' * 3_000_000)\n'done'")
    assert (whole.returncode, len(whole.stdout), whole.stderr) == (0, 3_000_001 + len("'done'\n"), "")
    cut = cli("exec", sid, "print('x' * 3_000_000)", ORCH_MAX_OUTPUT_FILE_BYTES="2000000")
    assert cut.returncode == 9 and cut.stdout == "x" * 2_000_000
    one_line(cut.stderr, "OutputCut")
    assert "stdout past its first 1.9 MiB" in cut.stderr
    cell = "for i in range(100_000):\n    print(i)\ni"
    reader_gone = subprocess.run(  # `| head -2`: the reader goes away, the call ends and its state is kept
        [
            "bash",
            "-c",
            f'"$0" -m orchestrator exec {sid} "$1" | head -2; exit "${{PIPESTATUS[0]}}"',
            sys.executable,
            cell,
        ],
        capture_output=True,
        text=True,
        env=cli_env(store),
        timeout=120,
    )
    assert (reader_gone.returncode, reader_gone.stdout, reader_gone.stderr) == (8, "0\n1\n", "")
    assert cli("exec", sid, "i").stdout == "99999\n"
    asked = cli("exec", sid, "a = input('name? ')\nb = input()\nprint('hello', a, repr(b))", input="Ada\n")
    assert (asked.returncode, asked.stdout) == (0, "name? hello Ada ''\n")  # end of input: an empty line


# ---------------------------------------------------------------------------- create, run, ls

LONG_ID = "an-operator-chose-this-id-for-the-nightly-build-cache-of-team-a"


def test_create_run_and_ls_with_whole_ids_on_80_columns_and_plain_when_piped(cli, terminal):
    made = cli("create", "--name", LONG_ID, "--label", "orchestrator.ops.team=a", "-q")
    assert (made.returncode, made.stdout, made.stderr) == (0, f"{LONG_ID}\n", "")
    short = cli("create", "-q").stdout.strip()
    assert cli("exec", LONG_ID, "x = 6").returncode == 0
    ran = cli("run", "--rm", "-q", "print(6 * 7)")
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, "42\n", "")

    t = terminal("ls", columns=80)
    t.expect(short)  # the rows are sorted by id
    t.expect("\n")
    assert t.close() == 0
    lines = t.seen.splitlines()
    assert all(len(line) <= 80 for line in lines) and "─" not in t.seen
    assert sorted(line.split()[0] for line in lines[1:]) == sorted([LONG_ID, short])

    piped = cli("ls")
    rows = [line.split() for line in piped.stdout.splitlines()]
    assert rows[0] == ["ID", "STATE", "IMAGE", "AGE", "IDLE", "CPU", "MEMORY", "CHECKPOINT"]
    assert all(len(row) == 8 for row in rows) and sorted(row[0] for row in rows[1:]) == sorted([LONG_ID, short])
    assert sorted(cli("ls", "-q").stdout.split()) == sorted([LONG_ID, short])
    assert cli("ls", "-q", "--filter", "label=orchestrator.ops.team=a").stdout == f"{LONG_ID}\n"
    assert [s["id"] for s in json.loads(cli("ls", "--format", "json", "-f", "id=an-*").stdout)] == [LONG_ID]
    assert cli("exec", LONG_ID, "x").stdout == "6\n"
    assert cli("rm", LONG_ID, short).returncode == 0


def test_prune_asks_on_a_terminal_and_refuses_without_one_or_without_a_criterion(cli, make, terminal):
    sid = make()
    for argv in (["prune"], ["prune", "--idle", "0"]):
        refused = cli(*argv)
        assert refused.returncode == 2 and refused.stdout == ""
        one_line(refused.stderr, "UsageError")
    t = terminal("prune", "--idle", "0")
    t.expect(f"would remove {sid} (")
    t.expect("[y/N] ")
    t.type("n\n")
    t.expect("orchestrator: prune cancelled; nothing was changed")
    assert t.close() == 0
    assert cli("ls", "-q").stdout == f"{sid}\n"
    t = terminal("prune", "--idle", "0")
    t.expect("[y/N] ")
    t.type("y\n")
    t.expect(f"remove {sid} (")
    assert t.close() == 0
    assert cli("ls", "-q").stdout == ""


def test_logs_follow_across_a_resume_until_removed_and_kept_outputs(cli, make, terminal):
    sid = make()
    t = terminal("logs", sid, "-f", "--tail", "1")
    assert cli("exec", sid, "import os\nn = os.write(2, b'first from fd 2\\n')").returncode == 0
    t.expect("first from fd 2\n")
    assert cli("hibernate", sid).returncode == 0
    t.expect("has no container now; waiting for one")
    assert cli("exec", sid, "n = os.write(2, b'second, in the next container\\n')").returncode == 0
    t.expect("runs in a new container; its log follows")
    t.expect("second, in the next container\n")
    big = cli("exec", sid, "print('y' * 2_000_000)")
    assert big.returncode == 0 and len(big.stdout) == 2_000_001
    kept = cli("logs", sid, "--output")
    assert kept.returncode == 0 and kept.stdout == big.stdout and "orchestrator: " in kept.stderr
    assert cli("rm", sid).returncode == 0
    t.expect(f"session {sid} was removed; nothing more to follow")
    assert t.close() == 0
