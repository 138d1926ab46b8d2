"""The entry point of the Python API: creates, attaches and lists sessions on one Docker engine."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
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
    SessionBusy,
    SessionNotFound,
    SessionsNotClosed,
)
from ..evaluation import EvalOptions, EvalReport, Evaluator, ResultsFile, Submission, read_submissions, submissions_from
from ..evaluation.evaluator import OnResult
from ..metrics import NO_METRICS, Metrics, MetricsServer, Recorder
from ..ops import capacity, hibernation, images
from ..ops.connect import connect_engine, open_store
from ..ops.pool import WarmPool
from ..ops.prune import Pruner, PruneReport
from ..ops.survey import SessionInfo, survey
from ..runtime import takeover
from ..runtime.restore import SessionSandbox
from ..runtime.sandbox import Sandbox
from ..state.ledger import CheckpointLedger, generation_not_found
from ..state.store import validate_session_id
from .held import HeldSessions
from .new_sessions import check_labels, fork_ids, new_id, new_record, start_all
from .results import Generation, generations
from .session import Session

logger = logging.getLogger(__name__)


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
        self.metrics: Recorder = NO_METRICS
        """What this orchestrator's sessions, pool and evaluations are measured with (``Settings.metrics_address``)."""
        self._metrics_server: MetricsServer | None = None
        self._sessions = HeldSessions()
        if self.settings.metrics_address is not None:
            metrics = Metrics()
            metrics.watch_sessions(self._sessions.states)
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
            self._sessions.apply_idle_policy(self.settings.capacity.hibernate_after)
        self._pool = WarmPool(self.backend, self.settings, scope=self.store.store_id, metrics=self.metrics)

    @property
    def metrics_address(self) -> str | None:
        """Where this orchestrator serves ``/metrics`` (HOST:PORT, the port bound), or None (docs/metrics.md)."""
        return None if self._metrics_server is None else self._metrics_server.address

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
        session_id = validate_session_id(session_id) if session_id else new_id()
        check_labels(labels)
        placement = placement or Placement()
        self.backend.check_placement(placement)
        image = image or self.default_image
        images.check_sandbox_image(
            self.backend, image, base_image=self.settings.base_image if image == self.default_image else None
        )
        record = new_record(session_id, image, labels or {}, placement)
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

    def _attach(self, session_id: str, *, force: bool) -> tuple[Session, SessionSandbox]:
        held = self._sessions.owned(session_id)
        if held is not None:
            return held
        ledger = CheckpointLedger.take_ownership(self.store, session_id, self._quota, force=force, keep=self._keep)
        session, sandbox = self._session(ledger)
        try:
            takeover.serve(sandbox)
        except BaseException:
            self._sessions.forget(session)
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
        ids = fork_ids(count, session_ids)
        check_labels(labels)
        if placement is not None:
            self.backend.check_placement(placement)
        source = self.store.load(validate_session_id(session_id))
        children = [new_record(child, source.image, {**source.labels, **(labels or {})}) for child in ids]
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
        start_all(forks)
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
        held = self._sessions.owned(session_id)
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
        held = self._sessions.sandbox_of(session_id)
        if held is not None:
            hibernation.forget_sandbox(held)
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
        held = self._sessions.owned(session_id)
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
        held = self._sessions.owned(session_id)
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
            labels=labels,
            make_room=lambda session_id: capacity.room_for(self.store, self.backend, self.settings, session_id),
            # A pooled container has only the pool's labels and runs anywhere: a session with labels or a placement
            # of its own starts its own.
            take_pooled=(lambda image: None) if record.labels or record.placement else self._pooled_sandbox,
            metrics=self.metrics,
        )
        session = Session(sandbox, on_close=self._sessions.forget, forker=self.fork)
        self._sessions.add(session, sandbox)
        return session, sandbox

    def _pooled_sandbox(self, image: str) -> Sandbox | None:
        """A started sandbox from the warm pool for a session of the default image, or None (the session starts one).

        The pool starts with the first call; its containers carry no session label (labels cannot change).
        """
        if image != self.default_image or self._sessions.closing.is_set():
            return None
        return self._pool.take(image)

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
        try:
            failures = self._sessions.close_all()
        finally:
            try:
                self._pool.close()
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
