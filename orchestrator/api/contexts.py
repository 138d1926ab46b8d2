"""Contexts: more isolated namespaces in one session, each with its own working directory and environment.

A context is a namespace of the session's one worker (README "Contexts" says why not a worker
of its own), with its own checkpoint keys (``<id>/<name>`` in the session's manifest), its
own working directory under the sandbox's writable workspace and its own environment
variables. The session's own namespace is the default context (id ``"default"``). This module
holds the checks of what a caller asks for (ids, directories, environments) and ``Context``,
the handle, which runs its calls through the session (its public calls, and ``ContextCalls``).
"""

from __future__ import annotations

import posixpath
import secrets
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..agent.checkpoint_names import CONTEXT_ID, CONTEXT_SEPARATOR
from ..config import Settings
from ..errors import ConfigError
from ..state.store import SessionRecord
from .events import Event, OnOutput
from .results import ExecResult

if TYPE_CHECKING:
    from ..runtime.hostcalls import HostCalls
    from .session import Session

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


def workspace(settings: Settings) -> str:
    """The writable directory in the sandbox under which contexts' directories live: ``/tmp``, or the first tmpfs.

    Raises:
        ConfigError: the sandbox has no writable directory (``Settings.confinement.tmpfs`` is empty).
    """
    mounts = sorted(settings.confinement.tmpfs)
    if "/tmp" in mounts:
        return "/tmp"
    if not mounts:
        raise ConfigError(
            "contexts need a writable workspace in the sandbox, but Settings.confinement.tmpfs mounts nothing"
        )
    return mounts[0]


def resolve_cwd(root: str, context_id: str, cwd: object) -> str:
    """The absolute directory a context runs in: ``<root>/contexts/<id>`` by default, a relative ``cwd`` under
    ``root``, an absolute one as given; it must stay inside ``root`` (the writable workspace).

    Raises:
        ConfigError: ``cwd`` is not a str, holds a NUL, or leads outside ``root``.
    """
    if cwd is None:
        return posixpath.join(root, CONTEXTS_DIR, context_id)
    if not isinstance(cwd, str) or not cwd or "\x00" in cwd:
        raise ConfigError(f"cwd must be a non-empty path (str) inside the workspace {root}, got {cwd!r}")
    resolved = posixpath.normpath(posixpath.join(root, cwd))
    if resolved != root and not resolved.startswith(root.rstrip("/") + "/"):
        raise ConfigError(
            f"cwd {cwd!r} leads to {resolved}, outside the sandbox's writable workspace {root}; "
            f"give a path inside {root} (a relative one is taken from there)"
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


@dataclass(frozen=True)
class ContextCalls:
    """What a context does through its session besides the session's public calls, each for one context (None: the
    default one); the session hands its contexts these, bound to itself."""

    spec: Callable[[str | None], dict[str, Any] | None]
    """The record of a context (None for the default one); raises ``ContextNotFound`` for one that is gone."""
    record: Callable[[], SessionRecord]
    """The session's stored record."""
    add_versioned: Callable[[str, Any, int | None, str | None], int]
    """``add_context`` ("context") or ``add_history`` ("history"): the payload under ``<prefix>_<index>``."""
    set_value: Callable[[str, Any, Collection[str], str | None], None]
    reset: Callable[[str | None], None]
    destroy: Callable[[str], None]


class Context:
    """One isolated namespace of a session, with the session's call surface; from ``Session.create_context``,
    ``Session.context(id)`` or ``Session.contexts``.

    Calls go through the session (one at a time per session). The default context (id
    ``"default"``) is the session's own namespace, working directory and environment.
    """

    def __init__(self, session: Session, context_id: str, calls: ContextCalls) -> None:
        self._session = session
        self._id = context_id
        self._calls = calls

    @property
    def id(self) -> str:
        return self._id

    @property
    def session(self) -> Session:
        return self._session

    @property
    def _wire_id(self) -> str | None:
        return None if self._id == DEFAULT_CONTEXT else self._id

    @property
    def cwd(self) -> str | None:
        """The working directory in the sandbox the context was created with (None: the default context's,
        the image's working directory). A cell's ``os.chdir`` lasts in its context until the next restore."""
        spec = self._calls.spec(self._wire_id)
        return None if spec is None else str(spec["cwd"])

    @property
    def env(self) -> dict[str, str]:
        """The environment variables the context was created with, on top of the sandbox's own."""
        spec = self._calls.spec(self._wire_id)
        return {} if spec is None else dict(spec["env"])

    @property
    def variables(self) -> list[str]:
        """The context's names held by the last checkpoint."""
        self._calls.spec(self._wire_id)
        return names_of(self._calls.record().variables, self._wire_id)

    def execute(
        self,
        code: str,
        timeout: float | None = None,
        *,
        host_calls: HostCalls | None = None,
        on_output: OnOutput | None = None,
    ) -> ExecResult:
        """Run ``code`` in this context and checkpoint it: ``Session.execute`` (same arguments, result and errors).

        Raises:
            ContextNotFound: the context was destroyed.
        """
        return self._session.execute(code, timeout, host_calls=host_calls, on_output=on_output, context=self._id)

    def stream(self, code: str, timeout: float | None = None) -> Iterator[Event | ExecResult]:
        """``Session.stream`` in this context."""
        return self._session.stream(code, timeout, context=self._id)

    def add_context(self, payload: str | bytes | dict[str, Any] | list[Any], index: int | None = None) -> int:
        """``Session.add_context`` in this context: ``context_<index>`` (and ``context``); returns the index."""
        return self._calls.add_versioned("context", payload, index, self._wire_id)

    def add_history(self, messages: list[Any], index: int | None = None) -> int:
        """``Session.add_history`` in this context: ``history_<index>`` (and ``history``); returns the index."""
        if not isinstance(messages, list):
            raise ConfigError(f"messages must be a list, not {type(messages).__name__}")
        return self._calls.add_versioned("history", messages, index, self._wire_id)

    def set_value(
        self, name: str, payload: str | bytes | dict[str, Any] | list[Any], *, aliases: Collection[str] = ()
    ) -> None:
        """``Session.set_value`` in this context."""
        self._calls.set_value(name, payload, aliases, self._wire_id)

    def get_context_count(self) -> int:
        return self._count("context_count")

    def get_history_count(self) -> int:
        return self._count("history_count")

    def _count(self, counter: str) -> int:
        spec = self._calls.spec(self._wire_id)
        return int(getattr(self._calls.record(), counter) if spec is None else spec[counter])

    def reset(self) -> None:
        """Clear this context's variables (the others keep theirs); the empty state is checkpointed."""
        self._calls.reset(self._wire_id)

    def destroy(self) -> None:
        """Delete the context and its variables from the sandbox and the checkpoint; the others are untouched.

        Raises:
            ConfigError: this is the default context (close the session instead).
            ContextNotFound: the context was destroyed already.
        """
        if self._wire_id is None:
            raise ConfigError("the default context is the session's own namespace; use Session.close() to end it")
        self._calls.destroy(self._wire_id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Context) and (other._session, other._id) == (self._session, self._id)

    def __hash__(self) -> int:
        return hash((id(self._session), self._id))

    def __repr__(self) -> str:
        return f"<Context {self._id} of session {self._session.id}>"
