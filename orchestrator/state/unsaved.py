"""The record's unsaved report: names the worker holds that its checkpoint does not, merged per context, bounded.

Each delta reports the unsaved names of the one context it comes from, complete: they replace that
context's names in the record and leave the other contexts' alone. A context's keys are
``<context id>/<name>``; every other key is the default context's. A context's delta that reports a
key outside its prefix lies (the agent prefixes every key it reports), so it is refused. The default
context's keys are whatever its namespace holds, shown (``a/b`` is an honest name there): one whose
prefix reads as a context id is stored as its ``repr``, so it can never be taken for a context's
key and is replaced by the default context's next report. The workspace's paths that could not be
kept are keyed ``/workspace/<path>`` (``files.UNSAVED_PREFIX``; a default key that starts so is
stored as its ``repr`` too): a delta's ``files.unsaved`` replaces them all, and a delta without
``files`` leaves them alone.

The report is bounded as a whole, across contexts: at most ``MAX_UNSAVED_NAMES`` entries and
``MAX_UNSAVED_BYTES`` bytes as stored (UTF-8 JSON, escapes included). Past either, the report keeps
the first entries that fit (the delta's own first) and one more, ``+N more``, counting those left
out. Kept generations hold the names only (``names_only``): rewind and undo say which names are
gone, and the reasons of every earlier call would multiply the record's size by its history.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

from ..agent.checkpoint_names import CONTEXT_ID, CONTEXT_SEPARATOR, MAX_UNSAVED_NAMES
from ..errors import ProtocolError
from .files import UNSAVED_PREFIX
from .history import compact_json, stored

MAX_UNSAVED_BYTES = 256 << 10
"""Bytes the record's unsaved report takes in ``meta.json`` (its JSON object, UTF-8), all contexts together."""
_LEFT_OUT = re.compile(r"\d+ more names were not saved; the session's record lists only the first \d+\Z")


WORKSPACE = UNSAVED_PREFIX
"""The owner of the workspace's keys: no context id, since those never start with "/"."""


def owner(key: str) -> str | None:
    """The context whose name ``key`` is (None: the default context's; ``WORKSPACE``: a workspace path)."""
    if key.startswith(UNSAVED_PREFIX):
        return WORKSPACE
    context, separator, _ = key.partition(CONTEXT_SEPARATOR)
    return context if separator and CONTEXT_ID.fullmatch(context) else None


def merged(
    before: Mapping[str, str],
    reported: Mapping[str, str],
    *,
    context: str | None,
    known: Collection[str],
    workspace: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The record's unsaved report after a delta of ``context`` reported ``reported``; ``known``: the session's
    contexts after the delta (names of any other are dropped); ``workspace``: the delta's workspace paths, keyed
    ``files.UNSAVED_PREFIX`` and the path (None: the delta has no ``files``, those of ``before`` stay).

    Raises:
        ProtocolError: a context's delta reports a key of another context, or of the default one.
    """
    if context is None:
        reported = {_as_default(key): reason for key, reason in reported.items()}
    elif any(owner(key) != context for key in reported):
        stray = next(key for key in reported if owner(key) != context)
        raise ProtocolError(f"checkpoint of context {context} reports an unsaved name of another: {stray[:80]!r}")
    replaced = {context} if workspace is None else {context, WORKSPACE}
    others = {
        k: v for k, v in before.items() if owner(k) not in replaced and k not in reported and not _LEFT_OUT.match(v)
    }
    together = {**reported, **(workspace or {}), **others}
    return bounded({k: v for k, v in together.items() if owner(k) in (None, WORKSPACE) or owner(k) in known})


def bounded(unsaved: dict[str, str]) -> dict[str, str]:
    """``unsaved`` within ``MAX_UNSAVED_NAMES`` entries and ``MAX_UNSAVED_BYTES`` stored bytes."""
    if len(unsaved) <= MAX_UNSAVED_NAMES and len(stored(compact_json(unsaved))) <= MAX_UNSAVED_BYTES:
        return unsaved  # one pass of the C encoder: the usual case
    room = MAX_UNSAVED_BYTES - 2 - _entry_bytes(*_left_out(len(unsaved), len(unsaved)))  # "{}" and the last entry
    kept: dict[str, str] = {}
    for key, reason in unsaved.items():
        size = _entry_bytes(key, reason)
        if len(kept) == MAX_UNSAVED_NAMES - 1 or size > room:
            break
        kept[key], room = reason, room - size
    key, reason = _left_out(len(unsaved) - len(kept), len(kept))
    return {**kept, key: reason}


def names_only(unsaved: Mapping[str, str]) -> dict[str, str]:
    """What a kept generation keeps of a report: its names, each with an empty reason."""
    return dict.fromkeys(unsaved, "")


def _as_default(key: str) -> str:
    """A default context's key as the record keeps it: never one that reads as another context's."""
    return repr(key) if owner(key) is not None else key


def _entry_bytes(key: str, reason: str) -> int:
    return len(stored(compact_json(key))) + len(stored(compact_json(reason))) + 2  # ":" and ","


def _left_out(count: int, listed: int) -> tuple[str, str]:
    return f"+{count} more", f"{count} more names were not saved; the session's record lists only the first {listed}"
