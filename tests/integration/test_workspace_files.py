"""The workspace kept with the variables, on a real engine: what a cell writes under /workspace comes back
byte-identical after a kill of the container and after hibernation; a fork's files are its own; a rewind brings the
workspace back exactly; session.files writes what a cell reads and reads what a cell wrote; rlms' drop-in keeps a
file for the next turn across a kill (docs/files.md)."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from support import kill_and_wait

from orchestrator import Orchestrator, Session, Settings
from orchestrator.rlm import DockerREPL

pytestmark = pytest.mark.docker

TEST_LABEL = "orchestrator.test.run"
WRITE = (
    "import os\n"
    "os.makedirs('deep/er/still', exist_ok=True)\n"
    "open('blob.bin', 'wb').write(bytes(range(256)) * 4096)\n"
    "open('empty', 'wb').close()\n"
    "open('deep/er/still/n.txt', 'w').write('nested')\n"
    "os.symlink('deep/er/still/n.txt', 'link')\n"
    "os.symlink('/etc/hostname', 'out')\n"
    "open('script.sh', 'w').write('#!/bin/sh\\necho hi\\n')\n"
    "os.chmod('script.sh', 0o750)\n"
)
LOOK = (
    "import hashlib, json, os\n"
    "def look():\n"
    "    seen = {}\n"
    "    for top, dirs, files in os.walk('.'):\n"
    "        for name in sorted(dirs + files):\n"
    "            path = os.path.join(top, name)[2:]\n"
    "            st = os.lstat(path)\n"
    "            if os.path.islink(path):\n"
    "                seen[path] = ['l', os.readlink(path)]\n"
    "            elif os.path.isdir(path):\n"
    "                seen[path] = ['d', oct(st.st_mode & 0o777)]\n"
    "            else:\n"
    "                seen[path] = ['f', oct(st.st_mode & 0o777), hashlib.sha256(open(path, 'rb').read()).hexdigest()]\n"
    "    return json.dumps(seen, sort_keys=True)\n"
)


def _run(session: Session, code: str) -> str | None:
    result = session.execute(code)
    assert result.error is None, str(result.error)
    return result.return_value


def _workspace(session: Session) -> dict[str, list[str]]:
    """What the sandbox's /workspace holds now, as the cell sees it (paths, kinds, modes, contents' hashes)."""
    _run(session, LOOK)
    text = _run(session, "look()")
    assert text is not None
    return dict(json.loads(ast.literal_eval(text)))


@pytest.fixture
def written(new_session: Callable[..., Session], orch: Orchestrator) -> tuple[Session, dict[str, list[str]]]:
    session = new_session(orch)
    _run(session, WRITE)
    return session, _workspace(session)


def test_a_kill_of_the_container_keeps_every_file_byte_identical(
    written: tuple[Session, dict[str, list[str]]], kill_container: Callable[[Session], None]
) -> None:
    session, before = written
    assert before["script.sh"][1] == "0o750" and before["link"] == ["l", "deep/er/still/n.txt"]
    old = session.container_id
    kill_container(session)
    after = _workspace(session)
    assert session.container_id != old and after == before


def test_hibernate_and_resume_keep_the_files(written: tuple[Session, dict[str, list[str]]]) -> None:
    session, before = written
    session.hibernate()
    assert session.files.read("deep/er/still/n.txt") == b"nested"  # from the store: not started
    assert session.container_id is None
    assert _workspace(session) == before


def test_a_forks_files_are_its_own(written: tuple[Session, dict[str, list[str]]]) -> None:
    session, before = written
    child = session.fork()
    try:
        _run(child, "import os\nos.remove('empty')\nopen('blob.bin', 'ab').write(b'child')")
        child.files.write("from_child", b"c")
        assert not child.files.exists("empty") and child.files.exists("from_child")
        assert _workspace(session) == before and not session.files.exists("from_child")
        assert session.files.read("blob.bin") == bytes(range(256)) * 4096
    finally:
        child.close()


def test_rewind_brings_the_workspace_back_exactly(written: tuple[Session, dict[str, list[str]]]) -> None:
    session, before = written
    generation = session.generation
    _run(session, "import os, shutil\nshutil.rmtree('deep')\nopen('later.txt', 'w').write('later')")
    assert session.files.exists("later.txt") and not session.files.exists("deep")
    earlier = session.fork(at=generation)
    try:
        assert _workspace(earlier) == before  # a fork at a kept generation gets that generation's files
    finally:
        earlier.close()
    session.rewind(generation)
    assert not session.files.exists("later.txt") and session.files.read("deep/er/still/n.txt") == b"nested"
    assert _workspace(session) == before


def test_files_write_reaches_a_cell_and_a_cells_file_reaches_files(session: Session, tmp_path: Path) -> None:
    session.files.write("in/data.bin", b"\x00\x01\xfe\xff", mode=0o600)
    assert _run(
        session, "import os\n(open('in/data.bin', 'rb').read(), oct(os.stat('in/data.bin').st_mode & 0o777))"
    ) == ("(b'\\x00\\x01\\xfe\\xff', '0o600')")
    _run(session, "import os\nos.makedirs('out', exist_ok=True)\nopen('out/r.txt', 'wb').write(b'result\\xff')")
    assert session.files.read("out/r.txt") == b"result\xff"
    assert [(i.path, i.kind) for i in session.files.list("out")] == [("out/r.txt", "file")]
    done = session.files.download("out", tmp_path / "got")
    assert done.files == 1 and (tmp_path / "got" / "r.txt").read_bytes() == b"result\xff"
    session.files.remove("in", recursive=True)
    assert _run(session, "import os\nos.path.exists('in')") == "False"


def test_the_rlms_drop_in_keeps_a_turns_file_across_a_kill(
    settings_for: Callable[..., Settings], run_id: str, orch: Orchestrator
) -> None:
    with DockerREPL(settings=settings_for(), labels={TEST_LABEL: run_id}) as repl:
        first = repl.execute_code("open('notes.md', 'w').write('turn one')")
        assert not first.stderr, first.stderr
        kill_and_wait(orch, repl.container_id)
        second = repl.execute_code("print(open('notes.md').read())")
        assert second.stdout.strip() == "turn one", second.stderr
        assert repl.files.read("notes.md") == b"turn one"


def test_a_file_bigger_than_a_batch_comes_back_alone(
    new_session: Callable[..., Session], orch: Orchestrator, kill_container: Callable[[Session], None]
) -> None:
    session = new_session(orch)
    digest = _run(
        session,
        "import hashlib, os\n"
        "with open('big.bin', 'wb') as f:\n"
        "    for _ in range(70):\n"
        "        f.write(os.urandom(1 << 20))\n"
        "hashlib.sha256(open('big.bin', 'rb').read()).hexdigest()",
    )
    assert session.files.list("big.bin")[0].size == 70 << 20
    kill_container(session)
    assert _run(session, "hashlib.sha256(open('big.bin', 'rb').read()).hexdigest()") == digest


def test_a_contexts_directory_and_files_come_back_after_a_kill(
    session: Session, kill_container: Callable[[Session], None]
) -> None:
    context = session.create_context(context_id="ctx")
    assert context.execute("open('c.txt', 'w').write('in ctx')").error is None
    context.files.write("contexts/ctx/d.txt", b"from the host")
    kill_container(session)
    result = context.execute("import os\n(os.getcwd(), open('c.txt').read(), open('d.txt').read())")
    assert result.return_value == "('/workspace/contexts/ctx', 'in ctx', 'from the host')", result.error
    assert session.files.read("/workspace/contexts/ctx/c.txt") == b"in ctx"
