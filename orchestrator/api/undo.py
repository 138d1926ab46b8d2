"""``undo_last_cell`` for ``PythonTool``: the generations before a model's calls, and the rewind back to them.

A model that broke its namespace (deleted a variable, overwrote a dataframe with a bad
transformation) can take its last call back instead of rebuilding the state by hand. The tool
notes the session's generation before each model call; a call after which the generation moved
changed the variables, and undoing it rewinds the session to the generation before it
(``Session.rewind``: a new generation, history stays linear). Undoing again takes back the call
before that one, not the undo. The log only covers an unbroken run of the model's own calls: if
the session changed in between by other hands (the program that runs the model), undoing would
throw that change away too, so the log starts over from there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol

from ..errors import GenerationNotFound
from .answers import Answer, listed_names
from .results import Generation

UNDO = "undo_last_cell"
_NAMES_CHARS = 1_000  # the names an answer lists; more are counted
_ONLY_VARIABLES = (
    "note: only variables are undone: files the code wrote stay as they are, and modules it imported stay loaded."
)


class Rewindable(Protocol):
    """What ``undo_last_cell`` needs of a session (``orchestrator.Session`` is one)."""

    @property
    def generation(self) -> int: ...

    def history(self) -> list[Generation]: ...

    def rewind(self, generation: int) -> Generation: ...


class UndoLog:
    """The generation before each of the model's calls that changed the session, oldest first; ``undo`` goes back."""

    def __init__(self, session: Rewindable) -> None:
        self._session = session
        self._before: list[int] = []
        self._left: int | None = None  # the generation the model's last call (or undo) left the session at
        self._calls = 0  # calls seen (an undo is not one)

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        """Wrap one model call that may change the session (``execute_code``, ``reset_repl``); whatever its outcome,
        a call after which the generation moved is one ``undo`` can take back."""
        before = self._session.generation
        self._start_over_if_changed_elsewhere(before)
        try:
            yield
        finally:
            self._calls += 1
            self._note(before)

    def undo(self) -> Answer:
        """Rewind to the generation before the newest call in the log, and say what came back or why nothing did.

        Raises:
            OrchestratorError: the rewind failed (the sandbox could not be restored...): the caller describes it.
        """
        current = self._session.generation
        if self._start_over_if_changed_elsewhere(current):
            return _not_undone(
                "The variables were changed by the program running you (not by your calls) since your last call; "
                "undoing your call would undo that too."
            )
        if not self._before:
            return _not_undone(self._why_empty())
        target = self._before[-1]
        try:
            rewound = self._session.rewind(target)
        except GenerationNotFound:
            self._before.clear()  # the oldest generations go first: every earlier one is gone too
            return _not_undone(
                "The session no longer keeps the state from before that call (it keeps only its most recent "
                "states), so it cannot be undone."
            )
        finally:
            if self._session.generation != current:  # the rewind was stored, even if restoring it then failed
                self._before.pop()
                self._left = self._session.generation
        return self._undone(rewound)

    def _start_over_if_changed_elsewhere(self, generation: int) -> bool:
        """Forget the log when the session is not where the model's last call left it; True when it was forgotten."""
        if self._left is None or generation == self._left:
            return False
        self._before.clear()
        self._left = generation
        return True

    def _note(self, before: int) -> None:
        after = self._session.generation
        if after != before:
            self._before.append(before)
        self._left = after

    def _why_empty(self) -> str:
        if self._calls == 0:
            return "No code has run yet, so there is nothing to undo."
        return (
            "None of your calls left to undo changed any variable (code that only prints or reads changes nothing), "
            "or every one has been undone already."
        )

    def _undone(self, rewound: Generation) -> Answer:
        answer = Answer()
        answer.line("status: success")
        answer.line("Your last call that changed variables was undone: they are as they were before it.")
        answer.line(f"names restored or removed: {listed_names(rewound.changed, _NAMES_CHARS)}")
        if rewound.unsaved:
            answer.line(
                "note: these variables could not be saved before that call and are gone: "
                + listed_names(tuple(rewound.unsaved), _NAMES_CHARS)
            )
        kept = {g.generation for g in self._session.history()}
        more = sum(generation in kept for generation in self._before)
        answer.line(
            f"note: {more} earlier call{'s' if more != 1 else ''} can be undone in turn."
            if more
            else "note: no earlier call can be undone."
        )
        answer.line(_ONLY_VARIABLES)
        return answer


def _not_undone(why: str) -> Answer:
    answer = Answer()
    answer.line("status: not undone")
    answer.line(why + " Nothing was changed.")
    return answer
