"""The docs tests' own rules: which blocks are read how, "not run" markers, console transcripts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from doc_fences import FenceError, read_fences, read_transcript
from doc_runner import DocumentRun


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "page.md"
    path.write_text(text, encoding="utf-8")
    return path


def test_fences_keep_order_language_line_and_lose_a_list_items_indentation(tmp_path: Path) -> None:
    page = write(
        tmp_path,
        "# t\n\n```python\nx = 1\n```\n\n- item:\n\n  ```console\n  $ echo hi\n  hi\n  ```\n\n````\nraw ```\n````\n",
    )
    fences = read_fences(page)
    assert [(f.language, f.line, f.source, f.not_run) for f in fences] == [
        ("python", 4, "x = 1\n", None),
        ("console", 10, "$ echo hi\nhi\n", None),
        ("", 15, "raw ```\n", None),
    ]
    assert fences[0].where == "page.md:4"


def test_a_not_run_marker_applies_to_the_next_fence_and_must_say_why(tmp_path: Path) -> None:
    page = write(tmp_path, "<!-- not run: needs a Swarm -->\n\n```python\nswarm()\n```\n\n```python\nx = 1\n```\n")
    assert [f.not_run for f in read_fences(page)] == ["needs a Swarm", None]
    with pytest.raises(FenceError, match=r"page.md:1: a 'not run' marker must say why"):
        read_fences(write(tmp_path, "<!-- not run: -->\n```sh\ntrue\n```\n"))


def test_an_unclosed_fence_is_an_error_naming_its_line(tmp_path: Path) -> None:
    with pytest.raises(FenceError, match=r"page.md:2: a fence that is never closed"):
        read_fences(write(tmp_path, "text\n```python\nx = 1\n"))


def test_a_transcript_is_commands_with_what_follows_each() -> None:
    steps = read_transcript("$ orchestrator shell s\n>>> 1 + 1\n2\n>>> ^D\n$ echo $?\n0\n")
    assert [(s.command, s.output) for s in steps] == [
        ("orchestrator shell s", [">>> 1 + 1", "2", ">>> ^D"]),
        ("echo $?", ["0"]),
    ]
    assert steps[0].typed_input == "1 + 1\n"
    assert steps[1].typed_input is None
    (shown,) = read_transcript(
        "$ orchestrator hibernate a nope\na: hibernated\norchestrator: nope: SessionNotFound: no\n"
    )
    assert shown.errors_shown == ["SessionNotFound"]
    assert read_transcript("$ orchestrator exec s 'x'\norchestrator: all good\n")[0].errors_shown == []


@pytest.fixture
def run(tmp_path: Path) -> Iterator[DocumentRun]:
    document = DocumentRun(tmp_path / "page.md")
    yield document
    document.close()


def console(run: DocumentRun, tmp_path: Path, transcript: str) -> None:
    (fence,) = read_fences(write(tmp_path, f"```console\n{transcript}```\n"))
    run.run(fence)


@pytest.mark.docker  # a DocumentRun sweeps its store when it closes
def test_a_transcript_checks_the_status_echo_shows_and_that_the_others_succeed(
    run: DocumentRun, tmp_path: Path
) -> None:
    console(run, tmp_path, "$ echo hi > f\n$ cat f\nhi\n$ exit 3\n$ echo $?\n3\n")
    with pytest.raises(AssertionError, match=r"'\$ exit 3' exited 3, the transcript shows 4"):
        console(run, tmp_path, "$ exit 3\n$ echo $?\n4\n")
    with pytest.raises(AssertionError, match=r"shows '\$ echo ok' report SessionNotFound, it did not"):
        console(run, tmp_path, "$ echo ok\norchestrator: SessionNotFound: no session\n")
    with pytest.raises(AssertionError, match=r"'\$ false' exited 1"):
        console(run, tmp_path, "$ false\n$ true\n")


@pytest.mark.docker  # a DocumentRun sweeps its store when it closes
def test_a_transcript_types_what_it_shows_at_a_prompt(run: DocumentRun, tmp_path: Path) -> None:
    console(run, tmp_path, "$ python3 -ic 'x = 41' 2>/dev/null | grep 42\n>>> print(x + 1)\n42\n>>> ^D\n")


@pytest.mark.docker  # a DocumentRun sweeps its store when it closes
def test_python_blocks_share_a_namespace_and_run_in_the_documents_own_directory_and_store(
    run: DocumentRun, tmp_path: Path
) -> None:
    first, second = read_fences(
        write(
            tmp_path,
            "```python\nimport os\nhere = os.getcwd()\n```\n\n```python\nstore = os.environ['ORCH_STATE_DIR']\n```\n",
        )
    )
    run.run(first)
    run.run(second)
    assert run.namespace["here"] == str(run.directory)
    assert run.namespace["store"] == str(run.directory / "state")
    assert Path.cwd() != run.directory
