"""Bytes stay bytes: what a cell writes to ``sys.stdout.buffer`` / ``sys.stderr.buffer`` reaches a pipe or a file
byte for byte through ``orchestrator exec``, ``orchestrator run`` and the Python API (streamed or not), while a
terminal still gets escapes, never a raw control byte (issue 38, item 2)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support import cli_env

from orchestrator import ExecResult, Orchestrator, OutputEvent, Session, Settings

pytestmark = pytest.mark.docker

ALL_BYTES = bytes(range(256))
SEED = 7
BIG = 3_000_000  # past the 1 MiB output limit: the whole stream is kept in a file on the host
BIG_CELL = f"import random, sys; n = sys.stdout.buffer.write(random.Random({SEED}).randbytes({BIG}))"
BIG_DATA = random.Random(SEED).randbytes(BIG)  # the same bytes: the sandbox's Python draws them alike


@pytest.fixture
def store(settings_for: Callable[..., Settings], image: str) -> Settings:
    return settings_for()


@pytest.fixture
def session_id(store: Settings, make_orch: Callable[[Settings], Orchestrator], new_session) -> str:
    session = new_session(make_orch(store))
    session.detach()
    return session.id


def orchestrator(store: Settings, tmp_path: Path, *argv: str) -> tuple[int, bytes, bytes]:
    """The command as a shell runs it with ``> out.bin 2> err.bin``: both streams are files."""
    out, err = tmp_path / "out.bin", tmp_path / "err.bin"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.run(
            [sys.executable, "-m", "orchestrator", *argv],
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            env=cli_env(store),
            timeout=180,
        )
    return proc.returncode, out.read_bytes(), err.read_bytes()


def test_exec_into_a_file_writes_the_cells_bytes(store, session_id, tmp_path):
    cell = "import sys; sys.stdout.buffer.write(bytes(range(256)))"  # the command, as typed
    assert orchestrator(store, tmp_path, "exec", session_id, cell) == (0, ALL_BYTES + b"\n256\n", b"")  # and its value
    cell = (
        "import sys; sys.stderr.buffer.write(bytes(range(256))); n = sys.stdout.buffer.write(bytes(range(255, -1, -1)))"
    )
    assert orchestrator(store, tmp_path, "exec", session_id, cell) == (0, ALL_BYTES[::-1], ALL_BYTES)


def test_three_megabytes_of_random_bytes_through_exec_and_run(store, session_id, tmp_path):
    assert orchestrator(store, tmp_path, "exec", session_id, BIG_CELL) == (0, BIG_DATA, b"")
    to_stderr = BIG_CELL.replace("sys.stdout", "sys.stderr")
    code, out, err = orchestrator(store, tmp_path, "run", "--rm", "-q", to_stderr)
    assert (code, out, len(err), err == BIG_DATA) == (0, b"", BIG, True)


def test_exec_with_json_keeps_the_text_and_says_nothing_of_the_bytes(store, session_id, tmp_path):
    """JSON holds text: the bytes that are not UTF-8 are U+FFFD there, and the document stays one JSON document."""
    code, out, _ = orchestrator(
        store, tmp_path, "exec", session_id, "import sys; n = sys.stdout.buffer.write(b'a\\xffb')", "--json"
    )
    assert code == 0 and b'"stdout": "a\\ufffdb"' in out and b"stdout_bytes" not in out


def test_the_python_api_gives_the_bytes(store, make_orch, new_session):
    session: Session = new_session(make_orch(store))
    result = session.execute(
        "import sys; sys.stdout.buffer.write(bytes(range(256))); n = sys.stderr.buffer.write(b'\\xfe!')"
    )
    assert (result.stdout_bytes, result.stderr_bytes) == (ALL_BYTES, b"\xfe!")
    assert result.stdout == ALL_BYTES.decode("utf-8", "replace") and result.stderr == "\ufffd!"
    text = session.execute("print('h\\u00e9'); import sys; print('w', file=sys.stderr)")
    assert (text.stdout_bytes, text.stderr_bytes) == ("hé\n".encode(), b"w\n")  # text too, as UTF-8
    big = session.execute(BIG_CELL)
    assert big.stdout_path is not None and big.stdout_path.read_bytes() == BIG_DATA
    assert big.stdout_bytes.startswith(BIG_DATA[:1000]) and big.stdout_bytes.endswith(BIG_DATA[-1000:])
    assert big.stdout == big.stdout_bytes.decode("utf-8", "replace")  # the preview, its bytes as they came


def test_the_streaming_api_gives_the_bytes(store, make_orch, new_session):
    session: Session = new_session(make_orch(store))
    events: list[OutputEvent] = []
    result = session.execute(BIG_CELL + "; n = sys.stderr.buffer.write(bytes(range(256)))", on_output=events.append)
    assert b"".join(e.data for e in events if e.stream == "stdout") == BIG_DATA
    assert b"".join(e.data for e in events if e.stream == "stderr") == ALL_BYTES
    assert result.stdout_path is not None and result.stdout_path.read_bytes() == BIG_DATA
    assert result.stderr_bytes == ALL_BYTES
    items = list(session.stream("import sys; n = sys.stdout.buffer.write(bytes(range(256)))"))
    assert b"".join(i.data for i in items if isinstance(i, OutputEvent)) == ALL_BYTES
    assert isinstance(items[-1], ExecResult) and items[-1].stdout_bytes == ALL_BYTES


def test_a_terminal_gets_escapes_never_a_raw_control_byte(store, session_id):
    cell = "import sys; sys.stdout.buffer.write(bytes(range(256))); n = sys.stderr.buffer.write(bytes(range(256)))"
    master, child = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "exec", session_id, cell],
        stdin=child,
        stdout=child,
        stderr=child,
        env=cli_env(store, TERM="dumb"),
        close_fds=True,
    )
    os.close(child)
    seen = bytearray()
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the program ended and closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        assert proc.wait(timeout=60) == 0
    finally:
        os.close(master)
    shown = bytes(seen).replace(b"\r\n", b"\n")  # the terminal's own line discipline turns \n into \r\n
    controls = {b for b in shown if b < 0x20 and b not in b"\t\n"} | {0x7F} & set(shown)
    assert not controls, sorted(controls)
    text = shown.decode("utf-8")  # valid UTF-8: no byte of the cell's raw
    assert text.count("\\x00\\x01\\x02") == 2 and text.count("\\x1b") == 2 and text.count("\\x7f") == 2
