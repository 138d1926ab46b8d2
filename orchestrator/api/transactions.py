"""What every call of a session shares: its turn, the record of the context it runs in, and a request sent with
recovery whose reply's checkpoint delta is committed before the call returns.

``Session`` holds one; a call checks its arguments, builds its request and hands it here. The delta is stored by
the ledger, under the store lock, only while the handle owns the session.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from ..agent import protocol
from ..errors import ConfigError, ContextNotFound
from ..runtime.recovery import Recoverer
from ..runtime.restore import SessionSandbox
from ..runtime.sandbox import ValueFile
from ..state.ledger import StagedBlob
from ..wire.connection import Body
from ..wire.replies import parse_state_reply, reply_reason
from .contexts import DEFAULT_CONTEXT
from .events import LiveCall

T = TypeVar("T")


class Transactions:
    """One session's calls as transactions on its checkpoint (one at a time)."""

    def __init__(self, sandbox: SessionSandbox) -> None:
        self.sandbox = sandbox
        self.ledger = sandbox.ledger
        self.settings = sandbox.settings
        self.recovery = Recoverer(sandbox, sandbox.metrics)
        self.live: LiveCall | None = None  # the running exec's output, input and interrupt (read by other threads)

    @property
    def session_id(self) -> str:
        return self.ledger.session_id

    def turn(self, *, call: bool = True) -> AbstractContextManager[None]:
        return self.sandbox.turn(call=call)

    def spec(self, context: str | None) -> dict[str, Any] | None:
        """The record of a context (None for the default one).

        Raises:
            ContextNotFound: the session has no such context.
        """
        if context is None or context == DEFAULT_CONTEXT:
            return None
        contexts = self.ledger.record.contexts
        spec = contexts.get(context)
        if spec is None:
            known = ", ".join([DEFAULT_CONTEXT, *sorted(contexts)])
            raise ContextNotFound(
                f"session {self.session_id} has no context {context!r}: it was destroyed or never created (its "
                f"contexts: {known}); make one with session.create_context()"
            )
        return spec

    def count(self, counter: str, context: str | None) -> int:
        """``context_count`` or ``history_count`` of a context."""
        spec = self.spec(context)
        return int(getattr(self.ledger.record, counter) if spec is None else spec[counter])

    def in_context(self, header: protocol.InContext, context: str | None) -> None:
        """Put the context a request runs in into its header (nothing for the default one), once it is known."""
        if self.spec(context) is not None:
            header["context"] = str(context)

    def control(
        self,
        header: protocol.Request,
        accept: Callable[[dict[str, Any], bytearray], T],
        body: Body | ValueFile = b"",
    ) -> T:
        """A request that runs no user code (a value, a reset, a context), within the time a start and a checkpoint
        may take."""
        timeouts = self.settings.timeouts
        seconds = timeouts.start + timeouts.checkpoint + timeouts.reply_margin
        return self.recovery.call(header, body, seconds, accept)

    def commit_state(
        self,
        reply: dict[str, Any],
        body: bytearray,
        counters: dict[str, int],
        context: str | None = None,
        staged: Collection[StagedBlob] = (),
    ) -> dict[str, str]:
        """Store a state reply's delta, and the context's (or the session's) counters with it."""
        context = None if context == DEFAULT_CONTEXT else context
        if context is None:
            return self.ledger.commit(parse_state_reply(reply), body, counters=counters, staged=staged)
        contexts = dict(self.ledger.record.contexts)
        contexts[context] = {**contexts[context], **counters}
        return self.ledger.commit(parse_state_reply(reply), body, contexts=contexts, staged=staged, context=context)

    def commit_context(self, reply: dict[str, Any], body: bytearray, context_id: str, spec: Any) -> None:
        """Store a created (``spec``) or destroyed (None) context with the delta its request caused."""
        if reply.get("status") == protocol.STATUS_ERROR:
            reason = reply_reason(reply, "")
            raise ConfigError(
                f"the sandbox of session {self.session_id} could not create context {context_id}: {reason}"
            )
        contexts = {k: v for k, v in self.ledger.record.contexts.items() if k != context_id}
        if spec is not None:
            contexts[context_id] = spec
        self.ledger.commit(parse_state_reply(reply), body, contexts=contexts)
