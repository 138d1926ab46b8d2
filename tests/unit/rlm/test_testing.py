"""ScriptedOpenAIServer, without Docker: the real openai client and rlms' OpenAI backend accept its replies.

Everything stays on 127.0.0.1.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from typing import Any

import openai
import pytest
from rlm.clients.openai import OpenAIClient

from orchestrator.rlm.testing import ScriptedOpenAIServer, ScriptedReply, ToolCall


def chat(server: ScriptedOpenAIServer, content: str, model: str = "m", **extra: Any) -> Any:
    with openai.OpenAI(api_key="test", base_url=server.base_url) as client:
        return client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}], **extra)


def test_a_callable_script_answers_and_every_request_is_recorded() -> None:
    def script(messages: list[dict[str, Any]], model: str) -> str:
        return f"{model} heard {messages[-1]['content']}"

    with ScriptedOpenAIServer(script) as server:
        assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
        reply = chat(server, "two words", model="scripted", temperature=0.5)
    assert reply.choices[0].message.content == "scripted heard two words"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == "scripted"
    assert reply.id.startswith("chatcmpl-")
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == (2, 4, 6)
    (request,) = server.requests  # still readable after close
    assert request.messages == [{"role": "user", "content": "two words"}]
    assert request.model == "scripted"
    assert request.body["temperature"] == 0.5
    assert request.prompt == "two words"
    assert request.reply == "scripted heard two words"
    assert server.errors == []


def test_rlms_openai_backend_reads_the_reply_and_its_usage() -> None:
    with ScriptedOpenAIServer(lambda messages, model: "one two three") as server:
        client = OpenAIClient(api_key="test", model_name="scripted", base_url=server.base_url)
        try:
            assert client.completion("hello there") == "one two three"
            assert client.completion([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]) == (
                "one two three"
            )
        finally:
            client.client.close()
    usage = client.get_usage_summary().model_usage_summaries["scripted"]
    assert (usage.total_calls, usage.total_input_tokens, usage.total_output_tokens) == (2, 4, 6)
    assert client.get_last_usage().total_output_tokens == 3


def test_a_list_is_given_out_in_order_and_running_out_fails_at_once(caplog: pytest.LogCaptureFixture) -> None:
    with ScriptedOpenAIServer(["first", "second"]) as server:
        assert chat(server, "a").choices[0].message.content == "first"
        assert chat(server, "b").choices[0].message.content == "second"
        started = time.monotonic()
        with (
            caplog.at_level(logging.CRITICAL, logger="orchestrator.rlm.testing"),
            pytest.raises(openai.InternalServerError, match="ran out"),
        ):
            chat(server, "c")
        assert time.monotonic() - started < 1.0, "x-should-retry: false, so the client does not back off and retry"
    assert [r.reply for r in server.requests] == ["first", "second", None]
    assert len(server.errors) == 1 and "ran out" in server.errors[0]


def test_a_script_that_raises_or_returns_no_str_is_a_500(caplog: pytest.LogCaptureFixture) -> None:
    replies: list[Any] = [ValueError("boom"), 42]

    def script(messages: list[dict[str, Any]], model: str) -> str:
        reply = replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply  # type: ignore[no-any-return]

    with caplog.at_level(logging.CRITICAL, logger="orchestrator.rlm.testing"), ScriptedOpenAIServer(script) as server:
        with pytest.raises(openai.InternalServerError, match="ValueError: boom"):
            chat(server, "a")
        with pytest.raises(openai.InternalServerError, match="returned int"):
            chat(server, "b")
    assert server.errors == ["ValueError: boom", "TypeError: the script returned int, not a str or a ScriptedReply"]


def _post(url: str, body: bytes) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def test_malformed_requests_get_openai_shaped_errors_and_never_reach_the_script() -> None:
    with ScriptedOpenAIServer(["never used"]) as server:
        url = f"{server.base_url}/chat/completions"
        for body, status, words in [
            (b"not json", 400, "not JSON"),
            (b"[]", 400, "JSON object"),
            (json.dumps({"messages": []}).encode(), 400, "'model'"),
            (json.dumps({"model": "m", "messages": "hi"}).encode(), 400, "'messages'"),
        ]:
            code, payload = _post(url, body)
            assert code == status
            assert words in payload["error"]["message"]
        code, payload = _post(f"{server.base_url}/embeddings", b"{}")
        assert code == 404 and "only .../chat/completions" in payload["error"]["message"]
    assert server.requests == []


def test_construction_checks_and_lifecycle() -> None:
    with pytest.raises(TypeError):
        ScriptedOpenAIServer("one reply")
    with pytest.raises(TypeError):
        ScriptedOpenAIServer([1, 2])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="loopback"):
        ScriptedOpenAIServer(["x"], host="0.0.0.0")
    server = ScriptedOpenAIServer(["x"], start=False)
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.base_url
    with server:
        assert chat(server, "a").choices[0].message.content == "x"
    server.close()  # again: nothing to do
    assert "stopped" in repr(server)


# ----------------------------------------------------------------- tool calls

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "add two numbers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }
]


def test_a_reply_can_call_tools_and_the_openai_client_reads_the_calls() -> None:
    calls = [ToolCall("add", {"a": 2, "b": 3}), ToolCall("add", '{"a": 1', id="mine")]
    with ScriptedOpenAIServer([ScriptedReply(tool_calls=calls), ScriptedReply("both", [ToolCall("add")])]) as server:
        first = chat(server, "add", tools=TOOLS).choices[0]
        second = chat(server, "again", tools=TOOLS).choices[0]
    assert first.finish_reason == "tool_calls" and first.message.content is None
    got = [(c.id, c.type, c.function.name, c.function.arguments) for c in first.message.tool_calls]
    assert got == [("call_1_0", "function", "add", '{"a": 2, "b": 3}'), ("mine", "function", "add", '{"a": 1')]
    assert second.finish_reason == "tool_calls" and second.message.content == "both"
    assert second.message.tool_calls[0].function.arguments == "{}"
    recorded = server.requests[0]
    assert recorded.reply == "" and [c.id for c in recorded.tool_calls] == ["call_1_0", "mine"]
    assert recorded.body["tools"] == TOOLS


def test_a_tool_loop_runs_offline_through_the_openai_client() -> None:
    """The loop an agent runs: the model calls a tool, the loop answers with a ``tool`` message, the model ends."""

    def model(messages: list[dict[str, Any]], model_name: str) -> str | ScriptedReply:
        if messages[-1]["role"] == "tool":
            return f"the sum is {messages[-1]['content']}"
        return ScriptedReply(tool_calls=[ToolCall("add", {"a": 2, "b": 40})])

    tools = {"add": lambda a, b: a + b}
    with ScriptedOpenAIServer(model) as server, openai.OpenAI(api_key="test", base_url=server.base_url) as client:
        messages: list[Any] = [{"role": "user", "content": "what is 2 + 40?"}]
        while True:
            message = client.chat.completions.create(model="m", messages=messages, tools=TOOLS).choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                result = tools[call.function.name](**json.loads(call.function.arguments))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
    assert message.content == "the sum is 42"
    first, second = server.requests
    assert first.tool_calls[0].name == "add"
    assert second.messages[-1] == {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "42"}


def test_a_streamed_reply_carries_the_text_and_the_tool_calls_in_pieces() -> None:
    text = "one two three four five six seven"
    reply = ScriptedReply(text, [ToolCall("add", {"a": 2, "b": 3}), ToolCall("add", {"a": 10, "b": 20})])
    with (
        ScriptedOpenAIServer([reply, "plain words only"]) as server,
        openai.OpenAI(api_key="test", base_url=server.base_url) as client,
    ):
        chunks = list(
            client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "go"}],
                tools=TOOLS,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        plain = list(
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True)
        )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == text and sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 1
    calls: dict[int, dict[str, str]] = {}
    for c in chunks:
        for delta in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            entry = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += delta.id or ""
            entry["name"] += (delta.function.name or "") if delta.function else ""
            entry["arguments"] += (delta.function.arguments or "") if delta.function else ""
    assert [(v["name"], json.loads(v["arguments"])) for _, v in sorted(calls.items())] == [
        ("add", {"a": 2, "b": 3}),
        ("add", {"a": 10, "b": 20}),
    ]
    assert [v["id"] for _, v in sorted(calls.items())] == ["call_1_0", "call_1_1"]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == server.requests[0].completion_tokens
    assert "".join(c.choices[0].delta.content or "" for c in plain) == "plain words only"
    assert plain[-1].choices[0].finish_reason == "stop" and all(c.usage is None for c in plain)
    assert [r.streamed for r in server.requests] == [True, True]


def test_scripted_replies_are_checked_when_made() -> None:
    with pytest.raises(TypeError, match="needs content"):
        ScriptedReply()
    with pytest.raises(TypeError, match="ToolCalls"):
        ScriptedReply(tool_calls=[{"name": "add"}])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="non-empty"):
        ToolCall("")
    with pytest.raises(TypeError, match="mapping or a str"):
        ToolCall("add", [1])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="str or a ScriptedReply"):
        ScriptedOpenAIServer(["ok", 3])  # type: ignore[list-item]
