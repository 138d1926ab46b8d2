"""rlms' own RLM loop on our DockerREPL: orchestrator.rlm.RLM, register(), RLMSession, restarts across turns.

The root model is ``ScriptedLM`` (its turns are REPL blocks written by the test) behind the
LM handler that rlms starts for every completion; ``rlm.core.rlm.get_client`` is patched to
return it, so nothing leaves this machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import rlm
import rlm.core.lm_handler
import rlm.core.rlm
from rlm.environments import docker_repl
from rlm_support import ScriptedLM, repl_block
from support import cli_env, kill_and_wait

from orchestrator import Orchestrator, Settings
from orchestrator.rlm import RLM, DockerREPL, RLMSession, register, registered, unregister

pytestmark = pytest.mark.docker


@pytest.fixture
def lm(monkeypatch: pytest.MonkeyPatch) -> ScriptedLM:
    """The root model of every completion in the test."""
    model = ScriptedLM()
    monkeypatch.setattr(rlm.core.rlm, "get_client", lambda backend, kwargs: model)
    return model


@pytest.fixture
def env_kwargs(settings_for: Callable[..., Settings], image: str, run_id: str) -> dict[str, Any]:
    return {"settings": settings_for(), "labels": {"orchestrator.test.run": run_id}}


@pytest.fixture
def make_rlm(env_kwargs: dict[str, Any]) -> Iterator[Callable[..., RLM]]:
    made: list[Any] = []

    def make(cls: Any = RLM, **kwargs: Any) -> Any:
        kwargs.setdefault("environment_kwargs", env_kwargs)
        kwargs.setdefault("backend_kwargs", {"model_name": "scripted"})
        kwargs.setdefault("max_iterations", 4)
        made.append(cls(backend="openai", **kwargs))
        return made[-1]

    try:
        yield make
    finally:
        for item in made:
            item.close()


def containers(env_kwargs: dict[str, Any]) -> list[str]:
    with Orchestrator(env_kwargs["settings"]) as orch:
        return [c.id for c in orch.containers()]


def test_persistent_rlm_reuses_one_repl_across_completions(make_rlm, lm: ScriptedLM, env_kwargs) -> None:
    engine = make_rlm(persistent=True)
    lm.script = [
        repl_block("x = 41\nprint(len(context))"),
        repl_block("answer['content'] = str(x + 1)\nanswer['ready'] = True"),
    ]
    assert engine.completion("doc one").response == "42"
    environment = engine.environment
    assert isinstance(environment, DockerREPL)
    container = environment.container_id
    lm.script = [
        repl_block(
            "answer['content'] = f\"{context_0}|{context_1}|{x}|{len(history_0) > 2}|{llm_query('ping')}\"\n"
            "answer['ready'] = True"
        )
    ]
    assert engine.completion("doc two").response == "doc one|doc two|41|True|sub:ping"
    assert environment.container_id == container
    assert environment.get_context_count() == 2 and environment.get_history_count() == 2
    engine.close()
    assert containers(env_kwargs) == []


def test_an_rlms_session_id_is_public_and_the_cli_finds_it(make_rlm, lm: ScriptedLM, env_kwargs) -> None:
    engine = make_rlm(persistent=True)
    assert engine.session_id is None  # no REPL before the first completion
    lm.script = [repl_block("answer['content'] = 'ok'; answer['ready'] = True")]
    assert engine.completion("doc").response == "ok"
    session_id = engine.session_id
    assert isinstance(session_id, str)
    shown = subprocess.run(
        [sys.executable, "-m", "orchestrator", "inspect", session_id, "--json"],
        capture_output=True,
        text=True,
        env=cli_env(env_kwargs["settings"]),
        timeout=120,
    )
    assert shown.returncode == 0 and json.loads(shown.stdout)["id"] == session_id, shown.stderr
    engine.close()
    assert engine.session_id is None
    assert make_rlm().session_id is None  # not persistent: nothing to name


def test_non_persistent_rlm_makes_and_removes_a_repl_per_completion(make_rlm, lm: ScriptedLM, env_kwargs) -> None:
    engine = make_rlm()
    lm.script = [repl_block("v = 'first'")]
    lm.script.append(repl_block("answer['content'] = v; answer['ready'] = True"))
    assert engine.completion("one").response == "first"
    assert containers(env_kwargs) == []
    lm.script = [repl_block("answer['content'] = str('v' in globals()); answer['ready'] = True")]
    assert engine.completion("two").response == "False"
    assert containers(env_kwargs) == []


def test_a_container_killed_between_and_during_completions_is_restored(
    make_rlm, lm: ScriptedLM, orch: Orchestrator
) -> None:
    engine = make_rlm(persistent=True)
    lm.script = [repl_block("x = 41"), repl_block("answer['content'] = 'one'; answer['ready'] = True")]
    engine.completion("doc one")
    environment = engine.environment
    kill_and_wait(orch, environment.container_id)

    def kill_then(code: str) -> Callable[[list[dict[str, Any]]], str]:
        def turn(prompt: list[dict[str, Any]]) -> str:
            kill_and_wait(orch, environment.container_id)
            return repl_block(code)

        return turn

    # rlms' second completion runs on a new LM handler (a new port); the sandbox was killed
    # before it began and again in the middle of it.
    lm.script = [
        repl_block("y = x + 1"),
        kill_then("answer['content'] = f\"{y}|{context_0}|{context_1}|{llm_query('ping')}\"\nanswer['ready'] = True"),
    ]
    assert engine.completion("doc two").response == "42|doc one|doc two|sub:ping"


def test_register_makes_plain_rlms_use_our_environment(lm: ScriptedLM, env_kwargs: dict[str, Any]) -> None:
    peer = docker_repl.DockerREPL
    assert not registered()
    register()
    try:
        from rlm.environments.docker_repl import DockerREPL as Imported

        assert Imported is DockerREPL
        engine = rlm.RLM(
            backend="openai",
            backend_kwargs={"model_name": "scripted"},
            environment="docker",
            environment_kwargs=env_kwargs,
            persistent=True,
            max_iterations=3,
        )
        try:
            lm.script = [repl_block("answer['content'] = llm_query.__module__; answer['ready'] = True")]
            _quiet_handlers(engine)
            assert engine.completion("ctx").response == "__orchestrator_scaffold__"
            assert isinstance(engine._persistent_env, DockerREPL)
        finally:
            engine.close()
    finally:
        unregister()
    assert docker_repl.DockerREPL is peer and not registered()


def _quiet_handlers(engine: Any) -> None:
    """Plain rlms leaves each completion's handler socket open; close it so the test's warnings stay errors."""
    spawn = engine._spawn_completion_context

    import contextlib

    @contextlib.contextmanager
    def closing(prompt: Any) -> Iterator[Any]:
        with spawn(prompt) as (handler, environment):
            server = handler._server
            yield handler, environment
        server.server_close()

    engine._spawn_completion_context = closing


def test_rlm_session_keeps_the_conversation_and_the_session_contexts(lm: ScriptedLM, env_kwargs) -> None:
    with RLMSession(
        backend="openai",
        backend_kwargs={"model_name": "scripted"},
        environment_kwargs=env_kwargs,
        max_iterations=3,
    ) as chat:
        lm.script = [repl_block("answer['content'] = 'A1'; answer['ready'] = True")]
        assert chat.chat("first question").response == "A1"
        lm.script = [
            repl_block(
                "answer['content'] = f'{session_context_0}|{session_context_1}|{len(context_history)}|"
                "{len(session_history)}|{context_history[1] == context_1}'\nanswer['ready'] = True"
            )
        ]
        assert chat.chat("second question").response == "first question|second question|2|1|True"
        assert chat.turns == 2
        prompt = lm.root_prompts[-1]
        assert prompt[1] == {"role": "user", "content": "first question"}
        assert prompt[2] == {"role": "assistant", "content": "A1"}
        assert "session_context_1" in prompt[3]["content"] and "turn 2" in prompt[3]["content"]
        assert chat.message_history[-2:] == [
            {"role": "user", "content": "second question"},
            {"role": "assistant", "content": "first question|second question|2|1|True"},
        ]
        environment = chat.environment
        lm.script = [repl_block("answer['content'] = str(len(session_history)); answer['ready'] = True")]
        assert chat.chat({"data": [1, 2]}, root_prompt="third?").response == "2"
        assert "third?" in chat.message_history[-2]["content"]
    assert environment.session_id is None
    assert containers(env_kwargs) == []
