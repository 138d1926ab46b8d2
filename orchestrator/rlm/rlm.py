"""rlms' RLM with environment="docker" on orchestrator sessions, without changing rlms for anyone else."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ._upstream import RLM as _PeerRLM
from .routing import ROUTE_KEY, route_marked


class RLM(_PeerRLM):
    """rlms' ``RLM`` whose "docker" environment (the default here) is ``orchestrator.rlm.DockerREPL``.

    Everything else is rlms' own: ``persistent=True`` keeps one REPL across ``completion()``
    calls (rlms updates its handler address and adds ``context_N`` / ``history_N``), child RLMs
    of recursive sub-calls get our environment too, and ``close()`` or the end of a ``with``
    block removes the container and its stored state. ``environment_kwargs`` may carry
    DockerREPL's own keywords (``settings``, ``cell_timeout``, ``session_id``, ``labels``).

    The default environment is "docker", where rlms' is "local": code from a model should run
    in the sandbox unless asked otherwise. Each completion's LM handler has its listening socket
    closed when the completion ends (rlms only shuts the server down, which leaks the socket).
    """

    def __init__(
        self,
        backend: str = "openai",
        backend_kwargs: dict[str, Any] | None = None,
        environment: str = "docker",
        environment_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        env_kwargs = dict(environment_kwargs or {})
        if environment == "docker":
            env_kwargs[ROUTE_KEY] = True
            route_marked()
        super().__init__(
            backend=backend,
            backend_kwargs=backend_kwargs,
            environment=environment,
            environment_kwargs=env_kwargs,
            **kwargs,
        )

    @property
    def environment(self) -> Any:
        """The persistent environment once the first completion made it (``persistent=True``), else None."""
        return self._persistent_env

    @property
    def session_id(self) -> str | None:
        """The orchestrator session of the persistent environment (``orchestrator inspect ID``, ``logs ID``,
        ``DockerREPL(session_id=ID)``): None before the first completion, after ``close()``, without
        ``persistent=True`` (each completion's REPL is removed when it ends) or in another environment."""
        session_id = getattr(self._persistent_env, "session_id", None)
        return session_id if isinstance(session_id, str) else None

    @contextmanager
    def _spawn_completion_context(self, prompt: str | dict[str, Any]) -> Iterator[tuple[Any, Any]]:
        server = None
        try:
            with super()._spawn_completion_context(prompt) as (lm_handler, environment):
                server = getattr(lm_handler, "_server", None)
                yield lm_handler, environment
        finally:
            if server is not None:
                server.server_close()
