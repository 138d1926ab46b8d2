"""The janitor: prunes the sessions of one store on an interval, until SIGTERM (the compose service).

Each pass hibernates sessions idle past ``hibernate_after`` (when set), then removes those that
meet the removal criteria (``--idle``, ``--older-than``); every prune also cleans up orphans,
so a janitor with no criterion at all still reaps what crashed controllers left behind. It logs
one line per action and touches a heartbeat file after every good pass, which ``--health``
(the container's healthcheck) reads: a janitor that cannot reach the engine turns unhealthy
instead of dying, and comes back by itself when the engine does. With ``--metrics`` it serves
Prometheus metrics: its passes and actions, and the store's sessions by state as its last pass
saw them (docs/metrics.md).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from ..backends.base import Backend
from ..config import Settings
from ..errors import ConfigError
from ..files import replace_file
from ..metrics import Metrics, MetricsServer
from ..safe_text import log_to_stderr
from ..state.store import SessionStore
from ..units import describe_duration, optional_duration_argument, positive_duration_argument
from .connect import connect_engine, open_store
from .images import write_janitor_context
from .prune import PruneAction, Pruner, PruneReport
from .survey import survey

logger = logging.getLogger(__name__)

DEFAULT_INTERVAL = 60.0
DEFAULT_HEARTBEAT = Path("/tmp/orchestrator-janitor.heartbeat")
HEALTHY_WITHIN = 3
"""Intervals the heartbeat may be old before ``--health`` calls the janitor unhealthy."""
_PAST = {"remove": "removed", "hibernate": "hibernated", "skip": "skipped", "quarantine": "quarantined"}


class Janitor:
    """The pruning loop over one store (``run`` builds it from the command line)."""

    def __init__(
        self,
        settings: Settings,
        *,
        interval: float = DEFAULT_INTERVAL,
        idle_for: float | None = None,
        older_than: float | None = None,
        hibernate_after: float | None = None,
        heartbeat: Path = DEFAULT_HEARTBEAT,
        metrics_address: str | None = None,
    ) -> None:
        """``metrics_address``: where to serve ``/metrics`` (``Settings.metrics_address``'s forms, behind
        ``settings.metrics_token``), or None.

        Raises:
            ConfigError: the interval is not positive, or the metrics address cannot be served on.
        """
        if not interval > 0:
            raise ConfigError(f"the janitor's interval must be more than 0 seconds, got {interval!r}")
        self.settings = settings
        self.interval = interval
        self.idle_for = idle_for
        self.older_than = older_than
        self.hibernate_after = hibernate_after
        self.heartbeat = Path(heartbeat)
        self._engine: tuple[SessionStore, Backend] | None = None
        self.metrics: Metrics | None = None
        self._metrics_server: MetricsServer | None = None
        self._states: list[str] = []
        """Each session's state as the last pass's survey saw it (``orchestrator_sessions``)."""
        if metrics_address is not None:
            self.metrics = Metrics()
            self.metrics.watch_sessions(lambda: self._states)
            self._metrics_server = MetricsServer(self.metrics, metrics_address, settings.metrics_token)

    @property
    def metrics_address(self) -> str | None:
        """Where it serves ``/metrics`` (HOST:PORT), or None."""
        return None if self._metrics_server is None else self._metrics_server.address

    def run_pass(self) -> list[PruneAction]:
        """One pass: hibernate, then remove; log each action and a summary; return the actions.

        Raises:
            OrchestratorError: the pass could not run (no engine, unreadable store). Failed actions
                are not raised: they are in the list, with ``ok`` False.
        """
        started = time.monotonic()
        if self._engine is None:  # made here, not at start: the engine may come up after the janitor
            store = open_store(self.settings)
            self._engine = store, connect_engine(self.settings, store)
        store, backend = self._engine
        actions: list[PruneAction] = []
        if self.hibernate_after is not None:
            actions += self._log(self._prune(store, backend, self.hibernate_after, None, hibernate_only=True))
        # With no removal criterion no session is stale: this prune then only reaps orphans.
        actions += self._log(self._prune(store, backend, self.idle_for, self.older_than, hibernate_only=False))
        if self.metrics is not None:
            self._states = [info.status.value for info in survey(store, backend, now=time.time())]
        if actions:
            logger.info("pass %s (%.1f s)", PruneReport(actions, dry_run=False).summary(), time.monotonic() - started)
        return actions

    def _prune(
        self,
        store: SessionStore,
        backend: Backend,
        idle_for: float | None,
        older_than: float | None,
        *,
        hibernate_only: bool,
    ) -> list[PruneAction]:
        return (
            Pruner(store, backend, self.settings, dry_run=False, now=time.time())
            .run(idle_for, older_than, hibernate_only)
            .actions
        )

    def serve(self, stop: threading.Event, *, once: bool = False) -> int:
        """Run passes every ``interval`` until ``stop`` is set (after the pass under way), or one with ``once``.

        Returns:
            The exit status: 0, or with ``once`` 1 when the pass failed or any action did.
        """
        logger.info(
            "janitor started: every %s; idle %s, older than %s, hibernate after %s; state %s",
            _seconds(self.interval),
            _seconds(self.idle_for),
            _seconds(self.older_than),
            _seconds(self.hibernate_after),
            self.settings.state_dir,
        )
        self._beat()
        status = 0
        try:
            while True:
                try:
                    actions = self.run_pass()
                except Exception as exc:  # the engine is down, the store unreadable, a bug: try again next time
                    logger.error("pass failed: %s: %s", type(exc).__name__, exc)
                    logger.debug("pass failed", exc_info=True)
                    status = 1
                    if self.metrics is not None:
                        self.metrics.janitor_passes.labels("failed").inc()
                else:
                    self._beat()
                    status = 1 if any(not a.ok for a in actions) else 0
                    if self.metrics is not None:
                        self.metrics.janitor_passes.labels("ok").inc()
                if once or stop.wait(self.interval):
                    break
        finally:
            self.close()
        return status if once else 0

    def close(self) -> None:
        """Close the engine client (the janitor holds no session) and stop serving metrics."""
        if self._metrics_server is not None:
            self._metrics_server.close()
        if self._engine is not None:
            self._engine[1].close()
            self._engine = None

    def _beat(self) -> None:
        """Touch the heartbeat atomically; it holds the interval, so ``--health`` needs no options."""
        try:
            replace_file(self.heartbeat, f"{self.interval}\n".encode())
        except OSError as exc:
            logger.error("cannot write the heartbeat %s: %s", self.heartbeat, exc)

    def _log(self, actions: list[PruneAction]) -> list[PruneAction]:
        for action in actions:
            logger.log(logging.INFO if action.ok else logging.WARNING, "%s", _line(action), extra=_about(action))
            if self.metrics is not None:
                self.metrics.janitor_actions.labels(action.action, "true" if action.ok else "false").inc()
        return actions


def _about(action: PruneAction) -> dict[str, str]:
    """The session a logged action is about, for ``--log-json`` (its target, when that is a session)."""
    return {"session_id": action.target} if action.action in ("remove", "hibernate", "skip") else {}


def _verb(action: str) -> str:
    """``removed``, ``hibernated``, ``skipped``, ``removed orphan container`` ..."""
    first, _, rest = action.partition("-")
    return " ".join(filter(None, (_PAST.get(first, first), rest.replace("-", " "))))


def _line(action: PruneAction) -> str:
    """``removed s1234 (idle 31m, created 2h ago)``; a failure says so, with the error."""
    if action.ok:
        return f"{_verb(action.action)} {action.target} ({action.reason})"
    return f"failed: {action.action.replace('-', ' ')} {action.target} ({action.reason}): {action.error}"


def _seconds(value: float | None) -> str:
    return "off" if value is None else describe_duration(value)


def health(heartbeat: Path, interval: float) -> tuple[bool, str]:
    """Whether a janitor touched ``heartbeat`` within ``HEALTHY_WITHIN`` intervals, and one line saying so.

    The interval is the one the janitor wrote into the file (``interval`` when it is unreadable).
    """
    try:
        age = time.time() - heartbeat.stat().st_mtime
    except OSError:
        return False, f"unhealthy: no heartbeat at {heartbeat}"
    with contextlib.suppress(OSError, ValueError):
        interval = float(heartbeat.read_text().strip())
    limit = HEALTHY_WITHIN * interval
    if age > limit:
        return False, f"unhealthy: last good pass {age:.0f} s ago (limit {limit:g} s)"
    return True, f"healthy: last good pass {age:.0f} s ago"


def compose_environment(settings: Settings) -> dict[str, str]:
    """The variables ``compose/docker-compose.yml`` needs for this user's store and engine."""
    socket = "/var/run/docker.sock"
    docker_host = os.environ.get("DOCKER_HOST", "")
    if docker_host.startswith("unix://"):
        socket = docker_host[len("unix://") :]
    env = {
        "ORCH_STATE_DIR": str(Path(settings.state_dir).absolute()),
        "ORCH_RUNTIME_DIR": str(Path(settings.runtime_dir).absolute()),
        "ORCH_BASE_IMAGE": settings.base_image,
        "ORCH_UID": str(os.geteuid()),
        "ORCH_GID": str(os.getegid()),
        "ORCH_DOCKER_SOCKET": socket,
    }
    with contextlib.suppress(OSError):
        env["ORCH_DOCKER_GID"] = str(os.stat(socket).st_gid)  # so a non-root janitor may use the socket
    return env


@contextlib.contextmanager
def _stopping_on_signals(stop: threading.Event) -> Iterator[list[str]]:
    """SIGTERM and SIGINT set ``stop`` (the loop ends after its pass) instead of killing the process mid-prune.

    Yields the names of the signals received. The handler only sets the event: logging from a signal
    handler could interrupt a log line being written.
    """
    received: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def handle(signum: int, frame: FrameType | None) -> None:
        received.append(signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The janitor's options, on the parser of ``orchestrator janitor``."""
    parser.add_argument(
        "--interval",
        type=positive_duration_argument,
        default=DEFAULT_INTERVAL,
        metavar="D",
        help="time between passes (default 60s)",
    )
    parser.add_argument(
        "--idle", type=optional_duration_argument, metavar="D", help="remove sessions without a call for D (30m, 1d)"
    )
    parser.add_argument(
        "--older-than", type=optional_duration_argument, metavar="D", help="remove sessions created more than D ago"
    )
    parser.add_argument(
        "--hibernate-after",
        type=optional_duration_argument,
        metavar="D",
        help="hibernate sessions without a call for D (default: ORCH_HIBERNATE_AFTER, else off)",
    )
    parser.add_argument(
        "--heartbeat",
        type=Path,
        default=DEFAULT_HEARTBEAT,
        metavar="PATH",
        help=f"file touched after every good pass (default {DEFAULT_HEARTBEAT})",
    )
    parser.add_argument(
        "--metrics",
        metavar="ADDRESS",
        help="serve Prometheus metrics on ADDRESS: PORT (loopback), HOST:PORT or [::1]:PORT "
        "(default: ORCH_METRICS_ADDRESS, else none; docs/metrics.md)",
    )
    parser.add_argument(
        "--log-json", action="store_true", default=argparse.SUPPRESS, help="log one JSON object per line"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="one pass, then exit: 1 if it or any action failed")
    mode.add_argument(
        "--health",
        action="store_true",
        help=f"exit 0 if a janitor touched the heartbeat within {HEALTHY_WITHIN} intervals, else 1 (the healthcheck)",
    )
    mode.add_argument(
        "--write-context",
        type=Path,
        metavar="DIR",
        help="write the janitor image's packages into DIR/site (DIR: compose/janitor), then exit",
    )
    mode.add_argument(
        "--print-env",
        action="store_true",
        help="print `export` lines of the variables compose/docker-compose.yml needs for this store, then exit",
    )


def run(args: argparse.Namespace) -> int:
    """Run ``orchestrator janitor`` with parsed ``args``; return the exit status."""
    if args.health:
        healthy, line = health(args.heartbeat, args.interval)
        print(line)
        return 0 if healthy else 1
    try:
        if args.write_context is not None:
            print(write_janitor_context(args.write_context))
            return 0
        settings = Settings.from_env()
        if args.print_env:
            for name, value in compose_environment(settings).items():
                print(f"export {name}={shlex.quote(value)}")
            return 0
        janitor = Janitor(
            settings,
            interval=args.interval,
            idle_for=args.idle,
            older_than=args.older_than,
            hibernate_after=settings.capacity.hibernate_after if args.hibernate_after is None else args.hibernate_after,
            heartbeat=args.heartbeat,
            metrics_address=settings.metrics_address if args.metrics is None else args.metrics,
        )
    except ConfigError as exc:
        print(f"orchestrator: ConfigError: {exc}", file=sys.stderr)
        return 2
    # The janitor logs one line per action itself; prune's own lines would repeat them.
    log_to_stderr(logging.WARNING, as_json=getattr(args, "log_json", False))
    logger.setLevel(logging.DEBUG if getattr(args, "verbose", False) else logging.INFO)
    logging.getLogger("orchestrator.ops.prune").setLevel(logging.ERROR)
    stop = threading.Event()
    with _stopping_on_signals(stop) as received:
        status = janitor.serve(stop, once=args.once)
    logger.info("janitor stopped%s", f" ({received[0]})" if received else "")
    return status
