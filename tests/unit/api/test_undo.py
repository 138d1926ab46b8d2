"""PythonTool's undo_last_cell on real sessions over the fake engine: which call it takes back, and every refusal."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeAgent, FakeBackend, Header, fake_settings

from orchestrator import AsyncOrchestrator, ConfigError, Generation, Orchestrator, PythonTool, SandboxCrashed, Session
from orchestrator.agent import protocol, request_table


def resetting(agent: FakeAgent, request: Header, body: bytes) -> Any:
    """A healthy agent whose reset deletes every name (the default fake's changes nothing)."""
    if request["type"] != request_table.RESET:
        return agent.answer(request, body)
    agent.generation += 1
    deleted, agent.values = sorted(agent.values), {}
    delta = {"generation": agent.generation, "blobs": [], "vars": {}, "deleted": deleted, "unsaved": {}}
    return {"type": request_table.STATE_REPLY, "status": protocol.STATUS_OK, "checkpoint": delta}


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    with Orchestrator(fake_settings(tmp_path), backend=FakeBackend(resetting)) as orch:
        yield orch.create_session()


def run(tool: PythonTool, code: str) -> str:
    text = tool.handle("execute_code", {"code": code})
    assert text.startswith("status: success\n"), text
    return text


def undo(tool: PythonTool) -> str:
    return tool.handle("undo_last_cell", "{}")


def test_undo_is_offered_only_when_asked(session: Session) -> None:
    assert [d["function"]["name"] for d in session.as_tool().definitions] == ["execute_code", "reset_repl"]
    assert session.as_tool().undo is False
    tool = session.as_tool(undo=True)
    assert tool.undo is True
    names = [d["function"]["name"] for d in tool.definitions]
    assert names == ["execute_code", "reset_repl", "undo_last_cell"]
    definition = tool.definitions[2]["function"]
    assert definition["parameters"]["properties"] == {} and "Call it again" in definition["description"]
    refused = session.as_tool().handle("undo_last_cell", {})
    assert "There is no tool 'undo_last_cell'; the tools are execute_code and reset_repl." in refused
    assert "the tools are execute_code, reset_repl and undo_last_cell." in tool.handle("run_shell", {})
    assert "Unexpected argument(s): steps" in tool.handle("undo_last_cell", {"steps": 2})


def test_two_undos_take_back_two_cells_not_the_undo(session: Session) -> None:
    tool = session.as_tool(undo=True)
    run(tool, "x = 1")
    run(tool, "y = 2")
    run(tool, "print(y)")  # changes nothing: not a cell undo goes back over
    assert session.variables == ["x", "y"]

    first = undo(tool)
    assert first.startswith("status: success\n"), first
    assert "names restored or removed: y\n" in first and "note: 1 earlier call can be undone in turn." in first
    assert "only variables are undone" in first
    assert session.variables == ["x"]

    second = undo(tool)
    assert "names restored or removed: x\n" in second and "no earlier call can be undone" in second
    assert session.variables == []

    third = undo(tool)
    assert third.startswith("status: not undone\n") and "undone already" in third
    assert session.variables == []
    assert [g.rewound_from for g in session.history()[-2:]] == [1, 0]  # linear history: two rewinds


def test_a_new_cell_after_an_undo_is_the_next_one_undone(session: Session) -> None:
    tool = session.as_tool(undo=True)
    run(tool, "x = 1")
    run(tool, "y = 2")
    undo(tool)
    run(tool, "z = 3")
    assert session.variables == ["x", "z"]
    assert "names restored or removed: z" in undo(tool)
    assert "names restored or removed: x" in undo(tool)
    assert session.variables == []


def test_nothing_to_undo_says_why(session: Session) -> None:
    tool = session.as_tool(undo=True)
    assert undo(tool) == "status: not undone\nNo code has run yet, so there is nothing to undo. Nothing was changed.\n"
    run(tool, "print('only output')")
    text = undo(tool)
    assert text.startswith("status: not undone\nNone of your calls left to undo changed any variable")


def test_a_reset_is_undone_like_a_cell(session: Session) -> None:
    tool = session.as_tool(undo=True)
    run(tool, "x = 1")
    assert tool.handle("reset_repl", {}).startswith("status: success\n")
    assert session.variables == []
    assert "names restored or removed: x" in undo(tool)
    assert session.variables == ["x"]


def test_a_generation_no_longer_kept_cannot_be_undone(tmp_path: Path) -> None:
    settings = fake_settings(tmp_path, ORCH_HISTORY_GENERATIONS="1")
    with Orchestrator(settings, backend=FakeBackend()) as orch, orch.create_session() as session:
        tool = session.as_tool(undo=True)
        for code in ("x = 1", "y = 2", "z = 3"):
            run(tool, code)
        assert "no earlier call can be undone" in undo(tool)  # generation 1 is gone already
        text = undo(tool)
        assert text.startswith("status: not undone\nThe session no longer keeps the state from before that call")
        assert session.variables == ["x", "y"]
        assert undo(tool).startswith("status: not undone\nNone of your calls left")


def test_a_change_by_other_hands_is_never_undone_by_the_model(session: Session) -> None:
    tool = session.as_tool(undo=True)
    run(tool, "x = 1")
    session.execute("w = 9")  # the program running the model, between its calls
    text = undo(tool)
    assert text.startswith("status: not undone\nThe variables were changed by the program running you")
    assert session.variables == ["w", "x"]
    run(tool, "y = 2")
    assert "names restored or removed: y" in undo(tool)
    assert undo(tool).startswith("status: not undone\nNone of your calls left")
    assert session.variables == ["w", "x"]


class _Stub:
    """A session that rewinds to a scripted outcome."""

    def __init__(self, outcome: Generation | Exception) -> None:
        self.generation = 0
        self.outcome = outcome

    def execute(self, code: str, timeout: float | None = None) -> Any:
        from orchestrator import ExecResult

        self.generation += 1
        return ExecResult(generation=self.generation)

    def reset(self) -> None:
        raise AssertionError("not used")

    def history(self) -> list[Generation]:
        return []

    def rewind(self, generation: int) -> Generation:
        if isinstance(self.outcome, Exception):
            raise self.outcome
        self.generation += 1
        return self.outcome


def test_a_failed_rewind_is_an_answer() -> None:
    tool = PythonTool(_Stub(SandboxCrashed("the container died while restoring", restored=False)), undo=True)
    run(tool, "x = 1")
    text = undo(tool)
    assert text.startswith("status: crashed\n") and "the container died while restoring" in text


def test_names_from_the_sandbox_are_made_safe_and_bounded() -> None:
    hostile = ("\x1b[2Jclear", *(f"name_{i:04d}" for i in range(500)))
    rewound = Generation(1, 0.0, hostile, 0, 0, True, rewound_from=0, unsaved={"\u202egen": "generator"})
    tool = PythonTool(_Stub(rewound), undo=True)
    run(tool, "x = 1")
    text = undo(tool)
    assert "\x1b" not in text and "\u202e" not in text and "\\x1b[2Jclear" in text
    assert re.search(r"and \d+ more\n", text) and len(text) < 3_000
    assert "could not be saved before that call and are gone: \\u202egen" in text


def test_undo_is_checked_at_construction(session: Session) -> None:
    with pytest.raises(ConfigError, match="undo must be True or False, got 'yes'"):
        session.as_tool(undo="yes")  # type: ignore[arg-type]

    class CannotRewind:
        def execute(self, code: str, timeout: float | None = None) -> Any: ...

        def reset(self) -> None: ...

    with pytest.raises(ConfigError, match="undo=True needs a session that can rewind"):
        PythonTool(CannotRewind(), undo=True)


def test_the_async_tool_undoes_too(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AsyncOrchestrator(fake_settings(tmp_path), backend=FakeBackend()) as orch:
            session = await orch.create_session()
            tool = await session.as_tool(undo=True)
            assert tool.undo and tool.definitions[-1]["function"]["name"] == "undo_last_cell"
            assert (await tool.handle("execute_code", {"code": "x = 1"})).startswith("status: success")
            call = {"id": "c1", "function": {"name": "undo_last_cell", "arguments": ""}}
            answer = await tool.handle_tool_call(call)
            assert answer["content"].startswith("status: success\n") and session.variables == []

    asyncio.run(scenario())
