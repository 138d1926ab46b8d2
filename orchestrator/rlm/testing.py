"""A scripted OpenAI-compatible chat-completions server on loopback, for testing RLM flows with no model and no network.

rlms' ``openai`` backend talks to a model through the real ``openai`` client and a
``base_url``. Point that ``base_url`` at a ``ScriptedOpenAIServer`` and the "model" is your
script: a function of the request's messages and model, or a list of replies given out in
order. Every request is recorded, so a test can assert what the root model and the sub-calls
(``llm_query`` in the sandbox) were sent::

    def model(messages, model_name):
        if messages[0]["role"] != "system":          # an llm_query sub-call: one user message
            return "sub: " + messages[-1]["content"]
        return '```repl\\nanswer["content"] = "done"; answer["ready"] = True\\n```'

    with ScriptedOpenAIServer(model) as server:
        rlm = RLM(backend="openai", backend_kwargs={"model_name": "scripted", "base_url": server.base_url,
                                                     "api_key": "test"})
        ...
        server.requests                               # what was asked, and answered

A reply can also call tools: return a ``ScriptedReply`` with ``ToolCall``s and the answer's
message carries OpenAI's ``tool_calls`` (``finish_reason`` "tool_calls"), so a tool loop runs
offline; the next request holds the ``role: "tool"`` messages the loop sent back::

    def model(messages, model_name):
        if messages[-1]["role"] == "tool":                        # the loop ran the tool: answer with it
            return "the sum is " + messages[-1]["content"]
        return ScriptedReply(tool_calls=[ToolCall("execute_code", {"code": "print(1 + 1)"})])

The server speaks enough of the API for the ``openai`` client: ``POST .../chat/completions``
answers with ``id``, ``choices[0].message`` (``content``, ``tool_calls``), ``finish_reason`` and
``usage`` (prompt, completion and total tokens, counted as whitespace-separated words, not by a
tokenizer); with ``stream=true`` the same reply comes as server-sent ``chat.completion.chunk``
events (the text a few words at a time, each tool call's name and then its arguments in pieces,
``usage`` in a last chunk when ``stream_options.include_usage`` asks for it), then ``[DONE]``.
A script that fails (raises, returns something other than a str or a ``ScriptedReply``, or a
list that ran out) answers HTTP 500 with ``x-should-retry: false``, so the ``openai`` client
raises at once instead of retrying; the failure is in ``ScriptedRequest.error``. It uses only
the standard library and never imports rlms.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolCall:
    """One function call a scripted reply makes (an entry of OpenAI's ``tool_calls``)."""

    name: str
    """The function's name (the ``tools`` the request offered are not checked: a test may call one it did not)."""
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    """The arguments: a mapping (sent as JSON text) or the text itself (to test a model's malformed JSON)."""
    id: str | None = None
    """The call's id, which the ``role: "tool"`` answer names; None: ``call_<request>_<index>``."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError("a ToolCall's name must be a non-empty str")
        if not isinstance(self.arguments, (str, Mapping)):
            raise TypeError("a ToolCall's arguments must be a mapping or a str of JSON")
        if self.id is not None and not isinstance(self.id, str):
            raise TypeError("a ToolCall's id must be a str or None")

    @property
    def arguments_json(self) -> str:
        """The arguments as the wire carries them: JSON text."""
        return self.arguments if isinstance(self.arguments, str) else json.dumps(dict(self.arguments))


@dataclass(frozen=True)
class ScriptedReply:
    """A scripted model's answer with tool calls, text, or both (a plain str is text alone)."""

    content: str | None = None
    """The text; None (the default) with tool calls is what models send when they only call."""
    tool_calls: tuple[ToolCall, ...] = ()
    """The calls, in order (a list is accepted)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "tool_calls", tuple(self.tool_calls))
        if self.content is not None and not isinstance(self.content, str):
            raise TypeError("a ScriptedReply's content must be a str or None")
        if not all(isinstance(call, ToolCall) for call in self.tool_calls):
            raise TypeError("a ScriptedReply's tool_calls must be ToolCalls")
        if self.content is None and not self.tool_calls:
            raise TypeError("a ScriptedReply needs content, tool calls, or both")


Reply = str | ScriptedReply
Script = Callable[[list[dict[str, Any]], str], Reply]
"""A scripted model: ``(messages, model) -> reply`` (a str, or a ``ScriptedReply`` with tool calls). It may be
called from several threads at once."""

MAX_BODY_BYTES = 64 * 2**20
"""Largest request body the server reads; a bigger one gets HTTP 413."""


@dataclass(frozen=True)
class ScriptedRequest:
    """One chat-completions request the server received, and what it answered."""

    messages: list[dict[str, Any]]
    """The request's ``messages``, as sent."""
    model: str
    """The request's ``model``."""
    body: dict[str, Any]
    """The whole JSON body (sampling arguments, ``extra_body`` fields, ...)."""
    reply: str | None
    """The reply text sent back ("" for tool calls alone), or None when the script failed."""
    error: str | None
    """Why the script failed (the reply was HTTP 500), or None."""
    prompt_tokens: int
    completion_tokens: int
    tool_calls: tuple[ToolCall, ...] = ()
    """The tool calls sent back (their ids filled in)."""
    streamed: bool = False
    """Whether the request asked for ``stream=true`` (and got server-sent events)."""

    @property
    def prompt(self) -> str:
        """The content of the last message (for a sub-call: its prompt)."""
        if not self.messages:
            return ""
        content = self.messages[-1].get("content", "")
        return content if isinstance(content, str) else json.dumps(content)


class _ListScript:
    """Replies from a list, one per request, in the order the requests arrive."""

    def __init__(self, replies: Iterable[Reply]) -> None:
        self._replies = collections.deque(replies)
        self._lock = threading.Lock()

    def __call__(self, messages: list[dict[str, Any]], model: str) -> Reply:
        with self._lock:
            if not self._replies:
                raise LookupError("the scripted replies ran out: the list had fewer replies than requests came")
            return self._replies.popleft()


def count_words(text: str) -> int:
    """The stand-in for a token count: whitespace-separated words."""
    return len(text.split())


def _message_words(messages: list[dict[str, Any]]) -> int:
    total = 0
    for message in messages:
        content = message.get("content", "") if isinstance(message, dict) else message
        total += count_words(content if isinstance(content, str) else json.dumps(content))
    return total


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"  # one request per connection: no idle keep-alive threads at close

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("scripted server: " + format, *args)

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if not path.endswith("/chat/completions"):
            self._error(404, f"no such endpoint: POST {path} (only .../chat/completions)", "not_found_error")
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._error(411, "a Content-Length header is required", "invalid_request_error")
            return
        if not 0 <= length <= MAX_BODY_BYTES:
            self._error(413, f"the body is larger than {MAX_BODY_BYTES} bytes", "invalid_request_error")
            return
        try:
            body = json.loads(self.rfile.read(length))
        except ValueError as exc:
            self._error(400, f"the body is not JSON: {exc}", "invalid_request_error")
            return
        problem = _check_body(body)
        if problem is not None:
            self._error(400, problem, "invalid_request_error")
            return
        self._complete(body)

    def do_GET(self) -> None:
        self._error(404, f"no such endpoint: GET {self.path} (only POST .../chat/completions)", "not_found_error")

    def _complete(self, body: dict[str, Any]) -> None:
        messages: list[dict[str, Any]] = body["messages"]
        model: str = body["model"]
        streamed = bool(body.get("stream"))
        number = self.server.log.next_id()
        prompt_tokens = _message_words(messages)
        answer: ScriptedReply | None = None
        error: str | None = None
        try:
            answer = _as_reply(self.server.script(messages, model), number)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            logger.warning("scripted server: the script failed: %s", error)
        completion_tokens = 0 if answer is None else _reply_words(answer)
        self.server.log.record(
            ScriptedRequest(
                messages=messages,
                model=model,
                body=body,
                reply=None if answer is None else answer.content or "",
                error=error,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                tool_calls=() if answer is None else answer.tool_calls,
                streamed=streamed,
            )
        )
        if answer is None:
            self._error(500, f"the scripted model failed: {error}", "server_error")
            return
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        head = {"id": f"chatcmpl-scripted-{number}", "created": int(time.time()), "model": model}
        if streamed:
            options = body.get("stream_options")
            with_usage = isinstance(options, dict) and bool(options.get("include_usage"))
            self._send_events(_chunks(head, answer, usage if with_usage else None))
            return
        message: dict[str, Any] = {"role": "assistant", "content": answer.content}
        if answer.tool_calls:
            message["tool_calls"] = [_wire_call(call) for call in answer.tool_calls]
        self._send(
            200,
            {
                **head,
                "object": "chat.completion",
                "choices": [
                    {"index": 0, "message": message, "finish_reason": _finish_reason(answer), "logprobs": None}
                ],
                "usage": usage,
            },
        )

    def _error(self, status: int, message: str, kind: str) -> None:
        self._send(status, {"error": {"message": message, "type": kind, "param": None, "code": None}})

    def _send_events(self, events: Iterator[dict[str, Any]]) -> None:
        """Server-sent events, one ``data:`` line each, then ``[DONE]``; the closed connection ends the body."""
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            for event in events:
                self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
        except OSError:
            logger.debug("scripted server: the client closed during the stream")

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status >= 400:
                self.send_header("x-should-retry", "false")  # the openai client obeys this: no retry, no backoff
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client went away; nothing to tell it
            logger.debug("scripted server: the client closed before the reply was sent")


def _check_body(body: Any) -> str | None:
    """Why ``body`` is not a chat-completions request this server answers, or None."""
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    if not isinstance(body.get("model"), str):
        return "'model' must be a string"
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return "'messages' must be a list of objects"
    return None


def _as_reply(answer: object, number: int) -> ScriptedReply:
    """The script's answer as a ``ScriptedReply`` whose tool calls all have ids.

    Raises:
        TypeError: the answer is neither a str nor a ``ScriptedReply``.
    """
    if isinstance(answer, str):
        return ScriptedReply(content=answer)
    if not isinstance(answer, ScriptedReply):
        raise TypeError(f"the script returned {type(answer).__name__}, not a str or a ScriptedReply")
    calls = tuple(
        call if call.id is not None else dataclasses.replace(call, id=f"call_{number}_{index}")
        for index, call in enumerate(answer.tool_calls)
    )
    return dataclasses.replace(answer, tool_calls=calls)


def _reply_words(answer: ScriptedReply) -> int:
    return count_words(answer.content or "") + sum(
        count_words(f"{call.name} {call.arguments_json}") for call in answer.tool_calls
    )


def _finish_reason(answer: ScriptedReply) -> str:
    return "tool_calls" if answer.tool_calls else "stop"


def _wire_call(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments_json}}


def _pieces(text: str, size: int = 3) -> Iterator[str]:
    """``text`` a few words at a time (spaces kept), as a model streams it."""
    words = re.findall(r"\S+\s*|\s+", text)
    for start in range(0, len(words), size):
        yield "".join(words[start : start + size])


def _chunks(head: dict[str, Any], answer: ScriptedReply, usage: dict[str, int] | None) -> Iterator[dict[str, Any]]:
    """The ``chat.completion.chunk`` events of one streamed reply, in the order OpenAI sends them."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return {**head, "object": "chat.completion.chunk", "choices": [choice]}

    yield chunk({"role": "assistant", "content": "" if answer.content is not None else None})
    for piece in _pieces(answer.content or ""):
        yield chunk({"content": piece})
    for index, call in enumerate(answer.tool_calls):
        opening = {"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
        yield chunk({"tool_calls": [opening]})
        for piece in _pieces(call.arguments_json, size=2):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, _finish_reason(answer))
    if usage is not None:
        yield {**head, "object": "chat.completion.chunk", "choices": [], "usage": usage}


class _Log:
    """The requests a server received, shared by its handler threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[ScriptedRequest] = []
        self._ids = itertools.count(1)

    def record(self, request: ScriptedRequest) -> None:
        with self.lock:
            self.requests.append(request)

    def next_id(self) -> int:
        with self.lock:
            return next(self._ids)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], script: Script, log: _Log) -> None:
        super().__init__(address, _Handler)
        self.script = script
        self.log = log


class ScriptedOpenAIServer:
    """An OpenAI-compatible chat-completions endpoint on 127.0.0.1 whose replies come from a script.

    It listens on an ephemeral port from construction (or ``start()``) until ``close()`` or the
    end of its ``with`` block, serving each request on its own thread.
    """

    def __init__(self, script: Script | Iterable[Reply], *, host: str = "127.0.0.1", start: bool = True) -> None:
        """Make the server (and start it, unless ``start=False``).

        Args:
            script: ``(messages, model) -> str | ScriptedReply`` called for every request (possibly from several
                threads at once), or an iterable of replies (str or ScriptedReply) given out in arrival order.
            host: the loopback address to listen on.
            start: listen at once; otherwise call ``start()`` or enter the ``with`` block.

        Raises:
            TypeError: ``script`` is neither callable nor an iterable of replies (a single str included).
            ValueError: ``host`` is not a loopback address.
        """
        if callable(script):
            self._script: Script = script
        elif isinstance(script, (str, bytes)) or not isinstance(script, Iterable):
            raise TypeError("script must be a callable (messages, model) -> reply or an iterable of replies")
        else:
            replies = list(script)
            if not all(isinstance(reply, (str, ScriptedReply)) for reply in replies):
                raise TypeError("every scripted reply must be a str or a ScriptedReply")
            self._script = _ListScript(replies)
        if host not in ("127.0.0.1", "::1", "localhost"):
            raise ValueError(f"the scripted server listens on loopback only, not {host!r}")
        self._host = host
        self._log = _Log()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        if start:
            self.start()

    def start(self) -> ScriptedOpenAIServer:
        """Listen and serve on a background thread; a server already started is left as it is."""
        with self._lock:
            if self._server is None:
                server = _Server((self._host, 0), self._script, self._log)
                thread = threading.Thread(
                    target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="scripted-openai", daemon=True
                )
                thread.start()
                self._server, self._thread = server, thread
                logger.debug("scripted OpenAI server on %s", self.base_url)
        return self

    def close(self) -> None:
        """Stop serving and close the listening socket. Calling it again does nothing."""
        with self._lock:
            server, thread = self._server, self._thread
            self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join()

    def __enter__(self) -> ScriptedOpenAIServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _running(self) -> _Server:
        server = self._server
        if server is None:
            raise RuntimeError("the scripted server is not running (start() it, or use it in a with block)")
        return server

    @property
    def port(self) -> int:
        """The port it listens on.

        Raises:
            RuntimeError: the server is not running.
        """
        return int(self._running().server_address[1])

    @property
    def base_url(self) -> str:
        """The ``base_url`` for the ``openai`` client (and rlms' ``backend_kwargs``): ``http://127.0.0.1:PORT/v1``.

        Raises:
            RuntimeError: the server is not running.
        """
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}/v1"

    @property
    def requests(self) -> list[ScriptedRequest]:
        """Every request answered so far (a copy), in the order the replies were made; readable after ``close()``."""
        with self._log.lock:
            return list(self._log.requests)

    @property
    def errors(self) -> list[str]:
        """Why the script failed, for each request it failed on."""
        return [request.error for request in self.requests if request.error is not None]

    def __repr__(self) -> str:
        state = self.base_url if self._server is not None else "stopped"
        return f"<ScriptedOpenAIServer {state}, {len(self.requests)} requests>"
