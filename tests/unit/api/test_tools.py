"""PythonTool on a fake session: the tool definitions, and the text the model gets for every outcome."""

from __future__ import annotations

import json
import re
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


def _safe(text: str) -> bool:
    """Nothing a terminal would act on: every character printable but newlines and tabs."""
    return text.replace("\n", "").replace("\t", "").isprintable()


def test_a_stream_the_session_kept_in_a_file_is_shown_from_the_file_and_named(tmp_path: Path) -> None:
    whole = tmp_path / "stdout.txt"
    whole.write_text("".join(f"line {i}\n" for i in range(500_000)))
    result = ExecResult(stdout="the session's preview", stdout_path=whole)
    text = PythonTool(FakeSession(result)).handle("execute_code", {"code": "print(much)"})
    assert len(text) <= 20_000
    assert text.startswith("status: success\nelapsed: 0.000 s\nstdout:\nline 0\nline 1\n")
    head, marker, tail = re.search(
        r"\n(line \d+)\n\[\.\.\. ([\d,]+) bytes left out \.\.\.\]\n(line \d+)\n", text
    ).groups()  # type: ignore[union-attr]
    shown = text[text.index("line 0") : text.index("[...")] + text[text.index(tail) : text.index("note:")]
    assert int(marker.replace(",", "")) == whole.stat().st_size - len(shown.encode())  # lines cut whole
    assert int(tail.split()[1]) > int(head.split()[1])
    note = f"note: stdout was cut to fit this answer: {marker} bytes left out; all of it is in the file {whole}"
    assert text.endswith(f"line 499999\n{note} on the host.\n")
    assert "stderr" not in text and "preview" not in text


def test_a_stream_whose_file_is_gone_is_shown_as_the_session_previewed_it(tmp_path: Path) -> None:
    result = ExecResult(stdout="head\n[... marker ...]\ntail\n", stdout_path=tmp_path / "gone.stdout")
    text = PythonTool(FakeSession(result)).handle("execute_code", {"code": "print('x' * 10**9)"})
    assert "stdout:\nhead\n[... marker ...]\ntail\nnote: stdout above is the session's head-and-tail preview; " in text
    assert f"all of it was in the file {tmp_path / 'gone.stdout'} on the host, which cannot be read now" in text


HOSTILE = {
    "escape sequences": ExecResult(stdout="\x1b[2J\x1b]52;c;SGVsbG8=\x07\rforged line\u202e\n" * 100_000),
    "one 10 MB line": ExecResult(stdout="x" * 10_000_000),
    "a huge repr": ExecResult(return_value="[" + "0, " * 1_000_000 + "]"),
    "a huge traceback": ExecResult(
        error=ExecError(
            "RecursionError", "too deep", 2, "f()", "Traceback (most recent call last):\n" + "  f()\n" * 400_000
        )
    ),
    "a huge message": ExecResult(
        error=ExecError("ValueError", "\x1b[31m" + "bad " * 1_000_000 + "\nsecond line", 1, "x" * 100_000, "", column=5)
    ),
    "everything at once": ExecResult(
        stdout="\x00\x9b" * 600_000,
        stderr="\ud800" * 600_000,
        return_value="\u2028" * 600_000,
        unsaved={f"name\x1b{i}": "reason\r" * 1000 for i in range(10_000)},
        restore_failures={"x" * 10_000: "y" * 10_000},
    ),
}


@pytest.mark.parametrize("limit", [2_000, 20_000, 100_000])
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_cells_get_an_answer_within_the_cap_with_every_character_safe(
    case: str, limit: int, tmp_path: Path
) -> None:
    tool = PythonTool(FakeSession(HOSTILE[case]), max_answer_chars=limit, output_dir=tmp_path)
    text = tool.handle("execute_code", {"code": "hostile()"})
    assert len(text) <= limit
    assert _safe(text)
    assert "left out" in text and text.startswith("status: ")
    for note in re.findall(r"all of it is in the file (\S+) on the host", text):
        assert Path(note).parent == tmp_path and Path(note).stat().st_mode & 0o777 == 0o600


def test_each_output_kind_is_cut_to_head_and_tail_and_kept_whole(tmp_path: Path) -> None:
    tb = "Traceback (most recent call last):\n" + "".join(f"  frame {i}\n" for i in range(20_000)) + "KeyError: 'k'\n"
    stdout = "".join(f"out {i}\n" for i in range(20_000))
    stderr = "".join(f"err {i}\n" for i in range(20_000))
    result = ExecResult(
        stdout=stdout,
        stderr=stderr,
        return_value="'" + "v" * 50_000 + "'",
        error=ExecError("KeyError", "'k'", 1, "d['k']", tb),
    )
    text = PythonTool(FakeSession(result), output_dir=tmp_path).handle("execute_code", {"code": "..."})
    assert len(text) <= 20_000
    for label, whole, first, last in [
        ("stdout", stdout, "out 0\n", "out 19999\n"),
        ("stderr", stderr, "err 0\n", "err 19999\n"),
        ("traceback", tb, "Traceback (most recent call last):\n", "KeyError: 'k'\n"),
    ]:
        body = text[text.index(f"{label}:\n") :]
        assert body.startswith(f"{label}:\n{first}")
        marker = re.search(r"\[\.\.\. ([\d,]+) characters \(([\d,]+) lines\) left out \.\.\.\]\n", body)
        assert marker is not None
        note = re.search(
            rf"{last}note: {label} was cut to fit this answer: {marker[1]} characters \({marker[2]} lines\) left out; "
            r"all of it is in the file (\S+) on the host\.\n",
            body,
        )
        assert note is not None, body[:3000]
        assert Path(note[1]).read_text() == whole
    assert "return value:\n'vvv" in text and "characters of one line left out" in text
    assert "error: KeyError at line 1: 'k'\n    d['k']\n" in text


def test_without_an_output_dir_the_note_says_the_whole_text_was_not_kept() -> None:
    text = PythonTool(FakeSession(ExecResult(stdout="z\n" * 50_000))).handle("execute_code", {"code": "..."})
    assert text.endswith("left out; it was not kept.\n") and len(text) <= 20_000


def test_a_short_section_is_shown_whole_beside_a_long_one() -> None:
    result = ExecResult(stdout="o" * 1_000_000, stderr="DeprecationWarning: short\n", return_value="7")
    text = PythonTool(FakeSession(result), max_answer_chars=5_000).handle("execute_code", {"code": "..."})
    assert "stderr:\nDeprecationWarning: short\nreturn value: 7\n" in text
    assert len(text) <= 5_000 and text.count("left out") == 2  # the marker and the note of stdout


def test_output_before_a_timeout_is_cut_too() -> None:
    exc = ExecutionTimeout("the cell ran past its 1 s timeout", stdout="tick\n" * 100_000, stderr="\x1b[5m" * 100_000)
    text = PythonTool(FakeSession(exc)).handle("execute_code", {"code": "loop()"})
    assert len(text) <= 20_000 and _safe(text)
    assert "stdout before the interrupt:\ntick\n" in text and "stderr before the interrupt:\n\\x1b[5m" in text


def test_the_tool_keeps_no_more_files_than_it_is_told(tmp_path: Path) -> None:
    results = [ExecResult(stdout=f"{i}\n" * 20_000) for i in range(5)]
    tool = PythonTool(FakeSession(*results), output_dir=tmp_path / "outputs", max_output_files=2)
    for _ in results:
        tool.handle("execute_code", {"code": "..."})
    kept = sorted(tmp_path.joinpath("outputs").iterdir())
    assert len(kept) == 2 and all(p.suffix == ".stdout" for p in kept)


def test_a_bad_call_is_answered_within_the_cap_too() -> None:
    text = PythonTool(FakeSession(), max_answer_chars=2_000).handle("\x1b]0;pwned\x07" * 10_000, {"code": "1"})
    assert text.startswith("status: invalid call\nThere is no tool ") and len(text) <= 2_000 and _safe(text)


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


@pytest.mark.parametrize(
    ("keywords", "words"),
    [
        ({"max_timeout": 0}, "max_timeout must be a positive number"),
        ({"max_timeout": float("inf")}, "max_timeout must be a positive number"),
        ({"max_answer_chars": 1_999}, "max_answer_chars must be a number of characters of at least 2,000, got 1999"),
        ({"max_answer_chars": 20_000.0}, "got 20000.0"),
        ({"max_answer_chars": True}, "got True"),
        ({"max_output_files": 0}, "max_output_files must be a positive int"),
        ({"output_dir": 3}, "output_dir must be a path"),
    ],
)
def test_the_arguments_are_checked(keywords: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(words)):
        PythonTool(FakeSession(), **keywords)
