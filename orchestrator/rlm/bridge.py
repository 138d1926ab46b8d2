"""The host side of the sandbox's llm_query / rlm_query: host-call handlers that reach the LM handler.

The sandbox has no network. Its ``llm_query`` is a host call that lands here and is forwarded
with rlms' own socket protocol to the LM handler at the address the environment holds *now*:
rlms starts a new handler for every completion, so the address changes each turn, and it
lives on the host, so it is right after any container restart. ``rlm_query`` goes to the
environment's ``subcall_fn``, at most ``max_concurrent_subcalls`` invocations at once across
the whole environment, however many cells, threads or batches ask.

A handler reports a failure by raising ``HostCallError``; the sandbox turns it into the
``"Error: ..."`` string rlms returns, so user code never sees an exception from a sub-call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..runtime.hostcalls import HostCallError, HostCallHandler
from ._upstream import LMRequest, RLMChatCompletion, send_lm_request, send_lm_request_batched
from .calls import CellCalls

Address = tuple[str, int]
SubcallFn = Callable[[str, str | None], RLMChatCompletion]
NO_HANDLER = "No LM handler configured"


def _model(payload: dict[str, Any]) -> str | None:
    model = payload.get("model")
    if model is not None and not isinstance(model, str):
        raise HostCallError(f"model must be a str or None, not {type(model).__name__}")
    return model


def _single(payload: Any) -> tuple[Any, str | None]:
    if not isinstance(payload, dict) or "prompt" not in payload:
        raise HostCallError("the call needs a JSON object with a 'prompt'")
    return payload["prompt"], _model(payload)


def _batch(payload: Any) -> tuple[list[Any], str | None]:
    if not isinstance(payload, dict) or not isinstance(payload.get("prompts"), list):
        raise HostCallError("the call needs a JSON object with a list of 'prompts'")
    return payload["prompts"], _model(payload)


class LMBridge:
    """Answers one environment's LM host calls; ``handlers`` binds them to one cell's ``CellCalls``."""

    def __init__(
        self,
        *,
        address: Callable[[], Address | None],
        depth: Callable[[], int],
        subcall_fn: SubcallFn | None,
        max_concurrent_subcalls: int,
    ) -> None:
        """``address`` and ``depth`` are read at every call: a handler address updated between turns counts at once."""
        self._address = address
        self._depth = depth
        self._subcall_fn = subcall_fn
        self._max_subcalls = max_concurrent_subcalls
        self._subcall_slots = threading.BoundedSemaphore(max_concurrent_subcalls)
        self._local = threading.local()

    @property
    def in_subcall(self) -> bool:
        """True on a thread that is running ``subcall_fn`` for this environment right now."""
        return bool(getattr(self._local, "active", False))

    def handlers(self, calls: CellCalls) -> dict[str, HostCallHandler]:
        """The host-call handlers of one cell; what they complete goes to ``calls`` only."""
        return {
            "llm_query": lambda payload: self.llm_query(calls, payload),
            "llm_query_batched": lambda payload: self.llm_query_batched(calls, payload),
            "rlm_query": lambda payload: self.rlm_query(calls, payload),
            "rlm_query_batched": lambda payload: self.rlm_query_batched(calls, payload),
        }

    # -- plain LM calls

    def llm_query(self, calls: CellCalls, payload: Any) -> str:
        prompt, model = _single(payload)
        address = self._address()
        if address is None:
            raise HostCallError(NO_HANDLER)
        slot = calls.reserve()
        response = send_lm_request(address, LMRequest(prompt=prompt, model=model, depth=self._depth()))
        completion = response.chat_completion
        if not response.success or completion is None:
            raise HostCallError(str(response.error or "the LM handler sent no completion"))
        calls.fill(slot, [completion])
        return completion.response

    def llm_query_batched(self, calls: CellCalls, payload: Any) -> list[str]:
        prompts, model = _batch(payload)
        if not prompts:
            return []
        address = self._address()
        if address is None:
            return [f"Error: {NO_HANDLER}"] * len(prompts)
        slot = calls.reserve()
        responses = send_lm_request_batched(address, prompts, model=model, depth=self._depth())
        results: list[str] = []
        done: list[RLMChatCompletion] = []
        for response in responses:
            completion = response.chat_completion
            if response.success and completion is not None:
                done.append(completion)
                results.append(completion.response)
            else:
                results.append(f"Error: {response.error}")
        calls.fill(slot, done)
        return results

    # -- recursive sub-calls

    def rlm_query(self, calls: CellCalls, payload: Any) -> str:
        if self._subcall_fn is None:
            return self.llm_query(calls, payload)
        prompt, model = _single(payload)
        slot = calls.reserve()
        completion = self._subcall(self._subcall_fn, prompt, model)
        calls.fill(slot, [completion])
        return completion.response

    def rlm_query_batched(self, calls: CellCalls, payload: Any) -> list[str]:
        if self._subcall_fn is None:
            return self.llm_query_batched(calls, payload)
        subcall_fn = self._subcall_fn
        prompts, model = _batch(payload)
        if not prompts:
            return []
        slot = calls.reserve()
        results = [""] * len(prompts)
        done: list[RLMChatCompletion | None] = [None] * len(prompts)

        def run(index: int) -> None:
            try:
                completion = self._subcall(subcall_fn, prompts[index], model)
                done[index] = completion
                results[index] = completion.response
            except HostCallError as exc:
                results[index] = f"Error: {exc}"

        if len(prompts) == 1:
            run(0)
        else:
            with ThreadPoolExecutor(min(self._max_subcalls, len(prompts)), thread_name_prefix="rlm-subcall") as pool:
                list(pool.map(run, range(len(prompts))))
        calls.fill(slot, [completion for completion in done if completion is not None])
        return results

    def _subcall(self, subcall_fn: SubcallFn, prompt: Any, model: str | None) -> RLMChatCompletion:
        """One ``subcall_fn`` call under the environment-wide cap; a malformed completion is an error."""
        with self._subcall_slots:
            self._local.active = True
            try:
                completion = subcall_fn(prompt, model)
                response = getattr(completion, "response", None)
            except Exception as exc:
                raise HostCallError(f"RLM query failed - {exc}") from None
            finally:
                self._local.active = False
        if not isinstance(response, str):
            raise HostCallError(
                f"RLM query failed - subcall_fn returned {type(completion).__name__}, "
                "not a completion with a str response"
            )
        return completion
