"""The entry point of the Python API: creates, attaches and lists sessions on one Docker engine."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..agent import protocol
from ..backends.base import LABEL_PREFIX, SESSION_ID, STORE_ID, Backend, ContainerState, Phase, Placement
from ..checks import is_count
from ..config import Settings
from ..errors import (
    CheckpointError,
    ConfigError,
    EngineError,
    OrchestratorError,
    SessionAttachedElsewhere,
    SessionBusy,
    SessionNotFound,
    SessionsNotClosed,
)
from ..evaluation import EvalOptions, EvalReport, Evaluator, ResultsFile, Submission, read_submissions, submissions_from
from ..evaluation.evaluator import OnResult
from ..metrics import NO_METRICS, Metrics, MetricsServer, Recorder
from ..ops import capacity, hibernation, images
from ..ops.connect import connect_engine, open_store
from ..ops.pool import SandboxPool
from ..ops.prune import Pruner, PruneReport
from ..ops.survey import SessionInfo, survey
from ..runtime import takeover
from ..runtime.restore import SessionSandbox
from ..runtime.sandbox import Sandbox
from ..state.activity import Activity
from ..state.controllers import controller_labels
from ..state.lease import RENEW_EVERY
from ..state.ledger import CheckpointLedger, generation_not_found, new_owner_token
from ..state.store import SessionRecord, validate_session_id
from .results import Generation, generations
from .session import Session, SessionState

logger = logging.getLogger(__name__)

_FORK_STARTS = 8
"""Forks whose sandboxes ``Orchestrator.fork`` starts and restores at once."""


def _check_labels(labels: Mapping[str, str] | None) -> None:
    """Raises ConfigError for a label outside our namespace (``orchestrator.<you>.<name>``)."""
    for key in labels or {}:
        if not key.startswith(LABEL_PREFIX) or key.count(".") < 2:
            raise ConfigError(f"label {key!r} must be namespaced like 'orchestrator.<you>.<name>'")


class Orchestrator:
    """Runs one long-lived sandbox container per persistent session.

    Closing the orchestrator (or leaving its ``with`` block) closes every session it still
    holds; ``Session.detach()`` keeps a session's container and checkpoint for a later
    ``attach`` instead.
    """

    def __init__(self, settings: Settings | None = None, *, backend: Backend | None = None) -> None:
        """Connect to the engine (DOCKER_HOST; a Swarm manager when ``settings.backend`` is "swarm") with ``settings``
        (default: ``Settings.from_env()``).

        Raises:
            ConfigError: the runtime directory is not private (a symlink, not ours, or open to others), or metrics
                cannot be served at ``settings.metrics_address`` (in use, not this machine's).
            EngineUnavailable: no Docker engine answers; the message says how to start one.
        """
        self.settings = settings or Settings.from_env()
        self.store = open_store(self.settings)
        self._owns_backend = backend is None
        self.backend: Backend = backend or connect_engine(self.settings, self.store)
        self._sessions: dict[str, tuple[Session, SessionSandbox]] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._idle_watch: threading.Thread | None = None
        self._pool: SandboxPool | None = None
        self._renewer: threading.Thread | None = None
        self.metrics: Recorder = NO_METRICS
        """What this orchestrator's sessions, pool and evaluations are measured with (``Settings.metrics_address``)."""
        self._metrics_server: MetricsServer | None = None
        if self.settings.metrics_address is not None:
            metrics = Metrics()
            metrics.watch_sessions(self._session_states)
            try:
                self._metrics_server = MetricsServer(
                    metrics, self.settings.metrics_address, self.settings.metrics_token
                )
            except ConfigError:
                if self._owns_backend:
                    self.backend.close()
                raise
            self.metrics = metrics
        if self.settings.capacity.hibernate_after is not None:
            self._idle_watch = threading.Thread(
                target=self._hibernate_idle_sessions, args=(self.settings.capacity.hibernate_after,), daemon=True
            )
            self._idle_watch.start()

    @property
    def metrics_address(self) -> str | None:
        """Where this orchestrator serves ``/metrics`` (HOST:PORT, the port bound), or None (docs/metrics.md)."""
        return None if self._metrics_server is None else self._metrics_server.address

    def _session_states(self) -> list[str]:
        """The state of each session this orchestrator holds, for ``orchestrator_sessions`` (no engine call)."""
        states = []
        for sandbox in self._held_sandboxes():
            if sandbox.sandbox is None:
                states.append("hibernated")
            elif sandbox.lock.acquire(blocking=False):  # a call (or a start, a restore) holds it while it runs
                sandbox.lock.release()
                states.append("running")
            else:
                states.append("busy")
        return states

    @property
    def default_image(self) -> str:
        """The image sessions use unless told otherwise."""
        return images.sandbox_image(self.settings)

    def build_image(self, *, rebuild: bool = False) -> str:
        """Build (or reuse) the default sandbox image on ``settings.base_image``; return its tag."""
        return images.build_image(self.backend, self.settings.base_image, rebuild=rebuild)

    def create_session(
        self,
        *,
        session_id: str | None = None,
        image: str | None = None,
        labels: Mapping[str, str] | None = None,
        placement: Placement | None = None,
    ) -> Session:
        """Start a new session in its own container.

        Args:
            session_id: an id of your choosing (3-63 lowercase letters, digits, dashes).
            image: a sandbox image, one with the agent in it (default: ``default_image``); a base image is refused
                (build a sandbox image on it: ``Settings.base_image``, ``build_image``).
            labels: extra container labels; keys must start with ``orchestrator.``.
            placement: where its sandboxes may run and what they reserve (Swarm backend); kept for its restarts.

        Raises:
            ConfigError: the id is invalid or taken, a label is outside our namespace, or a placement is given to
                the docker backend.
            ImageMissing: the image is not built; the message says how to build it.
            NotASandboxImage: the image is a base image (no agent); nothing was started.
            EngineError: the engine refused to start the container.
            AgentStartFailed: the container exited before its agent connected (its exit code and last log lines).
            AgentStartTimeout: the container started but its agent never connected.
        """
        session_id = validate_session_id(session_id) if session_id else f"s{secrets.token_hex(6)}"
        _check_labels(labels)
        placement = placement or Placement()
        self.backend.check_placement(placement)
        image = image or self.default_image
        images.check_sandbox_image(
            self.backend, image, base_image=self.settings.base_image if image == self.default_image else None
        )
        now = time.time()
        record = SessionRecord(
            session_id=session_id,
            image=image,
            created_at=now,
            last_used_at=now,
            labels=dict(labels or {}),
            placement=placement.to_json(),
            owner=new_owner_token(),
            epoch=1,
        )
        session, sandbox = self._session(CheckpointLedger.create(self.store, record, self._quota, keep=self._keep))
        try:
            sandbox.start()
        except BaseException:
            with contextlib.suppress(OrchestratorError):
                session.close()
            raise
        logger.info("created session %s on %s", session_id, image)
        return session

    def attach(self, session_id: str, *, force: bool = False) -> Session:
        """A handle on a stored session, owned by this orchestrator.

        A session this orchestrator holds already gives the handle it has (nothing changes). A session
        no live controller holds (detached, or its controller died: its lease lapsed, or its process is
        gone on this host) is taken: this handle owns it from now on and every earlier handle is stale.
        A live container is taken over in band; otherwise a new container starts and the checkpoint is
        restored when the session is next used.

        Args:
            force: take the session even from a live controller: the call it runs is stopped and not kept,
                and its handle goes stale.

        Raises:
            SessionHeld: a live controller holds the session (it is named) and ``force`` is False.
            SessionNotFound: no session with that id was stored.
            SessionBusy: another process held the session's lock too long.
            SessionAttachedElsewhere: another controller attached it meanwhile (it won).
        """
        return self._attach(session_id, force=force)[0]

    def _held(self, session_id: str) -> tuple[Session, SessionSandbox] | None:
        """This orchestrator's handle on the session, if it still owns it."""
        with self._lock:
            held = self._sessions.get(validate_session_id(session_id))
        if held is None or held[0].state is not SessionState.READY:
            return None
        try:
            held[1].ledger.check_owner()
        except SessionAttachedElsewhere:
            held[1].become_stale()  # taken by force meanwhile: this handle is stale, the next attach decides
            return None
        return held

    def _attach(self, session_id: str, *, force: bool) -> tuple[Session, SessionSandbox]:
        held = self._held(session_id)
        if held is not None:
            return held
        ledger = CheckpointLedger.take_ownership(self.store, session_id, self._quota, force=force, keep=self._keep)
        session, sandbox = self._session(ledger)
        try:
            takeover.serve(sandbox)
        except BaseException:
            self._forget(session)
            raise
        return session, sandbox

    @property
    def _quota(self) -> int:
        return self.settings.limits.checkpoint_quota_bytes

    @property
    def _keep(self) -> int:
        return self.settings.limits.history_generations

    def fork(
        self,
        session_id: str,
        count: int = 1,
        *,
        at: int | None = None,
        labels: Mapping[str, str] | None = None,
        session_ids: Sequence[str] | None = None,
        placement: Placement | None = None,
    ) -> list[Session]:
        """``count`` new sessions, owned by this orchestrator, each with the state of stored session ``session_id``:
        its last committed generation, or the kept generation ``at`` (``history``).

        The source is only read (under its store lock, for a moment): it is not taken over, whoever holds it, and a
        call it runs goes on (what it commits later is not in the forks). Each fork gets the source's variables,
        contexts, scaffold and unsaved report, its image and placement, and its labels with ``labels`` added. Stored
        values are shared, not copied: the host's cost is the number of names, not their bytes, and removing any of
        the sessions never breaks another. Each fork's sandbox is started (from the warm pool where one is
        configured) and restored before this returns.

        Each fork is stored whole or not at all. When one cannot be made or started, the ones made by this call are
        removed and the error raised; a controller killed meanwhile leaves the forks it had stored as ordinary
        sessions (``forked_from`` names the source).

        Args:
            session_ids: the forks' ids (``count`` of them); default: new random ones.
            placement: where the forks' sandboxes may run (Swarm backend); default: the source's placement.

        Raises:
            GenerationNotFound: ``at`` is not a generation the source keeps.
            SessionNotFound: no session ``session_id`` is stored.
            ConfigError: ``count`` is not a positive integer, an id is invalid or taken, or a label is outside our
                namespace.
            CheckpointError: the source's checkpoint is damaged.
        """
        if not is_count(count) or count < 1:
            raise ConfigError(f"count must be a positive integer, got {count!r}")
        ids = [f"s{secrets.token_hex(6)}" for _ in range(count)] if session_ids is None else list(session_ids)
        if len(ids) != count or len(set(ids)) != count:
            raise ConfigError(f"session_ids must name {count} different ids, got {ids!r}")
        ids = [validate_session_id(child) for child in ids]
        _check_labels(labels)
        if placement is not None:
            self.backend.check_placement(placement)
        source = self.store.load(validate_session_id(session_id))
        now = time.time()
        children = [
            SessionRecord(
                session_id=child,
                image=source.image,
                created_at=now,
                last_used_at=now,
                labels={**source.labels, **(labels or {})},
                owner=new_owner_token(),
                epoch=1,
            )
            for child in ids
        ]
        ledgers = CheckpointLedger.fork(
            self.store,
            session_id,
            children,
            self._quota,
            at=at,
            keep=self._keep,
            placement=None if placement is None else placement.to_json(),
        )
        forks = [self._session(ledger) for ledger in ledgers]
        try:
            with ThreadPoolExecutor(min(count, _FORK_STARTS), thread_name_prefix="fork-start") as starts:
                for started in [starts.submit(sandbox.start) for _, sandbox in forks]:
                    started.result()
        except BaseException:
            for fork, _ in forks:
                with contextlib.suppress(OrchestratorError):
                    fork.close()
            raise
        logger.info("forked session %s into %s", session_id, ", ".join(ids))
        return [fork for fork, _ in forks]

    def history(self, session_id: str) -> list[Generation]:
        """The generations stored session ``session_id`` keeps, oldest first (the last is the current one); reads
        only, whoever holds it.

        Raises:
            SessionNotFound: no session with that id was stored.
        """
        return generations(self.store.load(validate_session_id(session_id)))

    def rewind(self, session_id: str, generation: int, *, force: bool = False) -> Generation:
        """Rewind stored session ``session_id`` to its kept generation ``generation`` (``Session.rewind``).

        A session this orchestrator holds is rewound in place. Any other is attached (as ``attach``: refused while
        a live controller holds it, unless ``force``), rewound, and let go of (detached).

        Raises:
            GenerationNotFound: the session keeps no such generation.
            SessionHeld: a live controller holds the session and ``force`` is False.
            SessionNotFound: no session with that id was stored.
        """
        held = self._held(session_id)
        if held is None and is_count(generation):  # refused before the session is taken from anyone
            record = self.store.load(validate_session_id(session_id))
            if record.generation_at(generation) is None:
                raise generation_not_found(record, generation)
        session, _ = held or self._attach(session_id, force=force)
        try:
            return session.rewind(generation)
        finally:
            if held is None:
                session.detach()

    def evaluate(
        self,
        submissions: Iterable[Submission | Mapping[str, Any]] | str | os.PathLike[str],
        *,
        out: str | os.PathLike[str] | None = None,
        junit: str | os.PathLike[str] | None = None,
        resume: bool = False,
        on_result: OnResult | None = None,
        options: EvalOptions | None = None,
    ) -> EvalReport:
        """Grade untrusted submissions, each in a fresh sandbox (``orchestrator eval``; docs/eval.md).

        Args:
            submissions: a JSONL file's path, or ``Submission``s / dicts with the same fields.
            out: the results file (JSON lines, one record per submission, written as each ends).
            junit: where to write a JUnit XML report at the end.
            resume: keep ``out`` and skip the ids it holds (an ``infra_error`` runs again).
            on_result: called with each ``EvalResult`` as it is written (on a worker thread).
            options: jobs, default timeout and memory, output limit (``EvalOptions``).

        Returns:
            The ``EvalReport``: results in input order, invalid lines, ``exit_code`` (0 / 1 / 2).

        Raises:
            ConfigError: the submissions file or the results file cannot be read or written.
            ImageMissing: the sandbox image is not built.
        """
        if isinstance(submissions, (str, os.PathLike)):
            try:
                with open(submissions, "rb") as handle:
                    items = list(read_submissions(handle))
            except OSError as exc:
                raise ConfigError(f"cannot read the submissions file {submissions}: {exc}") from None
        else:
            items = list(submissions_from(submissions))
        if resume and out is None:
            raise ConfigError("resume needs the results file (out) of the earlier run")
        results = None if out is None else ResultsFile(Path(out), resume=resume, fsync=True)
        try:
            evaluator = Evaluator(self.backend, self.settings, options, image=self.default_image, metrics=self.metrics)
            return evaluator.run(
                items, results_file=results, junit=None if junit is None else Path(junit), on_result=on_result
            )
        finally:
            if results is not None:
                results.close()

    def list_sessions(self, *, now: float | None = None) -> list[SessionInfo]:
        """Every stored session, whoever holds it, with its status, ages and sizes (sorted by id).

        Reads only: no session is taken over, started or waited for. ``now`` replaces the clock.
        """
        return survey(self.store, self.backend, now=time.time() if now is None else now)

    def describe(self, session_id: str, *, now: float | None = None) -> SessionInfo:
        """One session as ``list_sessions`` shows it, and the bytes it shares with other sessions (``shared_bytes``).

        Raises:
            SessionNotFound: no session with that id was stored.
        """
        if not self.store.exists(validate_session_id(session_id)):
            self.store.load(session_id)  # raises SessionNotFound with the store's path
        now = time.time() if now is None else now
        return survey(self.store, self.backend, now=now, session_ids=[session_id], shared=True)[0]

    def hibernate(self, session_id: str) -> bool:
        """Remove a session's container and keep its checkpoint; its next call (from any owner) resumes it.

        Its owner, here or in another process, keeps owning it. Returns False if it was hibernated already.

        Raises:
            SessionNotFound: no session with that id was stored.
            SessionBusy: a call runs on it now; try again when it has ended.
        """
        done = hibernation.hibernate_idle(self.store, self.backend, self.settings.runtime_dir, session_id)
        if done is None:
            raise SessionBusy(f"session {session_id} is in a call; hibernate it when the call has ended")
        with self._lock:
            held = self._sessions.get(session_id)
        if held is not None:
            hibernation.forget_sandbox(held[1])
        return done

    def resume(self, session_id: str, *, force: bool = False) -> bool:
        """Start a hibernated (or broken) session's sandbox now and restore it; False if it was running already.

        A session this orchestrator holds is resumed in place (its handle stays). Any other is attached
        (as ``attach``: refused while a live controller holds it, unless ``force``), resumed, and let go
        of (detached), so its next owner finds it running.

        Raises:
            SessionHeld: a live controller holds the session and ``force`` is False.
            SessionNotFound: no session with that id was stored.
            SandboxError, EngineError: the sandbox could not be started.
        """
        held = self._held(session_id)
        session, sandbox = held or self._attach(session_id, force=force)
        try:
            if sandbox.sandbox is not None:
                return False
            sandbox.start()
            return True
        finally:
            if held is None:
                session.detach()

    def logs(self, session_id: str, tail: int | None = 200) -> str:
        """The log of the session's container (the agent's messages), its last ``tail`` lines or all.

        Raises:
            SessionNotFound: no session with that id was stored.
            ConfigError: the session has no container now (hibernated, or never started).
        """
        record = self.store.load(session_id)
        gone = ConfigError(f"session {session_id} has no container now (hibernated or gone); its log went with it")
        if record.container_id is None or self.backend.inspect(record.container_id) is None:
            raise gone
        try:
            return self.backend.logs(record.container_id, tail)
        except EngineError:  # removed meanwhile ("dead or marked for removal"): say which, as above
            self.store.load(session_id)  # SessionNotFound when the session went with it
            state = self.backend.inspect(record.container_id)
            if state is None or state.phase in (Phase.REMOVING, Phase.DEAD):
                raise gone from None
            raise

    def prune(
        self,
        *,
        idle_for: float | None = None,
        older_than: float | None = None,
        hibernate_only: bool = False,
        dry_run: bool = False,
        now: float | None = None,
    ) -> PruneReport:
        """Remove (or hibernate) stale sessions and clean up what crashed controllers left behind.

        A session is stale when it meets every given criterion: no call for ``idle_for``
        seconds, created ``older_than`` seconds ago. With neither, no session is stale. A
        session in a call is skipped; one used while the prune ran is decided again. Always
        cleaned: containers of this store with no record, records whose container and
        checkpoint are gone, blobs no manifest names, channel directories of gone sandboxes,
        containers created but never started. A record that cannot be read is never removed:
        it is quarantined (moved aside whole, reported as ``quarantine-record``) and its
        containers are left alone. Failures are in the report (``failed``), not raised;
        everything else goes on.

        Args:
            hibernate_only: hibernate stale sessions instead of removing them (and remove no record).
            dry_run: report what would be done and change nothing.
            now: the clock's value to judge by (default now).
        """
        pruner = Pruner(
            self.store, self.backend, self.settings, dry_run=dry_run, now=time.time() if now is None else now
        )
        return pruner.run(idle_for, older_than, hibernate_only)

    def remove(self, session_id: str, *, force: bool = False) -> None:
        """Remove a session: its containers, channel directories and stored state.

        The session is attached first (as ``attach``), so one a live controller holds is removed only
        with ``force``; its handles elsewhere then become stale (``SessionAttachedElsewhere``).

        Raises:
            SessionHeld: a live controller holds the session and ``force`` is False.
            SessionNotFound: no session with that id was stored.
        """
        held = self._held(session_id)
        if held is not None:
            held[0].close()
            return
        ledger = CheckpointLedger.take_ownership(self.store, session_id, self._quota, force=force, keep=self._keep)
        self._session(ledger)[0].close()

    def _session(self, ledger: CheckpointLedger) -> tuple[Session, SessionSandbox]:
        """A handle on a session this controller owns (``ledger``), and the runtime behind it that the
        orchestrator drives (start, take over, hibernate)."""
        record = ledger.record
        labels = {
            STORE_ID: self.store.store_id,
            SESSION_ID: record.session_id,
            LABEL_PREFIX + "created-at": str(int(record.created_at)),
            LABEL_PREFIX + "protocol": str(protocol.PROTOCOL_VERSION),
            **record.labels,
        }
        sandbox = SessionSandbox(
            ledger,
            backend=self.backend,
            settings=self.settings,
            scope=self.store.store_id,
            labels=labels,
            activity=Activity(self.store.activity_path(record.session_id), wait=self.settings.timeouts.lock),
            make_room=lambda session_id: capacity.room_for(self.store, self.backend, self.settings, session_id),
            # A pooled container has only the pool's labels and runs anywhere: a session with labels or a placement
            # of its own starts its own.
            take_pooled=(lambda image: None) if record.labels or record.placement else self._pooled_sandbox,
            metrics=self.metrics,
        )
        session = Session(sandbox, on_close=self._forget, forker=self.fork)
        with self._lock:
            self._sessions[session.id] = (session, sandbox)
            if self._renewer is None and not self._closing.is_set():
                self._renewer = threading.Thread(
                    target=_renew_leases, args=(weakref.ref(self), self._closing), name="lease-renewal", daemon=True
                )
                self._renewer.start()
        return session, sandbox

    def _held_sandboxes(self) -> list[SessionSandbox]:
        """The sessions this orchestrator holds now (not detached, stale or closed)."""
        with self._lock:
            return [sandbox for session, sandbox in self._sessions.values() if session.state is SessionState.READY]

    def _pooled_sandbox(self, image: str) -> Sandbox | None:
        """A started sandbox from the warm pool (``Settings.capacity.pool_size``), or None: no pool, another image, or
        the pool could not give one (the caller then starts one itself, which reports the engine's error if it fails
        too).

        The pool starts with the first call. Its containers carry no session label (labels cannot change): a
        session's record names the one it took, and prune removes spares whose controller is gone.
        """
        if self.settings.capacity.pool_size == 0 or image != self.default_image:
            return None
        with self._lock:
            if self._closing.is_set():
                return None
            if self._pool is None:
                labels = {
                    STORE_ID: self.store.store_id,
                    LABEL_PREFIX + "protocol": str(protocol.PROTOCOL_VERSION),
                    **controller_labels("pool", self.settings.runtime_dir),
                }
                self._pool = SandboxPool(
                    self.backend,
                    self.settings,
                    image=image,
                    scope=self.store.store_id,
                    labels=labels,
                    size=self.settings.capacity.pool_size,
                    share_network=False,  # a session keeps its sandbox for long: a namespace of its own
                    prepare=Sandbox.warm_up,  # its first checkpoint or restore then needs no import
                    metrics=self.metrics,
                )
            pool = self._pool
        try:
            return pool.take()
        except OrchestratorError as exc:
            logger.warning(
                "warm pool of store %s gave no sandbox (%s); starting one directly", self.store.store_id, exc
            )
            return None

    def _hibernate_idle_sessions(self, idle_for: float) -> None:
        """The idle policy for the sessions this orchestrator holds (the janitor applies it to the others)."""
        while not self._closing.wait(min(max(idle_for / 4, 0.2), 30.0)):
            with self._lock:
                held = [sandbox for _, sandbox in self._sessions.values()]
            for sandbox in held:
                hibernation.hibernate_if_idle(sandbox, idle_for)

    def _forget(self, session: Session) -> None:
        with self._lock:
            held = self._sessions.get(session.id)
            if held is not None and held[0] is session:
                del self._sessions[session.id]

    def containers(self, session_id: str | None = None) -> list[ContainerState]:
        """Containers of this store, running or not: all (warm pools' spares too), or one session's (found by label,
        and the one its record names, which has no session label when it came from a warm pool)."""
        labels = {STORE_ID: self.store.store_id}
        if session_id is None:
            return self.backend.find(labels)
        found = self.backend.find({**labels, SESSION_ID: validate_session_id(session_id)})
        recorded = None
        with contextlib.suppress(SessionNotFound, CheckpointError):
            recorded = self.store.load(session_id).container_id
        if recorded and all(c.id != recorded for c in found):
            found += [c for c in self.backend.find(labels) if c.id == recorded]
        return found

    def sessions(self) -> list[str]:
        """Ids of every stored session (this controller's or not)."""
        return list(self.store.ids())

    def close(self) -> None:
        """Close the sessions this orchestrator still holds (detached ones are left alone), then the engine client.

        Every session is tried, even when some fail, and the pool and the engine client are closed all the same.

        Raises:
            SessionsNotClosed: some sessions could not be closed (an unreadable record, the engine failing); it
                names each with its error. Raised after everything else was done.
        """
        self._closing.set()
        if self._idle_watch is not None:
            self._idle_watch.join()
        if self._renewer is not None:
            self._renewer.join()
        with self._lock:
            held = [session for session, _ in self._sessions.values()]
        failures: dict[str, Exception] = {}
        try:
            for session in held:
                try:
                    if session.state is SessionState.READY:
                        with contextlib.suppress(SessionAttachedElsewhere):
                            session.close()
                except Exception as exc:  # every session gets its turn; all failures are reported
                    logger.warning("closing session %s failed: %s: %s", session.id, type(exc).__name__, exc)
                    failures[session.id] = exc
                finally:
                    self._forget(session)
        finally:
            with self._lock:
                pool, self._pool = self._pool, None
            try:
                if pool is not None:
                    pool.close()
            finally:
                if self._metrics_server is not None:
                    self._metrics_server.close()
                if self._owns_backend:
                    self.backend.close()
        if failures:
            raise SessionsNotClosed(failures)

    def __enter__(self) -> Orchestrator:
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        try:
            self.close()
        except SessionsNotClosed:
            if exc_type is None:
                raise
            # The block's own exception goes on (the close failures were logged, one line per session).


def _renew_leases(orchestrator: weakref.ref[Orchestrator], closing: threading.Event) -> None:
    """The proof of life of the sessions an orchestrator holds: their leases renewed every ``RENEW_EVERY`` seconds
    until it closes (or is collected: its leases then lapse, and others may take its sessions)."""
    while not closing.wait(RENEW_EVERY):
        orch = orchestrator()
        if orch is None:
            return
        held = orch._held_sandboxes()
        del orch
        for sandbox in held:
            try:
                if not sandbox.ledger.renew_lease():
                    logger.debug("session %s: its lease is another handle's now", sandbox.session_id)
            except SessionNotFound:
                pass  # removed meanwhile: its handle learns it at its next call
            except Exception as exc:  # the thread must go on: the other sessions' leases depend on it
                logger.warning(
                    "session %s: its lease was not renewed: %s: %s", sandbox.session_id, type(exc).__name__, exc
                )
