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

The server speaks just enough of the API for a non-streaming client: ``POST .../chat/completions``
answers with ``id``, ``choices[0].message.content``, ``finish_reason`` and ``usage`` (prompt,
completion and total tokens, counted as whitespace-separated words, not by a tokenizer).
A script that fails (raises, returns something other than a str, or a list that ran out)
answers HTTP 500 with ``x-should-retry: false``, so the ``openai`` client raises at once
instead of retrying; the failure is in ``ScriptedRequest.error``. It uses only the standard
library and never imports rlms.
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

logger = logging.getLogger(__name__)

Script = Callable[[list[dict[str, Any]], str], str]
"""A scripted model: ``(messages, model) -> reply text``. It may be called from several threads at once."""

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
    """The reply text sent back, or None when the script failed."""
    error: str | None
    """Why the script failed (the reply was HTTP 500), or None."""
    prompt_tokens: int
    completion_tokens: int

    @property
    def prompt(self) -> str:
        """The content of the last message (for a sub-call: its prompt)."""
        if not self.messages:
            return ""
        content = self.messages[-1].get("content", "")
        return content if isinstance(content, str) else json.dumps(content)


class _ListScript:
    """Replies from a list, one per request, in the order the requests arrive."""

    def __init__(self, replies: Iterable[str]) -> None:
        self._replies = collections.deque(replies)
        self._lock = threading.Lock()

    def __call__(self, messages: list[dict[str, Any]], model: str) -> str:
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
        prompt_tokens = _message_words(messages)
        reply: str | None = None
        error: str | None = None
        try:
            answer = self.server.script(messages, model)
            if not isinstance(answer, str):
                raise TypeError(f"the script returned {type(answer).__name__}, not a str")
            reply = answer
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            logger.warning("scripted server: the script failed: %s", error)
        completion_tokens = count_words(reply) if reply is not None else 0
        self.server.log.record(
            ScriptedRequest(
                messages=messages,
                model=model,
                body=body,
                reply=reply,
                error=error,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
            )
        )
        if reply is None:
            self._error(500, f"the scripted model failed: {error}", "server_error")
            return
        self._send(
            200,
            {
                "id": f"chatcmpl-scripted-{self.server.log.next_id()}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": reply},
                        "finish_reason": "stop",
                        "logprobs": None,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            },
        )

    def _error(self, status: int, message: str, kind: str) -> None:
        self._send(status, {"error": {"message": message, "type": kind, "param": None, "code": None}})

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
    if body.get("stream"):
        return "stream=true is not supported by ScriptedOpenAIServer"
    return None


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

    def __init__(self, script: Script | Iterable[str], *, host: str = "127.0.0.1", start: bool = True) -> None:
        """Make the server (and start it, unless ``start=False``).

        Args:
            script: ``(messages, model) -> str`` called for every request (possibly from several
                threads at once), or an iterable of reply strings given out in arrival order.
            host: the loopback address to listen on.
            start: listen at once; otherwise call ``start()`` or enter the ``with`` block.

        Raises:
            TypeError: ``script`` is neither callable nor an iterable of str (a single str included).
            ValueError: ``host`` is not a loopback address.
        """
        if callable(script):
            self._script: Script = script
        elif isinstance(script, (str, bytes)) or not isinstance(script, Iterable):
            raise TypeError("script must be a callable (messages, model) -> str or an iterable of reply strings")
        else:
            replies = list(script)
            if not all(isinstance(reply, str) for reply in replies):
                raise TypeError("every scripted reply must be a str")
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
