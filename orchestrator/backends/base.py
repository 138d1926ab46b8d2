"""What the controller needs from a container engine, as a protocol: ``DockerBackend`` and ``SwarmBackend`` are two.

Everything above this layer (sandboxes, sessions, the manager) speaks only these types, so another
engine (Kubernetes) can stand in without touching them. Labels are the engine's only memory of
what we created: every container carries ``orchestrator.managed``, the id of the store that owns
it (``orchestrator.store``), its sandbox id and, when it serves one, its session.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from ..checks import is_number
from ..config import Settings
from ..errors import ConfigError
from ..units import parse_size
from ..wire.endpoint import Endpoint

LABEL_PREFIX = "orchestrator."
MANAGED = LABEL_PREFIX + "managed"
STORE_ID = LABEL_PREFIX + "store"
SANDBOX_ID = LABEL_PREFIX + "sandbox-id"
SESSION_ID = LABEL_PREFIX + "session-id"
WORKER_UID = LABEL_PREFIX + "worker-uid"
"""The uid (and gid) the sandbox's worker runs as, one per live sandbox (``identity.py``)."""
SUPERVISOR_CAPABILITIES = ("SETUID", "SETGID", "SETPCAP", "KILL")
"""What the supervisor keeps when every other capability is dropped: SETUID and SETGID to start each worker as the
sandbox's uid with no groups, KILL to signal and kill that worker's process group, SETPCAP to empty the bounding
set that the worker inherits. The worker, another uid, holds none of them."""


@dataclass(frozen=True)
class ResourceUsage:
    """What a running container uses now, as its cgroup counts it (None: the engine does not say)."""

    memory_bytes: int | None = None
    cpu_seconds: float | None = None
    """CPU time its processes used since it started (all cores together); two readings give the live CPU share."""


class Phase(Enum):
    """Where a sandbox container is in its life, in our words: each backend translates its engine's into these, and
    nothing above this layer reads the engine's own words (``ContainerState.status``, for people)."""

    CREATED = "created"
    """Made and not started yet (a local container created but never started; a Swarm task on its way)."""
    RUNNING = "running"
    REMOVING = "removing"
    """On its way out (being removed; a Swarm task told to shut down): its end is not settled yet."""
    DEAD = "dead"
    """Its removal failed half-way: what is left only waits to be removed."""
    ENDED = "ended"
    """It stopped (or was lost with its machine) and will not start again by itself."""


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do that another may not: callers ask it here instead of testing which backend it is."""

    passes_descriptors: bool
    """Its sandboxes run on this host, so a file descriptor can be passed to their processes over a Unix socket
    (the local engine); a sandbox on another machine is reached only over a connection (Swarm)."""
    delivers_signals: bool
    """``kill`` delivers any signal to the sandbox's init (SIGUSR1: the agent reconnects, for a takeover); without
    it only SIGKILL is honoured, and opening an endpoint cuts the agent's connection instead."""


@dataclass(frozen=True)
class ContainerState:
    """What the engine says about one sandbox container."""

    id: str
    name: str
    status: str
    """The engine's own word for its state ("exited", a Swarm task's "rejected: ..."), for messages and listings."""
    phase: Phase
    running: bool
    exit_code: int | None
    oom_killed: bool
    labels: Mapping[str, str]
    node: str | None = None
    """The machine it runs on, for a backend that spreads sandboxes over several (the Swarm node's hostname)."""
    created_at: float | None = None
    """When the engine created it (Unix time), where the listing says; prune's grace for containers never started."""

    @property
    def ended(self) -> bool:
        """It ran and stopped: its exit code is known (a Swarm task still pending has none), it will not start
        again by itself."""
        return not self.running and self.exit_code is not None and self.phase is not Phase.CREATED

    def describe(self) -> str:
        """A sentence for error messages: how the container ended."""
        if self.oom_killed:
            return f"container {self.name} was killed for exceeding its memory limit"
        if self.running:
            return f"container {self.name} is still running"
        where = f" on node {self.node}" if self.node else ""
        return f"container {self.name}{where} is {self.status} (exit code {self.exit_code})"


@dataclass(frozen=True)
class ContainerUsage:
    """What the kernel counted for one container's cgroup since it started, read from outside the container (no
    process in it writes these numbers). None: not known."""

    cpu_ns: int | None
    """CPU time of every process it ran, user and system, in nanoseconds."""
    peak_memory: int | None
    """The most memory (bytes) its cgroup was charged at once: cgroup v1 ``memory.max_usage_in_bytes``, v2
    ``memory.peak``."""


@dataclass(frozen=True)
class Placement:
    """Where a session's sandboxes may run and what they reserve there; only a backend that places sandboxes on
    several machines takes one (``Backend.check_placement``).

    Constraints are in the backend's syntax, which it checks (Swarm's: ``node.labels.zone==eu``,
    ``node.role!=manager``, ``node.hostname==n1``, ...).
    """

    constraints: tuple[str, ...] = ()
    reserve_cpus: float | None = None
    """CPUs the node must have free for the sandbox (the scheduler counts reservations, not use)."""
    reserve_memory: str | None = None
    """Memory the node must have free ("512m")."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "constraints", tuple(self.constraints))
        for constraint in self.constraints:
            if not isinstance(constraint, str):
                raise ConfigError(f"a placement constraint must be a string, got {constraint!r}")
        if self.reserve_cpus is not None and not is_number(self.reserve_cpus):
            raise ConfigError(f"Placement.reserve_cpus must be a number of CPUs, got {self.reserve_cpus!r}")
        if self.reserve_cpus is not None and not self.reserve_cpus > 0:
            raise ConfigError(f"Placement.reserve_cpus must be > 0, got {self.reserve_cpus!r}")
        if self.reserve_memory is not None:
            parse_size(self.reserve_memory)

    def is_empty(self) -> bool:
        return not self.constraints and self.reserve_cpus is None and self.reserve_memory is None

    def to_json(self) -> dict[str, Any]:
        """What a session record keeps (``SessionRecord.placement``); empty for anywhere."""
        if self.is_empty():
            return {}
        return {
            "constraints": list(self.constraints),
            "reserve_cpus": self.reserve_cpus,
            "reserve_memory": self.reserve_memory,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Placement:
        return cls(tuple(data.get("constraints", ())), data.get("reserve_cpus"), data.get("reserve_memory"))


@dataclass(frozen=True)
class SandboxSpec:
    """Everything a backend needs to start one sandbox container; the security settings come from ``Settings``."""

    name: str
    image: str
    labels: Mapping[str, str]
    environment: Mapping[str, str] = field(default_factory=dict)
    mounts: Mapping[str, str] = field(default_factory=dict)
    """Host path -> container path, always mounted read-only."""
    command: tuple[str, ...] | None = None
    network_of: str | None = None
    """Join this container's network namespace (a loopback-only one, ``pool.NetworkSlots``) instead of a new one."""
    placement: Placement = field(default_factory=Placement)
    """The session's placement, plus the endpoint's own constraints (a relay's node)."""
    groups: tuple[int, ...] = ()
    """Supplementary groups of the container's user (the supervisor): the endpoint's ``groups()``."""


class Backend(Protocol):
    """A container engine, reduced to what sandboxes need."""

    capabilities: Capabilities

    def check_placement(self, placement: Placement) -> None:
        """Raises ConfigError for a placement this backend cannot honour (its constraints' syntax, or any placement
        on a backend that runs every sandbox on one machine), before anything is stored or started: the node choice
        is the backend's, so is what a placement may say."""
        ...

    def image_exists(self, tag: str) -> bool: ...

    def image_id(self, tag: str) -> str | None:
        """The image's id (``sha256:...``), or None when it does not exist."""
        ...

    def image_labels(self, tag: str) -> Mapping[str, str] | None:
        """The image's labels, or None when it does not exist."""
        ...

    def build_image(
        self, context_tar: bytes, tag: str, buildargs: Mapping[str, str], labels: Mapping[str, str]
    ) -> None: ...

    def create_endpoint(self, sandbox_id: str, settings: Settings, placement: Placement) -> Endpoint:
        """Make a new sandbox's channel endpoint (its directory, secret and listening socket) where it can reach it.

        A multi-node backend picks the node here, among those ``placement`` allows; the endpoint's
        ``constraints()`` then pin the sandbox there.
        """
        ...

    def open_endpoint(self, sandbox_id: str, container_id: str, settings: Settings) -> Endpoint:
        """Take over a live sandbox's endpoint; the agent is made to reconnect to it (``Sandbox.take_over``)."""
        ...

    def run_sandbox(self, spec: SandboxSpec, settings: Settings) -> str:
        """Start a hardened container for ``spec``; return its id."""
        ...

    def inspect(self, container_id: str) -> ContainerState | None:
        """The container's state, or None when it no longer exists."""
        ...

    def kill(self, container_id: str, signal: str = "SIGKILL") -> None:
        """Send the sandbox's init a signal; SIGKILL stops the sandbox. SIGUSR1 asks its agent to reconnect (takeover),
        sent only where ``capabilities.delivers_signals``: elsewhere opening the endpoint cut the agent's connection."""
        ...

    def remove(self, container_id: str) -> None:
        """Remove the container, running or not; a missing one is fine."""
        ...

    def find(self, labels: Mapping[str, str]) -> list[ContainerState]:
        """Our containers carrying all of ``labels``, running or not, in one engine call.

        ``oom_killed`` is not known from a listing (False); ``inspect`` one container for it.
        """
        ...

    def resource_usage(self, container_ids: Iterable[str]) -> dict[str, ResourceUsage]:
        """Memory and CPU time each running container uses now, for those the engine can tell quickly."""
        ...

    def usage(self, container_id: str) -> ContainerUsage | None:
        """Its CPU time and peak memory as the engine reads them from its cgroup (None: not known, or it is gone)."""
        ...

    def logs(self, container_id: str, tail: int | None) -> str:
        """The container's output (the agent's log), its last ``tail`` lines or all."""
        ...

    def close(self) -> None: ...
