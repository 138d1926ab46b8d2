"""``--label KEY=VALUE`` as ``docker`` takes it: a plain key is kept under a prefix of ours the user never types.

The API keeps only labels in our namespace (``orchestrator.<you>.<name>``: the engine's labels of a
session's container are ours to read). A CLI user types ``team=a``; it is stored as
``orchestrator.label.team`` and shown, filtered and given back as ``team``. A key that starts
with ``orchestrator.`` is taken as it is (namespaced already).
"""

from __future__ import annotations

USER_PREFIX = "orchestrator.label."
"""Where a plain key of ``--label`` is kept."""
_OURS = "orchestrator."


def stored_key(key: str) -> str:
    """The label key the session keeps for ``key`` as typed."""
    return key if key.startswith(_OURS) else USER_PREFIX + key


def shown_key(key: str) -> str:
    """A kept label key as the user typed it (``stored_key``'s inverse)."""
    return key.removeprefix(USER_PREFIX) if key.startswith(USER_PREFIX) and len(key) > len(USER_PREFIX) else key
