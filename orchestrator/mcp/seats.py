"""How many sandbox sessions the whole server holds: ``--max-sessions`` counts every client's, not each client's.

Over HTTP each MCP session has a workspace of its own; were the cap a workspace's, a token holder would get
``--max-sessions`` sandboxes per MCP session it opened. Every workspace of a server takes its places here.
"""

from __future__ import annotations

from ..slots import Slots
from .files import BadCall


class Refused(BadCall):
    """The server is at a cap: nothing the client sent was wrong, it may try again once a place is free."""


class Seats:
    """Places for sandbox sessions, ``most`` in all, shared by every workspace of one server."""

    def __init__(self, most: int) -> None:
        if most < 1:
            raise ValueError(f"a server holds at least one session, not {most}")
        self.most = most
        self._slots = Slots(most)

    def take(self) -> None:
        """Hold one more place.

        Raises:
            Refused: every place is held.
        """
        if not self._slots.reserve():
            raise Refused(
                f"This server holds {self._slots.held} sandbox sessions, the most it allows for all its clients "
                f"together (--max-sessions {self.most}); close one of yours with close_session, or try again "
                "once other clients have gone."
            )

    def give_back(self, count: int = 1) -> None:
        """Let go of ``count`` places (sessions removed or detached)."""
        self._slots.release(count)

    @property
    def held(self) -> int:
        return self._slots.held
