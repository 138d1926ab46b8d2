"""RLMSession: a multi-turn chat with an RLM over one persistent REPL (the "session" spec of rlms, seed 002).

The root model sees the conversation as prompt-level message history (each earlier turn's
prompt and final answer); the REPL keeps every turn's payload as ``session_context_<n>``
(the latest is ``session_context_{turns-1}``), all of them in ``context_history``, and the
message history of each completed turn in ``session_history``. The names are bound to the
values rlms already stored (``context_<m>``, ``history_<k>``) by small cells, so a large
payload travels and is stored once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ._upstream import RLMChatCompletion
from .rlm import RLM

_SHOWN_PROMPT = 4000  # characters of a str prompt repeated in the message history


class _SessionRLM(RLM):
    """Our RLM with two hooks for the session: after the environment is ready, and when the prompt is built."""

    def __init__(self, chat: RLMSession, **kwargs: Any) -> None:
        self._chat = chat
        super().__init__(**kwargs)

    @contextmanager
    def _spawn_completion_context(self, prompt: str | dict[str, Any]) -> Iterator[tuple[Any, Any]]:
        with super()._spawn_completion_context(prompt) as (lm_handler, environment):
            self._chat._store_turn_context(environment)
            yield lm_handler, environment

    def _setup_prompt(self, prompt: str | dict[str, Any], root_prompt: str | None = None) -> list[dict[str, Any]]:
        return self._chat._with_conversation(super()._setup_prompt(prompt, root_prompt))


def _run(environment: Any, code: str) -> None:
    """A bookkeeping cell of the session; it does not fail unless the REPL's variables were removed."""
    result = environment.execute_code(code)
    if result.stderr.strip():
        first = code.splitlines()[0]
        raise RuntimeError(f"RLMSession could not update its REPL variables ({first} ...): {result.stderr}")


class RLMSession:
    """Chat with an RLM across turns: ``chat(prompt)`` per turn, ``close()`` (or ``with``) at the end.

    Takes ``RLM``'s arguments (``backend``, ``backend_kwargs``, ``environment`` (default
    "docker"), ``environment_kwargs``, ``max_iterations``, ...); the REPL is always persistent.
    """

    def __init__(self, **rlm_kwargs: Any) -> None:
        """Make the RLM; its REPL starts with the first ``chat``.

        Raises:
            ValueError: ``persistent=False`` was asked for.
        """
        if rlm_kwargs.pop("persistent", True) is not True:
            raise ValueError("an RLMSession keeps one REPL across turns; persistent=False makes no sense here")
        self.message_history: list[dict[str, str]] = []
        """The conversation the root model sees: each turn's prompt and final answer."""
        self._turns = 0
        self._context_index = 0
        self._rlm = _SessionRLM(self, persistent=True, **rlm_kwargs)

    @property
    def turns(self) -> int:
        """Prompts stored so far (``session_context_0`` ... ``session_context_{turns-1}``)."""
        return self._turns

    @property
    def rlm(self) -> RLM:
        """The persistent RLM underneath."""
        return self._rlm

    @property
    def environment(self) -> Any:
        """The REPL, once the first ``chat`` made it."""
        return self._rlm.environment

    @property
    def session_id(self) -> str | None:
        """The orchestrator session of the REPL, once the first ``chat`` made it (``RLM.session_id``)."""
        return self._rlm.session_id

    def chat(self, prompt: str | dict[str, Any], root_prompt: str | None = None) -> RLMChatCompletion:
        """One turn: the RLM answers ``prompt`` (stored as ``session_context_<turn>``) seeing the turns before.

        Raises:
            whatever ``RLM.completion`` raises (rlms' limits, our infrastructure errors).
        """
        completion = self._rlm.completion(prompt, root_prompt=root_prompt)
        turn = self._turns - 1
        self.message_history.append({"role": "user", "content": self._shown(prompt, root_prompt, turn)})
        self.message_history.append({"role": "assistant", "content": str(completion.response)})
        environment = self.environment
        if environment is not None and hasattr(environment, "get_history_count"):
            names = ", ".join(f"history_{k}" for k in range(environment.get_history_count()))
            _run(environment, f"session_history = [{names}]")
        return completion

    def close(self) -> None:
        """Remove the REPL (for a DockerREPL: its container and stored state)."""
        self._rlm.close()

    def __enter__(self) -> RLMSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the hooks

    def _store_turn_context(self, environment: Any) -> None:
        """Bind this turn's payload (rlms just stored it as the newest ``context_<m>``) as ``session_context_<n>``."""
        turn, self._context_index = self._turns, environment.get_context_count() - 1
        names = ", ".join(f"session_context_{k}" for k in range(turn + 1))
        _run(environment, f"session_context_{turn} = context_{self._context_index}\ncontext_history = [{names}]")
        self._turns = turn + 1

    def _with_conversation(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """rlms' opening messages, the earlier turns after the system prompt, and where this turn's prompt is."""
        turn = self._turns - 1
        where = f"`session_context_{turn}` (the same value as `context_{self._context_index}`)"
        if turn == 0:
            note = f"This is turn 1 of a multi-turn session: this turn's prompt is in {where}."
        else:
            note = (
                f"This is turn {turn + 1} of a multi-turn session. The current prompt is in {where}; "
                f"session_context_0 ... session_context_{turn - 1} hold the prompts of earlier turns (all of them "
                "are in the list `context_history`) and are history: answer the current prompt. `session_history` "
                "holds the message histories of earlier turns, and the conversation so far is above."
            )
        opening = [dict(message) for message in messages]
        if len(opening) > 1:
            opening[1]["content"] = f"{opening[1]['content']}\n\n{note}"
        else:
            opening.append({"role": "user", "content": note})
        return [opening[0], *self.message_history, *opening[1:]]

    @staticmethod
    def _shown(prompt: str | dict[str, Any], root_prompt: str | None, turn: int) -> str:
        """How a turn's prompt appears in the conversation: its text when short, else where it is stored."""
        if root_prompt:
            return f"{root_prompt}\n\n(Context of this turn: session_context_{turn}.)"
        if isinstance(prompt, str) and len(prompt) <= _SHOWN_PROMPT:
            return prompt
        size = len(prompt)
        return f"[The prompt of this turn is in session_context_{turn}: a {type(prompt).__name__} of length {size}.]"
