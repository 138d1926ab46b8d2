"""Deferred values: names a restore bound to stored blobs that are loaded when a cell first uses them.

Standard library only (runs in the sandbox worker). A restore sends big values as ``defer``
requests (docs/protocol.md, "Deferred values"): the context's tracker counts them as saved and
unchanged, and they are not in the namespace until something uses them. Two ways lead to a load:

- before a cell runs, its code is scanned: a name it deletes (``del x``) or a string constant
  equal to a pending name (``globals()["x"]``, ``FINAL_VAR("x")``) is loaded first, and a cell
  that names ``globals``, ``vars``, ``dir``, ``locals`` or ``__builtins__`` loads them all;
- while names are pending, the namespace's ``__builtins__`` is a copy of the builtins whose
  ``__missing__`` loads a pending name: ``LOAD_NAME`` and ``LOAD_GLOBAL`` fall back to the
  builtins when the (exact) globals dict misses, so the cell, and every function defined before,
  finds the value where it always was.

Loading asks the controller for the blob by a host call of the reserved name ``BLOB_CALL``,
unpickles it with the context's module as dill's ``__main__`` while the controller checks the blob
against its digest, and binds it once the controller confirms (``BLOB_CHECK_CALL``). A value the
controller refuses or that does not unpickle raises ``DeferredValueLost`` (a NameError) in the cell
and leaves the checkpoint: the next delta reports it deleted. A call that fails on the way (no cell
runs, the controller is gone) or that the controller cannot serve now (``BLOB_UNAVAILABLE``: its host
is short of descriptors or memory, or the value was asked for too often since the restore) raises
``DeferredValueUnavailable`` and, like an interrupt while loading, leaves the value pending.
"""

from __future__ import annotations

import builtins
import contextlib
import sys
import threading
import types
from typing import Any, Callable, Iterator, List, NoReturn, Set

from . import blob_format, checkpoint, checkpoint_names, hostcall, protocol

_LOAD_ALL = frozenset(("globals", "vars", "dir", "locals", "__builtins__"))
_DELETES = frozenset(("DELETE_NAME", "DELETE_GLOBAL"))


class DeferredValueLost(NameError):
    """A value of the restored checkpoint could not be loaded on first use (its blob is damaged or gone)."""


class DeferredValueUnavailable(NameError):
    """A value of the restored checkpoint cannot be loaded now (no cell runs, the controller is not connected);
    it stays in the session and loads at a later use."""


class Blobs(object):
    """How the worker reaches the controller for deferred values (host calls), and every context's ``Deferred``."""

    __slots__ = ("check", "everywhere", "fetch")

    def __init__(
        self,
        fetch: Callable[[str, str], Any],
        check: Callable[[str, str], None],
        everywhere: Callable[[], List["Deferred"]],
    ) -> None:
        self.fetch = fetch  # (checkpoint key, digest) -> the blob's bytes
        self.check = check  # (checkpoint key, digest): raises unless the blob handed out matched its digest
        self.everywhere = everywhere  # the deferred values of every context of the worker


class _LazyBuiltins(dict):  # type: ignore[type-arg]
    """The builtins (a copy, synced before each cell) whose misses load a pending name of the context."""

    def __init__(self, owner: "Deferred") -> None:
        super().__init__()
        self.owner = owner
        self.sync()

    def sync(self) -> None:
        """Take the builtins as they are now (the worker swaps ``input`` for each cell)."""
        self.clear()
        self.update(builtins.__dict__)

    def __missing__(self, name: str) -> Any:
        real = builtins.__dict__
        if name in real:  # added to the builtins after the last sync
            return real[name]
        return self.owner.load(name)


class Deferred(object):
    """The pending values of one context and how they are loaded."""

    def __init__(self, context: Any, blobs: Blobs) -> None:
        """``context``: the worker's context (its module, tracker and id); ``blobs``: asks the controller."""
        self._context = context
        self._blobs = blobs
        self._lock = threading.RLock()  # a cell's threads may miss the same name at once
        self._builtins: Any = None  # made when the first value is deferred; kept by functions made meanwhile

    @property
    def pending(self) -> Any:
        return self._context.tracker.pending

    def defer(self, name: str, digest: str, size: int) -> None:
        """Bind ``name`` to its stored blob, loaded on first use."""
        namespace = self._context.module.__dict__
        namespace.pop(name, None)
        self._context.tracker.defer(name, digest, size)
        if self._builtins is None:
            self._builtins = _LazyBuiltins(self)
        namespace["__builtins__"] = self._builtins

    def before_cell(self, code: str) -> None:
        """Sync the builtins the namespace's functions see, and load what ``code`` needs that a miss cannot."""
        if self._builtins is not None:
            self._builtins.sync()
        if not self.pending:
            return
        try:
            compiled = compile(code, "<cell>", "exec", dont_inherit=True)
        except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError):
            return  # the cell reports it
        import dis  # here: only a session with pending values needs it (0.2 MB of every worker otherwise)

        needed: Set[str] = set()
        for unit in _code_objects(compiled):
            if _LOAD_ALL.intersection(unit.co_names):
                needed.update(self.pending)
                break
            needed.update(const for const in unit.co_consts if isinstance(const, str) and const in self.pending)
            needed.update(str(op.argval) for op in dis.get_instructions(unit) if op.opname in _DELETES)
        for name in sorted(needed):
            if name in self.pending:
                self.load(name)

    def load(self, name: str) -> Any:
        """The value of pending ``name``, loaded now; KeyError when it is not pending (a NameError for the cell).

        Raises:
            DeferredValueLost: it could not be loaded (it is pending no more).
            DeferredValueUnavailable: the controller cannot be asked now (it stays pending).
            KeyboardInterrupt: the cell was interrupted meanwhile (it stays pending).
        """
        with self._lock:
            namespace = self._context.module.__dict__
            if name in namespace:
                return namespace[name]
            tracker = self._context.tracker
            entry = tracker.pending.get(name)
            if entry is None:
                raise KeyError(name)
            digest = entry[0]
            prefix = (
                ""
                if self._context.context_id is None
                else self._context.context_id + checkpoint_names.CONTEXT_SEPARATOR
            )
            key = prefix + name
            try:
                value = self._unpickle(self._blobs.fetch(key, digest), digest)
                self._blobs.check(key, digest)
            except KeyboardInterrupt:
                raise
            except hostcall.HostCallError as exc:
                if not str(exc).startswith(protocol.BLOB_REFUSED):
                    raise DeferredValueUnavailable(
                        "name %r of the restored checkpoint cannot be loaded now (%s); it is still in the session"
                        % (name, checkpoint.describe(exc))
                    ) from None
                self._lose(name, exc)
            except BaseException as exc:  # anything the unpickling raised
                self._lose(name, exc)
            if checkpoint.deeply_immutable(value):  # one object for every name of the blob, as a restore gives
                for deferred in self._blobs.everywhere():
                    deferred.bind_loaded(digest, value)
            else:
                self.bind(name, value)
            return value

    def _lose(self, name: str, exc: BaseException) -> NoReturn:
        """Pending ``name`` cannot be loaded ever: it leaves the checkpoint (the next delta says deleted)."""
        self._context.tracker.forget_pending(name)
        reason = checkpoint.describe(exc)
        if sys.__stderr__ is not None:  # the container's log (sys.stderr is the cell's output now)
            print("orchestrator worker: deferred value %r lost: %s" % (name, reason), file=sys.__stderr__)
        raise DeferredValueLost(
            "name %r of the restored checkpoint could not be loaded on first use (%s); it is no longer "
            "in the session" % (name, reason)
        ) from None

    def bind_loaded(self, digest: str, value: Any) -> None:
        """Bind every pending name of this context saved in blob ``digest`` to ``value`` (immutable), just loaded."""
        for name in [name for name, entry in self.pending.items() if entry[0] == digest]:
            self.bind(name, value)

    def bind(self, name: str, value: Any) -> None:
        """Pending ``name`` is loaded: in the namespace and saved in its blob, as a restored value is."""
        namespace = self._context.module.__dict__
        tracker = self._context.tracker
        digest, size = tracker.pending[name]
        namespace[name] = value
        tracker.record(name, value, digest, size)
        if not tracker.pending and namespace.get("__builtins__") is self._builtins:
            namespace["__builtins__"] = builtins.__dict__

    def _unpickle(self, body: Any, digest: str) -> Any:
        try:
            if blob_format.is_host_blob(digest) and not blob_format.host_blob_framed(body):
                raise ValueError("the host-made blob is not whole")
            return checkpoint.loads(body, self._context.module)
        finally:
            close = getattr(body, "close", None)  # a blob that came as a file: unmapped now
            if close is not None:
                with contextlib.suppress(BufferError):  # a view outlives the load (a traceback): unmapped when freed
                    close()

    def clear(self) -> None:
        """The namespace was emptied (reset, restore): nothing is pending any more."""
        self._context.tracker.pending.clear()


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    """``code`` and every code object nested in it (functions, classes, comprehensions)."""
    stack = [code]
    while stack:
        unit = stack.pop()
        yield unit
        stack.extend(const for const in unit.co_consts if isinstance(const, types.CodeType))
