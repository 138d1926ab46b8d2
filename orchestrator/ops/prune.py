"""Pruning: remove (or hibernate) stale sessions and clean up what crashed controllers left behind.

Safe against races by construction. A session is acted on only while its activity lock is
held exclusively (``activity.quiet``): that fails while a call runs, so a busy session is
skipped, and no call can begin (nor be acknowledged) until the session is gone. Staleness is
decided again under that lock. Blobs are judged under the session's store lock, where no commit
is half done. Everything removed may already be gone (another prune, the owner): that is success.

Careful with what it cannot read: a session whose record is unreadable is never removed (its container may
serve a live controller); its directory is moved aside, whole, to ``<state_dir>/quarantine/`` and reported,
and its containers are left alone, now and by later prunes.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..backends.base import SANDBOX_ID, SESSION_ID, STORE_ID, Backend, ContainerState, Phase
from ..config import Settings
from ..errors import CheckpointError, OrchestratorError, SessionNotFound
from ..runtime import discard
from ..state import activity
from ..state.controllers import CONTROLLER_RUNTIME_DIR, EVAL_RUN, controller_gone, left_behind
from ..state.index import StoreIndex
from ..state.store import QUARANTINE_DIR, SessionStore, is_sandbox_id
from ..units import describe_bytes, describe_duration
from ..wire.endpoint import discard_sandbox_dir, leftover_dir_grace
from . import hibernation
from .survey import Deciding, SessionInfo, SessionStatus, survey

logger = logging.getLogger(__name__)

ORPHAN_GRACE = 60.0
"""Seconds a session directory without a record is left alone (a create may be writing it)."""


@dataclass(frozen=True)
class PruneAction:
    """One thing a prune did (or, in a dry run, would do)."""

    action: str
    """"remove" | "hibernate" | "skip" (busy: left alone) | "quarantine-record" (unreadable: moved aside, kept, its
    containers left alone) | "remove-orphan-container" | "remove-unstarted-container" (created, never started)
    | "remove-orphan-record" | "remove-orphan-blobs" | "remove-orphan-sandbox-dir"."""
    target: str
    """A session id, a container name, or a path."""
    reason: str
    ok: bool = True
    error: str | None = None
    freed_bytes: int = 0
    """Bytes that leave the disk: a removed session's blobs (its kept generations' too) that no fork shares."""

    def describe(self, dry_run: bool) -> str:
        """One line for logs and the CLI."""
        verb = ("would " if dry_run else "") + self.action.replace("-", " ")
        line = f"{verb} {self.target} ({self.reason})"
        return line if self.ok else f"{line}: FAILED: {self.error}"


@dataclass(frozen=True)
class PruneReport:
    """Everything one prune did; ``failed`` non-empty means a partial failure."""

    actions: list[PruneAction]
    dry_run: bool

    @property
    def failed(self) -> list[PruneAction]:
        return [a for a in self.actions if not a.ok]

    def to_json(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "actions": [asdict(a) for a in self.actions], "failed": len(self.failed)}

    def summary(self) -> str:
        """One line: how many of each action, bytes freed, failures ("2 remove, 1 skip; 3.1 MiB freed; 0 failed")."""
        counts: dict[str, int] = {}
        for action in self.actions:
            if action.ok:
                counts[action.action] = counts.get(action.action, 0) + 1
        done = ", ".join(f"{n} {name.replace('-', ' ')}" for name, n in counts.items()) or "nothing to do"
        freed = describe_bytes(sum(a.freed_bytes for a in self.actions if a.ok))
        if self.dry_run:
            return f"dry run, would do: {done}; {freed} to free; {len(self.failed)} failed"
        return f"done: {done}; {freed} freed; {len(self.failed)} failed"


class Pruner:
    """One prune over one store (see ``Orchestrator.prune``)."""

    def __init__(self, store: SessionStore, backend: Backend, settings: Settings, *, dry_run: bool, now: float) -> None:
        self.store = store
        self.backend = backend
        self.settings = settings
        self.dry_run = dry_run
        self.now = now
        self.actions: list[PruneAction] = []
        self.index = StoreIndex(store)
        self.containers: dict[str, ContainerState] = {}
        """The store's containers by id as the first survey saw them (the re-checks reuse them)."""

    def run(self, idle_for: float | None, older_than: float | None, hibernate_only: bool) -> PruneReport:
        self.containers = {c.id: c for c in self.backend.find({STORE_ID: self.store.store_id})}
        infos = survey(self.store, self.backend, now=self.now, deciding=Deciding(self.containers, self.index))
        for info in infos:
            stale = _stale(info, idle_for, older_than)
            if info.record_unreadable:
                if not hibernate_only:
                    self._quarantine(info)
            elif self._orphan(info):
                if not hibernate_only:
                    self._session(info, "remove-orphan-record", info.problem or "", self._orphan)
            elif stale is not None and hibernate_only:
                if info.status is not SessionStatus.HIBERNATED:
                    self._session(info, "hibernate", stale, lambda f: _stale(f, idle_for, older_than) is not None)
            elif stale is not None:
                self._session(info, "remove", stale, lambda f: _stale(f, idle_for, older_than) is not None)
        self._orphan_containers()
        self._dead_eval_runs()
        self._unstarted_containers()
        self._orphan_blobs([info.id for info in infos if not info.record_unreadable])
        self._orphan_record_dirs({info.id for info in infos})
        self._orphan_sandbox_dirs()
        self.index.save()
        return PruneReport(self.actions, self.dry_run)

    # ---------------------------------------------------------------- sessions

    def _session(
        self, info: SessionInfo, action: str, reason: str, still_wanted: Callable[[SessionInfo], bool]
    ) -> None:
        """Act on one session while holding it still; decide again there (a call may have just ended).

        A dry run decides on the survey alone: it changes nothing, so it holds nothing still (nor creates an activity
        file), and a session that was in a call at the survey was not stale there.
        """
        freed = 0 if action == "hibernate" else None
        if self.dry_run:
            self._record(action, info.id, reason, None, freed=self._own_bytes(info.id) if freed is None else freed)
            return
        try:
            with activity.quiet(self.store.activity_path(info.id)) as still:
                if not still:
                    self.actions.append(PruneAction("skip", info.id, "in a call now"))
                    return
                fresh = self._recheck(info)
                if fresh.last_active_at > info.last_active_at or not still_wanted(fresh):
                    self.actions.append(PruneAction("skip", info.id, "used meanwhile"))
                    return
                held = hibernation.hibernate_held if action == "hibernate" else discard.remove_held
                self._record(
                    action,
                    info.id,
                    reason,
                    lambda: held(self.store, self.backend, self.settings.runtime_dir, info.id),
                    freed=self._own_bytes(info.id) if freed is None else freed,
                )
        except SessionNotFound:
            return  # removed meanwhile (another prune, or its owner): nothing left to do
        except OrchestratorError as exc:
            self.actions.append(PruneAction(action, info.id, reason, ok=False, error=str(exc)))

    def _recheck(self, info: SessionInfo) -> SessionInfo:
        """The session surveyed again, held still: its record (in full, not from the index) and activity read anew,
        the engine's listing of the first survey reused unless the record names another container since (then the
        engine is asked again, and its answer kept for the decisions that follow)."""
        fresh = self._survey_one(info.id, Deciding(self.containers, self.index, held=True, reread=True))
        if fresh.container_id == info.container_id:
            return fresh
        self.containers.update((c.id, c) for c in self.backend.find({STORE_ID: self.store.store_id}))
        return self._survey_one(info.id, Deciding(self.containers, held=True, reread=True))

    def _survey_one(self, session_id: str, deciding: Deciding) -> SessionInfo:
        return survey(self.store, self.backend, now=self.now, session_ids=[session_id], deciding=deciding)[0]

    def _orphan(self, info: SessionInfo) -> bool:
        """A record whose container and checkpoint are both gone: nothing is left to resume."""
        container = self.containers.get(info.container_id or "")
        running = container is not None and container.running
        return info.checkpoint_damaged and info.status is not SessionStatus.BUSY and not running

    def _own_bytes(self, session_id: str) -> int:
        """Bytes removing the session gives back: its blobs (kept generations' too) that no fork's directory shares."""
        record = self.index.latest(session_id)  # as the survey (or the re-check under the locks) read it
        if record is None:
            return 0
        return record.history_bytes - self.store.shared_bytes_of(session_id, record.blobs)

    def _quarantine(self, info: SessionInfo) -> None:
        """Move an unreadable record aside instead of removing anything: its container may serve a live session.

        Nothing of it is deleted and none of its containers is touched (a running one goes on running; later
        prunes leave them alone too): what to do with them is a person's decision.
        """
        action = "quarantine-record"
        try:
            with activity.quiet(self.store.activity_path(info.id)) as still:
                if not still:
                    self.actions.append(PruneAction("skip", info.id, "in a call now"))
                    return
                with self.store.locked(info.id):
                    try:
                        self.store.load(info.id)
                    except CheckpointError as exc:
                        problem = str(exc)
                    else:
                        self.actions.append(PruneAction("skip", info.id, "its record is readable again"))
                        return
                    containers = self.backend.find(discard.session_labels(self.store, info.id))
                    running = [c.name for c in containers if c.running]
                    left = (
                        f"its running container {', '.join(running)} was left alone"
                        if running
                        else "no container of it runs"
                    )
                    reason = f"{problem}; kept whole under {self.store.base / QUARANTINE_DIR}, not deleted; {left}"
                    self._record(action, info.id, reason, lambda: self.store.quarantine(info.id, reason))
        except SessionNotFound:
            return
        except OrchestratorError as exc:
            self.actions.append(PruneAction(action, info.id, info.problem or "", ok=False, error=str(exc)))

    # ---------------------------------------------------------------- orphans

    def _orphan_containers(self) -> None:
        """Our store's containers whose session has no record (a controller died between removing them), and warm
        pools' spares whose controller is gone (a container from a pool is a session's once a record names it)."""
        recorded: dict[str, str] | None = None
        quarantined = self.store.quarantined()
        for container in self.backend.find({STORE_ID: self.store.store_id}):
            session_id = container.labels.get(SESSION_ID, "")
            if session_id in quarantined:
                continue  # its record is unreadable and kept aside: a person decides
            if session_id:
                if not self.store.exists(session_id):
                    self._record(
                        "remove-orphan-container",
                        container.name,
                        f"session {session_id} has no record",
                        lambda c=container: discard.discard_sandbox(
                            self.backend, self.settings.runtime_dir, c.labels.get(SANDBOX_ID), c.id
                        ),
                    )
                continue
            if not controller_gone(container):
                continue
            recorded = self.index.recorded_containers() if recorded is None else recorded
            # Read every record before removing: its controller may have recorded it just before it died.
            if container.id not in recorded and container.id not in self.store.recorded_containers():
                self._record(
                    "remove-orphan-container",
                    container.name,
                    "a warm pool's spare whose controller is gone",
                    lambda c=container: discard.discard_left_behind(self.backend, c),
                )

    def _unstarted_containers(self) -> None:
        """Containers of this store, or of this host's controllers with our runtime dir (a pool's, an eval run's),
        created but never started for longer than a start may take, that no record names.

        Their creator removes them when the start fails (``Backend.run_sandbox``); one killed between create and
        start cannot, and an engine that failed the removal too leaves them here.
        """
        grace = leftover_dir_grace(self.settings.timeouts.start)
        found = {c.id: c for c in self.backend.find({STORE_ID: self.store.store_id})}
        found.update((c.id, c) for c in self.backend.find({CONTROLLER_RUNTIME_DIR: str(self.settings.runtime_dir)}))
        quarantined = self.store.quarantined()
        done = {a.target for a in self.actions if a.action == "remove-orphan-container"}  # by an earlier sweep
        now = time.time()
        unstarted = [
            (c, now - c.created_at)
            for c in found.values()
            if c.phase is Phase.CREATED
            and c.created_at is not None
            and now - c.created_at > grace
            and c.name not in done
            and c.labels.get(SESSION_ID, "") not in quarantined
        ]
        recorded = self.store.recorded_containers() if unstarted else {}
        for container, age in unstarted:
            if container.id in recorded:
                continue  # named by a record: that session's next call deals with it
            self._record(
                "remove-unstarted-container",
                container.name,
                f"created {describe_duration(age)} ago and never started",
                lambda c=container: self._discard(c),
            )

    def _discard(self, container: ContainerState) -> None:
        """Remove a container with its channel directory (in the runtime dir its controller label names, or ours)."""
        if container.labels.get(CONTROLLER_RUNTIME_DIR):
            discard.discard_left_behind(self.backend, container)
        else:
            discard.discard_sandbox(
                self.backend, self.settings.runtime_dir, container.labels.get(SANDBOX_ID), container.id
            )

    def _orphan_blobs(self, session_ids: list[str]) -> None:
        """Blobs no manifest names (the current one or a kept generation) and unfinished temp files, judged under each
        session's store lock.

        A session whose directories and record are unchanged since a prune found nothing there (``StoreIndex.clean``)
        is not locked nor listed again: a new file in either directory changes its modification time, and a new
        record is a new file in the session's directory.
        """
        for session_id in session_ids:
            if self._clean(session_id):
                continue
            try:
                with self.store.locked(session_id):
                    seen_at = time.time()
                    stamps = self._stamps(session_id)
                    meta, named = self._named_blobs(session_id, seen_at)
                    stray = self.store.stray_files(session_id, named)
                    if stray:  # what is deleted is decided on the record itself, not on the index
                        record, meta = self.store.read(session_id)
                        stray = self.store.stray_files(session_id, record.named_blobs())
                    if not stray:
                        if stamps is not None:
                            self.index.note_clean(session_id, meta, *stamps, seen_at)
                        continue
                    self._record(
                        "remove-orphan-blobs",
                        session_id,
                        f"{len(stray)} file(s) no checkpoint names",
                        lambda s=stray: [p.unlink(missing_ok=True) for p in s],
                        freed=sum(stray.values()),
                    )
            except (SessionNotFound, CheckpointError):
                continue  # gone, or unreadable: removed whole as an orphan record, not blob by blob
            except OrchestratorError as exc:
                self.actions.append(PruneAction("remove-orphan-blobs", session_id, "", ok=False, error=str(exc)))

    def _named_blobs(self, session_id: str, seen_at: float) -> tuple[os.stat_result, list[str]]:
        """The blobs the session's record names (its current manifest and kept generations), with the record's
        ``stat``: from the index when it holds the record as it is now, else read (call it holding the session's lock).
        Enough to find a session clean; what to delete is decided on the record itself.

        Raises:
            SessionNotFound: the session has no record.
            CheckpointError: its record is unreadable.
        """
        summary, meta, _ = self.index.lookup(session_id, self.store.session_path(session_id), seen_at)
        return meta, summary.blobs

    def _clean(self, session_id: str) -> bool:
        """Whether a prune found nothing to remove in the session's directories as they are (``StoreIndex.clean``)."""
        try:
            return self.index.clean(session_id, os.stat(self.store.session_path(session_id)))
        except OSError:
            return False

    def _stamps(self, session_id: str) -> tuple[os.stat_result, os.stat_result] | None:
        """``stat`` of the session's directory and of its ``blobs/`` (None if either is missing)."""
        directory = self.store.session_path(session_id)
        try:
            return os.stat(directory), os.stat(os.path.join(directory, "blobs"))
        except OSError:
            return None

    def _orphan_record_dirs(self, surveyed: set[str]) -> None:
        """Session directories without a record, older than ``ORPHAN_GRACE`` (a crashed create or delete); those the
        survey found a record in are not looked at again."""
        for directory in self.store.session_dirs(skip=surveyed):
            if os.path.exists(os.path.join(directory, "meta.json")) or self._younger_than(directory, ORPHAN_GRACE):
                continue
            self._remove_dir(directory, "a session directory without a record")
        for directory in self.store.unfinished_removals():
            if not self._younger_than(directory, ORPHAN_GRACE):
                self._remove_dir(directory, "a removal that did not finish")

    def _remove_dir(self, directory: Path, reason: str) -> None:
        self._record(
            "remove-orphan-record", str(directory), reason, lambda: shutil.rmtree(directory, ignore_errors=True)
        )

    def _dead_eval_runs(self) -> None:
        """Sandboxes of ``orchestrator eval`` runs on this host whose process is gone (killed before cleaning up)."""
        for container in left_behind(self.backend, "eval"):
            self._record(
                "remove-orphan-container",
                container.name,
                f"its eval run {container.labels.get(EVAL_RUN, '?')} ended without removing it",
                lambda c=container: discard.discard_left_behind(self.backend, c),
            )

    def _orphan_sandbox_dirs(self) -> None:
        """Channel directories in the runtime dir whose container is gone (in any store: the dir is shared)."""
        runtime_dir = self.settings.runtime_dir
        if not runtime_dir.is_dir():
            return
        live = {c.labels.get(SANDBOX_ID) for c in self.backend.find({})}
        grace = leftover_dir_grace(self.settings.timeouts.start)
        for entry in sorted(runtime_dir.iterdir()):
            if not is_sandbox_id(entry.name) or entry.name in live or self._younger_than(entry, grace):
                continue
            self._record(
                "remove-orphan-sandbox-dir",
                str(entry),
                "its container is gone",
                lambda path=entry: _discard_dir(runtime_dir, path),
            )

    # ---------------------------------------------------------------- helpers

    def _younger_than(self, path: Path, seconds: float) -> bool:
        try:
            return time.time() - os.lstat(path).st_mtime < seconds
        except OSError:
            return True

    def _record(self, action: str, target: str, reason: str, do: Any, freed: int = 0) -> None:
        """Do (unless dry run) and note one action; a failure is noted, not raised, and the prune goes on."""
        try:
            if not self.dry_run:
                do()
        except (OrchestratorError, OSError) as exc:
            entry = PruneAction(action, target, reason, ok=False, error=str(exc))
            logger.warning("prune: %s", entry.describe(self.dry_run))
        else:
            entry = PruneAction(action, target, reason, freed_bytes=freed)
            logger.info("prune: %s", entry.describe(self.dry_run))
        self.actions.append(entry)


def _discard_dir(runtime_dir: Path, path: Path) -> None:
    """Delete a gone sandbox's channel directory; one that stays (``discard_sandbox_dir`` only logs) is a failure."""
    discard_sandbox_dir(runtime_dir, path.name)
    if os.path.lexists(path):
        raise OSError(f"{path} could not be deleted (see the log)")


def _stale(info: SessionInfo, idle_for: float | None, older_than: float | None) -> str | None:
    """Why the session is stale under the criteria (all given ones must hold), or None."""
    if idle_for is None and older_than is None:
        return None
    reasons = []
    if idle_for is not None:
        if info.idle_seconds < idle_for:
            return None
        reasons.append(f"idle {describe_duration(info.idle_seconds)}")
    if older_than is not None:
        if info.age_seconds < older_than:
            return None
        reasons.append(f"created {describe_duration(info.age_seconds)} ago")
    return ", ".join(reasons)
