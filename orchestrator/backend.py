"""What the controller needs from a container engine, as a protocol: ``DockerBackend`` is the first one.

Everything above this line (sandboxes, sessions, the manager) speaks only these types, so a
Swarm or Kubernetes backend can stand in without touching them. Labels are the engine's only
memory of what we created: every container carries ``orchestrator.managed``, the id of the
store that owns it (``orchestrator.store``), its sandbox id and, when it serves one, its session.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from .config import Settings

LABEL_PREFIX = "orchestrator."
MANAGED = LABEL_PREFIX + "managed"
STORE_ID = LABEL_PREFIX + "store"
SANDBOX_ID = LABEL_PREFIX + "sandbox-id"
SESSION_ID = LABEL_PREFIX + "session-id"


@dataclass(frozen=True)
class ContainerState:
    """What the engine says about one sandbox container."""

    id: str
    name: str
    status: str
    running: bool
    exit_code: int | None
    oom_killed: bool
    labels: Mapping[str, str]

    def describe(self) -> str:
        """A sentence for error messages: how the container ended."""
        if self.oom_killed:
            return f"container {self.name} was killed for exceeding its memory limit"
        if self.running:
            return f"container {self.name} is still running"
        return f"container {self.name} is {self.status} (exit code {self.exit_code})"


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


class Backend(Protocol):
    """A container engine, reduced to what sandboxes need."""

    def image_exists(self, tag: str) -> bool: ...

    def image_id(self, tag: str) -> str | None:
        """The image's id (``sha256:...``), or None when it does not exist."""
        ...

    def build_image(
        self, context_tar: bytes, tag: str, buildargs: Mapping[str, str], labels: Mapping[str, str]
    ) -> None: ...

    def run_sandbox(self, spec: SandboxSpec, settings: Settings) -> str:
        """Start a hardened container for ``spec``; return its id."""
        ...

    def inspect(self, container_id: str) -> ContainerState | None:
        """The container's state, or None when it no longer exists."""
        ...

    def kill(self, container_id: str, signal: str = "SIGKILL") -> None: ...

    def remove(self, container_id: str) -> None:
        """Remove the container, running or not; a missing one is fine."""
        ...

    def find(self, labels: Mapping[str, str]) -> list[ContainerState]:
        """Our containers carrying all of ``labels``, running or not, in one engine call.

        ``oom_killed`` is not known from a listing (False); ``inspect`` one container for it.
        """
        ...

    def memory_usage(self, container_ids: Iterable[str]) -> dict[str, int]:
        """Bytes of memory each running container uses now, for those the engine can tell quickly."""
        ...

    def logs(self, container_id: str, tail: int | None) -> str:
        """The container's output (the agent's log), its last ``tail`` lines or all."""
        ...

    def close(self) -> None: ...
