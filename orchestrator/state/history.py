"""The generations a session keeps besides its current one: what ``rewind`` and ``fork(at=...)`` go back to.

A generation is a whole manifest (names -> blob ids, sizes, contexts, counters, the unsaved
report, the workspace's ``files``), kept as a ``Snapshot`` in the session's record beside the current one. Snapshots
name the same content-addressed blobs the current manifest names, so keeping one costs the
bytes of the values that changed since, not a copy: ``distinct_bytes`` counts every blob once,
and the retention rule (``retain``) keeps the newest snapshots that fit the session's history
depth and checkpoint quota together with the current state. A blob leaves the disk only when
no kept manifest names it (``named_blobs``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

from .files import Entry

compact_json = json.JSONEncoder(separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode
"""Compact JSON with sorted keys, as records are stored (one encoder: ``json.dumps`` with options makes one a call);
text as it is, not as ``\\u`` escapes (which would take up to 6 bytes for a character UTF-8 stores in 1 to 3)."""


def stored(text: str) -> bytes:
    """A record's JSON text as its file holds it: UTF-8, a lone surrogate (JSON from a sandbox may hold one) as its own
    three bytes, which ``json.loads`` of the file's bytes reads back as it was."""
    return text.encode("utf-8", "surrogatepass")


@dataclass(frozen=True)
class Snapshot:
    """One generation of a session's state, as stored."""

    generation: int
    at: float
    """When it was committed (the host's clock)."""
    variables: dict[str, str]
    blob_sizes: dict[str, int]
    contexts: dict[str, dict[str, Any]] = field(default_factory=dict)
    context_count: int = 0
    history_count: int = 0
    changed: list[str] = field(default_factory=list)
    """Names set or deleted to reach it from the generation before."""
    unsaved: dict[str, str] = field(default_factory=dict)
    """Names the worker held then that its checkpoint could not hold, with why (a kept generation: the names only,
    ``unsaved.names_only``)."""
    rewound_from: int | None = None
    """The generation it copies, when ``rewind`` made it."""
    files: dict[str, Entry] = field(default_factory=dict)
    """Its workspace (``files``): path -> (kind, mode, mtime_ns, ref); the files' blobs are in ``blob_sizes``."""
    files_changed: list[str] = field(default_factory=list)
    """Paths set or deleted to reach it (``files.changed_paths``: bounded)."""

    @property
    def size(self) -> int:
        return sum(self.blob_sizes.values())

    @cached_property
    def encoded(self) -> str:
        """Its fields as compact JSON with sorted keys, made once: a snapshot never changes, and the record that keeps
        it is written again by every commit (``SessionRecord.to_json``)."""
        return compact_json({f.name: getattr(self, f.name) for f in fields(self)})


def named_blobs(manifests: Iterable[Mapping[str, int]]) -> set[str]:
    """Every blob id the given ``blob_sizes`` maps name."""
    named: set[str] = set()
    for sizes in manifests:
        named.update(sizes)
    return named


def distinct_bytes(manifests: Iterable[Mapping[str, int]]) -> int:
    """Bytes of the blobs the given ``blob_sizes`` maps name, each blob counted once."""
    sizes: dict[str, int] = {}
    for manifest in manifests:
        sizes.update(manifest)
    return sum(sizes.values())


def retain(history: list[Snapshot], current: Mapping[str, int], *, keep: int, quota: int) -> list[Snapshot]:
    """The newest ``keep`` snapshots of ``history`` (oldest first) that fit ``quota`` bytes with the ``current``
    manifest's blobs, each blob counted once; older ones are dropped first."""
    kept = history[-keep:] if keep > 0 else []
    while kept and distinct_bytes([current, *(s.blob_sizes for s in kept)]) > quota:
        kept = kept[1:]
    return kept


def changed_names(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """Names whose blob differs between two manifests (set, changed or deleted), sorted."""
    return sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
