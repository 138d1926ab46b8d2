"""Fakes for the rlms tests: LM clients that never leave this machine, and LM handlers that are shut down cleanly.

``EchoLM`` answers every prompt with ``<prefix>:<prompt>`` (after an optional delay), the way
rlms' own robustness tests do; ``ScriptedLM`` plays the root model of a completion from a
list of turns and echoes sub-calls. Handlers run rlms' own ``LMHandler`` on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from rlm.clients.base_lm import BaseLM
from rlm.core.lm_handler import LMHandler
from rlm.core.types import ModelUsageSummary, RLMChatCompletion, UsageSummary


class EchoLM(BaseLM):
    """Answers ``<prefix>:<first 40 characters of the prompt>``."""

    def __init__(self, prefix: str = "echo", delay: float = 0.0) -> None:
        super().__init__(model_name=prefix)
        self.prefix = prefix
        self.delay = delay

    def completion(self, prompt: Any, model: str | None = None) -> str:
        if self.delay:
            time.sleep(self.delay)
        return f"{self.prefix}:{str(prompt)[:40]}"

    async def acompletion(self, prompt: Any, model: str | None = None) -> str:
        if self.delay:
            await asyncio.sleep(self.delay)
        return f"{self.prefix}:{str(prompt)[:40]}"

    def get_usage_summary(self) -> UsageSummary:
        return UsageSummary({self.prefix: ModelUsageSummary(1, 10, 10)})

    def get_last_usage(self) -> ModelUsageSummary:
        return ModelUsageSummary(1, 10, 10)


Turn = str | Callable[[list[dict[str, Any]]], str]


def repl_block(code: str) -> str:
    """A model response that runs ``code`` in the REPL."""
    return f"```repl\n{code}\n```"


class ScriptedLM(EchoLM):
    """The root model of a completion plays ``script`` (one response per call); sub-calls are echoed."""

    def __init__(self, script: list[Turn] | None = None) -> None:
        super().__init__(prefix="sub")
        self.script: list[Turn] = list(script or [])
        self.root_prompts: list[list[dict[str, Any]]] = []

    def completion(self, prompt: Any, model: str | None = None) -> str:
        if not isinstance(prompt, list):
            return super().completion(prompt, model)
        self.root_prompts.append(prompt)
        turn = self.script.pop(0) if self.script else repl_block("answer['ready'] = True")
        return turn(prompt) if callable(turn) else turn


def completion(response: str, prompt: str = "p") -> RLMChatCompletion:
    """A sub-call's completion, as a ``subcall_fn`` returns it."""
    return RLMChatCompletion(
        root_model="child",
        prompt=prompt,
        response=response,
        usage_summary=UsageSummary(model_usage_summaries={}),
        execution_time=0.0,
    )


@contextlib.contextmanager
def lm_handlers() -> Iterator[Callable[..., LMHandler]]:
    """A factory of running LM handlers (``start(client)``), all stopped and closed at the end."""
    started: list[LMHandler] = []

    def start(client: BaseLM | None = None) -> LMHandler:
        handler = LMHandler(client or EchoLM())
        handler.start()
        started.append(handler)
        return handler

    try:
        yield start
    finally:
        for handler in started:
            stop(handler)


def stop(handler: LMHandler) -> None:
    """Stop a handler and close its socket (rlms' ``stop()`` leaves it open, which warns)."""
    server = handler._server
    address = handler.address
    handler.stop()
    handler._port = address[1]  # keep .address telling where it was
    if server is not None:
        server.server_close()
