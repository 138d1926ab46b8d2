"""Prometheus metrics of one controller: their definitions, the recorder the code calls, and the server of ``/metrics``.

Each ``Orchestrator`` (and each janitor) that serves metrics has a ``Metrics`` of its own, on a registry of its own
(never the process's default one), so two in one process do not collide. Code that knows a fact calls one method of
its ``Recorder``; ``NO_METRICS``, the recorder of everything that serves none, does nothing, so metrics that are off
cost a method call that returns (and ``prometheus_client`` is imported only by a controller that serves them).
docs/metrics.md lists every metric; ``DEFINED`` is what it must list.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from .errors import ConfigError
from .metrics_http import MAX_CONNECTIONS, READ_TIMEOUT, BoundedServer, metrics_app

if TYPE_CHECKING:
    from prometheus_client import Counter, Gauge, Histogram
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)

SESSION_STATES = ("running", "busy", "hibernated", "broken")
"""The values of ``orchestrator_sessions``' ``state`` label (``ops.survey.SessionStatus``)."""

HOST_CALL_OUTCOMES = ("ok", "error", "refused", "expired")
"""The values of ``orchestrator_host_calls_total``'s ``outcome`` label."""

_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_BYTES = tuple(float(4**n) for n in range(5, 17))  # 1 KiB to 4 GiB, times 4


@dataclass(frozen=True)
class Definition:
    """One metric: its name as scraped (a counter's ends in ``_total``), type, labels and meaning (docs/metrics.md)."""

    name: str
    kind: str
    labels: tuple[str, ...]
    help: str


DEFINED = (
    Definition("orchestrator_sessions", "gauge", ("state",), "Sessions by state (running, busy, hibernated, broken)."),
    Definition(
        "orchestrator_call_duration_seconds",
        "histogram",
        ("request", "outcome"),
        "Seconds of each request to a session's sandbox, recovery included; outcome ok or the error's class.",
    ),
    Definition(
        "orchestrator_restore_duration_seconds",
        "histogram",
        ("cause",),
        "Seconds to restore a session's checkpoint into a sandbox, by what caused the restore.",
    ),
    Definition(
        "orchestrator_checkpoint_written_bytes_total",
        "counter",
        (),
        "Bytes of checkpoint values received from sandboxes and stored.",
    ),
    Definition(
        "orchestrator_checkpoint_bytes",
        "histogram",
        (),
        "Size in bytes of a session's whole stored checkpoint after each commit that changed it.",
    ),
    Definition(
        "orchestrator_host_calls_total",
        "counter",
        ("outcome",),
        "Host calls made from cells: ok, error (the handler raised) or refused (unknown, too large, too many).",
    ),
    Definition("orchestrator_pool_ready_sandboxes", "gauge", (), "Started sandboxes waiting in warm pools."),
    Definition(
        "orchestrator_pool_wait_seconds",
        "histogram",
        (),
        "Seconds a taker waited for a sandbox from a warm pool (or for its own start, in a pool of size 0).",
    ),
    Definition(
        "orchestrator_eval_results_total", "counter", ("outcome",), "Graded submissions by outcome (their status)."
    ),
    Definition(
        "orchestrator_janitor_passes_total",
        "counter",
        ("outcome",),
        "Janitor passes: ok, or failed (the pass could not run).",
    ),
    Definition(
        "orchestrator_janitor_actions_total",
        "counter",
        ("action", "ok"),
        "Janitor actions (remove, hibernate, ...) by result.",
    ),
)
"""Every metric a ``Metrics`` registers, in docs/metrics.md's order."""


class Recorder:
    """What the code tells the metrics; every method does nothing here (``NO_METRICS``), ``Metrics`` counts."""

    enabled = False

    def call(self, request: str, outcome: str, seconds: float) -> None:
        """A request to a session's sandbox ended (its recovery included)."""

    def restore(self, cause: str, seconds: float) -> None:
        """A checkpoint was restored into a sandbox."""

    def checkpoint(self, written: int, stored: int) -> None:
        """A commit stored ``written`` bytes of values; the session's checkpoint holds ``stored`` bytes now."""

    def host_call(self, outcome: str) -> None:
        """A host call was answered: "ok", "error" or "refused"."""

    def pool_ready(self, change: int) -> None:
        """Sandboxes waiting in a warm pool went up (+1) or down (-1)."""

    def pool_wait(self, seconds: float) -> None:
        """A taker got a sandbox from a warm pool after ``seconds``."""

    def eval_result(self, outcome: str) -> None:
        """A submission was graded."""


NO_METRICS = Recorder()
"""The recorder of whatever serves no metrics."""


class Metrics(Recorder):
    """The metrics of one controller on a registry of its own (``DEFINED``)."""

    enabled = True

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        made: dict[str, Any] = {}
        for d in DEFINED:
            if d.name == "orchestrator_sessions":
                continue  # a collector's (``watch_sessions``): counted when scraped
            kind = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}[d.kind]
            options: dict[str, Any] = {}
            if d.kind == "histogram":
                options["buckets"] = _BYTES if d.name.endswith("_bytes") else _SECONDS
            made[d.name] = kind(d.name, d.help, d.labels, registry=self.registry, **options)
        self._calls: Histogram = made["orchestrator_call_duration_seconds"]
        self._restores: Histogram = made["orchestrator_restore_duration_seconds"]
        self._written: Counter = made["orchestrator_checkpoint_written_bytes_total"]
        self._checkpoints: Histogram = made["orchestrator_checkpoint_bytes"]
        self._host_calls: Counter = made["orchestrator_host_calls_total"]
        self._pool_ready: Gauge = made["orchestrator_pool_ready_sandboxes"]
        self._pool_wait: Histogram = made["orchestrator_pool_wait_seconds"]
        self._eval: Counter = made["orchestrator_eval_results_total"]
        self.janitor_passes: Counter = made["orchestrator_janitor_passes_total"]
        self.janitor_actions: Counter = made["orchestrator_janitor_actions_total"]
        for outcome in HOST_CALL_OUTCOMES:  # a fixed set: there at 0 from the start, so a rate() of each is defined
            self._host_calls.labels(outcome)
        for outcome in ("ok", "failed"):
            self.janitor_passes.labels(outcome)

    def call(self, request: str, outcome: str, seconds: float) -> None:
        self._calls.labels(request, outcome).observe(seconds)

    def restore(self, cause: str, seconds: float) -> None:
        self._restores.labels(cause).observe(seconds)

    def checkpoint(self, written: int, stored: int) -> None:
        self._written.inc(written)
        self._checkpoints.observe(stored)

    def host_call(self, outcome: str) -> None:
        self._host_calls.labels(outcome).inc()

    def pool_ready(self, change: int) -> None:
        self._pool_ready.inc(change)

    def pool_wait(self, seconds: float) -> None:
        self._pool_wait.observe(seconds)

    def eval_result(self, outcome: str) -> None:
        self._eval.labels(outcome).inc()

    def watch_sessions(self, count: Callable[[], Iterable[str]]) -> None:
        """Serve ``orchestrator_sessions`` from ``count``, called at each scrape: one state per session."""
        self.registry.register(cast("Collector", _SessionStates(count)))


class _SessionStates:
    """``orchestrator_sessions`` counted when scraped (a state every session has now, not a running total)."""

    def __init__(self, count: Callable[[], Iterable[str]]) -> None:
        self._count = count

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily("orchestrator_sessions", DEFINED[0].help, labels=["state"])
        states = dict.fromkeys(SESSION_STATES, 0)
        try:
            for state in self._count():
                states[state] = states.get(state, 0) + 1
        except Exception as exc:  # a scrape reports what it can; the store or engine failing is logged, not raised
            logger.warning("metrics: sessions could not be counted: %s: %s", type(exc).__name__, exc)
            return
        for state, value in states.items():
            family.add_metric([state], value)
        yield family

    def describe(self) -> list[GaugeMetricFamily]:
        from prometheus_client.core import GaugeMetricFamily

        return [GaugeMetricFamily("orchestrator_sessions", DEFINED[0].help, labels=["state"])]


def parse_address(text: str) -> tuple[str, int]:
    """``(host, port)`` from "PORT" (on loopback), "HOST:PORT" or "[IPv6]:PORT"; port 0 takes a free one.

    Raises:
        ConfigError: not an address to serve on.
    """
    if not isinstance(text, str):
        raise ConfigError(f"{text!r} is not an address to serve metrics on: use PORT, HOST:PORT or [::1]:PORT")
    given, _, port = text.strip().rpartition(":")
    bracketed = given.startswith("[") and given.endswith("]")
    host = given[1:-1] if bracketed else given
    plain_host = not bracketed and not any(c in host for c in ":[]")
    if not (port.isdigit() and int(port) < 65536 and (plain_host or (":" in host and _is_ip(host)))):
        raise ConfigError(
            f"{text!r} is not an address to serve metrics on: use PORT (loopback), HOST:PORT or [::1]:PORT"
        )
    return host or "127.0.0.1", int(port)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class MetricsServer:
    """``/metrics`` of one registry over HTTP, on a thread of its own, until ``close``; bounded in connections and
    time (``metrics_http``), behind ``token`` when one is given."""

    def __init__(
        self,
        metrics: Metrics,
        address: str,
        token: str | None = None,
        *,
        max_connections: int = MAX_CONNECTIONS,
        timeout: float = READ_TIMEOUT,
    ) -> None:
        """Start serving at ``address`` (``parse_address``); ``token``: what ``Authorization: Bearer`` must carry.

        Raises:
            ConfigError: the address is invalid, or cannot be bound (in use, not this machine's).
        """
        host, port = parse_address(address)
        app = metrics_app(metrics.registry, token)
        try:
            self._server = BoundedServer(host, port, app, cap=max_connections, timeout=timeout)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {address!r}: {exc}") from None
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)
        self._thread.start()
        self._closed = threading.Lock()
        logger.info("serving metrics on http://%s/metrics", self.address)

    @property
    def address(self) -> str:
        """Where it listens, as HOST:PORT (the port it got when asked for port 0)."""
        bound = self._server.server_address
        host, port = str(bound[0]), int(bound[1])
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def close(self) -> None:
        """Stop serving (idempotent)."""
        if self._closed.acquire(blocking=False):
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
