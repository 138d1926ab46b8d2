"""Fresh sandboxes on demand: a pool of pre-started ones, each handed out once, refilled in the background.

A sandbox takes a few hundred milliseconds to start (container, agent, handshake); a pool starts
them ahead so that start-up overlaps with the work of the sandboxes already handed out. The
pool never takes a sandbox back: whoever takes one ``discard``s it when done, and the pool
starts a new one in its place. ``orchestrator eval`` runs every submission in a sandbox from a
pool; sessions can start from one too.

With ``network_mode="none"`` the most expensive part of a container's start-up and removal is
its network namespace (measured here: half of the engine's work per container). ``NetworkSlots``
keeps a few loopback-only namespaces, each held open by a small container of its own, and lends
each to one sandbox at a time: a sandbox joins its slot's namespace (``network_of``) and the
slot is lent again only after that sandbox's container is removed, so no two sandboxes ever
share one at the same time, and nothing of one is left in it for the next (a socket lives
only as long as the processes that hold it). The sandbox still sees only ``lo`` and no route.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..agent import protocol
from ..backends.base import LABEL_PREFIX, STORE_ID, Backend, SandboxSpec
from ..config import Settings
from ..errors import ChannelLost, ConfigError, EngineError, OrchestratorError, TransportError
from ..metrics import NO_METRICS, Recorder
from ..runtime.sandbox import Sandbox
from ..state.controllers import controller_labels
from ..state.store import new_sandbox_id

logger = logging.getLogger(__name__)

_HOLDER_COMMAND = ("python3", "-S", "-c", "import signal; signal.pause()")
_HOLDER_LIMITS = {"memory": "32m", "pids": 4}


@dataclass(frozen=True)
class SandboxTemplate:
    """What a pool starts: sandboxes of ``image``, their containers named after ``scope`` and carrying ``labels``."""

    image: str
    scope: str
    labels: Mapping[str, str]


class NetworkSlots:
    """Loopback-only network namespaces lent to one sandbox at a time (see the module's docstring)."""

    def __init__(self, backend: Backend, settings: Settings, template: SandboxTemplate):
        self._backend = backend
        self._settings = settings.replace(limits=settings.limits.replace(**_HOLDER_LIMITS))
        self._image = template.image
        self._scope = template.scope
        self._labels = dict(template.labels)
        self._free: list[str] = []
        self._all: list[str] = []
        self._lock = threading.Lock()
        self._closed = False

    def lease(self) -> str:
        """The container id of a free slot (a new one is started when none is free).

        Raises:
            EngineError: the engine could not start a slot's container.
        """
        with self._lock:
            if self._closed:
                raise ConfigError("the network slots were closed")
            if self._free:
                return self._free.pop()
        spec = SandboxSpec(
            name=f"orch-{self._scope}-net-{new_sandbox_id()}",
            image=self._image,
            labels=self._labels,
            command=_HOLDER_COMMAND,
        )
        holder = self._backend.run_sandbox(spec, self._settings)
        with self._lock:
            closed = self._closed
            if not closed:
                self._all.append(holder)
        if closed:  # closed while it started: nobody else will remove it
            self._backend.remove(holder)
            raise ConfigError("the network slots were closed")
        return holder

    def give_back(self, holder: str) -> None:
        """The sandbox that used ``holder`` is removed (its container is gone): lend the slot again."""
        with self._lock:
            if holder in self._all and not self._closed:
                self._free.append(holder)

    def give_back_failed(self, holder: str) -> None:
        """A sandbox could not start in ``holder``'s slot: lend it again if its container runs, else drop it (a
        slot whose holder died would fail every sandbox lent it)."""
        try:
            state = self._backend.inspect(holder)
        except OrchestratorError:
            state = None
        if state is not None and state.running:
            self.give_back(holder)
            return
        with self._lock:
            if holder in self._all:
                self._all.remove(holder)
        with contextlib.suppress(OrchestratorError):
            self._backend.remove(holder)
        logger.warning("network slot %s is not running; dropped it", holder[:12])

    def close(self) -> None:
        """Remove every slot's container (the sandboxes that used them must be removed first)."""
        with self._lock:
            self._closed = True
            holders, self._all, self._free = self._all, [], []
        for holder in holders:
            with contextlib.suppress(OrchestratorError):
                self._backend.remove(holder)


class SandboxPool:
    """Up to ``size`` started sandboxes of one image and one set of limits, waiting to be taken.

    ``take`` hands out a ready one (or waits for the next to start); ``discard`` removes a used
    one. Each sandbox is handed out at most once. ``start`` makes one with other limits (say a
    larger memory limit) outside the pool. Thread-safe. ``close`` removes what was never taken.
    """

    def __init__(
        self,
        backend: Backend,
        settings: Settings,
        template: SandboxTemplate,
        *,
        size: int,
        share_network: bool = True,
        prepare: Callable[[Sandbox], None] | None = None,
        metrics: Recorder = NO_METRICS,
    ) -> None:
        """Start filling at once.

        Args:
            size: sandboxes kept started ahead (0: each ``take`` starts one).
            share_network: lend loopback-only network namespaces (``NetworkSlots``) when
                ``settings.confinement.network_mode`` is "none"; False gives each sandbox a new one.
            prepare: run on each pooled sandbox after it started, before anyone can take it
                (e.g. ``Sandbox.warm_up``); a sandbox it fails on is removed and the error handed out.
            metrics: told the sandboxes waiting and how long each ``take`` waited.
        """
        if not isinstance(size, int) or size < 0:
            raise ConfigError(f"the pool size must be a non-negative integer, got {size!r}")
        self._backend = backend
        self._settings = settings
        self._image = template.image
        self._scope = template.scope
        self._labels = dict(template.labels)
        self._size = size
        self._prepare = prepare
        self._metrics = metrics
        self._slots = (
            NetworkSlots(backend, settings, template)
            if share_network and settings.confinement.network_mode == "none"
            else None
        )
        self._slot_of: dict[str, str] = {}  # sandbox id -> the network slot it holds
        self._lock = threading.Lock()
        self._ready: queue.SimpleQueue[Sandbox | BaseException] = queue.SimpleQueue()
        self._closed = threading.Event()
        self._starter = ThreadPoolExecutor(max_workers=max(1, size), thread_name_prefix=f"pool-{template.scope}")
        for _ in range(size):
            self._starter.submit(self._fill_one)

    @property
    def size(self) -> int:
        return self._size

    def take(self) -> Sandbox:
        """A fresh, started sandbox that nobody has used; ``discard`` it when done.

        A sandbox the engine refused to start (a plain ``EngineError``: one container, not a missing image or
        an engine that is down) costs one attempt, as one that died while it waited does.

        Raises:
            EngineError, ImageMissing, AgentStartTimeout: starting it failed (the engine refused every attempt).
            ConfigError: the pool was closed.
        """
        started = time.monotonic()
        if self._size == 0:
            sandbox = self.start()
            self._metrics.pool_wait(time.monotonic() - started)
            return sandbox
        refused: EngineError | None = None
        for _ in range(3 * self._size + 1):
            if self._closed.is_set():
                raise ConfigError("the sandbox pool was closed")
            item = self._ready.get()
            if not self._closed.is_set():
                self._starter.submit(self._fill_one)
            if type(item) is EngineError:  # the engine refused one container (not a missing image, not engine down)
                logger.warning("pool %s: a sandbox failed to start (%s); taking another", self._scope, item)
                refused = item
                continue
            if isinstance(item, BaseException):
                raise item
            self._metrics.pool_ready(-1)
            try:
                item.connection.check_idle()  # it waited: make sure it did not die meanwhile
            except TransportError as exc:
                logger.warning(
                    "pool %s: sandbox %s died while waiting (%s); taking another", self._scope, item.sandbox_id, exc
                )
                self.discard(item)
                continue
            self._metrics.pool_wait(time.monotonic() - started)
            return item
        if refused is not None:
            raise refused
        raise ChannelLost(f"pool {self._scope}: sandboxes keep dying while they wait; see their `docker logs`")

    def start(self, settings: Settings | None = None) -> Sandbox:
        """Start a sandbox now (outside the pool), with ``settings`` if given (other limits); ``discard`` it too."""
        slot = self._slots.lease() if self._slots is not None else None
        try:
            sandbox = Sandbox.start(
                self._backend,
                settings or self._settings,
                image=self._image,
                scope=self._scope,
                labels=self._labels,
                network_of=slot,
            )
        except BaseException:
            if slot is not None and self._slots is not None:
                self._slots.give_back_failed(slot)
            raise
        if slot is not None:
            with self._lock:
                self._slot_of[sandbox.sandbox_id] = slot
        return sandbox

    def discard(self, sandbox: Sandbox) -> None:
        """Remove a sandbox this pool started (used or not); its network slot is lent again once it is gone.

        Raises:
            EngineError: the engine could not remove it (its slot is then never lent again).
        """
        with self._lock:
            slot = self._slot_of.pop(sandbox.sandbox_id, None)
        sandbox.remove()
        if slot is not None and self._slots is not None:
            self._slots.give_back(slot)

    @contextlib.contextmanager
    def sandbox(self) -> Iterator[Sandbox]:
        """``take`` one for the ``with`` block and ``discard`` it after."""
        sandbox = self.take()
        try:
            yield sandbox
        finally:
            self.discard(sandbox)

    def _fill_one(self) -> None:
        if self._closed.is_set():
            return
        try:
            sandbox = self.start()
        except BaseException as exc:  # the taker gets it: a pool that cannot start says why
            self._ready.put(exc)
            return
        if self._prepare is not None:
            try:
                self._prepare(sandbox)
            except BaseException as exc:
                with contextlib.suppress(OrchestratorError):
                    self.discard(sandbox)
                self._ready.put(exc)
                return
        if self._closed.is_set():
            with contextlib.suppress(OrchestratorError):
                self.discard(sandbox)
            return
        self._metrics.pool_ready(1)  # before a taker can count it out
        self._ready.put(sandbox)

    def close(self) -> None:
        """Stop refilling and remove every sandbox not taken, then the network slots (discard taken ones first)."""
        self._closed.set()
        self._starter.shutdown(wait=True, cancel_futures=True)
        while True:
            try:
                item = self._ready.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Sandbox):
                self._metrics.pool_ready(-1)
                with contextlib.suppress(OrchestratorError):
                    self.discard(item)
        if self._slots is not None:
            self._slots.close()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class WarmPool:
    """The warm pool an ``Orchestrator``'s new sessions start from (``Settings.capacity.pool_size``), started at the
    first ``take``: sandboxes of that image, labelled with the store and this controller (no session label, labels
    cannot change: a session's record names the one it took, and prune removes spares whose controller is gone)."""

    def __init__(self, backend: Backend, settings: Settings, *, scope: str, metrics: Recorder) -> None:
        self._backend = backend
        self._settings = settings
        self._scope = scope
        self._metrics = metrics
        self._pool: SandboxPool | None = None
        self._closed = False
        self._lock = threading.Lock()

    def take(self, image: str) -> Sandbox | None:
        """A started sandbox of ``image`` (always the same one), or None: no pool, closed, or the pool could not give
        one (the caller then starts one itself, which reports the engine's error if it fails too)."""
        if self._settings.capacity.pool_size == 0:
            return None
        with self._lock:
            if self._closed:
                return None
            if self._pool is None:
                labels = {
                    STORE_ID: self._scope,
                    LABEL_PREFIX + "protocol": str(protocol.PROTOCOL_VERSION),
                    **controller_labels("pool", self._settings.runtime_dir),
                }
                self._pool = SandboxPool(
                    self._backend,
                    self._settings,
                    SandboxTemplate(image, self._scope, labels),
                    size=self._settings.capacity.pool_size,
                    share_network=False,  # a session keeps its sandbox for long: a namespace of its own
                    prepare=Sandbox.warm_up,  # its first checkpoint or restore then needs no import
                    metrics=self._metrics,
                )
            pool = self._pool
        try:
            return pool.take()
        except OrchestratorError as exc:
            logger.warning("warm pool of store %s gave no sandbox (%s); starting one directly", self._scope, exc)
            return None

    def close(self) -> None:
        with self._lock:
            self._closed, pool, self._pool = True, self._pool, None
        if pool is not None:
            pool.close()
