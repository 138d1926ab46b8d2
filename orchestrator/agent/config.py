"""The supervisor's settings, from the container environment the controller made, and the sandbox's secret."""

from __future__ import annotations

import math
import os
from typing import Any, Dict, Optional

from . import confinement, handshake, protocol
from .log import log

DEFAULT_CHANNEL = "/run/orchestrator/channel.sock"
DEFAULT_SECRET_FILE = "/run/orchestrator/secret"
DEFAULT_WORKSPACE_DIR = "/workspace"  # the cells' files, checkpointed with the values (docs/design/workspace.md)
DEFAULT_WORKSPACE_BYTES = 1 << 30  # the controller's defaults (Settings.limits), for a controller that sets none
DEFAULT_WORKSPACE_FILES = 10_000


class ConfigError(Exception):
    """The container environment or the secret file is unusable."""


def _env_number(environ: Dict[str, str], name: str, default: float, integer: bool) -> Any:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        raise ConfigError("%s=%r is not a number" % (name, raw)) from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError("%s=%r must be a non-negative number" % (name, raw))
    return value


class Config:
    """Settings the controller passes through the container environment."""

    def __init__(self, environ: Dict[str, str]) -> None:
        self.channel = environ.get("ORCH_CHANNEL") or DEFAULT_CHANNEL
        self.secret_file = environ.get("ORCH_SECRET_FILE") or DEFAULT_SECRET_FILE
        self.sandbox_id = environ.get("ORCH_SANDBOX_ID", "")
        self.output_limit = _env_number(environ, "ORCH_OUTPUT_LIMIT", 1 << 20, True)
        self.grace = _env_number(environ, "ORCH_INTERRUPT_GRACE", 2.0, False)
        # A frame that started must keep flowing: a stall this long mid-frame is treated as a forgery.
        self.frame_timeout = _env_number(environ, "ORCH_FRAME_TIMEOUT", 10.0, False) or 10.0
        self.checkpoint_quota = _env_number(environ, "ORCH_CHECKPOINT_QUOTA", 0, True)
        # The workspace's bounds (the controller's settings); a directory that does not exist turns it off.
        self.workspace_dir = environ.get("ORCH_WORKSPACE_DIR") or DEFAULT_WORKSPACE_DIR
        self.workspace_bytes = _env_number(environ, "ORCH_WORKSPACE_BYTES", DEFAULT_WORKSPACE_BYTES, True)
        self.workspace_files = _env_number(environ, "ORCH_WORKSPACE_FILES", DEFAULT_WORKSPACE_FILES, True)
        self.host_call_max = (
            _env_number(environ, "ORCH_HOST_CALL_MAX_BYTES", protocol.HOST_CALL_MAX_BYTES, True)
            or protocol.HOST_CALL_MAX_BYTES
        )
        uid = _env_number(environ, "ORCH_WORKER_UID", confinement.DEFAULT_WORKER_UID, True)
        if uid > confinement.MAX_WORKER_UID:
            raise ConfigError("ORCH_WORKER_UID=%r must be a uid from 0 to %d" % (uid, confinement.MAX_WORKER_UID))
        # Only root can start the worker as another uid; any other user (Settings.user), or a worker uid that is
        # our own, runs it as the supervisor's user: no boundary between them.
        self.worker_uid: Optional[int] = uid if os.geteuid() == 0 and uid != 0 else None
        self.worker_environ = confinement.worker_environment(environ, self.worker_uid, log)


def read_secret(path: str) -> bytes:
    """The sandbox's shared secret from its file (``handshake.parse_secret``: 64 hex characters, one final newline)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(1024)
    except OSError as exc:
        raise ConfigError("cannot read the secret file %s: %s" % (path, exc.strerror or exc)) from None
    try:
        return handshake.parse_secret(raw)
    except ValueError:
        raise ConfigError("the secret file %s must hold exactly 64 hex characters" % path) from None
