"""The host side of orchestrator.rlm without Docker: tool sorting, per-cell call tracking, the LM bridge,
REPLResults, routing, the import boundary, and RLMSession over rlms' LocalREPL.

LM calls go to rlms' own LMHandler on loopback with fake clients; nothing leaves this machine.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import rlm.core.rlm
from rlm.clients.base_lm import BaseLM
from rlm.core.lm_handler import LMHandler
from rlm.core.types import ModelUsageSummary, RLMChatCompletion, UsageSummary

from orchestrator import ConfigError, ExecutionTimeout, SandboxCrashed, SandboxOutOfMemory, Settings
from orchestrator.api.results import ExecError, ExecResult
from orchestrator.rlm import DockerREPL, RLMSession, outcome, routing
from orchestrator.rlm.bridge import LMBridge
from orchestrator.rlm.calls import CellCalls
from orchestrator.rlm.tools import plan_tools
from orchestrator.runtime.hostcalls import HostCallError


class EchoLM(BaseLM):
    def __init__(self, script: list[str] | None = None) -> None:
        super().__init__(model_name="echo")
        self.script = list(script or [])
        self.root_prompts: list[Any] = []

    def completion(self, prompt: Any, model: str | None = None) -> str:
        if isinstance(prompt, list):
            self.root_prompts.append(prompt)
            return self.script.pop(0)
        return f"echo:{prompt}"

    async def acompletion(self, prompt: Any, model: str | None = None) -> str:
        await asyncio.sleep(0)
        return f"echo:{prompt}"

    def get_usage_summary(self) -> UsageSummary:
        return UsageSummary({"echo": ModelUsageSummary(1, 1, 1)})

    def get_last_usage(self) -> ModelUsageSummary:
        return ModelUsageSummary(1, 1, 1)


def done(response: str) -> RLMChatCompletion:
    return RLMChatCompletion("child", "p", response, UsageSummary({}), 0.0)


@pytest.fixture
def handler() -> Iterator[LMHandler]:
    lm = LMHandler(EchoLM())
    lm.start()
    server = lm._server
    try:
        yield lm
    finally:
        lm.stop()
        server.server_close()


# ----------------------------------------------------------------- tools


def test_tools_are_sorted_by_how_they_reach_the_sandbox(caplog: pytest.LogCaptureFixture) -> None:
    plan = plan_tools(
        {
            "f": "def f(x):\n    return x",
            "g": "  lambda y: y",
            "K": "class K:\n    pass",
            "text": "two\nlines",
            "word": "hello",
            "cfg": {"tool": (1, 2), "description": "a pair"},
            "host": len,
        }
    )
    assert set(plan.code) == {"f", "g", "K"} and plan.code["g"] == "lambda y: y"
    assert plan.data == {"text": "two\nlines", "word": "hello", "cfg": [1, 2]}
    assert plan.host == ("host",)
    assert "'host' is a callable of this host process" in caplog.text
    for bad, match in [
        ({"f": "def g():\n    pass"}, "does not define"),
        ({"f": "def f(:"}, "does not compile"),
        ({"x": object()}, "JSON"),
        ({"not an identifier": 1}, "identifier"),
    ]:
        with pytest.raises(ValueError, match=match):
            plan_tools(bad)


# ----------------------------------------------------------------- call tracking


def test_cell_calls_keep_call_order_and_drop_what_ends_after_the_cell() -> None:
    calls = CellCalls()
    first, second = calls.reserve(), calls.reserve()
    assert calls.fill(second, [done("b1"), done("b2")])
    assert calls.fill(first, [done("a")])
    failed = calls.reserve()
    late = calls.reserve()
    assert [c.response for c in calls.close()] == ["a", "b1", "b2"]
    assert failed == 2 and not calls.fill(late, [done("late")])


# ----------------------------------------------------------------- the bridge


def test_bridge_reaches_the_current_handler_address(handler: LMHandler) -> None:
    address: list[Any] = [None]
    bridge = LMBridge(address=lambda: address[0], depth=lambda: 1, subcall_fn=None, max_concurrent_subcalls=2)
    calls = CellCalls()
    with pytest.raises(HostCallError, match="No LM handler configured"):
        bridge.llm_query(calls, {"prompt": "hi"})
    assert bridge.llm_query_batched(calls, {"prompts": ["a"]}) == ["Error: No LM handler configured"]
    address[0] = handler.address
    handlers = bridge.handlers(calls)
    assert handlers["llm_query"]({"prompt": "hi", "model": None}) == "echo:hi"
    assert handlers["rlm_query_batched"]({"prompts": ["a", "b"]}) == ["echo:a", "echo:b"]
    assert [c.response for c in calls.close()] == ["echo:hi", "echo:a", "echo:b"]
    with pytest.raises(HostCallError, match="prompt"):
        bridge.llm_query(CellCalls(), ["not an object"])


def test_bridge_subcalls_cap_order_failures_and_malformed_completions() -> None:
    lock = threading.Lock()
    active, peak = [0], [0]

    def subcall(prompt: str, model: str | None) -> Any:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.05 * (5 - int(prompt[-1])) if prompt[-1].isdigit() else 0.01)
        with lock:
            active[0] -= 1
        if prompt == "boom":
            raise RuntimeError("exploded")
        return 7 if prompt == "odd" else done(f"c:{prompt}")

    bridge = LMBridge(address=lambda: None, depth=lambda: 1, subcall_fn=subcall, max_concurrent_subcalls=2)
    calls = CellCalls()
    threads = [
        threading.Thread(target=bridge.rlm_query_batched, args=(calls, {"prompts": [f"{t}{i}" for i in range(4)]}))
        for t in "ab"
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert peak[0] <= 2
    results = bridge.rlm_query_batched(calls, {"prompts": ["p1", "boom", "odd", "p4"]})
    assert results[0] == "c:p1" and results[3] == "c:p4"
    assert results[1] == "Error: RLM query failed - exploded"
    assert results[2].startswith("Error: RLM query failed - subcall_fn returned int")
    assert len(calls.close()) == 10
    assert not bridge.in_subcall


# ----------------------------------------------------------------- results


def test_results_carry_the_traceback_the_scaffold_report_and_unsaved_names() -> None:
    error = ExecError("ValueError", "kaboom", 2, "raise ValueError('kaboom')", "Traceback ...\nValueError: kaboom\n")
    result = ExecResult(
        stdout="out\n",
        stderr="warn",
        error=error,
        unsaved={"gen": "generator"},
        restore_failures={"lost": "hung"},
        scaffold={"final_answer": "42", "locals": {"x": "1", "bad": 3}},
    )
    converted = outcome.from_exec(result, [done("a")], 0.5)
    assert converted.stderr.startswith("Note: the sandbox restarted") and "lost" in converted.stderr
    assert converted.stderr.endswith("warn\nTraceback ...\nValueError: kaboom\n")
    assert converted.locals == {"x": "1"} and converted.final_answer == "42"
    assert converted.unsaved == {"gen": "generator"} and [c.response for c in converted.rlm_calls] == ["a"]
    assert outcome.from_exec(ExecResult(scaffold=None), [], 0.1).locals == {}


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (ExecutionTimeout("t", restored=False, stdout="so far", stderr=""), "was interrupted. Variables keep"),
        (ExecutionTimeout("t", restored=True), "did not stop when interrupted"),
        (SandboxOutOfMemory("oom", restored=True), "MemoryError: the cell used more than the sandbox's 1g"),
        (SandboxCrashed("crash", restored=True), "SandboxCrashed: the Python process running the cell died"),
    ],
)
def test_failures_become_results_that_say_what_happened(error: Any, expected: str) -> None:
    converted = outcome.from_failure(error, [], 1.0, timeout=30, memory="1g")
    assert expected in converted.stderr and converted.final_answer is None


# ----------------------------------------------------------------- routing and imports


def test_marked_docker_environments_are_routed_to_ours_and_the_rest_to_rlms(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[dict[str, Any]] = []
    monkeypatch.setattr(routing, "DockerREPL", lambda **kwargs: made.append(kwargs) or "ours")
    routing.route_marked()
    routing.route_marked()  # installs once
    get_environment = rlm.core.rlm.get_environment
    assert get_environment("docker", {routing.ROUTE_KEY: True, "depth": 2}) == "ours"
    assert made == [{"depth": 2}]
    local = get_environment("local", {routing.ROUTE_KEY: True})
    try:
        assert type(local).__name__ == "LocalREPL"
    finally:
        local.cleanup()


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_import_orchestrator_does_not_import_rlms() -> None:
    result = _python("import sys, orchestrator; print('rlm' in sys.modules, 'orchestrator.rlm' in sys.modules)")
    assert result.stdout.strip() == "False False", result.stderr


def test_without_rlms_the_import_error_says_what_to_install() -> None:
    result = _python("import sys; sys.modules['rlm'] = None\nimport orchestrator.rlm")
    assert "ImportError: orchestrator.rlm needs the rlms package" in result.stderr
    assert "pip install -e '.[rlm]'" in result.stderr
    assert "pip install 'orchestrator-sessions[rlm]'" in result.stderr  # ours, not PyPI's unrelated orchestrator


# ----------------------------------------------------------------- RLMSession on any persistent environment


def test_rlm_session_over_a_local_repl(monkeypatch: pytest.MonkeyPatch) -> None:
    lm = EchoLM(
        [
            "```repl\nanswer['content'] = 'A1'; answer['ready'] = True\n```",
            "```repl\nanswer['content'] = f'{session_context_1}|{len(context_history)}|{len(session_history)}'\n"
            "answer['ready'] = True\n```",
        ]
    )
    monkeypatch.setattr(rlm.core.rlm, "get_client", lambda backend, kwargs: lm)
    with RLMSession(environment="local", backend_kwargs={"model_name": "echo"}, max_iterations=2) as chat:
        assert chat.chat("hello").response == "A1"
        assert chat.chat("x" * 10_000).response == f"{'x' * 10_000}|2|1"
    second = lm.root_prompts[-1]
    assert second[1:3] == [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "A1"}]
    assert chat.message_history[-2]["content"].startswith("[The prompt of this turn is in session_context_1")
    with pytest.raises(ValueError, match="persistent"):
        RLMSession(persistent=False)


def test_cell_timeout_takes_a_duration_and_refuses_the_rest_before_any_engine_is_used() -> None:
    settings = Settings(base_image="never-pulled:1")
    for bad in (0, -1, "soon", float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="cell_timeout must be a positive duration"):
            DockerREPL(cell_timeout=bad, settings=settings)
