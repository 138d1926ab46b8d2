"""How rlms reaches our DockerREPL: everywhere after ``register()``, or only from ``orchestrator.rlm.RLM``.

rlms makes environments in ``rlm.environments.get_environment``, which imports
``rlm.environments.docker_repl.DockerREPL`` when it is called; ``register()`` replaces that
attribute, so plain ``rlm.RLM(environment="docker")`` and ``from rlm.environments.docker_repl
import DockerREPL`` give ours until ``unregister()``.

Without ``register()``, ``orchestrator.rlm.RLM`` puts a marker into its environment kwargs.
rlms hands those kwargs on to the child RLMs of recursive sub-calls, so a thin wrapper around
the ``get_environment`` that ``rlm.core.rlm`` calls sends every marked "docker" environment to
ours (children included), and everything else to rlms unchanged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ._upstream import docker_repl_module, rlm_core_module
from .environment import DockerREPL

ROUTE_KEY = "_orchestrator_sandbox"
"""Environment kwarg that marks an environment to be ours; removed before any environment sees it."""

_lock = threading.Lock()
_peer_class: Any = None  # rlms' DockerREPL while ours is registered


def register() -> None:
    """Make rlms use our DockerREPL for every "docker" environment, until ``unregister()``."""
    global _peer_class
    module = docker_repl_module()
    with _lock:
        if _peer_class is None:
            _peer_class = getattr(module, "DockerREPL")  # noqa: B009  (rlms is untyped: attributes by name)
            setattr(module, "DockerREPL", DockerREPL)  # noqa: B010


def unregister() -> None:
    """Give rlms its own DockerREPL back (``orchestrator.rlm.RLM`` keeps using ours)."""
    global _peer_class
    module = docker_repl_module()
    with _lock:
        if _peer_class is not None:
            setattr(module, "DockerREPL", _peer_class)  # noqa: B010
            _peer_class = None


def registered() -> bool:
    """True between ``register()`` and ``unregister()``."""
    return _peer_class is not None


def route_marked() -> None:
    """Install, once, the wrapper that sends marked "docker" environments to our DockerREPL."""
    core = rlm_core_module()
    with _lock:
        current: Callable[[str, dict[str, Any]], Any] = getattr(core, "get_environment")  # noqa: B009
        if getattr(current, "orchestrator_route", False):
            return

        def get_environment(environment: str, environment_kwargs: dict[str, Any]) -> Any:
            kwargs = dict(environment_kwargs)
            if kwargs.pop(ROUTE_KEY, False) and environment == "docker":
                return DockerREPL(**kwargs)
            return current(environment, kwargs)

        get_environment.orchestrator_route = True  # type: ignore[attr-defined]
        setattr(core, "get_environment", get_environment)  # noqa: B010
