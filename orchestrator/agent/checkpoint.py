"""Incremental dill checkpoints of a namespace: pickle only what changed, name what cannot be saved.

Runs in the sandbox worker (standard library plus dill). Each saved variable is one blob.
A value that is the very object saved last time and is deeply immutable (a str, bytes,
number, or tuple of those; a module) is skipped without pickling, so a 100 MB context
costs nothing after its first checkpoint. Other values are pickled and sent only when
their digest changed. Classes bound under their own name pickle by value, everything
else refers to them by name, so instances restored later still match their class.
"""

from __future__ import annotations

import hashlib
import types
import warnings
from typing import Any, Dict, List, Tuple

import dill

_SCALARS = (str, bytes, int, float, complex, bool, type(None), range, type(Ellipsis))
_IMMUTABLE_SCAN_LIMIT = 10_000


def is_internal(name: str) -> bool:
    """Names the checkpoint leaves out: dunders such as __builtins__ belong to the runtime."""
    return name.startswith("__") and name.endswith("__")


def _deeply_immutable(value: Any, budget: List[int]) -> bool:
    budget[0] -= 1
    if budget[0] < 0:
        return False
    if type(value) in _SCALARS or isinstance(value, types.ModuleType):
        return True
    if type(value) in (tuple, frozenset):
        return all(_deeply_immutable(item, budget) for item in value)
    return False


def deeply_immutable(value: Any) -> bool:
    """True when the same object can never change, so identity proves it is unchanged."""
    return _deeply_immutable(value, [_IMMUTABLE_SCAN_LIMIT])


def dumps(name: str, value: Any) -> bytes:
    """Pickle one variable; raise on anything dill cannot save or can only save by a broken reference."""
    by_value = isinstance(value, type) and value.__module__ == "__main__" and value.__qualname__ == name
    with warnings.catch_warnings():
        warnings.simplefilter("error", dill.PicklingWarning)
        try:
            return dill.dumps(value, byref=not by_value, recurse=False)
        except dill.PicklingWarning:
            # A class that is no longer reachable by name: save it inside the value instead.
            return dill.dumps(value, byref=False, recurse=False)


def digest(blob: bytes) -> str:
    """Content digest naming a blob, on both sides of the channel."""
    return hashlib.blake2b(blob, digest_size=16).hexdigest()


class _Saved:
    __slots__ = ("digest", "frozen", "value")

    def __init__(self, value: Any, blob_digest: str) -> None:
        self.value = value
        self.digest = blob_digest
        self.frozen = deeply_immutable(value)


class Tracker:
    """Remembers what the last checkpoint holds, to compute the next one as a delta."""

    def __init__(self) -> None:
        self.generation = 0
        self._saved: Dict[str, _Saved] = {}
        self._unsaveable: Dict[str, Tuple[Any, str]] = {}

    def delta(self, namespace: Dict[str, Any]) -> Tuple[dict, List[bytes]]:
        """Return (description, blobs) of what changed since the last checkpoint, and advance to it.

        The description maps each changed name to its blob digest; ``blobs`` lists each new
        blob once, even when several names hold the same object (``context`` and ``context_0``).
        """
        changed: Dict[str, str] = {}
        blob_index: List[dict] = []
        blobs: List[bytes] = []
        pickled_now: Dict[int, str] = {}
        unsaved: Dict[str, str] = {}
        for name, value in list(namespace.items()):
            if is_internal(name):
                continue
            prev = self._saved.get(name)
            if prev is not None and prev.value is value and prev.frozen:
                continue
            known_bad = self._unsaveable.get(name)
            if known_bad is not None and known_bad[0] is value:
                unsaved[name] = known_bad[1]
                continue
            blob_digest = pickled_now.get(id(value))
            if blob_digest is None:
                try:
                    blob = dumps(name, value)
                except Exception as exc:  # anything dill raises means: cannot be saved
                    reason = "%s: %s" % (type(exc).__name__, str(exc)[:200])
                    self._unsaveable[name] = (value, reason)
                    unsaved[name] = reason
                    continue
                blob_digest = digest(blob)
                pickled_now[id(value)] = blob_digest
                if prev is None or prev.digest != blob_digest:
                    blob_index.append({"digest": blob_digest, "size": len(blob)})
                    blobs.append(blob)
            self._unsaveable.pop(name, None)
            if prev is not None and prev.digest == blob_digest:
                prev.value = value
                continue
            self._saved[name] = _Saved(value, blob_digest)
            changed[name] = blob_digest
        deleted = [name for name in self._saved if name not in namespace or name in unsaved]
        for name in deleted:
            del self._saved[name]
        for name in [n for n in self._unsaveable if n not in namespace]:
            del self._unsaveable[name]
        if changed or deleted:
            self.generation += 1
        description = {
            "generation": self.generation,
            "blobs": blob_index,
            "vars": changed,
            "deleted": deleted,
            "unsaved": unsaved,
        }
        return description, blobs

    def restore(
        self, namespace: Dict[str, Any], generation: int, variables: Dict[str, str], blobs: Dict[str, Any]
    ) -> Dict[str, str]:
        """Load each variable from its blob, retrying those that refer to names not loaded yet.

        ``variables`` maps names to digests and ``blobs`` digests to bytes. Returns the names
        that could not be loaded, with the reason.
        """
        pending = list(variables.items())
        failed: Dict[str, str] = {}
        while pending:
            retry = []
            for name, blob_digest in pending:
                try:
                    value = dill.loads(bytes(blobs[blob_digest]))
                except Exception as exc:
                    failed[name] = "%s: %s" % (type(exc).__name__, str(exc)[:200])
                    retry.append((name, blob_digest))
                    continue
                failed.pop(name, None)
                namespace[name] = value
                self._saved[name] = _Saved(value, blob_digest)
            if len(retry) == len(pending):
                break
            pending = retry
        self.generation = generation
        return failed
