"""``ls --filter KEY=VALUE``: which sessions a filter selects (the keys are fields of ``SessionInfo``).

As ``docker ps --filter``: filters with different keys must all match; several filters with the
same key match when any of them does. Values of ``id``, ``image`` and ``node`` are shell-style
patterns (``fnmatch``: ``*``, ``?``, ``[...]``); ``label=KEY`` selects sessions that have the
label, ``label=KEY=VALUE`` those where it has that value.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from .labels import stored_key

if TYPE_CHECKING:
    from ..ops.survey import SessionInfo

KEYS = ("id", "status", "image", "label", "node")
"""What ``--filter`` accepts (``state`` is ``status``)."""
_ALIASES = {"state": "status"}


def parse_filter(text: str) -> tuple[str, str]:
    """An argparse ``type``: ``KEY=VALUE`` checked (the key known, a status one of the statuses)."""
    key, equals, value = text.partition("=")
    key = _ALIASES.get(key.strip().lower(), key.strip().lower())
    if not equals or key not in KEYS:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE with KEY one of {', '.join(KEYS)}")
    if key == "status" and value not in _statuses():
        raise argparse.ArgumentTypeError(f"status {value!r} is not one of {', '.join(_statuses())}")
    if not value:
        raise argparse.ArgumentTypeError(f"{text!r} has no value after '='")
    return key, value


def _statuses() -> tuple[str, ...]:
    from ..ops.survey import SessionStatus  # the survey costs to import: only for a status filter

    return tuple(status.value for status in SessionStatus)


def select(infos: Iterable[SessionInfo], filters: Sequence[tuple[str, str]]) -> list[SessionInfo]:
    """The sessions every filter key matches (any of a key's values)."""
    by_key: dict[str, list[str]] = {}
    for key, value in filters:
        by_key.setdefault(key, []).append(value)
    return [info for info in infos if all(any(_matches(info, k, v) for v in vs) for k, vs in by_key.items())]


def _matches(info: SessionInfo, key: str, value: str) -> bool:
    if key == "status":
        return info.status.value == value
    if key == "label":
        name, equals, wanted = value.partition("=")
        name = stored_key(name)
        return name in info.labels and (not equals or info.labels[name] == wanted)
    field = {"id": info.id, "image": info.image, "node": info.node}[key]
    return field is not None and fnmatchcase(field, value)
