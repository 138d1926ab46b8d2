"""rlms' own RLM loop, end to end, on our sandbox: a scripted model on loopback plays the root LM and the sub-calls.

``orchestrator.rlm.RLM(backend="openai", environment="docker", persistent=True)`` talks to a
``ScriptedOpenAIServer`` through the real ``openai`` client; the REPL blocks it is given run
in one persistent session; ``llm_query`` in a cell travels as a host call to rlms' LM handler
of the current completion, and from there back to the scripted server.
"""

from __future__ import annotations

import contextlib
import gc
import socket
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support import kill_and_wait

from orchestrator import Orchestrator, SessionClosed, Settings
from orchestrator.rlm import RLM, DockerREPL
from orchestrator.rlm.testing import ScriptedOpenAIServer, ScriptedRequest

pytestmark = pytest.mark.docker

ROOT_MODEL = "scripted-root"
FIRST_CONTEXT = "alpha beta gamma delta"  # 22 characters
SECOND_CONTEXT = "a second document"
SUB_PROMPT = "how many characters? {facts}"


def repl(code: str) -> str:
    """A root-model reply holding one REPL block, fenced as rlms' find_code_blocks wants it."""
    return f"Let me run this.\n```repl\n{code}\n```\n"


# Turn by turn (keyed by the root prompt rlms shows the model), one reply per iteration.
TURNS = {
    "turn-1": [
        repl("facts = len(context_0)\nprint(facts)"),
        repl("answer['content'] = f'facts={facts}'\nanswer['ready'] = True"),
    ],
    "turn-2": [
        repl(f"sub = llm_query(f{SUB_PROMPT!r})\nprint(sub)"),
        repl(
            "answer['content'] = (f'{sub} | facts={facts} | turn1={len(context_0)} | '\n"
            "                     f'ctx1={context_1!r} | history={len(history_0)}')\n"
            "answer['ready'] = True"
        ),
    ],
}


def is_root(messages: list[dict[str, Any]]) -> bool:
    """rlms' root prompts start with its system prompt; an llm_query sub-call is one user message."""
    return bool(messages) and messages[0].get("role") == "system"


def turn_of(messages: list[dict[str, Any]]) -> str:
    """The turn a root request belongs to, from the "Answer the following: <root_prompt>" message."""
    for key in TURNS:
        if any(f"Answer the following: {key}" in str(m.get("content")) for m in messages[:3]):
            return key
    raise AssertionError(f"a root request of no known turn: {messages[:3]}")


def sub_reply(prompt: str) -> str:
    return f"SUB[{prompt}]"


def scripted_model(messages: list[dict[str, Any]], model: str) -> str:
    if not is_root(messages):
        return sub_reply(messages[-1]["content"])
    iteration = sum(1 for m in messages if m.get("role") == "assistant")
    return TURNS[turn_of(messages)][iteration]


def root_requests(server: ScriptedOpenAIServer, turn: str) -> list[ScriptedRequest]:
    return [r for r in server.requests if is_root(r.messages) and turn_of(r.messages) == turn]


def sub_requests(server: ScriptedOpenAIServer) -> list[ScriptedRequest]:
    return [r for r in server.requests if not is_root(r.messages)]


@contextlib.contextmanager
def collecting_rlms_leftovers() -> Iterator[None]:
    """Collect, with ResourceWarning off, what rlms leaves unclosed per completion (its LM handler's
    server socket, its openai clients' pools), so their warnings fall here and not into a later test."""
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()


@pytest.fixture
def server() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer(scripted_model) as s:
        yield s
    assert s.errors == [], f"the scripted model failed: {s.errors}"


@pytest.fixture
def make_rlm(
    settings_for: Callable[..., Settings], image: str, server: ScriptedOpenAIServer
) -> Iterator[Callable[[], Any]]:
    """Factory of persistent RLMs on our DockerREPL and the scripted model, each closed after the test."""
    made: list[Any] = []

    def make() -> Any:
        rlm = RLM(
            backend="openai",
            backend_kwargs={"model_name": ROOT_MODEL, "base_url": server.base_url, "api_key": "test"},
            environment="docker",
            environment_kwargs={"settings": settings_for(), "cell_timeout": 60},
            persistent=True,
            max_iterations=4,
        )
        made.append(rlm)
        return rlm

    with collecting_rlms_leftovers():
        try:
            yield make
        finally:
            for rlm in made:
                rlm.close()


def expected_second_answer(history_len: int) -> str:
    facts = len(FIRST_CONTEXT)
    return (
        f"{sub_reply(SUB_PROMPT.format(facts=facts))} | facts={facts} | turn1={facts} | "
        f"ctx1={SECOND_CONTEXT!r} | history={history_len}"
    )


def check_second_turn(server: ScriptedOpenAIServer, response: str) -> None:
    """The answer of turn 2 carries the sub-call's reply and what turn 1 left; the model saw the REPL output."""
    first = root_requests(server, "turn-1")
    assert len(first) == 2
    # rlms stores the message history of turn 1 as history_0: the messages of its last root call.
    assert response == expected_second_answer(len(first[-1].messages))
    subs = sub_requests(server)
    assert len(subs) == 1
    assert subs[0].messages == [{"role": "user", "content": SUB_PROMPT.format(facts=len(FIRST_CONTEXT))}]
    second = root_requests(server, "turn-2")
    assert len(second) == 2
    assert sub_reply(SUB_PROMPT.format(facts=len(FIRST_CONTEXT))) in second[-1].messages[-2]["content"]
    assert {r.model for r in server.requests} == {ROOT_MODEL}


def test_two_turns_share_state_and_a_sub_call_reaches_the_model(
    make_rlm: Callable[[], Any], server: ScriptedOpenAIServer
) -> None:
    rlm = make_rlm()
    first = rlm.completion(FIRST_CONTEXT, root_prompt="turn-1")
    assert first.response == f"facts={len(FIRST_CONTEXT)}"
    assert sub_requests(server) == []
    env = rlm.environment
    assert isinstance(env, DockerREPL)
    container = env.container_id

    second = rlm.completion(SECOND_CONTEXT, root_prompt="turn-2")
    check_second_turn(server, second.response)
    assert rlm.environment is env, "persistent=True reuses one REPL"
    assert env.container_id == container
    assert env.get_context_count() == 2
    assert env.get_history_count() == 2
    assert first.usage_summary.model_usage_summaries[ROOT_MODEL].total_calls == 2
    # The completion's usage counts the root calls and the sub-call that went through its handler.
    assert second.usage_summary.model_usage_summaries[ROOT_MODEL].total_calls == 3


def test_a_container_killed_between_turns_comes_back_with_the_state_and_the_new_handler(
    make_rlm: Callable[[], Any], server: ScriptedOpenAIServer, orch: Orchestrator
) -> None:
    rlm = make_rlm()
    assert rlm.completion(FIRST_CONTEXT, root_prompt="turn-1").response == f"facts={len(FIRST_CONTEXT)}"
    env = rlm.environment
    first_container, first_handler = env.container_id, env.lm_handler_address
    assert first_container is not None and first_handler is not None

    kill_and_wait(orch, first_container)
    second = rlm.completion(SECOND_CONTEXT, root_prompt="turn-2")

    # facts, context_0 and history_0 came back from the checkpoint; llm_query reached this
    # completion's LM handler (a new port: rlms stopped the one of turn 1 when that turn ended).
    check_second_turn(server, second.response)
    assert env.container_id not in (None, first_container)
    assert env.lm_handler_address not in (None, first_handler)


def test_a_persistent_environment_used_after_close_raises_a_clear_error(
    make_rlm: Callable[[], Any], orch: Orchestrator
) -> None:
    rlm = make_rlm()
    rlm.completion(FIRST_CONTEXT, root_prompt="turn-1")
    env = rlm.environment
    container = env.container_id
    rlm.close()
    assert rlm.environment is None
    assert orch.backend.inspect(container) is None, "close() removes the container"
    for use in (
        lambda: env.execute_code("facts"),
        lambda: env.add_context("more"),
        lambda: env.add_history([{"role": "user", "content": "hi"}]),
        lambda: env.update_handler_address(("127.0.0.1", 1)),
    ):
        with pytest.raises(SessionClosed, match=r"cleaned up or detached.*create a new DockerREPL"):
            use()
    rlm.close()  # again: nothing to do


def _free_port() -> int:
    """A loopback port nobody listens on (bound, read, closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_lm_handler_that_is_down_gives_an_error_string_in_the_repl(
    settings_for: Callable[..., Settings], image: str
) -> None:
    with DockerREPL(lm_handler_address=("127.0.0.1", _free_port()), settings=settings_for(), cell_timeout=60) as env:
        started = time.monotonic()
        result = env.execute_code(
            "one = llm_query('hello')\n"
            "many = llm_query_batched(['a', 'b'])\n"
            "print(type(one).__name__, one)\n"
            "print(len(many), all(m.startswith('Error') for m in many))"
        )
        assert time.monotonic() - started < 30
        assert result.stderr == ""
        first, second = result.stdout.splitlines()
        assert first.startswith("str Error"), first
        assert second == "2 True"
        assert result.rlm_calls == []
        # The session is fine afterwards.
        assert env.execute_code("print(one[:5])").stdout == "Error\n"
