"""The Docker engine as a ``Backend``: the only module that imports ``docker``.

Every ``docker.errors`` exception is translated here into the ``EngineError`` family, so no
caller ever sees a Docker SDK exception.
"""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import docker
import docker.errors
import requests.exceptions
from docker.types import LogConfig

from ..agent.usage import container_usage, cpu_and_peak
from ..config import WORKSPACE, Settings
from ..errors import ConfigError, EngineError, EngineUnavailable, ImageBuildFailed, ImageMissing
from ..safe_text import last_lines
from ..wire.endpoint import UnixSocketEndpoint
from .base import (
    MANAGED,
    SANDBOX_ID,
    SUPERVISOR_CAPABILITIES,
    Capabilities,
    ContainerState,
    ContainerUsage,
    Phase,
    Placement,
    ResourceUsage,
    SandboxSpec,
)
from .workspace import Workspaces

logger = logging.getLogger(__name__)

BUILD_NETWORK = "none"
"""The network of an image build's steps: none (the sandbox image's build context holds everything it installs)."""
_BUILD_LOG_LINES = 20
_BUILDER_COLOUR = re.compile(r"\x1b\[(?:91|0)m")
"""The classic builder's own marking of a step's stderr (red, then reset): dropped, not shown escaped."""
_BUILDER_NOISE = re.compile(r"^(?: ---> .*|Removing intermediate container \w+)$", re.MULTILINE)
"""The builder's bookkeeping lines (layer ids, cache use), which would push a step's own output out of the tail."""
_STEP_COMMAND = re.compile(r"^The command '.*' returned", re.DOTALL)
"""The engine's error repeats the whole failed step; the tail shows that step already."""

_START_ENGINE_HINT = (
    "start one with `scripts/setup-engine` (installs and starts Debian's docker.io as root) "
    "or `sudo systemctl start docker`, and check that DOCKER_HOST points at it"
)


@contextmanager
def engine_errors(action: str) -> Iterator[None]:
    """Translate Docker SDK and HTTP errors raised while doing ``action``."""
    try:
        yield
    except docker.errors.ImageNotFound as exc:
        raise ImageMissing(
            f"{action}: image not found ({exc.explanation}); build a sandbox image on a base image with python3: "
            "`orchestrator image build --base IMAGE`"
        ) from exc
    except (requests.exceptions.RequestException, docker.errors.DockerException) as exc:  # a timeout included
        if isinstance(exc, docker.errors.APIError):
            raise EngineError(f"{action}: the Docker engine refused: {exc.explanation or exc}") from exc
        raise EngineUnavailable(f"{action}: no Docker engine answers ({exc}); {_START_ENGINE_HINT}") from exc


class DockerBackend:
    """Sandbox containers and images on one Docker engine."""

    capabilities = Capabilities(passes_descriptors=True, delivers_signals=True)

    def __init__(self, client: docker.DockerClient | None = None) -> None:
        """Connect to the engine from the environment (DOCKER_HOST or the local socket).

        Raises:
            EngineUnavailable: no engine answers, with how to start one.
        """
        with engine_errors("connecting to the Docker engine"):
            self.client = client or docker.from_env()
            self.client.ping()
        self.workspaces = Workspaces()

    def close(self) -> None:
        """Close the connection pool to the engine."""
        self.client.close()

    def check_placement(self, placement: Placement) -> None:
        """One engine runs every sandbox: any placement is refused."""
        if not placement.is_empty():
            raise ConfigError(
                "a session placement (constraints, reservations) needs Settings.backend='swarm' (ORCH_BACKEND=swarm); "
                "the docker backend runs every sandbox on one engine"
            )

    def image_exists(self, tag: str) -> bool:
        return self.image_id(tag) is not None

    def image_id(self, tag: str) -> str | None:
        image = self._image(tag)
        return None if image is None else str(image.id)

    def image_labels(self, tag: str) -> dict[str, str] | None:
        image = self._image(tag)
        return None if image is None else dict(image.labels)

    def _image(self, tag: str) -> Any:
        with engine_errors(f"inspecting image {tag}"):
            try:
                return self.client.images.get(tag)
            except docker.errors.ImageNotFound:
                return None

    def build_image(
        self, context_tar: bytes, tag: str, buildargs: Mapping[str, str], labels: Mapping[str, str]
    ) -> None:
        """Build ``tag`` from an in-memory build context, its steps with no network (``network_mode`` "none"): the
        context holds all they need, and an engine without a default bridge (``--bridge=none``) builds it too.

        Raises:
            ImageBuildFailed: the build failed; the engine's error, and the build log's last lines.
        """
        with engine_errors(f"building image {tag}"):
            try:
                self.client.images.build(
                    fileobj=io.BytesIO(context_tar),
                    custom_context=True,
                    tag=tag,
                    buildargs=dict(buildargs),
                    labels=dict(labels),
                    network_mode=BUILD_NETWORK,
                    rm=True,
                    forcerm=True,
                    pull=False,
                )
            except docker.errors.BuildError as exc:
                base = buildargs.get("BASE_IMAGE", "")
                log = "".join(str(chunk.get("stream", "")) for chunk in exc.build_log if isinstance(chunk, dict))
                log = _BUILDER_NOISE.sub("", _BUILDER_COLOUR.sub("", log))
                reason = _STEP_COMMAND.sub("the step's command returned", " ".join(last_lines(str(exc.msg), 3, 500)))
                raise ImageBuildFailed(
                    f"building image {tag}{f' on {base}' if base else ''} failed: {reason}",
                    tag=tag,
                    base_image=base,
                    log_tail=last_lines(log, _BUILD_LOG_LINES),
                ) from None

    def create_endpoint(self, sandbox_id: str, settings: Settings, placement: Placement) -> UnixSocketEndpoint:
        """The controller listens in ``<runtime_dir>/<sandbox_id>/`` on this host (one machine: placement is moot)."""
        return UnixSocketEndpoint.create(settings.runtime_dir, sandbox_id, **endpoint_options(settings))

    def open_endpoint(self, sandbox_id: str, container_id: str, settings: Settings) -> UnixSocketEndpoint:
        return UnixSocketEndpoint.open(settings.runtime_dir, sandbox_id, **endpoint_options(settings))

    def run_sandbox(self, spec: SandboxSpec, settings: Settings) -> str:
        """Start one sandbox container with the security settings and its ``/workspace`` (``workspace.py``), its
        working directory; return its id.

        Raises:
            ImageMissing: ``spec.image`` does not exist.
            EngineError: the engine refused to create or start it (a container it created is removed again), or its
                workspace image could not be made (``WorkspaceMountFailed``, with ``workspace_mount`` "image").
        """
        workspace = self.workspaces.prepare(spec, settings, self._live_sandboxes)
        try:
            return self._run(spec, settings, workspace.volumes, workspace.tmpfs)
        except BaseException:
            self.workspaces.release(workspace)
            raise

    def _run(self, spec: SandboxSpec, settings: Settings, volumes: Mapping[str, Any], tmpfs: Mapping[str, str]) -> str:
        kwargs: dict[str, Any] = {
            "image": spec.image,
            "name": spec.name,
            "detach": True,
            "init": True,
            "labels": {MANAGED: "true", **spec.labels},
            "environment": dict(spec.environment),
            "volumes": {**{host: {"bind": inside, "mode": "ro"} for host, inside in spec.mounts.items()}, **volumes},
            "working_dir": WORKSPACE if volumes or tmpfs else "/tmp",
            "network_mode": f"container:{spec.network_of}" if spec.network_of else settings.confinement.network_mode,
            "user": settings.confinement.user,
            "read_only": settings.confinement.read_only,
            "tmpfs": {**settings.confinement.tmpfs, **tmpfs},
            "mem_limit": settings.limits.memory_bytes,
            "memswap_limit": settings.limits.memory_bytes,
            "nano_cpus": settings.limits.nano_cpus,
            "pids_limit": settings.limits.pids,
            "log_config": LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"}),
        }
        if spec.command is not None:
            kwargs["command"] = list(spec.command)
        if spec.groups:
            kwargs["group_add"] = [str(gid) for gid in spec.groups]
        if settings.confinement.cap_drop_all:
            kwargs["cap_drop"] = ["ALL"]
            if settings.confinement.separate_worker:
                kwargs["cap_add"] = list(SUPERVISOR_CAPABILITIES)
        if settings.confinement.no_new_privileges:
            kwargs["security_opt"] = ["no-new-privileges:true"]
        container_id = None
        try:
            with engine_errors(f"creating sandbox container {spec.name}"):
                container_id = str(self.client.containers.create(**kwargs).id)
            with engine_errors(f"starting sandbox container {spec.name}"):
                self.client.api.start(container_id)
        except BaseException:
            # Whatever came between create and start (an engine error, a timeout, KeyboardInterrupt), the container
            # must not outlive this call in state "created": nobody else knows it.
            self._remove_unstarted(container_id, spec)
            raise
        logger.info("started container %s (%s)", spec.name, container_id[:12])
        return container_id

    def _remove_unstarted(self, container_id: str | None, spec: SandboxSpec) -> None:
        """Remove a container whose start failed, or that create made though its answer was lost (found by its
        name and labels, never another's); a removal that fails too is logged (prune finds it later)."""
        try:
            if container_id is None:
                found = [c.id for c in self.find(spec.labels) if c.name == spec.name]
            else:
                found = [container_id]
            for container in found:
                self.remove(container)
        except EngineError as exc:
            logger.warning("could not remove container %s after its start failed (prune will): %s", spec.name, exc)

    def inspect(self, container_id: str) -> ContainerState | None:
        """The container's state, or None if it no longer exists."""
        with engine_errors(f"inspecting container {container_id[:12]}"):
            try:
                container = self.client.containers.get(container_id)
            except docker.errors.NotFound:
                return None
        return _state(container.attrs)

    def kill(self, container_id: str, signal: str = "SIGKILL") -> None:
        """Send a signal to the container's init process (SIGKILL stops the container)."""
        with engine_errors(f"signalling container {container_id[:12]}"):
            try:
                self.client.containers.get(container_id).kill(signal=signal)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # 409: not running, nothing to signal
                    raise

    def remove(self, container: str) -> None:
        """Remove a container (by id or name), running or not, then its workspace image (among its mounts, read
        first); missing or already being removed is fine."""
        mounts: list[dict[str, Any]] = []
        with engine_errors(f"removing container {container[:12]}"):
            try:
                mounts = self.client.api.inspect_container(container).get("Mounts") or []
                self.client.api.remove_container(container, force=True, v=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                if not (exc.status_code == 409 and "in progress" in str(exc.explanation)):
                    raise
        self.workspaces.release_mounted(mounts, self._live_sandboxes)

    def _live_sandboxes(self) -> set[str]:
        """The sandbox ids of every container of ours on this engine, running or not."""
        return {c.labels[SANDBOX_ID] for c in self.find({}) if SANDBOX_ID in c.labels}

    def find(self, labels: Mapping[str, str]) -> list[ContainerState]:
        """Our containers carrying all of ``labels``, found by label, running or not (one listing, no inspects)."""
        wanted = [f"{MANAGED}=true"] + [f"{key}={value}" for key, value in labels.items()]
        with engine_errors("listing sandbox containers"):
            containers = self.client.containers.list(all=True, filters={"label": wanted}, sparse=True)
            return [_listed_state(c.attrs) for c in containers]

    def resource_usage(self, container_ids: Iterable[str]) -> dict[str, ResourceUsage]:
        """Read from the containers' cgroups (``agent.usage``) when the engine runs on this host.

        A few small files per container (measured: docs/metrics.md); the stats API takes about a second per
        container, too slow for a listing. An engine on another host (or a cgroup layout we do not know) gives
        no numbers.
        """
        usage = {}
        for container_id in container_ids:
            memory, cpu = container_usage(container_id)
            if memory is not None or cpu is not None:
                usage[container_id] = ResourceUsage(memory_bytes=memory, cpu_seconds=cpu)
        return usage

    def usage(self, container_id: str) -> ContainerUsage | None:
        """Read from the container's cgroup on this host when the engine runs here (a file read); else one sample of
        the engine's stats (``one-shot``, which still waits for the engine's next collection: up to a second).

        Raises:
            EngineError: the engine refused; EngineUnavailable: it does not answer.
        """
        cpu, peak = cpu_and_peak(container_id)
        if cpu is not None and peak is not None:
            return ContainerUsage(cpu_ns=cpu, peak_memory=peak)
        with engine_errors(f"reading the stats of container {container_id[:12]}"):
            try:
                stats = self.client.api.stats(container_id, stream=False, one_shot=True)
            except (docker.errors.NotFound, requests.exceptions.JSONDecodeError):  # an empty body: it is being removed
                return None
        if not isinstance(stats, dict):
            return None
        cpu = _counter(stats, "cpu_stats", "cpu_usage", "total_usage")
        peak = _counter(stats, "memory_stats", "max_usage")
        if not cpu and peak is None:  # a stopped container's stats are empty
            return None
        return ContainerUsage(cpu_ns=cpu, peak_memory=peak)

    def logs(self, container_id: str, tail: int | None) -> str:
        with engine_errors(f"reading the log of container {container_id[:12]}"):
            raw = self.client.containers.get(container_id).logs(tail="all" if tail is None else tail)
        return bytes(raw).decode("utf-8", errors="replace")


def endpoint_options(settings: Settings) -> dict[str, Any]:
    """What an endpoint needs to know of the sandbox: its uid and gid, and the frame limits."""
    uid, gid = settings.confinement.sandbox_uid_gid
    return {
        "sandbox_uid": uid,
        "sandbox_gid": gid,
        "max_header": settings.limits.max_header_bytes,
        "max_body": settings.limits.max_body_bytes,
    }


_MAX_COUNTER = 1 << 62


def _counter(data: Any, *path: str) -> int | None:
    """A non-negative integer at ``path`` of the engine's JSON, or None (absent, not an integer, out of range)."""
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    return data if type(data) is int and 0 <= data < _MAX_COUNTER else None


_EXITED = re.compile(r"^Exited \((-?\d+)\)")
_PHASES = {"created": Phase.CREATED, "running": Phase.RUNNING, "removing": Phase.REMOVING, "dead": Phase.DEAD}
"""The engine's words for what is not an end; any other ("exited", "paused" or "restarting", which no sandbox of ours
reaches) is ``Phase.ENDED``."""


def _phase(status: str) -> Phase:
    return _PHASES.get(status, Phase.ENDED)


def _listed_state(attrs: dict[str, Any]) -> ContainerState:
    """A container as the listing shows it: its status word, and the exit code parsed from "Exited (137) ..."."""
    status = str(attrs.get("State", "unknown"))
    exited = _EXITED.match(str(attrs.get("Status", "")))
    names = attrs.get("Names") or [""]
    return ContainerState(
        id=attrs["Id"],
        name=str(names[0]).lstrip("/"),
        status=status,
        phase=_phase(status),
        running=status == "running",
        exit_code=int(exited.group(1)) if exited else None,
        oom_killed=False,
        labels=attrs.get("Labels") or {},
        created_at=float(created) if isinstance(created := attrs.get("Created"), int) else None,
    )


def _state(attrs: dict[str, Any]) -> ContainerState:
    state = attrs.get("State", {})
    return ContainerState(
        id=attrs["Id"],
        name=attrs.get("Name", "").lstrip("/"),
        status=state.get("Status", "unknown"),
        phase=_phase(state.get("Status", "unknown")),
        running=bool(state.get("Running")),
        exit_code=state.get("ExitCode"),
        oom_killed=bool(state.get("OOMKilled")),
        labels=attrs.get("Config", {}).get("Labels") or {},
    )
