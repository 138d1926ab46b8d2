"""PythonTool on a fake session: the tool definitions, and the text the model gets for every outcome."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator import (
    ChannelLost,
    ConfigError,
    ExecError,
    ExecResult,
    ExecutionTimeout,
    PythonTool,
    SandboxCrashed,
    SandboxOutOfMemory,
)


class FakeSession:
    """Answers every call with the next outcome: an ExecResult to return or an exception to raise."""

    def __init__(self, *outcomes: ExecResult | Exception) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[tuple[str, Any]] = []

    def execute(self, code: str, timeout: float | None = None) -> ExecResult:
        self.calls.append((code, timeout))
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def reset(self) -> None:
        self.calls.append(("reset", None))
        if self.outcomes:
            outcome = self.outcomes.pop(0)
            assert isinstance(outcome, Exception)
            raise outcome


def test_definitions_are_openai_function_tools() -> None:
    definitions = PythonTool(FakeSession(), max_timeout=60).definitions
    json.dumps(definitions)
    assert [d["type"] for d in definitions] == ["function", "function"]
    execute, reset = (d["function"] for d in definitions)
    assert execute["name"] == "execute_code" and reset["name"] == "reset_repl"
    assert execute["parameters"]["required"] == ["code"]
    assert execute["parameters"]["properties"]["code"]["type"] == "string"
    assert execute["parameters"]["properties"]["timeout_seconds"]["type"] == "number"
    assert "at most 60" in execute["parameters"]["properties"]["timeout_seconds"]["description"]
    assert reset["parameters"] == {"type": "object", "properties": {}, "required": [], "additionalProperties": False}
    assert "keeps running" in reset["description"] and "clears all variables" in reset["description"]


def test_success_text() -> None:
    session = FakeSession(ExecResult(stdout="hello\n", return_value="42", duration=0.0123))
    text = PythonTool(session).handle("execute_code", '{"code": "print(\'hello\')\\n6 * 7", "timeout_seconds": 5}')
    assert text == "status: success\nelapsed: 0.012 s\nstdout:\nhello\nreturn value: 42\n"
    assert session.calls == [("print('hello')\n6 * 7", 5.0)]


def test_nothing_to_show_and_notes() -> None:
    result = ExecResult(unsaved={"gen": "generator objects cannot be pickled"}, restore_failures={"bad": "raised"})
    text = PythonTool(FakeSession(result)).handle("execute_code", {"code": "gen = (i for i in [])"})
    assert "(no output and no value)" in text
    assert "lost if the sandbox restarts: gen (generator objects cannot be pickled)" in text
    assert "could not be brought back: bad (raised)" in text


def test_error_text_has_the_location_and_the_traceback() -> None:
    tb = 'Traceback (most recent call last):\n  File "<cell-2>", line 2, in <module>\nNameError: y\n'
    error = ExecError("NameError", "name 'y' is not defined", 2, "    print(y)", tb, column=11, end_column=12)
    text = PythonTool(FakeSession(ExecResult(stdout="partial\n", error=error))).handle("execute_code", {"code": "..."})
    lines = text.splitlines()
    assert lines[0] == "status: error"
    assert "error: NameError at line 2, column 11: name 'y' is not defined" in lines
    code_line = lines.index("        print(y)")
    assert lines[code_line + 1] == "              ^"
    assert lines[code_line + 1].index("^") == lines[code_line].index("y")
    assert text.endswith("traceback:\n" + tb)
    assert text.index("stdout:\npartial\n") < text.index("error:")


def test_a_syntax_error_shows_no_empty_traceback() -> None:
    error = ExecError("SyntaxError", "expected ':'", 1, "for i in x", '  File "<cell-1>", line 1\n...', column=11)
    text = PythonTool(FakeSession(ExecResult(error=error))).handle("execute_code", {"code": "for i in x"})
    assert "error: SyntaxError at line 1, column 11: expected ':'\n    for i in x\n              ^\n" in text
    assert "traceback" not in text


def test_truncated_output_names_the_file(tmp_path: Path) -> None:
    result = ExecResult(stdout="head\n...\ntail\n", stdout_path=tmp_path / "stdout.txt")
    text = PythonTool(FakeSession(result)).handle("execute_code", {"code": "print('x' * 10**9)"})
    assert "stdout:\nhead\n...\ntail\n" in text
    assert f"the full text is in the file {tmp_path / 'stdout.txt'}" in text
    assert "stderr" not in text


@pytest.mark.parametrize(
    ("exc", "status", "restored_note"),
    [
        (ExecutionTimeout("the cell ran past its 1 s timeout", stdout="tick\n"), "timeout", False),
        (SandboxCrashed("crashed: the interpreter died", restored=True), "crashed", True),
        (SandboxOutOfMemory("out of memory: killed", restored=True), "out of memory", True),
        (ChannelLost("the agent went away"), "failed", False),
    ],
)
def test_failures_of_the_sandbox_are_answers(exc: Exception, status: str, restored_note: bool) -> None:
    text = PythonTool(FakeSession(exc)).handle("execute_code", {"code": "work()", "timeout_seconds": 1})
    assert text.startswith(f"status: {status}\nelapsed: ")
    assert f"what happened: {exc}\n" in text
    assert ("restored to its last saved state" in text) == restored_note
    if isinstance(exc, ExecutionTimeout):
        assert "stdout before the interrupt:\ntick\n" in text


@pytest.mark.parametrize(
    ("name", "arguments", "words"),
    [
        ("execute_code", "{not json", "not valid JSON"),
        ("execute_code", "[1, 2]", "must be a JSON object, not an array"),
        ("execute_code", 42, "must be a JSON object"),
        ("execute_code", "{}", 'needs the argument "code"'),
        ("execute_code", None, 'needs the argument "code"'),
        ("execute_code", {"code": None}, '"code" must be a string of Python source, not null'),
        ("execute_code", {"code": ["x = 1"]}, "not an array"),
        ("execute_code", {"code": "1", "timeout_seconds": "5"}, "must be a number of seconds, not a string"),
        ("execute_code", {"code": "1", "timeout_seconds": True}, "not a boolean"),
        ("execute_code", '{"code": "1", "timeout_seconds": Infinity}', "must be a finite number"),
        ("execute_code", '{"code": "1", "timeout_seconds": NaN}', "must be a finite number"),
        ("execute_code", '{"code": "1", "timeout_seconds": 1' + "0" * 400 + "}", "must be a finite number"),
        ("execute_code", {"code": "1", "timeout_seconds": -2}, "must be more than 0, got -2"),
        ("execute_code", {"code": "1", "timeout_seconds": 0}, "must be more than 0"),
        ("execute_code", {"code": "1", "timeout_seconds": 600}, "at most 60, got 600"),
        ("execute_code", {"code": "1", "language": "python"}, "Unexpected argument(s): language"),
        ("reset_repl", {"hard": True}, "Unexpected argument(s): hard. The arguments are: none"),
        ("run_shell", {"cmd": "ls"}, "There is no tool 'run_shell'; the tools are execute_code and reset_repl"),
    ],
)
def test_bad_calls_are_explained(name: str, arguments: Any, words: str) -> None:
    session = FakeSession()
    text = PythonTool(session, max_timeout=60).handle(name, arguments)
    assert text.startswith("status: invalid call\n")
    assert words in text
    assert session.calls == []


def test_arguments_the_session_refuses_are_explained_too() -> None:
    session = FakeSession(ConfigError("code must be valid Unicode text: surrogates not allowed"))
    text = PythonTool(session).handle("execute_code", {"code": "'\udc80'"})
    assert text == "status: invalid call\ncode must be valid Unicode text: surrogates not allowed\n"


def test_reset() -> None:
    session = FakeSession()
    tool = PythonTool(session)
    assert tool.handle("reset_repl", "").startswith("status: success\nThe Python session was reset")
    assert tool.handle("reset_repl", "{}").startswith("status: success\n")
    assert session.calls == [("reset", None), ("reset", None)]
    failing = PythonTool(FakeSession(SandboxCrashed("the container died", restored=True)))
    assert failing.handle("reset_repl", {}).startswith("status: crashed\n")


def test_tool_call_objects_and_dicts() -> None:
    session = FakeSession(ExecResult(return_value="2"), ExecResult(return_value="3"))
    tool = PythonTool(session)
    call = SimpleNamespace(id="call_1", function=SimpleNamespace(name="execute_code", arguments='{"code": "1 + 1"}'))
    message = tool.handle_tool_call(call)
    assert message == {"role": "tool", "tool_call_id": "call_1", "content": message["content"]}
    assert "return value: 2" in message["content"]
    as_dict = {"id": "call_2", "type": "function", "function": {"name": "execute_code", "arguments": '{"code": "3"}'}}
    assert "return value: 3" in tool.handle_tool_call(as_dict)["content"]
    broken = tool.handle_tool_call(SimpleNamespace(id="call_3", function=None))
    assert broken["tool_call_id"] == "call_3" and broken["content"].startswith("status: invalid call")


def test_max_timeout_is_checked() -> None:
    with pytest.raises(ConfigError):
        PythonTool(FakeSession(), max_timeout=0)
