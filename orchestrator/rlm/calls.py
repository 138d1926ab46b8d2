"""The LM calls one cell made, in the order they were made, so each cell reports its own and no other.

A ``CellCalls`` exists for one ``execute_code`` only, and the host-call handlers of that cell
write into it alone; it is closed when the cell ends. A sub-call that finishes later (its cell
timed out, or a thread the cell started outlived it) is dropped, never counted for a later cell.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from ._upstream import RLMChatCompletion

logger = logging.getLogger(__name__)


class CellCalls:
    """Completions of one cell, kept in call order: each call takes a slot when it starts.

    Slots make the order that of the calls, not of their answers; a batch fills its slot with
    its completions in prompt order; a call that failed leaves its slot empty.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: list[list[RLMChatCompletion] | None] = []
        self._open = True

    def reserve(self) -> int:
        """A slot for a call that starts now."""
        with self._lock:
            self._slots.append(None)
            return len(self._slots) - 1

    def fill(self, slot: int, completions: Iterable[RLMChatCompletion]) -> bool:
        """Record a call's completions; False (and nothing recorded) once the cell has ended."""
        done = list(completions)
        with self._lock:
            if self._open:
                self._slots[slot] = done
                return True
        logger.debug("dropped %d LM completion(s) that finished after their cell had ended", len(done))
        return False

    def close(self) -> list[RLMChatCompletion]:
        """End the cell: its completions, in call order; later ones are dropped."""
        with self._lock:
            self._open = False
            slots, self._slots = self._slots, []
        return [completion for slot in slots if slot for completion in slot]
