"""All tunable defaults of the controller in one frozen dataclass, readable from ``ORCH_*`` variables."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError

DEFAULT_BASE_IMAGE = "python:3.12-slim"


def _default_state_dir() -> Path:
    root = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(root) / "orchestrator"


def _default_runtime_dir() -> Path:
    # Unix socket paths are limited to ~107 bytes, so sockets live under a short directory.
    return Path(tempfile.gettempdir()) / f"orchestrator-{os.getuid()}"


@dataclass(frozen=True)
class Settings:
    """Defaults for sessions; every security default is a named field a caller may loosen on purpose."""

    image: str | None = None
    """Sandbox image; None means the default image built from this package on ``base_image``."""
    base_image: str = DEFAULT_BASE_IMAGE
    """Base that ``orchestrator image build`` puts the agent on (needs ``python3`` on PATH)."""
    state_dir: Path = field(default_factory=_default_state_dir)
    """Host directory of session records and checkpoints (survives controller restarts)."""
    runtime_dir: Path = field(default_factory=_default_runtime_dir)
    """Host directory of per-session channel sockets, bind-mounted read-only into containers."""
    exec_timeout: float = 300.0
    """Seconds a cell may run when the call gives no timeout."""
    interrupt_grace: float = 2.0
    """Seconds a timed-out cell gets to stop after the interrupt before its worker is killed."""
    start_timeout: float = 30.0
    """Seconds to wait for a new container's agent to connect."""
    reply_margin: float = 10.0
    """Seconds beyond timeout + grace before the controller gives up on the agent and recycles the container."""
    frame_timeout: float = 10.0
    """Seconds the agent waits on a frame its worker started before it kills the worker (a stalled forgery)."""
    network_mode: str = "none"
    """Docker network mode; "none" keeps sandboxes off every network."""
    user: str = "65534:65534"
    """uid:gid the agent runs as (nobody)."""
    read_only: bool = True
    """Read-only root filesystem; writable paths come from ``tmpfs``."""
    tmpfs: Mapping[str, str] = field(default_factory=lambda: {"/tmp": "size=256m,mode=1777"})
    """Size-capped writable mounts."""
    cap_drop_all: bool = True
    """Drop every Linux capability."""
    no_new_privileges: bool = True
    """Forbid privilege gain through setuid binaries."""
    mem_limit: str = "1g"
    """Memory limit of the container (swap is disabled by setting the same memswap limit)."""
    nano_cpus: int = 1_000_000_000
    """CPU quota in billionths of a CPU (1e9 = one CPU)."""
    pids_limit: int = 256
    """Most processes and threads the container may have."""
    max_output_bytes: int = 1 << 20
    """Most bytes of stdout and of stderr kept per call; the rest is dropped with a marker."""
    max_header_bytes: int = 8 << 20
    """Largest JSON header accepted from an agent."""
    max_body_bytes: int = 1 << 30
    """Largest binary body (checkpoint delta) accepted from an agent."""
    fsync: bool = False
    """fsync checkpoint files; atomic renames already survive a controller crash, fsync adds power loss."""

    def __post_init__(self) -> None:
        for name in ("exec_timeout", "interrupt_grace", "start_timeout", "reply_margin", "frame_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"Settings.{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("pids_limit", "max_output_bytes", "max_header_bytes", "max_body_bytes", "nano_cpus"):
            if int(getattr(self, name)) <= 0:
                raise ConfigError(f"Settings.{name} must be a positive integer, got {getattr(self, name)!r}")
        object.__setattr__(self, "state_dir", Path(self.state_dir))
        object.__setattr__(self, "runtime_dir", Path(self.runtime_dir))

    def replace(self, **changes: object) -> Settings:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read ``ORCH_<FIELD>`` variables (upper-case field names) over the defaults.

        Raises:
            ConfigError: a variable has a value of the wrong type.
        """
        environ = os.environ if environ is None else environ
        defaults = cls()
        changes: dict[str, object] = {}
        for f in dataclasses.fields(cls):
            raw = environ.get(f"ORCH_{f.name.upper()}")
            if raw is None or f.name == "tmpfs":
                continue
            default = getattr(defaults, f.name)
            try:
                if isinstance(default, bool):
                    if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
                        raise ValueError(raw)
                    changes[f.name] = raw.lower() in ("1", "true", "yes")
                elif isinstance(default, int):
                    changes[f.name] = int(raw)
                elif isinstance(default, float):
                    changes[f.name] = float(raw)
                elif isinstance(default, Path):
                    changes[f.name] = Path(raw)
                else:
                    changes[f.name] = raw
            except ValueError:
                raise ConfigError(f"ORCH_{f.name.upper()}={raw!r} is not a valid {type(default).__name__}") from None
        return cls(**changes)  # type: ignore[arg-type]
