"""Runs inside the sandbox: the REPL surface rlms gives its model (llm_query, rlm_query, SHOW_VARS, answer, tools).

Never imported on the host: ``orchestrator.rlm.scaffold`` reads this file as text, appends one
``_configure(...)`` line and hands it to ``Session.set_scaffold``, which runs it in a module of
its own in every worker (again after every restart). The worker has put ``host_call``,
``HostCallError``, ``deferred_values`` and ``load_deferred`` (values a restore has not loaded yet)
into that module before it runs; every LM call leaves the sandbox through them, as JSON, to the
host's handlers (``orchestrator.rlm.bridge``).

Standard library only and Python 3.9+, like the agent: it runs on the sandbox image's Python.
"""

from __future__ import annotations

import builtins
import collections
import json
from collections.abc import Callable
from typing import Any

# The worker puts these into this module's globals before the code runs.
_host_call: Callable[..., Any] = globals()["host_call"]
_HostCallError: type[Exception] = globals()["HostCallError"]
_deferred_values: Callable[[], dict[str, int]] = globals()["deferred_values"]
_load_deferred: Callable[[str], Any] = globals()["load_deferred"]

HELPERS = ("llm_query", "llm_query_batched", "rlm_query", "rlm_query_batched", "SHOW_VARS")
COMPACTION_NAME = "_rlm_history"
EMPTY_ANSWER = {"content": "", "ready": False}
_NO_VARIABLES = "No variables created yet. Use ```repl``` blocks to create variables."

_MAX_TEXT = 200  # characters of a str / bytes shown in a locals repr
_MAX_ITEMS = 10  # items of a container shown
_MAX_DEPTH = 3  # container nesting shown
_MAX_REPR = 400  # characters of one locals repr in all
_MAX_LOCALS = 500  # names reported in locals
_MAX_ANSWER_JSON = 4 << 20  # the final answer travels in the reply's JSON header

_config: dict[str, Any] = {"compaction": False, "code_tools": {}, "host_tools": []}
_owned: frozenset[str] = frozenset(HELPERS)
_tools: dict[str, Any] | None = None  # built in this worker on its first cell
_namespace: dict[str, Any] = {}  # the user namespace, known from the first before_cell on


def _configure(config: dict[str, Any]) -> None:
    global _owned
    _config.update(config)
    _owned = frozenset(HELPERS) | frozenset(_config["code_tools"]) | frozenset(_config["host_tools"])


# -- what the model calls


def _single(name: str, prompt: Any, model: str | None) -> str:
    try:
        return str(_host_call(name, {"prompt": prompt, "model": model}))
    except _HostCallError as exc:
        return f"Error: {exc}"


def _batched(name: str, prompts: Any, model: str | None) -> list[str]:
    prompts = list(prompts)
    if not prompts:
        return []
    try:
        results = _host_call(name, {"prompts": prompts, "model": model})
    except _HostCallError as exc:
        return [f"Error: {exc}"] * len(prompts)
    return [str(result) for result in results]


def llm_query(prompt: Any, model: str | None = None) -> str:
    """One plain LM completion (no REPL, no recursion); an "Error: ..." string when it fails."""
    return _single("llm_query", prompt, model)


def llm_query_batched(prompts: Any, model: str | None = None) -> list[str]:
    """Plain LM completions of many prompts at once, answers in prompt order."""
    return _batched("llm_query_batched", prompts, model)


def rlm_query(prompt: Any, model: str | None = None) -> str:
    """A recursive RLM sub-call (a plain LM completion when recursion is not configured)."""
    return _single("rlm_query", prompt, model)


def rlm_query_batched(prompts: Any, model: str | None = None) -> list[str]:
    """Recursive RLM sub-calls of many prompts, answers in prompt order; one failure does not fail the rest."""
    return _batched("rlm_query_batched", prompts, model)


def SHOW_VARS() -> str:
    """The variables of the REPL and their types."""
    for name in sorted(_deferred_values()):  # the model asked to see them all
        _load_deferred(name)
    available = {}
    for name, value in list(_namespace.items()):
        if not name.startswith("_") and name != "answer" and name not in _owned:
            available[name] = type(value).__name__
    if not available:
        return _NO_VARIABLES
    return f"Available variables: {available!r}"


# -- custom tools


def _stub(name: str, message: str) -> Callable[..., Any]:
    def stub(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(message)

    stub.__name__ = stub.__qualname__ = name
    return stub


def _host_callable_stub(name: str) -> Callable[..., Any]:
    return _stub(
        name,
        f"custom tool {name!r} is a Python callable of the host process and cannot run inside the Docker sandbox; "
        f"pass its source code as a string instead, e.g. custom_tools={{{name!r}: 'def {name}(...): ...'}}",
    )


def _load_tool(name: str, source: str) -> Any:
    """Run a code tool in a module of its own (like the peer: it sees the helpers, not the user's variables).

    The host checked that ``source`` is a lambda expression or defines ``name``.
    """
    scope: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    scope.update((helper, globals()[helper]) for helper in HELPERS)
    filename = f"<tool {name}>"
    try:
        if source.lstrip().startswith("lambda"):
            return eval(compile(source.strip(), filename, "eval"), scope)
        exec(compile(source, filename, "exec"), scope)
    except Exception as exc:
        return _stub(name, f"custom tool {name!r} could not be defined: {type(exc).__name__}: {exc}")
    if name not in scope:
        return _stub(name, f"custom tool {name!r}: its code ran but did not define {name!r}")
    return scope[name]


def _tool_objects() -> dict[str, Any]:
    global _tools
    if _tools is None:
        made = {name: _load_tool(name, source) for name, source in _config["code_tools"].items()}
        made.update((name, _host_callable_stub(name)) for name in _config["host_tools"])
        _tools = made
    return _tools


# -- reserved names


def _restore(namespace: dict[str, Any]) -> None:
    """Put back what a cell may have overwritten: helpers, tools, the context/history aliases, the answer dict."""
    for helper in HELPERS:
        namespace[helper] = globals()[helper]
    namespace.update(_tool_objects())
    deferred = _deferred_values()  # stored values a restore has not loaded yet
    _alias(namespace, deferred, "context", "context_0")
    if _config["compaction"]:
        canonical = namespace.get(COMPACTION_NAME)
        if isinstance(canonical, list) and namespace.get("history") is not canonical:
            namespace["history"] = canonical
    else:
        _alias(namespace, deferred, "history", "history_0")
    if "answer" not in deferred and not isinstance(namespace.get("answer"), dict):
        namespace["answer"] = dict(EMPTY_ANSWER)


def _alias(namespace: dict[str, Any], deferred: dict[str, int], alias: str, name: str) -> None:
    """Bind ``alias`` to ``name``'s value; both still deferred (one blob) need nothing, and load nothing."""
    if name in namespace:
        namespace[alias] = namespace[name]
    elif name in deferred and alias not in deferred:  # the cell rebound the alias: the value comes back
        namespace[alias] = _load_deferred(name)


def before_cell(namespace: dict[str, Any]) -> None:
    global _namespace
    _namespace = namespace
    _restore(namespace)


def after_cell(namespace: dict[str, Any]) -> dict[str, Any]:
    _restore(namespace)
    return {"final_answer": _final_answer(namespace.get("answer")), "locals": _locals(namespace)}


# -- what goes back to the host


def _final_answer(answer: Any) -> str | None:
    if not isinstance(answer, dict) or not answer.get("ready"):
        return None
    content = answer.get("content", "")
    try:
        text = str(content)
    except Exception as exc:
        text = f"<str() of the answer raised {type(exc).__name__}: {exc}>"
    if len(json.dumps(text)) > _MAX_ANSWER_JSON:
        cut = _MAX_ANSWER_JSON // 8
        text = f"{text[:cut]}... [answer cut: {len(text) - cut} more characters]"
    return text


def _locals(namespace: dict[str, Any]) -> dict[str, str]:
    view: dict[str, str] = {}
    deferred = _deferred_values()
    names = [n for n in [*namespace, *sorted(deferred)] if not n.startswith("_") and n not in _owned]
    for name in names[:_MAX_LOCALS]:
        if name in namespace:
            view[name] = _short_repr(namespace[name])
        elif name in deferred:  # shown without loading it: after_cell runs after every cell
            view[name] = f"<stored value of {deferred[name]} bytes, loaded when a cell uses it>"
    if len(names) > _MAX_LOCALS:
        view["..."] = f"{len(names) - _MAX_LOCALS} more names"
    return view


def _short_repr(value: Any) -> str:
    """A repr bounded in size and in cost (a 50 MB str costs its first characters, not 50 MB)."""
    try:
        text = _bounded(value, _MAX_DEPTH)
    except Exception as exc:
        text = f"<{type(value).__name__} object; repr() raised {type(exc).__name__}>"
    if len(text) > _MAX_REPR:
        text = text[:_MAX_REPR] + "..."
    return text


_BRACKETS = {list: ("[", "]"), tuple: ("(", ")"), set: ("{", "}"), frozenset: ("frozenset({", "})")}


def _bounded(value: Any, depth: int) -> str:
    if isinstance(value, (str, bytes, bytearray)):
        text = repr(value[:_MAX_TEXT])
        return text if len(value) <= _MAX_TEXT else f"{text}... ({len(value)} in all)"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"<int of {value.bit_length()} bits>"
    if isinstance(value, dict):
        if depth <= 0:
            return "{...}"
        items = []
        for index, (key, item) in enumerate(value.items()):
            if index >= _MAX_ITEMS:
                items.append("...")
                break
            items.append(f"{_bounded(key, depth - 1)}: {_bounded(item, depth - 1)}")
        return _typed(value, dict, "{" + ", ".join(items) + "}")
    for kind in (list, tuple, set, frozenset, collections.deque):
        if isinstance(value, kind):
            left, right = _BRACKETS.get(kind, ("deque([", "])"))
            if depth <= 0:
                return left + "..." + right
            items = []
            for index, item in enumerate(value):
                if index >= _MAX_ITEMS:
                    items.append("...")
                    break
                items.append(_bounded(item, depth - 1))
            trail = "," if kind is tuple and len(items) == 1 else ""
            return _typed(value, kind, left + ", ".join(items) + trail + right)
    text = repr(value)
    return text if len(text) <= _MAX_REPR else text[:_MAX_REPR] + "..."


def _typed(value: Any, kind: type, text: str) -> str:
    return text if type(value) is kind else f"{type(value).__name__}({text})"
