"""The sessions an ``Orchestrator`` holds, and what keeps them: their leases renewed, its idle policy applied."""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref

from ..errors import SessionAttachedElsewhere, SessionNotFound
from ..ops import hibernation
from ..runtime.restore import SessionSandbox
from ..state.lease import RENEW_EVERY
from ..state.store import validate_session_id
from .session import Session, SessionState

logger = logging.getLogger(__name__)


class HeldSessions:
    """Each held session's handle and the runtime behind it, by id; a thread renews their leases from the first one
    on, and another may apply an idle policy."""

    def __init__(self) -> None:
        self._sessions: dict[str, tuple[Session, SessionSandbox]] = {}
        self._lock = threading.Lock()
        self.closing = threading.Event()
        """Set by ``close_all``: the threads stop, and nothing new starts."""
        self._renewer: threading.Thread | None = None
        self._idle_watch: threading.Thread | None = None

    def apply_idle_policy(self, idle_for: float) -> None:
        """Hibernate the sessions held here once idle for ``idle_for`` seconds (the janitor does it for the others)."""
        self._idle_watch = threading.Thread(target=self._hibernate_idle, args=(idle_for,), daemon=True)
        self._idle_watch.start()

    def add(self, session: Session, sandbox: SessionSandbox) -> None:
        with self._lock:
            self._sessions[session.id] = (session, sandbox)
            if self._renewer is None and not self.closing.is_set():
                self._renewer = threading.Thread(
                    target=_renew_leases, args=(weakref.ref(self), self.closing), name="lease-renewal", daemon=True
                )
                self._renewer.start()

    def owned(self, session_id: str) -> tuple[Session, SessionSandbox] | None:
        """The handle on the session, if it is held and still owned here."""
        with self._lock:
            held = self._sessions.get(validate_session_id(session_id))
        if held is None or held[0].state is not SessionState.READY:
            return None
        try:
            held[1].ledger.check_owner()
        except SessionAttachedElsewhere:
            held[1].become_stale()  # taken by force meanwhile: this handle is stale, the next attach decides
            return None
        return held

    def sandbox_of(self, session_id: str) -> SessionSandbox | None:
        """The runtime of a held session, in whatever state its handle is."""
        with self._lock:
            held = self._sessions.get(session_id)
        return None if held is None else held[1]

    def forget(self, session: Session) -> None:
        with self._lock:
            held = self._sessions.get(session.id)
            if held is not None and held[0] is session:
                del self._sessions[session.id]

    def ready(self) -> list[SessionSandbox]:
        """The sessions held now (not detached, stale or closed)."""
        with self._lock:
            return [sandbox for session, sandbox in self._sessions.values() if session.state is SessionState.READY]

    def states(self) -> list[str]:
        """The state of each, for ``orchestrator_sessions`` (no engine call)."""
        states = []
        for sandbox in self.ready():
            if sandbox.sandbox is None:
                states.append("hibernated")
            elif sandbox.lock.acquire(blocking=False):  # a call (or a start, a restore) holds it while it runs
                sandbox.lock.release()
                states.append("running")
            else:
                states.append("busy")
        return states

    def close_all(self) -> dict[str, Exception]:
        """Stop the threads and close every session still held (each is tried); return the failures by id."""
        self.closing.set()
        for thread in (self._idle_watch, self._renewer):
            if thread is not None:
                thread.join()
        with self._lock:
            held = [session for session, _ in self._sessions.values()]
        failures: dict[str, Exception] = {}
        for session in held:
            try:
                if session.state is SessionState.READY:
                    with contextlib.suppress(SessionAttachedElsewhere):
                        session.close()
            except Exception as exc:  # every session gets its turn; all failures are reported
                logger.warning("closing session %s failed: %s: %s", session.id, type(exc).__name__, exc)
                failures[session.id] = exc
            finally:
                self.forget(session)
        return failures

    def _hibernate_idle(self, idle_for: float) -> None:
        while not self.closing.wait(min(max(idle_for / 4, 0.2), 30.0)):
            with self._lock:
                held = [sandbox for _, sandbox in self._sessions.values()]
            for sandbox in held:
                hibernation.hibernate_if_idle(sandbox, idle_for)


def _renew_leases(sessions: weakref.ref[HeldSessions], closing: threading.Event) -> None:
    """The proof of life of the held sessions: their leases renewed every ``RENEW_EVERY`` seconds until their
    orchestrator closes (or is collected: its leases then lapse, and others may take its sessions)."""
    while not closing.wait(RENEW_EVERY):
        held_now = sessions()
        if held_now is None:
            return
        held = held_now.ready()
        del held_now
        for sandbox in held:
            try:
                if not sandbox.ledger.renew_lease():
                    logger.debug("session %s: its lease is another handle's now", sandbox.session_id)
            except SessionNotFound:
                pass  # removed meanwhile: its handle learns it at its next call
            except Exception as exc:  # the thread must go on: the other sessions' leases depend on it
                logger.warning(
                    "session %s: its lease was not renewed: %s: %s", sandbox.session_id, type(exc).__name__, exc
                )
