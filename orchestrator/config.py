"""All tunable defaults of the controller: one frozen ``Settings`` of small frozen groups, readable from ``ORCH_*``.

Each field names its variable and the reader of its text beside its default, so ``ENV_VARIABLES`` lists every
variable and ``EnvVariable.parse`` is the one place a variable's text becomes a value.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import posixpath
import re
import shlex
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from .agent.confinement import MAX_WORKER_UID
from .bearer import RULE, acceptable
from .checks import is_count, is_integer, is_number
from .errors import ConfigError
from .files import replace_file
from .metrics import parse_address
from .spelling import closest
from .units import DURATION_HELP, SIZE_HELP, parse_duration, parse_size

logger = logging.getLogger(__name__)

DEFAULT_BASE_IMAGE = "python:3.12-slim"
WORKSPACE = "/workspace"
"""Every sandbox's workspace: its cells' working directory, bounded by ``ResourceLimits.workspace_bytes`` and
``workspace_files`` (docs/files.md)."""
DEFAULTS_FILE = "defaults.json"
"""What set-up chose (the base image), for every later ``Settings.from_env()`` of this user on this machine, whatever
its state dir: ``$XDG_CONFIG_HOME/orchestrator/defaults.json`` (``defaults_path``)."""
MIN_SANDBOX_MEMORY = 32 << 20
"""The smallest memory limit a sandbox is given: below it the agent cannot start (measured: docs/eval.md)."""
MIN_MEMORY_WHY = ": below it the sandbox's agent cannot start"
MIN_WORKSPACE_BYTES = 1 << 20
MAX_WORKSPACE_FILES = 100_000
"""The most entries a workspace may be given (``ResourceLimits.workspace_files``): the checkpoint's file list of a
generation is bounded by it (docs/design/workspace.md)."""
WORKSPACE_BYTES_PER_FILE = 4096
"""Room each entry of ``workspace_files`` needs in ``workspace_bytes``: its inode, and a block to hold something."""
WORKSPACE_MOUNTS = ("auto", "image", "tmpfs")
CAPACITY_POLICIES = ("hibernate", "refuse")
BACKENDS = ("docker", "swarm")
CARRIERS = ("descriptors", "relayed")
_UID_RANGE = re.compile(r"^\s*(\d{1,10})\s*-\s*(\d{1,10})\s*$")


def parse_uid_range(text: str) -> tuple[int, int]:
    """``(low, high)`` from "low-high" (both included).

    Raises:
        ConfigError: not two numbers joined by a dash.
    """
    match = _UID_RANGE.match(text)
    if not match:
        raise ConfigError(f"{text!r} is not a range of uids: use low-high, e.g. 2000000000-2099999999")
    return int(match.group(1)), int(match.group(2))


def defaults_path() -> Path:
    """The user's defaults file: ``$XDG_CONFIG_HOME/orchestrator/defaults.json`` (``~/.config/...`` without it).

    Per user and machine, not per state dir, so a new state dir (a test's, a second store) starts sessions on the
    base image set-up chose, offline too.
    """
    root = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(root) / "orchestrator" / DEFAULTS_FILE


def save_default_base_image(base_image: str) -> Path:
    """Record ``base_image`` as the default of every later ``Settings.from_env()`` of this user (``defaults_path``).

    Set-up (``orchestrator image build --make-default``) calls it, so a new shell needs no
    ``ORCH_BASE_IMAGE``; the variable still overrides it. Returns the file written.
    """
    path = defaults_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    replace_file(path, (json.dumps({"base_image": base_image}, indent=1) + "\n").encode())
    return path


def _recorded_defaults() -> dict[str, str]:
    """What set-up recorded (an unreadable or foreign file counts as nothing recorded)."""
    try:
        data = json.loads(defaults_path().read_text())
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


def _flag(raw: str) -> bool:
    if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
        raise ValueError(raw)
    return raw.lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class Reader:
    """How the text of an ``ORCH_*`` variable becomes the value of its field."""

    read: Callable[[str], object]
    kind: str
    """What the text is not when ``read`` raises ``ValueError``: "ORCH_EXEC_TIMEOUT='a' is not a valid <kind>"."""


_TEXT = Reader(str, "str")
_PATH = Reader(Path, "Path")
_FLAG = Reader(_flag, "bool")
_INTEGER = Reader(int, "int")
_SIZE = Reader(parse_size, "size")
_DURATION = Reader(parse_duration, "duration")
_UIDS = Reader(parse_uid_range, "range of uids")
_COMMAND = Reader(lambda raw: tuple(shlex.split(raw)) or None, "command line")
_COMMA_LIST = Reader(lambda raw: tuple(part.strip() for part in raw.split(",") if part.strip()), "list")
_OPTIONAL_INTEGER = Reader(lambda raw: int(raw) if raw.strip() else None, "integer")
_OPTIONAL_TEXT = Reader(lambda raw: raw.strip() or None, "str")
_OPTIONAL_DURATION = Reader(lambda raw: parse_duration(raw) if raw.strip() else None, "duration")


def _env(name: str, reader: Reader) -> dict[str, object]:
    """A field's metadata: the ``ORCH_*`` variable that sets it and how its text is read."""
    return {"env": (name, reader)}


class _Fields:
    """What every settings object shares: a validated copy, and errors naming a field and its variable."""

    def replace(self: _S, **changes: object) -> _S:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def _invalid(self, name: str, rule: str, why: str = "") -> ConfigError:
        variable = _FIELD_VARIABLES.get((type(self).__name__, name))
        named = f" ({variable})" if variable else ""
        return ConfigError(f"{type(self).__name__}.{name} must be {rule}, got {getattr(self, name)!r}{why}{named}")

    def _read_text(self, parse: Callable[[str], object], rule: str, *names: str) -> None:
        """Read fields given as text in Python (``Timeouts(exec="5m")``) as their variables' text is read."""
        for name in names:
            value = getattr(self, name)
            if isinstance(value, str):
                try:
                    object.__setattr__(self, name, parse(value))
                except ConfigError:
                    raise self._invalid(name, rule) from None

    def _check_finite_positive(self, *names: str) -> None:
        self._read_text(parse_duration, f"a duration > 0: {DURATION_HELP}", *names)
        for name in names:
            value = getattr(self, name)
            if not (is_number(value) and 0 < value < math.inf):  # every wait has a finite deadline (NaN fails too)
                raise self._invalid(name, f"a duration > 0: {DURATION_HELP}")

    def _check_positive_size(self, *names: str) -> None:
        self._read_text(parse_size, f"a size > 0: {SIZE_HELP}", *names)
        for name in names:
            value = getattr(self, name)
            if not (is_integer(value) and value > 0):
                raise self._invalid(name, f"a size > 0: {SIZE_HELP}")

    def _check_positive_integer(self, *names: str) -> None:
        for name in names:
            value = getattr(self, name)
            if not (is_integer(value) and value > 0):
                raise self._invalid(name, "a positive integer")


_S = TypeVar("_S", bound=_Fields)


@dataclass(frozen=True)
class Timeouts(_Fields):
    """How long each wait of the controller and the agent may last, in seconds (each finite and > 0).

    A field given as text is read as its variable is, a duration: ``Timeouts(exec="5m")`` is ``Timeouts(exec=300)``.
    """

    exec: float = field(default=300.0, metadata=_env("ORCH_EXEC_TIMEOUT", _DURATION))
    """A cell's run when the call gives no timeout."""
    interrupt_grace: float = field(default=2.0, metadata=_env("ORCH_INTERRUPT_GRACE", _DURATION))
    """A timed-out cell's time to stop after the interrupt before its worker is killed."""
    start: float = field(default=30.0, metadata=_env("ORCH_START_TIMEOUT", _DURATION))
    """A new container's agent to connect."""
    reply_margin: float = field(default=10.0, metadata=_env("ORCH_REPLY_MARGIN", _DURATION))
    """Beyond timeout + grace, before the controller gives up on the agent and recycles the container."""
    frame: float = field(default=10.0, metadata=_env("ORCH_FRAME_TIMEOUT", _DURATION))
    """The agent's wait on a frame its worker started before it kills the worker (a stalled forgery)."""
    checkpoint: float = field(default=60.0, metadata=_env("ORCH_CHECKPOINT_TIMEOUT", _DURATION))
    """A call's checkpoint after its cell ended; apart from (not part of) the cell's timeout."""
    restore_value: float = field(default=30.0, metadata=_env("ORCH_RESTORE_VALUE_TIMEOUT", _DURATION))
    """One value's unpickling during a restore before it is skipped (and named)."""
    lock: float = field(default=30.0, metadata=_env("ORCH_LOCK_TIMEOUT", _DURATION))
    """A session's store lock held by another process, before ``SessionBusy``."""
    input: float = field(default=300.0, metadata=_env("ORCH_INPUT_TIMEOUT", _DURATION))
    """A cell's ``input()`` waiting for an answer before it raises ``EOFError`` (not counted as cell time)."""

    def __post_init__(self) -> None:
        self._check_finite_positive(*(f.name for f in dataclasses.fields(self)))


@dataclass(frozen=True)
class ResourceLimits(_Fields):
    """What one sandbox may use, and how much of what it sends the controller accepts and keeps.

    A byte field (``checkpoint_quota``, ``max_*_bytes``) given as text is read as its variable is, a size:
    ``ResourceLimits(max_output_bytes="64k")``.
    """

    memory: str | int = field(default="1g", metadata=_env("ORCH_MEM_LIMIT", _TEXT))
    """Memory limit of the container: a size ("512m", "2g") or bytes, at least ``MIN_SANDBOX_MEMORY``; swap is
    disabled by setting the same memswap limit. ``memory_bytes`` is it in bytes."""
    nano_cpus: int = field(default=1_000_000_000, metadata=_env("ORCH_NANO_CPUS", _INTEGER))
    """CPU quota in billionths of a CPU (1e9 = one CPU)."""
    pids: int = field(default=256, metadata=_env("ORCH_PIDS_LIMIT", _INTEGER))
    """Most processes and threads the container may have."""
    checkpoint_quota: int | None = field(default=None, metadata=_env("ORCH_CHECKPOINT_QUOTA", _SIZE))
    """Most bytes a session's stored checkpoint may hold; None means 4 x ``memory``. Values past it are unsaved."""
    history_generations: int = field(default=10, metadata=_env("ORCH_HISTORY_GENERATIONS", _INTEGER))
    """Earlier generations a session keeps for ``rewind`` and ``fork(at=...)`` (0: none). They stay within
    ``checkpoint_quota`` with the current one, each blob counted once: the oldest go first when they would not."""
    max_output_bytes: int = field(default=1 << 20, metadata=_env("ORCH_MAX_OUTPUT_BYTES", _SIZE))
    """Most bytes of stdout and of stderr a result holds per call; past it the result holds a head-and-tail preview
    and the whole stream is kept in a file (``ExecResult.stdout_path``)."""
    max_output_file_bytes: int = field(default=100 << 20, metadata=_env("ORCH_MAX_OUTPUT_FILE_BYTES", _SIZE))
    """Most bytes of one stream of one call kept in its file on the host; the rest is counted and dropped."""
    max_output_files: int = field(default=64, metadata=_env("ORCH_MAX_OUTPUT_FILES", _INTEGER))
    """Output files kept per session (under its state directory); the oldest go first. Removed with the session."""
    max_host_calls_per_cell: int = field(default=64, metadata=_env("ORCH_MAX_HOST_CALLS_PER_CELL", _INTEGER))
    """Host calls (``llm_query`` ...) of one cell waiting or running at once; more are refused at once with an error
    in the sandbox. ``HostCalls.max_concurrent`` says how many of them run."""
    max_host_calls_per_session: int = field(default=128, metadata=_env("ORCH_MAX_HOST_CALLS_PER_SESSION", _INTEGER))
    """Host calls of one session waiting or running at once, across its cells (a handler still running after its
    cell ended counts until it returns), and the most threads its handlers get; more are refused at once."""
    max_header_bytes: int = field(default=8 << 20, metadata=_env("ORCH_MAX_HEADER_BYTES", _SIZE))
    """Largest JSON header accepted from an agent."""
    max_body_bytes: int = field(default=1 << 30, metadata=_env("ORCH_MAX_BODY_BYTES", _SIZE))
    """Largest binary body (checkpoint delta) accepted from an agent."""
    workspace_bytes: int = field(default=1 << 30, metadata=_env("ORCH_WORKSPACE_BYTES", _SIZE))
    """Size of a sandbox's ``/workspace`` (its cells' working directory), at least 1 MiB: writing past it fails with
    ENOSPC in the cell. Held in a disk image outside the sandbox's memory, or where none can be mounted in a tmpfs
    counted in ``memory`` (``Confinement.workspace_mount``, docs/files.md)."""
    workspace_files: int = field(default=10_000, metadata=_env("ORCH_WORKSPACE_FILES", _INTEGER))
    """Most entries (files, directories and links together) a sandbox's ``/workspace`` holds, at most
    ``MAX_WORKSPACE_FILES`` and one per ``WORKSPACE_BYTES_PER_FILE`` of ``workspace_bytes``; one more fails with
    ENOSPC. The kernel rounds it up to fill its inode tables (by less than 2% at the defaults)."""

    def __post_init__(self) -> None:
        self._check_positive_integer(
            "pids", "max_output_files", "nano_cpus", "max_host_calls_per_cell", "max_host_calls_per_session"
        )
        self._check_positive_size(
            "max_output_bytes", "max_output_file_bytes", "max_header_bytes", "max_body_bytes", "workspace_bytes"
        )
        self._check_workspace()
        if self.checkpoint_quota is not None:
            self._check_positive_size("checkpoint_quota")
        if not (is_integer(self.history_generations) and self.history_generations >= 0):
            raise self._invalid("history_generations", "an integer >= 0 (0 keeps no history)")
        if not (isinstance(self.memory, str) or is_integer(self.memory)):
            raise self._invalid("memory", f"a size: {SIZE_HELP}")
        try:
            memory = parse_size(self.memory)
        except ConfigError:
            raise self._invalid("memory", f"a size: {SIZE_HELP}") from None
        if memory < MIN_SANDBOX_MEMORY:
            raise self._invalid("memory", f"at least {MIN_SANDBOX_MEMORY >> 20} MiB", MIN_MEMORY_WHY)

    def _check_workspace(self) -> None:
        if self.workspace_bytes < MIN_WORKSPACE_BYTES:
            raise self._invalid("workspace_bytes", f"at least {MIN_WORKSPACE_BYTES >> 20} MiB")
        if not (is_integer(self.workspace_files) and 0 < self.workspace_files <= MAX_WORKSPACE_FILES):
            raise self._invalid("workspace_files", f"an integer from 1 to {MAX_WORKSPACE_FILES:,}")
        if self.workspace_files * WORKSPACE_BYTES_PER_FILE > self.workspace_bytes:
            raise self._invalid(
                "workspace_files",
                f"at most one per {WORKSPACE_BYTES_PER_FILE >> 10} KiB of workspace_bytes "
                f"({self.workspace_bytes // WORKSPACE_BYTES_PER_FILE:,} for {self.workspace_bytes:,} bytes)",
                ": each entry's inode takes room in the workspace's file system",
            )

    @property
    def memory_bytes(self) -> int:
        """The memory limit in bytes."""
        return parse_size(self.memory)

    @property
    def checkpoint_quota_bytes(self) -> int:
        """The checkpoint quota in bytes (the default follows the memory limit)."""
        if self.checkpoint_quota is not None:
            return int(self.checkpoint_quota)
        return 4 * self.memory_bytes


@dataclass(frozen=True)
class Confinement(_Fields):
    """What a sandbox is kept from; every default is the strict one, and each a field a caller may loosen on
    purpose."""

    network_mode: str = field(default="none", metadata=_env("ORCH_NETWORK_MODE", _TEXT))
    """Docker network mode; "none" keeps sandboxes off every network."""
    user: str = field(default="0:0", metadata=_env("ORCH_USER", _TEXT))
    """uid:gid the container starts as: the agent's supervisor. Root (the default) holds only the capabilities of
    ``backend.SUPERVISOR_CAPABILITIES`` (with ``cap_drop_all``), enough to start each worker as the sandbox's own uid
    from ``worker_uids`` with no capability at all and to signal it, so no cell can reach the supervisor
    (docs/identity.md). A non-root user here runs the worker as that same user, within the cell's reach: a
    loosening."""
    worker_uids: tuple[int, int] = field(
        default=(2_000_000_000, 2_099_999_999), metadata=_env("ORCH_WORKER_UIDS", _UIDS)
    )
    """The uids (both ends included) a sandbox's worker uid is drawn from, at random and never one a live sandbox
    of this engine holds (its label ``orchestrator.worker-uid``); its gid is the same number. They need no entry in
    /etc/passwd and no user namespace; the default lies where no convention puts users or containers (systemd's
    container ranges end at 1879048191). ``ORCH_WORKER_UIDS`` takes ``low-high`` (docs/identity.md)."""
    read_only: bool = field(default=True, metadata=_env("ORCH_READ_ONLY", _FLAG))
    """Read-only root filesystem; writable paths come from ``tmpfs``."""
    tmpfs: Mapping[str, str] = field(default_factory=lambda: {"/tmp": "size=256m,mode=1777"})
    """Size-capped writable mounts besides ``/workspace`` (no variable): scratch, lost on every restore."""
    workspace_mount: str = field(default="auto", metadata=_env("ORCH_WORKSPACE_MOUNT", _TEXT))
    """What holds a sandbox's ``/workspace`` (docs/files.md): "image", an ext4 image on the host's disk, not counted in
    the sandbox's memory (the docker backend, its controller root with ``mkfs.ext4`` and loop devices; else starting a
    sandbox fails); "tmpfs", memory counted in the sandbox's memory limit; "auto" (the default), the image where it
    can be made, else the tmpfs (Swarm: always the tmpfs)."""
    cap_drop_all: bool = field(default=True, metadata=_env("ORCH_CAP_DROP_ALL", _FLAG))
    """Drop every Linux capability."""
    no_new_privileges: bool = field(default=True, metadata=_env("ORCH_NO_NEW_PRIVILEGES", _FLAG))
    """Forbid privilege gain through setuid binaries."""

    def __post_init__(self) -> None:
        self._check_worker_uids()
        self._check_user()
        if self.workspace_mount not in WORKSPACE_MOUNTS:
            raise self._invalid("workspace_mount", f"one of {', '.join(WORKSPACE_MOUNTS)}")
        if any(posixpath.normpath(path) == WORKSPACE for path in self.tmpfs):
            raise self._invalid(
                "tmpfs", f"mounts other than {WORKSPACE}", f": the backend mounts {WORKSPACE} (ORCH_WORKSPACE_MOUNT)"
            )

    def _check_user(self) -> None:
        """A non-root container user must be numeric: the sandbox's channel files are handed to its uid (or, under a
        non-root controller, opened through our group), and a user name's uid is known only to the image."""
        user = self.user.partition(":")[0]
        if user != "root" and not user.isdigit():
            raise self._invalid(
                "user",
                "'root', '0:0' or a numeric 'uid:gid'",
                ": the sandbox's secret and socket are handed to that uid, which a name does not give",
            )

    def _check_worker_uids(self) -> None:
        uids = tuple(self.worker_uids)
        if len(uids) != 2 or not all(is_integer(uid) for uid in uids):
            raise self._invalid("worker_uids", "two integers (low, high)")
        low, high = uids
        if not 0 < low <= high <= MAX_WORKER_UID:
            raise self._invalid("worker_uids", f"a range of uids with 0 < low <= high <= {MAX_WORKER_UID}")
        object.__setattr__(self, "worker_uids", uids)

    @property
    def sandbox_uid_gid(self) -> tuple[int | None, int | None]:
        """The numeric uid and gid the container (its supervisor) runs as, when ``user`` gives them."""
        user, _, group = self.user.partition(":")
        uid = int(user) if user.isdigit() else None
        gid = int(group) if group.isdigit() else uid
        return uid, gid

    @property
    def separate_worker(self) -> bool:
        """Whether each worker runs as a uid of its own (the container starts as root, which can switch to it)."""
        return self.user.partition(":")[0] in ("0", "root")


@dataclass(frozen=True)
class Capacity(_Fields):
    """How many sandboxes run: the cap and what happens at it, idle sessions given up, spares started ahead."""

    max_running: int | None = field(default=None, metadata=_env("ORCH_MAX_RUNNING", _OPTIONAL_INTEGER))
    """Most sessions of this store with a running container; None is no cap. See ``policy``."""
    policy: str = field(default="hibernate", metadata=_env("ORCH_CAPACITY_POLICY", _TEXT))
    """At ``max_running``: "hibernate" the least recently used idle session to make room, or "refuse" with
    ``CapacityExceeded``."""
    hibernate_after: float | None = field(default=None, metadata=_env("ORCH_HIBERNATE_AFTER", _OPTIONAL_DURATION))
    """Seconds without a call after which a session gives up its container (kept: its checkpoint); None is off.
    Applied by the ``Orchestrator`` to the sessions it holds and by the janitor to every session of the store.
    ``ORCH_HIBERNATE_AFTER`` takes durations like 10m."""
    pool_size: int = field(default=0, metadata=_env("ORCH_POOL_SIZE", _INTEGER))
    """Sandboxes of the default image kept started ahead, so a new session (or one whose container died) gets one
    at once; refilled in the background, each handed out once. 0 is off. The pool starts with the first session
    this ``Orchestrator`` starts and its spare containers go when it closes."""

    def __post_init__(self) -> None:
        if self.hibernate_after is not None:
            self._check_finite_positive("hibernate_after")
        if self.max_running is not None and not (is_integer(self.max_running) and self.max_running > 0):
            raise self._invalid("max_running", "a positive integer or None")
        if not is_count(self.pool_size):
            raise self._invalid("pool_size", "a non-negative integer")
        if self.policy not in CAPACITY_POLICIES:
            raise self._invalid("policy", f"one of {', '.join(CAPACITY_POLICIES)}")


@dataclass(frozen=True)
class SwarmSettings(_Fields):
    """Where sandboxes go and how they are reached with ``Settings.backend="swarm"`` (docs/swarm.md)."""

    node_dir: Path = field(default=Path("/var/lib/orchestrator-relay"), metadata=_env("ORCH_SWARM_NODE_DIR", _PATH))
    """The directory on every node where its relay keeps the sandboxes' channel directories (must exist on each
    node; the relay's bind mount)."""
    relay_port: int = field(default=7443, metadata=_env("ORCH_SWARM_RELAY_PORT", _INTEGER))
    """The TCP port each node's relay listens on (mutual TLS), on the node's address."""
    constraints: tuple[str, ...] = field(default=(), metadata=_env("ORCH_SWARM_CONSTRAINTS", _COMMA_LIST))
    """Placement constraints for every session's sandbox (``node.labels.pool==agents``); ``ORCH_SWARM_CONSTRAINTS``
    separates them by commas. A session can add its own (``Placement``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.relay_port, int) or not 0 < self.relay_port < 65536:
            raise self._invalid("relay_port", "a TCP port number")
        object.__setattr__(self, "constraints", tuple(self.constraints))
        if not all(isinstance(c, str) and c.strip() for c in self.constraints):
            raise self._invalid("constraints", "non-empty strings")
        object.__setattr__(self, "node_dir", Path(self.node_dir))
        if not self.node_dir.is_absolute():
            raise self._invalid("node_dir", "an absolute path")


_GROUPS = {
    "timeouts": Timeouts,
    "limits": ResourceLimits,
    "confinement": Confinement,
    "capacity": Capacity,
    "swarm": SwarmSettings,
}


@dataclass(frozen=True)
class Settings(_Fields):
    """Defaults for sessions: a few top-level choices and a small value object per concern.

    ``Settings(limits=ResourceLimits(memory="2g"))`` changes one limit and keeps every other default;
    ``settings.replace(timeouts=settings.timeouts.replace(exec=60))`` changes one of an existing object.
    ``Settings.from_env()`` reads the ``ORCH_*`` variable of each field (``ENV_VARIABLES``).
    """

    image: str | None = field(default=None, metadata=_env("ORCH_IMAGE", _TEXT))
    """Sandbox image; None means the default image built from this package on ``base_image``."""
    base_image: str = field(default=DEFAULT_BASE_IMAGE, metadata=_env("ORCH_BASE_IMAGE", _TEXT))
    """Base that ``orchestrator image build`` puts the agent on (needs ``python3`` on PATH)."""
    state_dir: Path = field(default_factory=_default_state_dir, metadata=_env("ORCH_STATE_DIR", _PATH))
    """Host directory of session records and checkpoints (survives controller restarts)."""
    runtime_dir: Path = field(default_factory=_default_runtime_dir, metadata=_env("ORCH_RUNTIME_DIR", _PATH))
    """Host directory of per-session channel sockets, bind-mounted read-only into containers."""
    agent_command: tuple[str, ...] | None = field(default=None, metadata=_env("ORCH_AGENT_COMMAND", _COMMAND))
    """Command that starts the agent in the container; None runs the image's CMD. ``ORCH_AGENT_COMMAND`` is split
    like a shell line."""
    fsync: bool = field(default=False, metadata=_env("ORCH_FSYNC", _FLAG))
    """fsync checkpoint files and their directories; atomic renames already survive a controller crash, fsync adds
    power loss."""
    backend: str = field(default="docker", metadata=_env("ORCH_BACKEND", _TEXT))
    """Where sandboxes run: "docker", containers on the engine DOCKER_HOST names; "swarm", one-replica services
    spread over the nodes of the Swarm whose manager DOCKER_HOST names, reached through a relay on each node
    (docs/swarm.md)."""
    metrics_address: str | None = field(default=None, metadata=_env("ORCH_METRICS_ADDRESS", _OPTIONAL_TEXT))
    """Where an ``Orchestrator`` serves Prometheus metrics (``/metrics``): "PORT" (on loopback), "HOST:PORT" or
    "[::1]:PORT"; port 0 takes a free one. None serves none (docs/metrics.md)."""
    metrics_token: str | None = field(default=None, repr=False, metadata=_env("ORCH_METRICS_TOKEN", _OPTIONAL_TEXT))
    """A bearer token ``/metrics`` requires (``Authorization: Bearer <token>``; the rule of ``bearer.RULE``), or
    None: the endpoint answers anyone who reaches it (docs/metrics.md)."""
    carrier: str | None = field(default=None, metadata=_env("ORCH_CARRIER", _OPTIONAL_TEXT))
    """How one hop's data channels reach the controller (docs/design/one-hop.md, "Carriers"): None, each sandbox's
    own (its descriptors on the local engine, "relayed" where none can pass, as on Swarm); "relayed" forces their
    bytes onto the supervisor's connection (tests run the attack files once so)."""
    timeouts: Timeouts = field(default_factory=Timeouts)
    """How long each wait may last."""
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    """Memory, CPU and processes of a sandbox; output, checkpoint, host-call and message caps."""
    confinement: Confinement = field(default_factory=Confinement)
    """Network, user, filesystem and capabilities of a sandbox."""
    capacity: Capacity = field(default_factory=Capacity)
    """The cap on running sessions, idle hibernation and the warm pool."""
    swarm: SwarmSettings = field(default_factory=SwarmSettings)
    """Swarm nodes' relays and placement (``backend="swarm"``)."""

    def __post_init__(self) -> None:
        for name, kind in _GROUPS.items():
            if not isinstance(getattr(self, name), kind):
                raise self._invalid(name, f"a {kind.__name__}")
        if self.backend not in BACKENDS:
            raise self._invalid("backend", f"one of {', '.join(BACKENDS)}")
        if self.carrier not in (None, *CARRIERS):
            raise self._invalid("carrier", f"None or one of {', '.join(CARRIERS)}")
        if self.agent_command is not None:
            command = tuple(self.agent_command)
            if not command or not all(isinstance(part, str) and part for part in command):
                raise self._invalid("agent_command", "non-empty strings")
            object.__setattr__(self, "agent_command", command)
        object.__setattr__(self, "state_dir", Path(self.state_dir))
        object.__setattr__(self, "runtime_dir", Path(self.runtime_dir))
        if self.metrics_address is not None:
            try:
                parse_address(self.metrics_address)
            except ConfigError:
                raise self._invalid("metrics_address", "PORT, HOST:PORT or [IPv6]:PORT") from None
        token = self.metrics_token
        if token is not None and not (isinstance(token, str) and acceptable(token)):
            raise ConfigError(f"Settings.metrics_token must be {RULE} (ORCH_METRICS_TOKEN)")  # not shown: a secret

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read the ``ORCH_*`` variables (``ENV_VARIABLES``) over the defaults.

        Without ``ORCH_BASE_IMAGE`` (and ``ORCH_IMAGE``), the base image set-up recorded for this user is used
        (``save_default_base_image``). A variable named ``ORCH_*`` that is neither one of them nor one of
        ``OTHER_VARIABLES`` is logged once as a warning, with the known name closest to it.

        Raises:
            ConfigError: a variable has a value of the wrong type, or one its field does not take.
        """
        environ = os.environ if environ is None else environ
        warn_unknown_variables(environ)
        changes: dict[str | None, dict[str, object]] = {}
        for variable in ENV_VARIABLES:
            raw = environ.get(variable.name)
            if raw is not None:
                changes.setdefault(variable.group, {})[variable.field] = variable.parse(raw)
        top = changes.pop(None, {})
        if "base_image" not in top and "image" not in top:
            top.update(_recorded_defaults())
        for group, fields in changes.items():
            top[group] = _GROUPS[group](**fields)  # type: ignore[index]
        return cls(**top)  # type: ignore[arg-type]


@dataclass(frozen=True)
class EnvVariable:
    """One ``ORCH_*`` variable and the field it sets: ``Settings.<field>``, or ``Settings.<group>.<field>``."""

    name: str
    group: str | None
    field: str
    reader: Reader

    def parse(self, raw: str) -> object:
        """The field's value from the variable's text.

        Raises:
            ConfigError: naming the variable, when the text is not a value of its kind.
        """
        try:
            return self.reader.read(raw)
        except ConfigError as exc:
            raise ConfigError(f"{self.name}={raw!r}: {exc}") from None
        except ValueError:
            raise ConfigError(f"{self.name}={raw!r} is not a valid {self.reader.kind}") from None

    def value(self, settings: Settings) -> object:
        """The field's value in ``settings``."""
        owner = settings if self.group is None else getattr(settings, self.group)
        return getattr(owner, self.field)


def _variables() -> tuple[EnvVariable, ...]:
    found = []
    for group, kind in [(None, Settings), *_GROUPS.items()]:
        for f in dataclasses.fields(kind):
            if "env" in f.metadata:
                name, reader = f.metadata["env"]
                found.append(EnvVariable(name, group, f.name, reader))
    return tuple(found)


ENV_VARIABLES = _variables()
"""Every ``ORCH_*`` variable ``Settings.from_env`` reads, in field order."""
_FIELD_VARIABLES = {
    ((Settings if v.group is None else _GROUPS[v.group]).__name__, v.field): v.name for v in ENV_VARIABLES
}


OTHER_VARIABLES = frozenset(
    {
        # Set by the controller in a sandbox's environment, read by the agent (orchestrator/agent/config.py).
        "ORCH_CHANNEL",
        "ORCH_SECRET_FILE",
        "ORCH_SANDBOX_ID",
        "ORCH_OUTPUT_LIMIT",
        "ORCH_HOST_CALL_MAX_BYTES",
        "ORCH_WORKER_UID",
        "ORCH_WORKSPACE_DIR",  # the agent's workspace (default /workspace): the agent's tests point it elsewhere
        # The Swarm node relay's (orchestrator/agent/node_relay.py).
        "ORCH_RELAY_LISTEN",
        "ORCH_RELAY_DIR",
        "ORCH_RELAY_CERT",
        "ORCH_RELAY_KEY",
        "ORCH_RELAY_CA",
        "ORCH_RELAY_MAX_CONNECTIONS",
        "ORCH_RELAY_CGROUP",
        # The janitor's compose file and scripts/janitor (compose/README.md).
        "ORCH_UID",
        "ORCH_GID",
        "ORCH_DOCKER_SOCKET",
        "ORCH_DOCKER_GID",
        "ORCH_JANITOR_IDLE",
        "ORCH_JANITOR_OLDER_THAN",
        "ORCH_JANITOR_INTERVAL",
        "ORCH_JANITOR_HEALTH_INTERVAL",
        # `orchestrator mcp --http`: its bearer token (docs/mcp.md).
        "ORCH_MCP_TOKEN",
        # Set-up scripts and the test harness (scripts/, images/, tests/).
        "ORCH_OLDEST_BASE_IMAGE",
        "ORCH_BASE_SUITE",
        "ORCH_REBUILD_BASE",
        "ORCH_REQUIRE_DOCKER",
        "ORCH_SWARM_MANAGER",
        "ORCH_SWARM_NODES",
        "ORCH_SWARM_IMAGES",
        "ORCH_REBUILD_SWARM_NODE",
        "ORCH_KEEP_SWARM",
        "ORCH_RLMS_UPSTREAM",
        "ORCH_TEST_ENGINE_RESTART",
        "ORCH_TEST_DIR",
    }
)
"""``ORCH_*`` variables that are not ``Settings``' but are meant for another part (the agent, the relay, the janitor's
compose file, set-up scripts, the tests): never warned about as unknown."""
_KNOWN_VARIABLES = frozenset(v.name for v in ENV_VARIABLES) | OTHER_VARIABLES
_warned: set[str] = set()
_warned_lock = threading.Lock()


def unknown_variables(environ: Mapping[str, str]) -> dict[str, str | None]:
    """Each ``ORCH_*`` name of ``environ`` nobody reads, with the ``Settings`` variable closest to it (or None)."""
    suffixes = [v.name.removeprefix("ORCH_") for v in ENV_VARIABLES]  # the shared prefix would make all look close

    def nearest(name: str) -> str | None:
        found = closest(name.removeprefix("ORCH_"), suffixes)
        return None if found is None else "ORCH_" + found

    return {
        name: nearest(name) for name in sorted(environ) if name.startswith("ORCH_") and name not in _KNOWN_VARIABLES
    }


def warn_unknown_variables(environ: Mapping[str, str]) -> None:
    """Log one warning naming the unknown ``ORCH_*`` variables of ``environ`` not warned about before in this
    process (a misspelt variable would otherwise be ignored without a word)."""
    unknown = unknown_variables(environ)
    with _warned_lock:
        new = {name: near for name, near in unknown.items() if name not in _warned}
        _warned.update(new)
    if new:
        named = ", ".join(name + (f" (did you mean {near}?)" if near else "") for name, near in new.items())
        logger.warning("unknown ORCH_ variable%s, ignored: %s", "s" if len(new) > 1 else "", named)
