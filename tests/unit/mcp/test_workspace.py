"""The sessions of one MCP client on the fake engine: which session a call reaches, the answers of bad calls, the
files ``add_context`` refuses, and what is left when the client goes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import FakeBackend, fake_settings

from orchestrator import Orchestrator
from orchestrator.mcp.files import FileRefused, read_context_file
from orchestrator.mcp.workspace import Binding, Limits, Workspace


@pytest.fixture
def orch(tmp_path: Path) -> Iterator[Orchestrator]:
    with Orchestrator(fake_settings(tmp_path, ORCH_HISTORY_GENERATIONS="3"), backend=FakeBackend()) as orchestrator:
        yield orchestrator


def test_no_session_is_started_before_a_call_needs_one_and_then_one_is_the_default(orch: Orchestrator) -> None:
    workspace = Workspace(orch, Limits())
    workspace.open()
    assert orch.sessions() == []
    assert "No session yet" in workspace.sessions()
    assert workspace.execute("x = 'one'", None, None).startswith("status: success")
    (made,) = orch.sessions()
    assert f"{made} (default)" in workspace.sessions()
    assert "variables (1): x" in workspace.list_variables(None)


def test_a_session_the_client_did_not_make_is_out_of_reach(orch: Orchestrator) -> None:
    other = orch.create_session()
    workspace = Workspace(orch, Limits())
    for answer in (
        workspace.execute("1", None, other.id),
        workspace.list_variables(other.id),
        workspace.close_session(other.id),
        workspace.rewind(0, "\x1b[2Jevil"),
    ):
        assert answer.startswith("status: invalid call") and "no session" in answer, answer
        assert "\x1b" not in answer  # the name the client sent is shown made safe
    assert other.state.value == "ready"


def test_forks_count_against_the_cap_and_only_forks_can_be_closed(orch: Orchestrator) -> None:
    workspace = Workspace(orch, Limits(max_sessions=2))
    workspace.execute("x = 'one'", None, None)
    forked = workspace.fork(None, None)
    assert "new session: " in forked
    fork = forked.split("new session: ")[1].split()[0]
    assert "status: refused" in workspace.fork(None, None)  # two is the most
    assert "return value" not in workspace.execute("x = 'two'", None, fork)
    default = next(sid for sid in orch.sessions() if sid != fork)
    assert "your default session" in workspace.close_session(default)
    assert "was removed" in workspace.close_session(fork)
    assert fork not in orch.sessions()


def test_a_generation_not_kept_is_an_invalid_call_naming_the_kept_ones(orch: Orchestrator) -> None:
    workspace = Workspace(orch, Limits())
    workspace.execute("x = 'one'", None, None)
    answer = workspace.rewind(99, None)
    assert answer.startswith("status: invalid call") and "99" in answer, answer


def test_add_context_takes_text_or_a_path_not_both_and_no_file_without_allowed_directories(
    orch: Orchestrator, tmp_path: Path
) -> None:
    workspace = Workspace(orch, Limits())
    assert "either" in workspace.add_context("a", "/etc/hostname", None)
    assert "either" in workspace.add_context(None, None, None)
    assert "--allow-files" in workspace.add_context(None, "/etc/hostname", None)
    assert "context_0 (also named context)" in workspace.add_context("the text", None, None)
    assert "context_1" in workspace.add_context("more", None, None)


def test_closing_removes_what_the_client_made(orch: Orchestrator) -> None:
    workspace = Workspace(orch, Limits())
    workspace.execute("x = 'one'", None, None)
    workspace.fork(None, None)
    assert len(orch.sessions()) == 2
    workspace.close()
    assert orch.sessions() == []
    assert "let go of" in workspace.execute("x", None, None)  # a late call starts nothing
    assert orch.sessions() == []


def test_a_named_session_is_created_at_open_and_detached_at_close(orch: Orchestrator, tmp_path: Path) -> None:
    workspace = Workspace(orch, Limits(), Binding(named="kept-one"))
    workspace.open()
    assert orch.sessions() == ["kept-one"]
    workspace.execute("x = 'one'", None, None)
    workspace.fork(None, None)
    workspace.close()
    assert orch.sessions() == ["kept-one"]  # the fork went; the named one stays, for the next client
    again = Workspace(orch, Limits(), Binding(named="kept-one"))
    again.open()
    assert "variables (1): x" in again.list_variables(None)
    again.close()


def test_keep_detaches_every_session(orch: Orchestrator) -> None:
    workspace = Workspace(orch, Limits(), Binding(keep=True))
    workspace.execute("x = 'one'", None, None)
    workspace.fork(None, None)
    workspace.close()
    assert len(orch.sessions()) == 2


@pytest.fixture
def root(tmp_path: Path) -> Path:
    base = tmp_path / "allowed"
    base.mkdir()
    return base


def test_a_file_is_read_as_text_or_bytes(root: Path) -> None:
    (root / "a.txt").write_text("héllo")
    (root / "b.bin").write_bytes(b"\xff\x00")
    assert read_context_file(str(root / "a.txt"), [root], 100) == "héllo"
    assert read_context_file(str(root / "b.bin"), [root], 100) == b"\xff\x00"


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        ("fifo", "not-a-file"),
        ("directory", "not-a-file"),
        ("device", "not-a-file"),
        ("missing", "missing"),
        ("outside", "outside"),
        ("link out", "link"),
        ("link in", "link"),
        ("directory link", "link"),
        ("too big", "too-big"),
        ("nul", "invalid"),
    ],
)
def test_a_path_that_is_not_a_small_regular_file_under_the_roots_is_refused(
    root: Path, tmp_path: Path, make: str, reason: str
) -> None:
    (tmp_path / "secret").write_text("not yours")
    path = root / "x"
    if make == "fifo":
        os.mkfifo(path)  # opening it to read would wait for a writer: refused without opening for reading
    elif make == "directory":
        path.mkdir()
    elif make == "device":
        path = Path("/dev/zero")
        root = Path("/dev")  # allowed, and still refused: endless
    elif make == "outside":
        path = root / ".." / "secret"
    elif make == "link out":
        path.symlink_to(tmp_path / "secret")
    elif make == "link in":  # a link that stays under the root is not followed either
        (root / "real").write_text("fine")
        path.symlink_to(root / "real")
    elif make == "directory link":  # a directory on the way that is a link out
        path.symlink_to(tmp_path)
        path = path / "secret"
    elif make == "too big":
        path.write_text("x" * 101)
    elif make == "nul":
        path = root / "x\0y"
    with pytest.raises(FileRefused) as refused:
        read_context_file(str(path), [root], 100)
    assert refused.value.reason == reason and str(refused.value)


def test_without_roots_no_file_is_read(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("a")
    with pytest.raises(FileRefused, match="reads no files"):
        read_context_file(str(tmp_path / "a"), [], 100)
