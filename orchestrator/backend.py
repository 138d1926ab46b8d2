"""The only module that talks to the Docker engine: images, sandbox containers, labels, inspection.

Every ``docker.errors`` exception is translated here into the ``EngineError`` family, so no
caller ever sees a Docker SDK exception. Everything we create carries ``orchestrator.*``
labels, which is how a restarted controller or an ops script finds it again.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests.exceptions
from docker.types import LogConfig
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

from .config import Settings
from .errors import ConfigError, EngineError, EngineUnavailable, ImageMissing

logger = logging.getLogger(__name__)

LABEL_PREFIX = "orchestrator."
MANAGED = LABEL_PREFIX + "managed"
SESSION_ID = LABEL_PREFIX + "session-id"
CHANNEL_MOUNT = "/run/orchestrator"
_START_ENGINE_HINT = (
    "start one with `scripts/setup-engine` (installs and starts Debian's docker.io as root) "
    "or `sudo systemctl start docker`, and check that DOCKER_HOST points at it"
)


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


def _is_conflict(exc: BaseException) -> bool:
    return isinstance(exc, docker.errors.APIError) and exc.status_code == 409


@contextmanager
def _engine_errors(action: str) -> Iterator[None]:
    """Translate Docker SDK and HTTP errors raised while doing ``action``."""
    try:
        yield
    except docker.errors.ImageNotFound as exc:
        raise ImageMissing(
            f"{action}: image not found ({exc.explanation}); build it with `orchestrator image build`"
        ) from exc
    except (requests.exceptions.ConnectionError, docker.errors.DockerException) as exc:
        if isinstance(exc, docker.errors.APIError):
            raise EngineError(f"{action}: the Docker engine refused: {exc.explanation or exc}") from exc
        raise EngineUnavailable(f"{action}: no Docker engine answers ({exc}); {_START_ENGINE_HINT}") from exc


class DockerBackend:
    """Sandbox containers and images on one Docker engine."""

    def __init__(self, client: docker.DockerClient | None = None) -> None:
        """Connect to the engine from the environment (DOCKER_HOST or the local socket).

        Raises:
            EngineUnavailable: no engine answers, with how to start one.
        """
        with _engine_errors("connecting to the Docker engine"):
            self.client = client or docker.from_env()
            self.client.ping()

    def close(self) -> None:
        """Close the connection pool to the engine."""
        self.client.close()

    def image_exists(self, tag: str) -> bool:
        with _engine_errors(f"inspecting image {tag}"):
            try:
                self.client.images.get(tag)
            except docker.errors.ImageNotFound:
                return False
        return True

    def build_image(
        self, context_tar: bytes, tag: str, buildargs: Mapping[str, str], labels: Mapping[str, str]
    ) -> None:
        """Build ``tag`` from an in-memory build context.

        Raises:
            EngineError: the build failed; the message carries the end of the build log.
        """
        with _engine_errors(f"building image {tag}"):
            try:
                self.client.images.build(
                    fileobj=io.BytesIO(context_tar),
                    custom_context=True,
                    tag=tag,
                    buildargs=dict(buildargs),
                    labels=dict(labels),
                    rm=True,
                    forcerm=True,
                    pull=False,
                )
            except docker.errors.BuildError as exc:
                tail = "".join(str(chunk.get("stream", chunk.get("error", ""))) for chunk in list(exc.build_log)[-15:])
                raise EngineError(f"building image {tag} failed: {exc.msg}\n{tail}") from exc

    @retry(
        retry=retry_if_exception(_is_conflict),
        stop=stop_after_attempt(5),
        wait=wait_exponential(multiplier=0.1, max=1.0),
        reraise=True,
    )
    def _create(self, **kwargs: Any) -> Any:
        return self.client.containers.run(**kwargs)

    def run_sandbox(
        self,
        *,
        session_id: str,
        image: str,
        channel_dir: Path,
        labels: Mapping[str, str],
        environment: Mapping[str, str],
        settings: Settings,
    ) -> str:
        """Start one sandbox container with the security settings; return its id.

        Raises:
            ImageMissing: ``image`` does not exist.
            EngineError: the engine refused to create or start it.
        """
        for key in labels:
            if not key.startswith(LABEL_PREFIX):
                raise ConfigError(f"label {key!r} must start with {LABEL_PREFIX!r}")
        name = f"orch-{session_id}"
        kwargs: dict[str, Any] = {
            "image": image,
            "name": name,
            "detach": True,
            "init": True,
            "labels": {MANAGED: "true", SESSION_ID: session_id, **labels},
            "environment": dict(environment),
            "volumes": {str(channel_dir): {"bind": CHANNEL_MOUNT, "mode": "ro"}},
            "working_dir": "/tmp",
            "network_mode": settings.network_mode,
            "user": settings.user,
            "read_only": settings.read_only,
            "tmpfs": dict(settings.tmpfs),
            "mem_limit": settings.mem_limit,
            "memswap_limit": settings.mem_limit,
            "nano_cpus": settings.nano_cpus,
            "pids_limit": settings.pids_limit,
            "log_config": LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"}),
        }
        if settings.cap_drop_all:
            kwargs["cap_drop"] = ["ALL"]
        if settings.no_new_privileges:
            kwargs["security_opt"] = ["no-new-privileges:true"]
        with _engine_errors(f"starting sandbox container {name}"):
            self.remove(name)  # a dead predecessor of a restarted session
            container = self._create(**kwargs)
        logger.info("started container %s (%s) for session %s", name, container.short_id, session_id)
        return str(container.id)

    def inspect(self, container_id: str) -> ContainerState | None:
        """The container's state, or None if it no longer exists."""
        with _engine_errors(f"inspecting container {container_id[:12]}"):
            try:
                container = self.client.containers.get(container_id)
            except docker.errors.NotFound:
                return None
        return _state(container.attrs)

    def kill(self, container_id: str, signal: str = "SIGKILL") -> None:
        """Send a signal to the container's init process (SIGKILL stops the container)."""
        with _engine_errors(f"signalling container {container_id[:12]}"):
            try:
                self.client.containers.get(container_id).kill(signal=signal)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # 409: not running, nothing to signal
                    raise

    def remove(self, container: str) -> None:
        """Remove a container (by id or name), running or not; missing or already being removed is fine."""
        with _engine_errors(f"removing container {container[:12]}"):
            try:
                self.client.containers.get(container).remove(force=True, v=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                if not (exc.status_code == 409 and "in progress" in str(exc.explanation)):
                    raise

    def find(self, session_id: str | None = None) -> list[ContainerState]:
        """Our containers (all, or one session's), found by label, running or not."""
        label = [f"{MANAGED}=true"] + ([f"{SESSION_ID}={session_id}"] if session_id else [])
        with _engine_errors("listing sandbox containers"):
            containers = self.client.containers.list(all=True, filters={"label": label})
            return [_state(c.attrs) for c in containers]


def _state(attrs: dict[str, Any]) -> ContainerState:
    state = attrs.get("State", {})
    return ContainerState(
        id=attrs["Id"],
        name=attrs.get("Name", "").lstrip("/"),
        status=state.get("Status", "unknown"),
        running=bool(state.get("Running")),
        exit_code=state.get("ExitCode"),
        oom_killed=bool(state.get("OOMKilled")),
        labels=attrs.get("Config", {}).get("Labels") or {},
    )
