"""All tunable defaults of the controller in one frozen dataclass, readable from ``ORCH_*`` variables."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shlex
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .agent.confinement import MAX_WORKER_UID
from .errors import ConfigError

DEFAULT_BASE_IMAGE = "python:3.12-slim"
DEFAULTS_FILE = "defaults.json"
"""Under the state dir: what set-up chose (the base image), for every later ``Settings.from_env()``."""
CAPACITY_POLICIES = ("hibernate", "refuse")
BACKENDS = ("docker", "swarm")
_MEMORY = re.compile(r"^\s*(\d+)\s*([kmg]?)b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_UID_RANGE = re.compile(r"^\s*(\d{1,10})\s*-\s*(\d{1,10})\s*$")


def parse_memory(text: str | int) -> int:
    """Bytes in a Docker-style size ("512m", "1g", "2048").

    Raises:
        ConfigError: not a size.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    match = _MEMORY.match(str(text))
    if not match:
        raise ConfigError(f"{text!r} is not a size: use bytes or a number with k, m or g (e.g. 512m)")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def parse_duration(text: str | float) -> float:
    """Seconds in a duration: "90", "30s", "30m", "24h", "7d", or combined like "1h30m".

    Raises:
        ConfigError: not a duration, or negative.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        spelled = str(text).strip().lower()
        try:
            seconds = float(spelled)
        except ValueError:
            parts = _DURATION.findall(spelled)
            if not parts or _DURATION.sub("", spelled).strip():
                raise ConfigError(
                    f"{text!r} is not a duration: use seconds or a number with s, m, h or d (e.g. 30m, 1h30m)"
                ) from None
            seconds = sum(float(number) * _SECONDS[unit] for number, unit in parts)
    if not seconds >= 0:
        raise ConfigError(f"a duration must not be negative, got {text!r}")
    return seconds


def parse_uid_range(text: str) -> tuple[int, int]:
    """``(low, high)`` from "low-high" (both included).

    Raises:
        ConfigError: not two numbers joined by a dash.
    """
    match = _UID_RANGE.match(text)
    if not match:
        raise ConfigError(f"{text!r} is not a range of uids: use low-high, e.g. 2000000000-2099999999")
    return int(match.group(1)), int(match.group(2))


def save_default_base_image(state_dir: Path, base_image: str) -> Path:
    """Record ``base_image`` as the default of every later ``Settings.from_env()`` on this state dir.

    Set-up (``orchestrator image build --make-default``) calls it, so a new shell needs no
    ``ORCH_BASE_IMAGE``; the variable still overrides it. Returns the file written.
    """
    path = Path(state_dir) / DEFAULTS_FILE
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{DEFAULTS_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps({"base_image": base_image}, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def _recorded_defaults(state_dir: Path) -> dict[str, str]:
    """What set-up recorded (an unreadable or foreign file counts as nothing recorded)."""
    try:
        data = json.loads((state_dir / DEFAULTS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if k == "base_image" and isinstance(v, str) and v}


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
    checkpoint_timeout: float = 60.0
    """Seconds a call's checkpoint may take after its cell ended; apart from (not part of) the cell's timeout."""
    restore_value_timeout: float = 30.0
    """Seconds one value may take to unpickle during a restore before it is skipped (and named)."""
    checkpoint_quota: int | None = None
    """Most bytes a session's stored checkpoint may hold; None means 4 x ``mem_limit``. Values past it are unsaved."""
    lock_timeout: float = 30.0
    """Seconds to wait for a session's store lock held by another process before ``SessionBusy``."""
    agent_command: tuple[str, ...] | None = None
    """Command that starts the agent in the container; None runs the image's CMD. ``ORCH_AGENT_COMMAND`` is split
    like a shell line."""
    network_mode: str = "none"
    """Docker network mode; "none" keeps sandboxes off every network."""
    user: str = "0:0"
    """uid:gid the container starts as: the agent's supervisor. Root (the default) holds only the capabilities of
    ``backend.SUPERVISOR_CAPABILITIES`` (with ``cap_drop_all``), enough to start each worker as the sandbox's own uid
    from ``worker_uids`` with no capability at all and to signal it, so no cell can reach the supervisor
    (docs/identity.md). A non-root user here runs the worker as that same user, within the cell's reach: a
    loosening."""
    worker_uids: tuple[int, int] = (2_000_000_000, 2_099_999_999)
    """The uids (both ends included) a sandbox's worker uid is drawn from, at random and never one a live sandbox
    of this engine holds (its label ``orchestrator.worker-uid``); its gid is the same number. They need no entry in
    /etc/passwd and no user namespace; the default lies where no convention puts users or containers (systemd's
    container ranges end at 1879048191). ``ORCH_WORKER_UIDS`` takes ``low-high`` (docs/identity.md)."""
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
    """Most bytes of stdout and of stderr a result holds per call; past it the result holds a head-and-tail preview
    and the whole stream is kept in a file (``ExecResult.stdout_path``)."""
    max_output_file_bytes: int = 100 << 20
    """Most bytes of one stream of one call kept in its file on the host; the rest is counted and dropped."""
    max_output_files: int = 64
    """Output files kept per session (under its state directory); the oldest go first. Removed with the session."""
    input_timeout: float = 300.0
    """Seconds a cell's ``input()`` waits for an answer before it raises ``EOFError`` (not counted as cell time)."""
    max_host_calls_per_cell: int = 64
    """Host calls (``llm_query`` ...) of one cell waiting or running at once; more are refused at once with an error
    in the sandbox. ``HostCalls.max_concurrent`` says how many of them run."""
    max_host_calls_per_session: int = 128
    """Host calls of one session waiting or running at once, across its cells (a handler still running after its
    cell ended counts until it returns), and the most threads its handlers get; more are refused at once."""
    max_header_bytes: int = 8 << 20
    """Largest JSON header accepted from an agent."""
    max_body_bytes: int = 1 << 30
    """Largest binary body (checkpoint delta) accepted from an agent."""
    fsync: bool = False
    """fsync checkpoint files and their directories; atomic renames already survive a controller crash, fsync adds
    power loss."""
    hibernate_after: float | None = None
    """Seconds without a call after which a session gives up its container (kept: its checkpoint); None is off.
    Applied by the ``Orchestrator`` to the sessions it holds and by the janitor to every session of the store.
    ``ORCH_HIBERNATE_AFTER`` takes durations like 10m."""
    max_running: int | None = None
    """Most sessions of this store with a running container; None is no cap. See ``capacity_policy``."""
    capacity_policy: str = "hibernate"
    """At ``max_running``: "hibernate" the least recently used idle session to make room, or "refuse" with
    ``CapacityExceeded``."""
    pool_size: int = 0
    """Sandboxes of the default image kept started ahead, so a new session (or one whose container died) gets one
    at once; refilled in the background, each handed out once. 0 is off. The pool starts with the first session
    this ``Orchestrator`` starts and its spare containers go when it closes."""
    backend: str = "docker"
    """Where sandboxes run: "docker", containers on the engine DOCKER_HOST names; "swarm", one-replica services
    spread over the nodes of the Swarm whose manager DOCKER_HOST names, reached through a relay on each node
    (docs/swarm.md)."""
    swarm_node_dir: Path = Path("/var/lib/orchestrator-relay")
    """Swarm: the directory on every node where its relay keeps the sandboxes' channel directories (must exist on
    each node; the relay's bind mount)."""
    swarm_relay_port: int = 7443
    """Swarm: the TCP port each node's relay listens on (mutual TLS), on the node's address."""
    swarm_constraints: tuple[str, ...] = ()
    """Swarm: placement constraints for every session's sandbox (``node.labels.pool==agents``);
    ``ORCH_SWARM_CONSTRAINTS`` separates them by commas. A session can add its own (``Placement``)."""

    @property
    def sandbox_uid_gid(self) -> tuple[int | None, int | None]:
        """The numeric uid and gid the container (its supervisor) runs as, when ``user`` gives them."""
        user, _, group = self.user.partition(":")
        uid = int(user) if user.isdigit() else None
        gid = int(group) if group.isdigit() else uid
        return uid, gid

    def __post_init__(self) -> None:
        for name in (
            "exec_timeout",
            "interrupt_grace",
            "start_timeout",
            "reply_margin",
            "frame_timeout",
            "checkpoint_timeout",
            "restore_value_timeout",
            "lock_timeout",
            "input_timeout",
        ):
            if not 0 < getattr(self, name) < math.inf:  # every wait has a finite deadline (NaN fails too)
                raise ConfigError(f"Settings.{name} must be a finite number > 0, got {getattr(self, name)!r}")
        for name in (
            "pids_limit",
            "max_output_bytes",
            "max_output_file_bytes",
            "max_output_files",
            "max_header_bytes",
            "max_body_bytes",
            "nano_cpus",
            "max_host_calls_per_cell",
            "max_host_calls_per_session",
        ):
            if int(getattr(self, name)) <= 0:
                raise ConfigError(f"Settings.{name} must be a positive integer, got {getattr(self, name)!r}")
        self._check_worker_uids()
        self._check_user()
        if self.checkpoint_quota is not None and int(self.checkpoint_quota) <= 0:
            raise ConfigError(
                f"Settings.checkpoint_quota must be a positive number of bytes, got {self.checkpoint_quota!r}"
            )
        parse_memory(self.mem_limit)
        if self.hibernate_after is not None:
            if isinstance(self.hibernate_after, str):
                object.__setattr__(self, "hibernate_after", parse_duration(self.hibernate_after))
            if not float(self.hibernate_after) > 0:
                raise ConfigError(f"Settings.hibernate_after must be > 0 seconds or None, got {self.hibernate_after!r}")
        if self.max_running is not None and (
            not isinstance(self.max_running, int) or isinstance(self.max_running, bool) or self.max_running <= 0
        ):
            raise ConfigError(f"Settings.max_running must be a positive integer or None, got {self.max_running!r}")
        if not isinstance(self.pool_size, int) or isinstance(self.pool_size, bool) or self.pool_size < 0:
            raise ConfigError(f"Settings.pool_size must be a non-negative integer, got {self.pool_size!r}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"Settings.backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if not isinstance(self.swarm_relay_port, int) or not 0 < self.swarm_relay_port < 65536:
            raise ConfigError(f"Settings.swarm_relay_port must be a TCP port number, got {self.swarm_relay_port!r}")
        object.__setattr__(self, "swarm_constraints", tuple(self.swarm_constraints))
        if not all(isinstance(c, str) and c.strip() for c in self.swarm_constraints):
            raise ConfigError(f"Settings.swarm_constraints must be non-empty strings, got {self.swarm_constraints!r}")
        if self.capacity_policy not in CAPACITY_POLICIES:
            raise ConfigError(
                f"Settings.capacity_policy must be one of {', '.join(CAPACITY_POLICIES)}, got {self.capacity_policy!r}"
            )
        if self.agent_command is not None:
            command = tuple(self.agent_command)
            if not command or not all(isinstance(part, str) and part for part in command):
                raise ConfigError(f"Settings.agent_command must be non-empty strings, got {self.agent_command!r}")
            object.__setattr__(self, "agent_command", command)
        object.__setattr__(self, "state_dir", Path(self.state_dir))
        object.__setattr__(self, "runtime_dir", Path(self.runtime_dir))
        object.__setattr__(self, "swarm_node_dir", Path(self.swarm_node_dir))
        if not self.swarm_node_dir.is_absolute():
            raise ConfigError(f"Settings.swarm_node_dir must be an absolute path, got {str(self.swarm_node_dir)!r}")

    def _check_user(self) -> None:
        """A non-root container user must be numeric: the sandbox's channel files are handed to its uid (or, under a
        non-root controller, opened through our group), and a user name's uid is known only to the image."""
        user = self.user.partition(":")[0]
        if user != "root" and not user.isdigit():
            raise ConfigError(
                f"Settings.user must be 'root', '0:0' or a numeric 'uid:gid', got {self.user!r}: the sandbox's "
                "secret and socket are handed to that uid, which a name does not give (ORCH_USER)"
            )

    def _check_worker_uids(self) -> None:
        uids = tuple(self.worker_uids)
        if len(uids) != 2 or not all(isinstance(uid, int) and not isinstance(uid, bool) for uid in uids):
            raise ConfigError(f"Settings.worker_uids must be two integers (low, high), got {self.worker_uids!r}")
        low, high = uids
        if not 0 < low <= high <= MAX_WORKER_UID:
            raise ConfigError(
                f"Settings.worker_uids must be a range of uids with 0 < low <= high <= {MAX_WORKER_UID}, got "
                f"{self.worker_uids!r}"
            )
        object.__setattr__(self, "worker_uids", uids)

    @property
    def separate_worker(self) -> bool:
        """Whether each worker runs as a uid of its own (the container starts as root, which can switch to it)."""
        return self.user.partition(":")[0] in ("0", "root")

    @property
    def checkpoint_quota_bytes(self) -> int:
        """The checkpoint quota in bytes (the default follows the memory limit)."""
        if self.checkpoint_quota is not None:
            return int(self.checkpoint_quota)
        return 4 * parse_memory(self.mem_limit)

    def replace(self, **changes: object) -> Settings:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read ``ORCH_<FIELD>`` variables (upper-case field names) over the defaults.

        Without ``ORCH_BASE_IMAGE`` (and ``ORCH_IMAGE``), the base image set-up recorded in the
        state dir is used (``save_default_base_image``).

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
                if f.name == "agent_command":
                    changes[f.name] = tuple(shlex.split(raw)) or None
                elif f.name == "checkpoint_quota":
                    changes[f.name] = parse_memory(raw)
                elif f.name == "hibernate_after":
                    changes[f.name] = parse_duration(raw) if raw.strip() else None
                elif f.name == "swarm_constraints":
                    changes[f.name] = tuple(part.strip() for part in raw.split(",") if part.strip())
                elif f.name == "worker_uids":
                    changes[f.name] = parse_uid_range(raw)
                elif f.name == "max_running":
                    changes[f.name] = int(raw) if raw.strip() else None
                elif isinstance(default, bool):
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
            except ConfigError as exc:
                raise ConfigError(f"ORCH_{f.name.upper()}={raw!r}: {exc}") from None
            except ValueError:
                kind = "integer" if f.name == "max_running" else type(default).__name__
                raise ConfigError(f"ORCH_{f.name.upper()}={raw!r} is not a valid {kind}") from None
        if "base_image" not in changes and "image" not in changes:
            state_dir = Path(changes.get("state_dir", defaults.state_dir))  # type: ignore[arg-type]
            changes.update(_recorded_defaults(state_dir))
        return cls(**changes)  # type: ignore[arg-type]
