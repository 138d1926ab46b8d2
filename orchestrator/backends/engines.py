"""The backend a controller uses: the engine ``Settings.backend`` names."""

from __future__ import annotations

from collections.abc import Callable

from ..config import Settings
from .base import Backend
from .docker import DockerBackend


def connect(settings: Settings, *, scope: str, sandbox_image: Callable[[], str]) -> Backend:
    """The engine ``Settings.backend`` names, reached through DOCKER_HOST (or the local socket).

    Args:
        scope: the store id (a Swarm's relay service and node directories are per store).
        sandbox_image: the sandbox image's tag, asked for only by a backend that runs it itself (a Swarm's relays).

    Raises:
        EngineUnavailable: no engine answers.
        ConfigError: a Swarm is named and the engine is not its manager.
    """
    if settings.backend == "swarm":
        from .swarm.backend import SwarmBackend  # only Swarm users load it

        return SwarmBackend(settings, scope=scope, relay_image=sandbox_image())
    return DockerBackend()
