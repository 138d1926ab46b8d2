"""The sandbox side of orchestrator.rlm, run in this process with a fake ``host_call`` (no Docker).

The scaffold source is exec'd the way the worker runs it: in a fresh module dict holding
``host_call`` and ``HostCallError``, then ``before_cell`` / ``after_cell`` around user code.
"""

from __future__ import annotations

import ast
import time
from typing import Any

import pytest

from orchestrator.rlm import scaffold
from orchestrator.rlm.tools import plan_tools


class FakeHostCallError(RuntimeError):
    pass


def load(compaction: bool = False, tools: dict[str, Any] | None = None, answers: Any = None) -> dict[str, Any]:
    """The scaffold module as the worker makes it; ``answers(name, payload)`` plays the host."""
    calls: list[tuple[str, Any]] = []

    def host_call(name: str, payload: Any = None, timeout: float | None = None) -> Any:
        calls.append((name, payload))
        if answers is None:
            raise FakeHostCallError("No LM handler configured")
        return answers(name, payload)

    deferred: dict[str, Any] = {}  # values a restore deferred: loaded into the namespace ``run`` last used

    def load_deferred(name: str) -> Any:
        value = module["namespace"][name] = deferred.pop(name)
        return value

    module: dict[str, Any] = {"__name__": "__orchestrator_scaffold__", "host_call": host_call}
    module["HostCallError"] = FakeHostCallError
    module["deferred_values"] = lambda: {n: len(v) for n, v in deferred.items() if n not in module["namespace"]}
    module["load_deferred"] = load_deferred
    module["deferred"] = deferred
    source = scaffold.scaffold_source(compaction=compaction, tools=plan_tools(tools))
    exec(compile(source, "<scaffold>", "exec"), module)
    module["calls"] = calls
    return module


def run(module: dict[str, Any], namespace: dict[str, Any], code: str) -> dict[str, Any]:
    module["namespace"] = namespace
    module["before_cell"](namespace)
    exec(code, namespace)
    return module["after_cell"](namespace)


def test_the_sandbox_module_is_python_3_9_and_agrees_with_the_host_constants() -> None:
    ast.parse(scaffold.module_source(), feature_version=(3, 9))
    module = load()
    assert module["HELPERS"] == scaffold.HELPERS
    assert module["COMPACTION_NAME"] == scaffold.COMPACTION_NAME
    assert module["EMPTY_ANSWER"] == scaffold.EMPTY_ANSWER
    assert set(scaffold.owned_names(plan_tools({"f": "def f(): pass", "h": len, "D": 1}))) == {
        *scaffold.HELPERS,
        "f",
        "h",
    }


def test_llm_calls_become_host_calls_and_failures_become_error_strings() -> None:
    module = load(answers=lambda name, payload: f"{name}:{payload['prompt']}" if "prompt" in payload else ["a", "b"])
    namespace: dict[str, Any] = {}
    run(
        module,
        namespace,
        "r = llm_query('hi', model='m')\nb = rlm_query_batched(['x', 'y'])\ne = llm_query_batched([])",
    )
    assert namespace["r"] == "llm_query:hi" and namespace["b"] == ["a", "b"] and namespace["e"] == []
    assert module["calls"] == [
        ("llm_query", {"prompt": "hi", "model": "m"}),
        ("rlm_query_batched", {"prompts": ["x", "y"], "model": None}),
    ]
    failing = load()
    run(failing, namespace, "r = rlm_query('hi')\nb = llm_query_batched(['x', 'y'])")
    assert namespace["r"] == "Error: No LM handler configured"
    assert namespace["b"] == ["Error: No LM handler configured"] * 2


def test_reserved_names_aliases_and_answer_are_restored_around_cells() -> None:
    module = load()
    namespace: dict[str, Any] = {"context_0": "C", "history_0": ["H"]}
    run(module, namespace, "llm_query = 1\nSHOW_VARS = 2\ncontext = 'x'\nhistory = 'y'\nanswer = 'z'")
    assert callable(namespace["llm_query"]) and callable(namespace["SHOW_VARS"])
    assert namespace["context"] == "C" and namespace["history"] == ["H"]
    assert namespace["answer"] == {"content": "", "ready": False}


def test_compaction_binds_history_to_the_stored_list() -> None:
    module = load(compaction=True)
    canonical: list[Any] = [{"type": "summary"}]
    namespace: dict[str, Any] = {scaffold.COMPACTION_NAME: canonical, "history_0": ["old"], "history": ["old"]}
    run(module, namespace, "seen = history\nhistory = 'clobbered'")
    assert namespace["seen"] is canonical and namespace["history"] is canonical


def test_final_answer_and_show_vars() -> None:
    module = load(tools={"square": "def square(x):\n    return x * x", "DATA": {"a": 1}})
    namespace: dict[str, Any] = {"DATA": {"a": 1}}
    report = run(module, namespace, "x = square(3)\n_private = 1\nshown = SHOW_VARS()\nanswer['content'] = 9")
    assert report["final_answer"] is None
    assert namespace["shown"] == "Available variables: {'DATA': 'dict', 'x': 'int'}"
    assert "square" not in report["locals"] and "_private" not in report["locals"]
    report = run(module, namespace, "answer['ready'] = True")
    assert report["final_answer"] == "9"
    report = run(module, namespace, "answer = {'content': None, 'ready': 1}")
    assert report["final_answer"] == "None"


def test_locals_are_bounded_in_size_and_in_cost() -> None:
    module = load()

    class Loud:
        def __repr__(self) -> str:
            raise ValueError("no")

    namespace: dict[str, Any] = {
        "big": "x" * 50_000_000,
        "blob": b"y" * 10_000_000,
        "many": {i: [i] * 100 for i in range(200_000)},
        "deep": [[[[[1]]]]],
        "loud": Loud(),
        "huge_int": 7**100_000,
        "t": (1,),
    }
    module["before_cell"](namespace)
    started = time.perf_counter()
    shown = module["after_cell"](namespace)["locals"]
    assert time.perf_counter() - started < 0.5
    assert all(len(text) <= 404 for text in shown.values())
    assert shown["big"].startswith("'xxx") and "50000000 in all" in shown["big"]
    assert shown["loud"] == "<Loud object; repr() raised ValueError>"
    assert shown["huge_int"].startswith("<int of ")
    assert shown["deep"] == "[[[[...]]]]"
    assert shown["t"] == "(1,)"


def test_tools_code_lambda_and_host_stub() -> None:
    module = load(tools={"double": "lambda x: 2 * x", "Box": "class Box:\n    v = 3", "hostfn": print})
    namespace: dict[str, Any] = {}
    run(module, namespace, "a = double(4)\nb = Box.v")
    assert (namespace["a"], namespace["b"]) == (8, 3)
    with pytest.raises(RuntimeError, match="host process"):
        run(module, namespace, "hostfn(1)")


def test_deferred_values_are_listed_unloaded_and_aliases_come_back_when_rebound() -> None:
    module = load()
    namespace: dict[str, Any] = {}
    module["deferred"].update(context_0="d" * 5000, context="d" * 5000, history_0=["h"], history=["h"])
    shown = run(module, namespace, "n = 1")["locals"]
    assert shown["context"] == "<stored value of 5000 bytes, loaded when a cell uses it>"
    assert "context" not in namespace and set(module["deferred"]) == {"context_0", "context", "history_0", "history"}
    run(module, namespace, "context = 'mine'\nhistory = []")  # the aliases rebound: they come back from _0
    assert namespace["context"] == "d" * 5000 and namespace["history"] == ["h"]
    assert set(module["deferred"]) == {"context", "history"}  # the worker forgets them at the checkpoint
    module["deferred"]["big"] = "b" * 10
    assert "big" in module["SHOW_VARS"]() and "big" in namespace  # the model asked to see everything
