"""PythonTool in a tool-calling loop: the real ``openai`` client, a scripted model on loopback, a real session.

The "model" is an OpenAI-compatible chat-completions server started here on 127.0.0.1 that gives
out canned replies in order and records what it was sent; nothing leaves the machine.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import openai
import pytest

from orchestrator import ConfigError, PythonTool, Session

pytestmark = pytest.mark.docker


@dataclass
class ScriptedModel:
    """Canned chat-completion messages, one per request; the request bodies it received."""

    replies: list[dict[str, Any]]
    requests: list[dict[str, Any]] = field(default_factory=list)
    base_url: str = ""


def _handler(model: ScriptedModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/v1/chat/completions" or not model.replies:
                self._send(404, {"error": {"message": f"nothing scripted for {self.path}", "type": "test"}})
                return
            model.requests.append(body)
            message = model.replies.pop(0)
            reason = "tool_calls" if message.get("tool_calls") else "stop"
            self._send(
                200,
                {
                    "id": f"chatcmpl-{len(model.requests)}",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body["model"],
                    "choices": [{"index": 0, "message": message, "finish_reason": reason}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                },
            )

        def _send(self, status: int, document: dict[str, Any]) -> None:
            data = json.dumps(document).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("x-should-retry", "false")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def scripted_model() -> Iterator[ScriptedModel]:
    model = ScriptedModel(replies=[])
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(model))
    thread = threading.Thread(target=server.serve_forever, name="scripted-model", daemon=True)
    thread.start()
    model.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield model
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def tool_call(call_id: str, code: str | None = None) -> dict[str, Any]:
    """The model calls execute_code with ``code``, or (None) undo_last_cell."""
    name, arguments = ("execute_code", json.dumps({"code": code})) if code is not None else ("undo_last_cell", "{}")
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}],
    }


def converse(model: ScriptedModel, tool: PythonTool, prompt: str) -> tuple[list[Any], list[dict[str, str]]]:
    """The loop of docs/tools.md with the real client against ``model``: the messages, and the tool's answers."""
    # trust_env=False: no proxy from the environment, the request stays on loopback.
    http_client = openai.DefaultHttpxClient(trust_env=False)
    client = openai.OpenAI(base_url=model.base_url, api_key="x", max_retries=0, http_client=http_client)
    messages: list[Any] = [{"role": "user", "content": prompt}]
    tool_results: list[dict[str, str]] = []
    try:
        for _ in range(10):
            response = client.chat.completions.create(model="scripted", messages=messages, tools=tool.definitions)
            message = response.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                tool_results.append(tool.handle_tool_call(call))
                messages.append(tool_results[-1])
    finally:
        client.close()
    return messages, tool_results


def test_a_tool_calling_loop_with_the_openai_client(scripted_model: ScriptedModel, session: Session) -> None:
    scripted_model.replies = [
        tool_call("call_1", "x = 21 * 2"),
        tool_call("call_2", "print(x)"),
        {"role": "assistant", "content": "x is 42."},
    ]
    tool = session.as_tool()
    messages, tool_results = converse(scripted_model, tool, "Compute 21 * 2 in Python, then print it.")

    assert messages[-1] == {"role": "assistant", "content": "x is 42."}
    assert [r["tool_call_id"] for r in tool_results] == ["call_1", "call_2"]
    assert tool_results[0]["content"].startswith("status: success\n")
    assert "stdout:\n42\n" in tool_results[1]["content"]
    requests = scripted_model.requests
    assert len(requests) == 3
    assert [t["function"]["name"] for t in requests[0]["tools"]] == ["execute_code", "reset_repl"]
    sent = [m for m in requests[2]["messages"] if m["role"] == "tool"]
    assert [(m["tool_call_id"], m["content"]) for m in sent] == [
        (r["tool_call_id"], r["content"]) for r in tool_results
    ]
    assert requests[2]["messages"][1]["tool_calls"][0]["function"]["name"] == "execute_code"


def test_a_model_undoes_the_cell_that_broke_its_data(scripted_model: ScriptedModel, session: Session) -> None:
    scripted_model.replies = [
        tool_call("c1", "class Stats:\n    def mean(self, v):\n        return sum(v) / len(v)\ndata = [3, 1, 2]"),
        tool_call("c2", "data = sorted(data)[5:]  # a slip: data is now empty"),
        tool_call("c3"),
        tool_call("c4", "print(Stats().mean(data), data)"),
        {"role": "assistant", "content": "The mean is 2.0."},
    ]
    tool = session.as_tool(undo=True)
    messages, results = converse(scripted_model, tool, "Find the mean of the data.")

    assert messages[-1]["content"] == "The mean is 2.0."
    assert [t["function"]["name"] for t in scripted_model.requests[0]["tools"]][-1] == "undo_last_cell"
    undone = results[2]["content"]
    assert undone.startswith("status: success\n") and "names restored or removed: data\n" in undone, undone
    assert "note: 1 earlier call can be undone in turn." in undone
    assert "stdout:\n2.0 [3, 1, 2]\n" in results[3]["content"]


def test_undo_on_a_real_sandbox_whatever_the_call_did(session: Session) -> None:
    tool = session.as_tool(undo=True)
    assert tool.handle("execute_code", {"code": "x = 'first'\nopen('kept.txt', 'w').write('file')"}).startswith(
        "status: success"
    )
    code = "import time\nx = 'partial'\nwhile True:\n    time.sleep(0.01)"
    assert tool.handle("execute_code", {"code": code, "timeout_seconds": 1}).startswith("status: timeout")
    assert "return value: 'partial'" in tool.handle("execute_code", {"code": "x"})  # the interrupt kept it
    assert tool.handle("execute_code", {"code": "del x"}).startswith("status: success")

    assert "names restored or removed: x" in tool.handle("undo_last_cell", {})  # the del
    assert "return value: 'partial'" in tool.handle("execute_code", {"code": "x"})
    assert "names restored or removed: time, x\n" in tool.handle("undo_last_cell", {})  # the timed-out cell
    text = tool.handle("execute_code", {"code": "x, open('kept.txt').read()"})
    assert "return value: ('first', 'file')" in text  # files are not undone
    assert "names restored or removed: x" in tool.handle("undo_last_cell", {})  # the first cell
    assert session.variables == [] and tool.handle("undo_last_cell", {}).startswith("status: not undone\n")


def test_the_text_of_an_error(shared_session: Session) -> None:
    tool = PythonTool(shared_session)
    text = tool.handle("execute_code", {"code": "values = [1, 2]\nif len(values) > 1\n    print(values)"})
    lines = text.splitlines()
    assert lines[0] == "status: error"
    assert lines[2].startswith("error: SyntaxError at line 2, column 19: ")
    assert lines[3:5] == ["    if len(values) > 1", "    " + " " * 18 + "^"]

    text = tool.handle("execute_code", '{"code": "def ratio(a, b):\\n    return a / b\\nratio(1, 0)"}')
    assert text.startswith("status: error\n")
    assert "error: ZeroDivisionError at line 2" in text
    assert "\n        return a / b\n" in text
    if "column" in text.splitlines()[2]:  # sandboxes on Python 3.11+
        assert "error: ZeroDivisionError at line 2, column 12: division by zero\n" in text
        assert "\n        return a / b\n               ^^^^^\n" in text
    assert "traceback:\nTraceback (most recent call last):\n" in text and "in ratio" in text


def test_the_text_of_a_timeout(shared_session: Session) -> None:
    tool = PythonTool(shared_session)
    code = "import time\nkept = 'yes'\nprint('started', flush=True)\nwhile True:\n    time.sleep(0.01)"
    text = tool.handle("execute_code", {"code": code, "timeout_seconds": 1})
    assert text.startswith("status: timeout\nelapsed: ")
    assert "what happened: the cell ran past its 1 s timeout" in text
    assert "stdout before the interrupt:\nstarted\n" in text
    assert "return value: 'yes'" in tool.handle("execute_code", {"code": "kept"})


def test_the_text_of_bad_arguments_and_a_reset(shared_session: Session) -> None:
    tool = PythonTool(shared_session)
    for name, arguments, words in [
        ("execute_code", "{'code': 'x = 1'}", "not valid JSON"),
        ("execute_code", "{}", 'needs the argument "code"'),
        ("execute_code", {"code": "x = 1", "timeout_seconds": -1}, "must be more than 0"),
        ("run_shell", {"cmd": "ls"}, "There is no tool 'run_shell'"),
    ]:
        text = tool.handle(name, arguments)
        assert text.startswith("status: invalid call\n") and words in text, text
    assert "return value: 3" in tool.handle("execute_code", {"code": "y = 3\ny"})
    assert tool.handle("reset_repl", "{}").startswith("status: success\nThe Python session was reset")
    assert "error: NameError" in tool.handle("execute_code", {"code": "y"})


def _safe(text: str) -> bool:
    return text.replace("\n", "").replace("\t", "").isprintable()


@pytest.mark.parametrize(
    ("code", "words"),
    [
        ("print('\\x1b[2J\\x1b]52;c;SGk=\\x07\\rforged\\u202e' * 20_000)", "characters of one line left out"),
        ("import sys\nsys.stdout.write('x' * 10_000_000)", "bytes left out"),  # one 10 MB line, kept in a file
        ("list(range(200_000))", "characters of one line left out"),  # a repr of 64 KiB (the agent's cap)
        ("raise ValueError('\\n'.join(map(str, range(100_000))))", "lines) left out"),  # a long message and traceback
        ("import sys\nfor i in range(100_000):\n    print(i)\n    print(-i, file=sys.stderr)", "lines) left out"),
    ],
    ids=["escape sequences", "one 10 MB line", "a huge repr", "a long traceback", "both streams"],
)
def test_a_hostile_cell_gets_a_model_sized_safe_answer_naming_the_file_with_all_of_it(
    session: Session, code: str, words: str
) -> None:
    tool = session.as_tool()
    text = tool.handle("execute_code", {"code": code})
    assert len(text) <= 20_000 and _safe(text), text[:2000]
    assert words in text
    files = re.findall(r"all of it is in the file (\S+) on the host", text)
    assert files and all(Path(f).parent == tool.output_dir and Path(f).stat().st_size > 20_000 for f in files)
    assert "return value: 'alive'" in tool.handle("execute_code", {"code": "'alive'"})  # the session goes on


def test_the_cap_is_the_callers(session: Session) -> None:
    small = session.as_tool(max_answer_chars=2_000).handle("execute_code", {"code": "print('z' * 5_000)"})
    assert len(small) <= 2_000 and "left out" in small
    large = session.as_tool(max_answer_chars=100_000).handle("execute_code", {"code": "print('z' * 5_000)"})
    assert "left out" not in large and "z" * 5_000 in large
    with pytest.raises(ConfigError, match="max_answer_chars must be a number of characters of at least 2,000"):
        session.as_tool(max_answer_chars=100)
