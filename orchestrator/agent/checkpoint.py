"""Incremental dill checkpoints of a namespace: pickle only what changed, name what cannot be saved.

Runs in the sandbox worker (standard library plus dill). Each saved variable is one blob, sent only
when its digest changed. Pickling is what every call pays for, so it is avoided where it can be: a
value that is the very object saved last time and deeply immutable (a str, bytes, number, tuple of
those, a module) is skipped, so a 100 MB context costs nothing after its first checkpoint; a new name
for such an object takes its blob; a str or bytes the controller made (``set_value``: a host-made
blob, docs/protocol.md) is adopted without pickling; and plain data (builtin containers of builtin
scalars) goes through the standard library's C pickler, about ten times faster than dill, because a
mutable value is pickled again at every checkpoint to learn whether it changed.

A value that cannot be saved is named unsaved and tried again, after the others, at every later
checkpoint: one that does not pickle, one whose blob would take the checkpoint past its quota, and,
when the checkpoint runs out of time (the pickler raises ``KeyboardInterrupt``), the value being
pickled and every later one that needs pickling. A class of the session bound under its own name
pickles by value and everything else refers to it by name, so restored instances are instances of
the session's class (one restored before its class fails and is retried). While a value is pickled
or unpickled, ``sys.modules["__main__"]`` is the active context's module (dill's ``_main``), so a
function of a context refers to that context's globals both ways.

Blobs are kept as the parts the pickler wrote (a big payload is referenced, not copied) and restored
straight from the receive buffer, so neither direction holds a value's bytes more than once.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import re
import sys
import types
import warnings
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Set, Tuple, Union

from . import blob_format, checkpoint_names

_SCALARS = (str, bytes, int, float, complex, bool, type(None), range, type(Ellipsis))
_IMMUTABLE_SCAN_LIMIT = 10_000
_KEEP_AT_LEAST = 1 << 16  # a bytes payload this big is kept by reference instead of copied into a chunk
_CHUNK_BYTES = 1 << 20
_MAX_REASON = 200

TIMEOUT_REASON = "checkpointing took longer than the checkpoint timeout"

Part = Union[bytes, bytearray]


def quota_reason(quota: int) -> str:
    return "checkpoint quota of %d bytes reached" % quota


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception from user code, clipped; never raises (``__str__`` is user code too)."""
    try:
        message = str(exc)
    except BaseException:
        message = "<unprintable message>"
    return ("%s: %s" % (type(exc).__name__, message))[:_MAX_REASON]


def names_reason() -> str:
    return "the checkpoint holds at most %d names and %d bytes of names" % (
        checkpoint_names.MAX_CHECKPOINT_NAMES,
        checkpoint_names.MAX_CHECKPOINT_NAME_BYTES,
    )


def shown_name(name: Any) -> str:
    """How ``unsaved`` lists a namespace key that cannot be a checkpoint name: clipped, a non-str as its repr."""
    text = name if isinstance(name, str) else repr(name)
    return text if len(text) <= checkpoint_names.MAX_NAME_CHARS else text[: checkpoint_names.MAX_NAME_CHARS] + "..."


def listed(unsaved: Dict[str, str]) -> Dict[str, str]:
    """``unsaved`` as a delta lists it: at most MAX_UNSAVED_NAMES entries, the last one counting those left out."""
    if len(unsaved) <= checkpoint_names.MAX_UNSAVED_NAMES:
        return unsaved
    kept = dict(list(unsaved.items())[: checkpoint_names.MAX_UNSAVED_NAMES - 1])
    more = len(unsaved) - len(kept)
    kept["+%d more" % more] = "%d more names were not saved; only the first %d are listed" % (more, len(kept))
    return kept


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


class Blob:
    """One pickled value: the parts the pickler wrote, back to back, with their size and digest."""

    __slots__ = ("digest", "parts", "size")

    def __init__(self, parts: List[Part], size: int, blob_digest: str) -> None:
        self.parts = parts
        self.size = size
        self.digest = blob_digest

    def tobytes(self) -> bytes:
        return b"".join(self.parts)


class _BlobWriter:
    """The file dill pickles into: small writes are gathered in chunks, big ``bytes`` payloads kept as they are.

    The pickler hands a big str's UTF-8 encoding or a bytes value to ``write`` in one call, so
    keeping that object (immutable) instead of copying it means a value is never held twice
    by its blob. Everything else (frames from the pickler's own buffer, bytearrays) is copied.
    """

    def __init__(self) -> None:
        self.parts: List[Part] = []
        self.chunk = bytearray()
        self.size = 0
        self.hash = blob_format.blob_hash()

    def write(self, data: Any) -> int:
        size = len(data)
        self.hash.update(data)
        self.size += size
        if type(data) is bytes and size >= _KEEP_AT_LEAST:
            self._flush()
            self.parts.append(data)
        else:
            self.chunk += data
            if len(self.chunk) >= _CHUNK_BYTES:
                self._flush()
        return size

    def _flush(self) -> None:
        if self.chunk:
            self.parts.append(self.chunk)
            self.chunk = bytearray()

    def finish(self) -> Blob:
        self._flush()
        return Blob(self.parts, self.size, self.hash.hexdigest())


def _bound_in_session(cls: type) -> bool:
    """True when a class of the session is reachable by its name in the session namespace."""
    qualname = getattr(cls, "__qualname__", None)
    if getattr(cls, "__module__", None) != "__main__" or not isinstance(qualname, str) or "<" in qualname:
        return False
    found: Any = sys.modules.get("__main__")
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return found is cls


_dill: Any = None  # the module, imported on first use (see ``dill_module``)
_SessionPickler: Any = None


def dill_module() -> Any:
    """dill, imported on first use.

    Importing dill costs more CPU than starting the interpreter and 3.6 MB of the worker's memory,
    and a sandbox whose values are plain data (``dump_plain``) or that runs cells without
    checkpoints (``orchestrator eval``) never needs it. The worker calls this while no interrupt
    can land in the import (a KeyboardInterrupt in the middle of it leaves dill half imported):
    before a request that may unpickle (a load, or a cell while deferred values are pending) and
    in a checkpoint, just before the first value that is not plain data is pickled. Pickler and
    unpickler take the session module from ``sys.modules["__main__"]`` each time, so when dill
    is imported does not matter.
    """
    global _dill, _SessionPickler
    if _dill is None:
        import dill

        _SessionPickler = _session_pickler_class(dill)
        _dill = dill
    return _dill


def dill_imported() -> bool:
    """Whether dill was imported already (``dill_module``)."""
    return _dill is not None


def dill_version() -> str:
    """dill's version, read from its ``__info__`` without importing it (or by importing it when that fails)."""
    try:
        spec = importlib.util.find_spec("dill")
        if spec is not None and spec.origin:
            with open(os.path.join(os.path.dirname(spec.origin), "__info__.py"), encoding="utf-8") as handle:
                found = re.search(r"^__version__ = ['\"]([^'\"]+)['\"]", handle.read(), re.MULTILINE)
            if found:
                return found.group(1)
    except (OSError, ImportError, ValueError):
        pass
    return str(dill_module().__version__)


def _session_pickler_class(dill: Any) -> Any:
    class SessionPickler(dill.Pickler):  # type: ignore[misc]
        """dill's pickler, except that a session class bound under its own name is saved as a reference to it.

        dill saves every ``__main__`` class by value, inside each instance. Saved by reference,
        an instance restored later is an instance of the class the session holds, and one
        restored before its class fails (the controller loads it again after the others).
        ``by_value`` is the class being saved under its own name: that one is saved whole.
        """

        def __init__(self, file: Any, byref: bool, by_value: Any) -> None:
            super().__init__(file, dill.settings["protocol"], byref=byref, recurse=False)
            self._by_value = by_value
            self._main = sys.modules["__main__"]  # the active context's module (see the top)

        def save(self, obj: Any, save_persistent_id: bool = True) -> None:
            if isinstance(obj, type) and obj is not self._by_value and _bound_in_session(obj):
                memoized = self.memo.get(id(obj))
                if memoized is not None:
                    self.write(self.get(memoized[0]))
                else:
                    self.save_global(obj, obj.__qualname__)
                return
            super().save(obj, save_persistent_id)

    return SessionPickler


class _NotPlain(Exception):
    """The value holds something other than plain data: dill must pickle it."""


_PLAIN_REDUCED = (complex, bytearray)  # builtin types the C pickler reduces (instead of writing them itself)


class _PlainPickler(pickle.Pickler):
    """The C pickler for plain data only: it gives up at the first object that is not.

    ``reducer_override`` runs for every object the C pickler does not write by itself
    (those are None, bools, ints, floats, str, bytes, and exact dicts, lists, tuples, sets
    and frozensets), so anything else (a subclass such as defaultdict, a function, an
    instance) stops it and the value goes to dill, which saves what the C pickler only
    refers to by name.
    """

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) in _PLAIN_REDUCED or (type(obj) is type and obj.__module__ == "builtins"):
            return NotImplemented
        raise _NotPlain


def dump_plain(value: Any) -> Optional[Blob]:
    """``value`` pickled by the standard library's C pickler when it is plain data (no dill needed), else None."""
    writer = _BlobWriter()
    try:
        _PlainPickler(writer, pickle.DEFAULT_PROTOCOL).dump(value)  # dill's default protocol too
    except _NotPlain:
        return None
    return writer.finish()


def _dump(value: Any, byref: bool, by_value: Any) -> Blob:
    writer = _BlobWriter()
    dill_module()
    _SessionPickler(writer, byref, by_value).dump(value)
    return writer.finish()


def dumps(name: str, value: Any) -> Blob:
    """Pickle one variable; raise on anything dill cannot save or can only save by a broken reference."""
    blob = dump_plain(value)
    if blob is not None:
        return blob
    own_class = isinstance(value, type) and getattr(value, "__qualname__", None) == name and _bound_in_session(value)
    by_value = value if own_class else None
    dill = dill_module()
    with warnings.catch_warnings():
        warnings.simplefilter("error", dill.PicklingWarning)
        try:
            return _dump(value, not own_class, by_value)
        except dill.PicklingWarning:
            # A class that is no longer reachable by name: save it inside the value instead.
            return _dump(value, False, by_value)


class _BufferReader:
    """A read-only file over a buffer whose reads are memoryview slices: the unpickler copies nothing.

    The C unpickler accepts any buffer from ``read`` and ``peek`` and unpickles straight out of
    it, so a 150 MB str is built from the receive buffer with no bytes object in between.
    """

    def __init__(self, data: Union[bytes, bytearray, memoryview]) -> None:
        self.view = memoryview(data).cast("B")
        self.pos = 0
        self.end = len(self.view)

    def read(self, size: int = -1) -> memoryview:
        start = self.pos
        stop = self.end if size is None or size < 0 else min(self.end, start + size)
        self.pos = stop
        return self.view[start:stop]

    def peek(self, size: int = 1) -> memoryview:
        return self.view[self.pos : min(self.end, self.pos + max(size, 1))]

    def readinto(self, target: Any) -> int:
        out = memoryview(target).cast("B")
        count = min(len(out), self.end - self.pos)
        out[:count] = self.view[self.pos : self.pos + count]
        self.pos += count
        return count

    def readline(self, size: int = -1) -> bytes:
        # Only the text opcodes of old pickle protocols read lines; they are short.
        start = self.pos
        while self.pos < self.end:
            step = bytes(self.view[self.pos : min(self.end, self.pos + 4096)])
            newline = step.find(b"\n")
            if newline >= 0:
                self.pos += newline + 1
                break
            self.pos += len(step)
        return bytes(self.view[start : self.pos])


def loads(data: Union[bytes, bytearray, memoryview], main: Optional[types.ModuleType] = None) -> Any:
    """Unpickle one blob straight from its buffer (no copy of the buffer), as ``dill.loads`` would.

    ``main``: the session module its functions belong to (default: the active context's).
    """
    unpickler = dill_module().Unpickler(_BufferReader(data))
    unpickler._main = sys.modules["__main__"] if main is None else main
    return unpickler.load()


class _Saved:
    __slots__ = ("digest", "frozen", "size", "value")

    def __init__(self, value: Any, blob_digest: str, size: int) -> None:
        self.value = value
        self.digest = blob_digest
        self.size = size
        self.frozen = deeply_immutable(value)


DumpsFunction = Callable[[str, Any], Blob]
_NOT_LOADED = object()  # the value a deferred name is saved with until it is loaded


class HeldBlobs:
    """The distinct blobs a session's checkpoint holds: shared by the trackers of its contexts (one quota)."""

    __slots__ = ("bytes", "files_bytes", "name_bytes", "names", "refs", "sizes")

    def __init__(self) -> None:
        self.bytes = 0
        self.files_bytes = 0  # the workspace's distinct file blobs (the worker sets it): the quota counts them too
        self.refs: Dict[str, int] = {}  # digest -> how many saved names hold it
        self.sizes: Dict[str, int] = {}
        self.names = 0  # saved names (checkpoint keys) of every context: checkpoint_names.MAX_CHECKPOINT_NAMES
        self.name_bytes = 0  # their keys' UTF-8 bytes: checkpoint_names.MAX_CHECKPOINT_NAME_BYTES


class _Delta(object):
    """One checkpoint in the making: the protocol's ``checkpoint`` object so far, and its body's blobs."""

    __slots__ = ("blob_index", "changed", "deleted", "held_before", "out_of_time", "parts", "pickle",
                 "pickled_now", "sent", "unsaved")  # fmt: skip

    def __init__(self, pickle: DumpsFunction, held_before: Set[str]) -> None:
        self.pickle = pickle
        self.held_before = held_before  # the blobs the checkpoint held when it began: the controller has them
        self.changed: Dict[str, str] = {}
        self.unsaved: Dict[str, str] = {}
        self.deleted: List[str] = []
        self.blob_index: List[dict] = []
        self.parts: List[Part] = []
        self.sent: Set[str] = set()
        self.pickled_now: Dict[int, Blob] = {}  # id(value) -> its blob, for a value several names hold
        self.out_of_time = False

    def send(self, blob: Blob) -> None:
        """Put ``blob`` in the body, unless the controller has it already or it is in the body already."""
        if blob.digest not in self.held_before and blob.digest not in self.sent:
            self.sent.add(blob.digest)
            self.blob_index.append({"digest": blob.digest, "size": blob.size})
            self.parts.extend(blob.parts)


class Tracker:
    """Remembers what the last checkpoint holds, to compute the next one as a delta.

    ``held_bytes`` is the size of the distinct blobs the checkpoint references; with a
    ``quota`` (bytes, 0 = none) a delta never takes it over the quota. Trackers of one
    session's contexts share ``held`` (the blobs of the whole checkpoint), so the quota is the
    session's, and a blob another context holds is not sent again.
    """

    def __init__(self, quota: int = 0, held: Optional[HeldBlobs] = None, prefix: str = "") -> None:
        self.generation = 0
        self.quota = quota
        self.prefix = prefix  # what makes a name of this tracker's context a checkpoint key ("" or "<context>/")
        self.held = HeldBlobs() if held is None else held
        self._saved: Dict[str, _Saved] = {}
        self._by_object: Dict[int, _Saved] = {}  # id(value) -> a saved entry of that deeply immutable value
        self._adopted: Dict[str, str] = {}  # names of host-made blobs the next delta reports as changed
        self._refs = self.held.refs
        self._sizes = self.held.sizes
        self._unsaved_last: Set[str] = set()
        self.excluded: FrozenSet[str] = frozenset()  # names the session's scaffold owns: never saved
        self.pending: Dict[str, Tuple[str, int]] = {}  # deferred names not loaded yet: name -> (digest, size)

    @property
    def held_bytes(self) -> int:
        return self.held.bytes

    def _key_bytes(self, name: str) -> int:
        return checkpoint_names.key_bytes(self.prefix + name)

    def _room_for(self, name: str) -> bool:
        """True when one more name fits the manifest's bounds (counted across contexts)."""
        held = self.held
        return (
            held.names < checkpoint_names.MAX_CHECKPOINT_NAMES
            and held.name_bytes + self._key_bytes(name) <= checkpoint_names.MAX_CHECKPOINT_NAME_BYTES
        )

    def _hold(self, blob_digest: str, size: int) -> None:
        count = self._refs.get(blob_digest, 0)
        if count == 0:
            self._sizes[blob_digest] = size
            self.held.bytes += size
        self._refs[blob_digest] = count + 1

    def _release(self, blob_digest: str) -> None:
        count = self._refs[blob_digest] - 1
        if count:
            self._refs[blob_digest] = count
        else:
            del self._refs[blob_digest]
            self.held.bytes -= self._sizes.pop(blob_digest)

    def _drop(self, name: str) -> bool:
        prev = self._saved.pop(name, None)
        if prev is None:
            return False
        self.held.names -= 1
        self.held.name_bytes -= self._key_bytes(name)
        if self._by_object.get(id(prev.value)) is prev:
            del self._by_object[id(prev.value)]
        self._release(prev.digest)
        return True

    def _index(self, saved: _Saved) -> None:
        if saved.frozen:
            self._by_object[id(saved.value)] = saved

    def _rebind(self, saved: _Saved, value: Any) -> None:
        """The name now holds another object that pickles to the same blob."""
        if self._by_object.get(id(saved.value)) is saved:
            del self._by_object[id(saved.value)]
        saved.value = value
        saved.frozen = deeply_immutable(value)
        self._index(saved)

    def _held_blob_of(self, value: Any) -> Optional[Blob]:
        """The blob another name holds for this very object, deeply immutable: it pickles the same, so it is not
        pickled again (and a host-made blob, which the agent has no bytes of, is shared, not copied)."""
        saved = self._by_object.get(id(value))
        if saved is None or saved.value is not value or not saved.frozen:
            return None
        return Blob([], saved.size, saved.digest)

    def _held_after(self, prev: Optional[_Saved], blob_digest: str, size: int) -> int:
        """The checkpoint's size if one name switched from ``prev`` to this blob (the workspace's files included)."""
        total = self.held.bytes + self.held.files_bytes
        if blob_digest not in self._refs:
            total += size
        if prev is not None and self._refs.get(prev.digest) == 1:
            total -= self._sizes[prev.digest]
        return total

    def record(self, name: str, value: Any, blob_digest: str, size: int) -> None:
        """Count ``value`` as saved under ``name`` with this blob (a value just restored from it)."""
        self._drop(name)
        self.pending.pop(name, None)
        saved = self._saved[name] = _Saved(value, blob_digest, size)
        self.held.names += 1
        self.held.name_bytes += self._key_bytes(name)
        self._index(saved)
        self._hold(blob_digest, size)

    def defer(self, name: str, blob_digest: str, size: int) -> None:
        """Count ``name`` as saved in this blob though its value is not loaded yet (a deferred value).

        Until it is loaded (``record``) or given up (``forget_pending``) a checkpoint treats it as
        present and unchanged, and the quota counts its blob.
        """
        self.record(name, _NOT_LOADED, blob_digest, size)
        self.pending[name] = (blob_digest, size)

    def forget_pending(self, name: str) -> None:
        """A deferred value could not be loaded: the next delta reports ``name`` deleted."""
        self.pending.pop(name, None)

    def adopt(self, names: List[str], value: Any, blob_id: str, size: int) -> None:
        """Count ``value`` as saved under ``names`` in a blob the controller made and stores (``set_value``).

        Nothing is pickled: the next delta reports these names as changed, naming ``blob_id``,
        with no blob in its body. The controller checked the quota before it sent the value.
        """
        for name in names:
            self.record(name, value, blob_id, size)
            self._adopted[name] = blob_id

    def delta(self, namespace: Dict[str, Any], dumps: Optional[DumpsFunction] = None) -> Tuple[dict, List[Part]]:
        """Return (description, body parts) of what changed since the last checkpoint, and advance to it.

        The description is the protocol's ``checkpoint`` object; the parts, back to back, are
        the new blobs in the order of ``description["blobs"]``: each blob the checkpoint did not
        hold yet, once, even when several names hold it (``context`` and ``context_0``).
        ``dumps`` (default: this module's) may raise KeyboardInterrupt: time is up.
        """
        adopted, self._adopted = self._adopted, {}
        run = _Delta(dumps if dumps is not None else globals()["dumps"], set(self._refs))
        saved = self._saved
        for name, value in self._to_check(namespace, run):
            prev = saved.get(name)  # a saved name passed the checks of _check when it was saved
            if prev is not None and prev.value is value and prev.frozen:  # unchanged, the common case: no call
                if name in adopted:
                    run.changed[name] = prev.digest
                continue
            self._check(name, value, prev, run)
        self._unsaved_last = set(run.unsaved)
        if run.changed or run.deleted:
            self.generation += 1
        description = {
            "generation": self.generation,
            "blobs": run.blob_index,
            "vars": run.changed,
            "deleted": run.deleted,
            "unsaved": listed(run.unsaved),
        }
        return description, run.parts

    def _to_check(self, namespace: Dict[str, Any], run: "_Delta") -> List[Tuple[str, Any]]:
        """The namespace's names to checkpoint, those that failed last time last (so one that keeps timing out
        cannot starve the values after it). The saved names that are gone are dropped first, as deleted: they free
        quota for what follows."""
        excluded = self.excluded
        items = [
            (name, value)
            for name, value in list(namespace.items())
            if not checkpoint_names.is_internal(name) and name not in excluded
        ]
        present = {name for name, _ in items}
        for name in [n for n in self.pending if n in present]:  # bound again meanwhile: its new value counts
            del self.pending[name]
        present.update(self.pending)
        for name in [n for n in self._saved if n not in present]:
            self._drop(name)
            run.deleted.append(name)
        items.sort(key=lambda item: item[0] in self._unsaved_last)
        return items

    def _check(self, name: str, value: Any, prev: Optional[_Saved], run: "_Delta") -> None:
        """Save ``name`` (saved before as ``prev``, if it was) in this checkpoint when its new value fits; else say in
        ``run.unsaved`` why not."""
        if prev is None:
            problem = checkpoint_names.name_problem(name)
            if problem is not None:  # the store could not read it back (docs/trust.md): named, never saved
                run.unsaved[shown_name(name)] = problem
                return
            if not self._room_for(name):
                self._unsave(run, name, names_reason())
                return
        blob = run.pickled_now.get(id(value)) or self._held_blob_of(value)
        if blob is None:
            blob = self._pickled(name, value, run)
            if blob is None:
                return
        if prev is not None and prev.digest == blob.digest:
            self._rebind(prev, value)
            return
        if self.quota and self._held_after(prev, blob.digest, blob.size) > self.quota:
            self._unsave(run, name, quota_reason(self.quota))
            return
        run.send(blob)
        self.record(name, value, blob.digest, blob.size)
        run.changed[name] = blob.digest

    def _pickled(self, name: str, value: Any, run: "_Delta") -> Optional[Blob]:
        """``value``'s new blob; None when it cannot be saved now (out of time, or pickling it raised): unsaved."""
        if run.out_of_time:
            self._unsave(run, name, TIMEOUT_REASON)
            return None
        try:
            blob = run.pickle(name, value)
        except KeyboardInterrupt:
            run.out_of_time = True
            self._unsave(run, name, TIMEOUT_REASON)
            return None
        except BaseException as exc:  # anything a __reduce__ raises, even SystemExit: cannot be saved
            self._unsave(run, name, describe(exc))
            return None
        if blob.digest in run.held_before:
            blob = Blob([], blob.size, blob.digest)  # the controller has these bytes: free them now
        run.pickled_now[id(value)] = blob
        return blob

    def _unsave(self, run: "_Delta", name: str, reason: str) -> None:
        run.unsaved[name] = reason
        if self._drop(name):
            run.deleted.append(name)
