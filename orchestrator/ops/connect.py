"""What a controller works on: its store, and the engine ``Settings.backend`` names (an ``Orchestrator``, the
janitor)."""

from __future__ import annotations

from ..backends.base import Backend
from ..backends.engines import connect
from ..config import Settings
from ..state.store import SessionStore
from ..wire.endpoint import ensure_private_dir
from .images import sandbox_image


def open_store(settings: Settings) -> SessionStore:
    """The store under ``settings.state_dir``, once the runtime directory is known to be private.

    Raises:
        ConfigError: the runtime directory is not private (a symlink, not ours, or open to others).
    """
    ensure_private_dir(settings.runtime_dir)
    return SessionStore(settings.state_dir, fsync=settings.fsync, lock_timeout=settings.timeouts.lock)


def connect_engine(settings: Settings, store: SessionStore) -> Backend:
    """The engine of ``store``'s sandboxes (a Swarm's relays run the sandbox image ``settings`` names).

    Raises:
        EngineUnavailable: no engine answers.
        ConfigError: a Swarm is named and the engine is not its manager.
    """
    return connect(settings, scope=store.store_id, sandbox_image=lambda: sandbox_image(settings))
