"""Which controller process started a container, so that what a killed controller left behind can be removed.

Sandboxes that serve no session yet (a warm pool's, an ``orchestrator eval`` run's) carry their
controller's host, pid and runtime directory as labels. While that process lives they are its
own; once it is gone nobody will use them, and the next prune, janitor pass or eval run on the
same host removes them with their channel directories. Containers of another host are left
alone: this host cannot tell whether their controller lives.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from ..backends.base import Backend, ContainerState

ROLE = "orchestrator.role"
"""What a container is for when it is not (yet) a session's: "pool" or "eval"."""
EVAL_RUN = "orchestrator.eval-run"
"""The ``orchestrator eval`` run a container of role "eval" serves."""
CONTROLLER_HOST = "orchestrator.controller-host"
CONTROLLER_PID = "orchestrator.controller-pid"
CONTROLLER_RUNTIME_DIR = "orchestrator.controller-runtime-dir"


def controller_labels(role: str, runtime_dir: Path) -> dict[str, str]:
    """The labels naming this process as the controller of a container started for ``role``."""
    return {
        ROLE: role,
        CONTROLLER_HOST: socket.gethostname(),
        CONTROLLER_PID: str(os.getpid()),
        CONTROLLER_RUNTIME_DIR: str(runtime_dir),
    }


def controller_gone(container: ContainerState) -> bool:
    """True when the container's controller ran on this host and its process has ended."""
    if container.labels.get(CONTROLLER_HOST) != socket.gethostname():
        return False
    pid = container.labels.get(CONTROLLER_PID, "")
    if not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def left_behind(backend: Backend, role: str) -> list[ContainerState]:
    """Containers started for ``role`` on this host by a controller process that is gone."""
    candidates = backend.find({ROLE: role, CONTROLLER_HOST: socket.gethostname()})
    return [container for container in candidates if controller_gone(container)]
