"""Contexts: more isolated namespaces in one session, each with its own working directory and environment.

A context is a namespace of the session's one worker (README "Contexts" says why not a worker
of its own), with its own checkpoint keys (``<id>/<name>`` in the session's manifest), its
own working directory under the sandbox's ``/workspace`` (or ``/tmp``) and its own environment
variables. The session's own namespace is the default context (id ``"default"``). This module
holds the checks of what a caller asks for (ids, directories, environments) and the naming of a
context's checkpoint keys; ``Context``, the handle, is in ``session.py`` (each of its calls is the
session's with ``context=`` it).
"""

from __future__ import annotations

import posixpath
import secrets
from collections.abc import Collection, Mapping

from ..agent.checkpoint_names import CONTEXT_ID, CONTEXT_SEPARATOR
from ..config import WORKSPACE, Settings
from ..errors import ConfigError

DEFAULT_CONTEXT = "default"
"""The id of the session's own namespace."""
CONTEXTS_DIR = "contexts"
"""Where, under the workspace, a context without a ``cwd`` gets its directory (``<workspace>/contexts/<id>``)."""
_MAX_ENV_BYTES = 256 << 10


def validate_context_id(context_id: object) -> str:
    """Context ids become directory names and checkpoint key prefixes, so they are restricted.

    Raises:
        ConfigError: not 1-64 letters, digits, ``_`` and ``-`` (starting with a letter or digit), or ``default``.
    """
    if not isinstance(context_id, str) or not CONTEXT_ID.match(context_id):
        raise ConfigError(
            f"invalid context id {context_id!r}: use 1-64 letters, digits, '_' and '-', starting with a letter or digit"
        )
    if context_id == DEFAULT_CONTEXT:
        raise ConfigError(f"{DEFAULT_CONTEXT!r} is the session's own context; choose another id")
    return context_id


def new_context_id() -> str:
    return f"ctx-{secrets.token_hex(4)}"


def writable_dirs(settings: Settings) -> tuple[str, ...]:
    """The sandbox's writable directories a context may run in: ``/workspace`` first (relative paths start there),
    then the scratch tmpfs mounts (``/tmp``)."""
    return (WORKSPACE, *sorted(settings.confinement.tmpfs))


def resolve_cwd(roots: tuple[str, ...], context_id: str, cwd: object) -> str:
    """The absolute directory a context runs in: ``<roots[0]>/contexts/<id>`` by default, a relative ``cwd`` under
    ``roots[0]``, an absolute one as given; it must stay inside one of ``roots`` (the writable directories).

    Raises:
        ConfigError: ``cwd`` is not a str, holds a NUL, or leads outside every root.
    """
    root = roots[0]
    if cwd is None:
        return posixpath.join(root, CONTEXTS_DIR, context_id)
    where = " or ".join(roots)
    if not isinstance(cwd, str) or not cwd or "\x00" in cwd:
        raise ConfigError(f"cwd must be a non-empty path (str) inside the sandbox's {where}, got {cwd!r}")
    resolved = posixpath.normpath(posixpath.join(root, cwd))
    if not any(resolved == r or resolved.startswith(r.rstrip("/") + "/") for r in roots):
        raise ConfigError(
            f"cwd {cwd!r} leads to {resolved}, outside the sandbox's writable directories ({where}); "
            f"give a path inside one of them (a relative one is taken from {root})"
        )
    return resolved


def validate_env(env: object) -> dict[str, str]:
    """A copy of ``env`` once checked: names and values are str, names non-empty without ``=``, no NUL anywhere.

    Raises:
        ConfigError: naming the first bad entry.
    """
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise ConfigError(f"env must be a mapping of str to str, not {type(env).__name__}")
    checked: dict[str, str] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not name or "=" in name or "\x00" in name:
            raise ConfigError(f"environment variable name {name!r} must be a non-empty str without '=' or NUL")
        if not isinstance(value, str) or "\x00" in value:
            raise ConfigError(f"environment variable {name} must have a str value without NUL, got {value!r:.80}")
        checked[name] = value
    if sum(len(k) + len(v) for k, v in checked.items()) > _MAX_ENV_BYTES:
        raise ConfigError(f"env holds more than {_MAX_ENV_BYTES} characters")
    return checked


def checkpoint_key(context_id: str | None, name: str) -> str:
    """The manifest key of variable ``name`` of a context (the default context's keys are the names)."""
    return name if context_id is None else f"{context_id}{CONTEXT_SEPARATOR}{name}"


def local_names(names: Mapping[str, str]) -> dict[str, str]:
    """``{<id>/<name>: reason}`` of one context's names as ``{<name>: reason}`` (default-context names stay)."""
    return {key.rpartition(CONTEXT_SEPARATOR)[2]: reason for key, reason in names.items()}


def names_of(variables: Collection[str], context_id: str | None) -> list[str]:
    """The variable names of one context among the manifest's keys."""
    if context_id is None:
        return sorted(key for key in variables if CONTEXT_SEPARATOR not in key)
    prefix = context_id + CONTEXT_SEPARATOR
    return sorted(key[len(prefix) :] for key in variables if key.startswith(prefix))
