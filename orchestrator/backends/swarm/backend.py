"""Docker Swarm as a ``Backend``: each sandbox is a one-replica service, placed on a node of the Swarm.

The controller talks to a Swarm manager (DOCKER_HOST or the Docker context, as for the docker
backend) and to the relay on each node (``relay_service.py``). A sandbox's "container id" is its
service's id. The same hardening as a local container is written into the service spec:
nobody, no capabilities, read-only root, size-capped tmpfs, memory / CPU / pids limits, and
no network: Swarm has no ``network_mode none``, so each sandbox gets an internal overlay
network of its own (no route out, no other sandbox on it) and a DNS server that answers
nothing (docs/swarm.md, ../shared/design/SWARM.md). Restart policy none: the controller
decides about restarts (from its checkpoints, on any node), never Swarm.

Health is judged from the task's desired state and its node's state, never from replica
counts: a stopped node's tasks still say "running" until the manager notices, ~15 s later.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import docker
import docker.errors
from docker.types import (
    ContainerSpec,
    DNSConfig,
    DriverConfig,
    EndpointSpec,
    Mount,
    Resources,
    RestartPolicy,
    ServiceMode,
    TaskTemplate,
)
from docker.types import Placement as SwarmPlacement
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, stop_when_event_set, wait_fixed

from ...config import WORKSPACE, Settings
from ...errors import ConfigError, EngineError, RelayUnavailable
from ...units import parse_size
from ...wire.endpoint import leftover_dir_grace
from ..base import (
    MANAGED,
    SANDBOX_ID,
    STORE_ID,
    SUPERVISOR_CAPABILITIES,
    Capabilities,
    ContainerState,
    ContainerUsage,
    Phase,
    Placement,
    ResourceUsage,
    SandboxSpec,
)
from ..docker import DockerBackend, endpoint_options, engine_errors
from ..workspace import tmpfs_options
from ..workspace_image import WorkspaceMountFailed
from .nodes import Node, choose, parse_constraint
from .relay_client import NodeDirectory, RelayClient, RelayEndpoint
from .relay_service import ROLE, RelayFleet

logger = logging.getLogger(__name__)

_NODES_FRESH_SECONDS = 1.0
_LOAD_FRESH_SECONDS = 1.0
"""How long a listing of the store's sandboxes per node serves node choices: the listing grows with the store
(every service and task), so a controller creating many sessions lists at most once a second and counts the
sandboxes it placed since."""
_NETWORK_GONE_SECONDS = 30.0
_STOP_GRACE_NS = 2_000_000_000
_RESOLVER_THAT_ANSWERS_NOTHING = "0.0.0.0"


class SwarmBackend:
    """Sandboxes as Swarm services on the nodes of the Swarm whose manager DOCKER_HOST names."""

    capabilities = Capabilities(passes_descriptors=False, delivers_signals=False)

    def __init__(
        self, settings: Settings, *, scope: str, relay_image: str, client: docker.DockerClient | None = None
    ) -> None:
        """Connect to a Swarm manager.

        Args:
            scope: the store id: it names this store's relay service and its part of each node's directory.
            relay_image: the image the relays run: the sandbox image (the relay is ``agent/node_relay.py``).

        Raises:
            EngineUnavailable: no engine answers.
            ConfigError: the engine is not a manager of an active Swarm.
        """
        self._images = DockerBackend(client)
        self.client = self._images.client
        with engine_errors("asking the engine about its Swarm"):
            swarm = self.client.info().get("Swarm") or {}
        if swarm.get("LocalNodeState") != "active" or not swarm.get("ControlAvailable"):
            raise ConfigError(
                "Settings.backend is 'swarm' but the engine DOCKER_HOST names is not a Swarm manager "
                f"(its swarm state: {swarm.get('LocalNodeState', 'unknown')}); point DOCKER_HOST at a manager, "
                "or run `docker swarm init` there"
            )
        self._settings = settings
        self._scope = scope
        self._relays = RelayFleet(self.client, settings, scope=scope, image=relay_image)
        self._nodes: tuple[float, dict[str, Node]] = (0.0, {})
        self._loads: tuple[float, Counter[str]] = (0.0, Counter())
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._sweeper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="swarm-sweep")
        self._sweep: Future[None] | None = None

    def close(self) -> None:
        """Stop the sweep (it gives up at its next step; a relay request under way ends first) before the engine
        client it uses is closed."""
        self._closing.set()
        self._sweeper.shutdown(wait=True, cancel_futures=True)
        self._images.close()

    def check_placement(self, placement: Placement) -> None:
        """Raises ConfigError for a constraint this controller cannot evaluate when it chooses a node."""
        for constraint in placement.constraints:
            parse_constraint(constraint)

    # -- images: on the manager's engine (a Swarm without a registry needs them loaded on every node: docs/swarm.md)

    def image_exists(self, tag: str) -> bool:
        return self._images.image_exists(tag)

    def image_id(self, tag: str) -> str | None:
        return self._images.image_id(tag)

    def image_labels(self, tag: str) -> Mapping[str, str] | None:
        return self._images.image_labels(tag)

    def build_image(
        self, context_tar: bytes, tag: str, buildargs: Mapping[str, str], labels: Mapping[str, str]
    ) -> None:
        self._images.build_image(context_tar, tag, buildargs, labels)

    # -- endpoints: the relay on the chosen node makes the sandbox's directory

    def create_endpoint(self, sandbox_id: str, settings: Settings, placement: Placement) -> RelayEndpoint:
        """Pick a node (ready, active, allowed by the constraints, fewest of this store's sandboxes) whose relay
        answers, and have that relay make the sandbox's directory; the endpoint pins the sandbox to the node.

        Raises:
            ConfigError: no node satisfies the constraints.
            RelayUnavailable: no eligible node's relay answered within ``Settings.timeouts.start``.
        """
        constraints = [*settings.swarm.constraints, *placement.constraints]
        deadline = time.monotonic() + settings.timeouts.start
        avoid: set[str] = set()
        failures: list[str] = []
        while True:
            nodes = self._node_map(fresh=True)
            candidates = choose(list(nodes.values()), constraints, self._load(), avoid)
            if not candidates and not avoid:
                raise ConfigError(
                    f"no ready, active node of the Swarm allows a sandbox with constraints {constraints or '(none)'}: "
                    f"nodes are {', '.join(_describe(n) for n in nodes.values()) or 'none'}"
                )
            for node in candidates:
                try:
                    endpoint = RelayEndpoint.create(
                        self._relays.client(node), sandbox_id, node=self._directory(node), **endpoint_options(settings)
                    )
                except RelayUnavailable as exc:
                    logger.warning("relay on node %s did not answer (%s); trying another node", node.hostname, exc)
                    avoid.add(node.id)
                    failures.append(f"{node.hostname}: {exc}")
                    continue
                with self._lock:
                    self._loads[1][node.id] += 1
                return endpoint
            if time.monotonic() >= deadline:
                raise RelayUnavailable(
                    f"no relay of an eligible node answered within {settings.timeouts.start:g} s "
                    f"({'; '.join(failures[-3:])}); check the relay service `docker service ps "
                    f"{self._relays.service_name}`"
                )
            avoid.clear()  # a relay that was starting may answer now
            time.sleep(0.5)

    def open_endpoint(self, sandbox_id: str, container_id: str, settings: Settings) -> RelayEndpoint:
        """Take the sandbox's endpoint over through the relay of the node it runs on; the relay cuts the agent's
        current connection, so it reconnects to the new socket (no signal needed).

        Raises:
            RelayUnavailable: that node's relay does not answer.
            EngineError: the sandbox runs on no known node.
        """
        task = self._task_of(container_id)
        node = self._node_map(fresh=True).get(str(task.get("NodeID"))) if task else None
        if node is None:
            raise EngineError(f"sandbox {sandbox_id} (service {container_id[:12]}) runs on no node the Swarm knows")
        return RelayEndpoint.open(
            self._relays.client(node), sandbox_id, node=self._directory(node), **endpoint_options(settings)
        )

    def _directory(self, node: Node) -> NodeDirectory:
        return NodeDirectory(node.id, self._relays.node_dir())

    # -- services

    def run_sandbox(self, spec: SandboxSpec, settings: Settings) -> str:
        """Create the sandbox's internal network and its one-replica service; return the service id.

        Raises:
            ConfigError: a setting Swarm cannot honour (a network other than none, a shared namespace).
            EngineError: the manager refused.
        """
        if settings.confinement.network_mode != "none" or spec.network_of is not None:
            raise ConfigError(
                "Swarm sandboxes have no network (an internal overlay of their own); Settings.confinement.network_mode "
                "other than 'none' and shared network namespaces need the docker backend"
            )
        labels = {MANAGED: "true", **spec.labels}
        with engine_errors(f"creating the network of sandbox {spec.name}"):
            network = self.client.api.create_network(
                spec.name, driver="overlay", internal=True, labels=labels, check_duplicate=True
            )["Id"]
        try:
            with engine_errors(f"creating sandbox service {spec.name}"):
                service = self.client.api.create_service(
                    self._task_template(spec, settings, network, labels),
                    name=spec.name,
                    labels=labels,
                    mode=ServiceMode("replicated", 1),
                    endpoint_spec=EndpointSpec(mode="dnsrr"),  # no virtual IP (and no IPVS on these nodes)
                )
        except BaseException:
            with contextlib.suppress(EngineError):
                self._remove_network(network, retry=False)
            raise
        logger.info("started service %s (%s)", spec.name, service["ID"][:12])
        return str(service["ID"])

    def _task_template(
        self, spec: SandboxSpec, settings: Settings, network: str, labels: Mapping[str, str]
    ) -> TaskTemplate:
        mounts = [Mount(inside, host, type="bind", read_only=True) for host, inside in spec.mounts.items()]
        mounts += [_tmpfs(path, options) for path, options in settings.confinement.tmpfs.items()]
        if settings.confinement.workspace_mount == "image":
            raise WorkspaceMountFailed(
                "Swarm nodes hold /workspace in a tmpfs, counted in the sandbox's memory (no node mounts images yet): "
                "ORCH_WORKSPACE_MOUNT=image needs Settings.backend='docker'; use auto or tmpfs"
            )
        # The workspace is always a tmpfs here, counted in the memory limit, until a node's relay mounts images; a
        # service's tmpfs takes no owner, so it is 1777 for the worker's uid, and no entry bound (docs/files.md).
        mounts.append(_tmpfs(WORKSPACE, tmpfs_options(settings.limits, owner=None)))
        container = ContainerSpec(
            image=spec.image,
            command=list(spec.command) if spec.command is not None else None,
            env=dict(spec.environment),
            workdir=WORKSPACE,
            user=settings.confinement.user,
            labels=dict(labels),
            mounts=mounts,
            read_only=settings.confinement.read_only,
            init=True,
            groups=[str(gid) for gid in spec.groups] or None,
            cap_drop=["ALL"] if settings.confinement.cap_drop_all else None,
            cap_add=list(SUPERVISOR_CAPABILITIES)
            if settings.confinement.cap_drop_all and settings.confinement.separate_worker
            else None,
            dns_config=DNSConfig(nameservers=[_RESOLVER_THAT_ANSWERS_NOTHING]),
            stop_grace_period=_STOP_GRACE_NS,
        )
        if settings.confinement.no_new_privileges:
            # Stored and enforced from API 1.45 on; Docker 20.10 drops it silently, which is why the sandbox
            # image has no setuid or setgid files (orchestrator/ops/sandbox.Dockerfile).
            container["Privileges"] = {"NoNewPrivileges": True}
        placement = spec.placement
        resources = Resources(
            cpu_limit=settings.limits.nano_cpus,
            mem_limit=settings.limits.memory_bytes,
            cpu_reservation=int(placement.reserve_cpus * 1e9) if placement.reserve_cpus else None,
            mem_reservation=parse_size(placement.reserve_memory) if placement.reserve_memory else None,
        )
        resources.setdefault("Limits", {})["Pids"] = settings.limits.pids  # no SDK argument; the engine enforces it
        template = TaskTemplate(
            container,
            resources=resources,
            restart_policy=RestartPolicy(condition="none"),
            placement=SwarmPlacement(constraints=[*settings.swarm.constraints, *placement.constraints]),
            log_driver=DriverConfig("json-file", {"max-size": "1m", "max-file": "1"}),
            networks=[{"Target": network}],
        )
        return template

    def inspect(self, container_id: str) -> ContainerState | None:
        """The sandbox's state from its service's newest task, or None when the service no longer exists."""
        with engine_errors(f"inspecting service {container_id[:12]}"):
            try:
                service = self.client.api.inspect_service(container_id)
            except docker.errors.NotFound:
                return None
            tasks = self.client.api.tasks(filters={"service": service["ID"]})
        return _state(service, _newest(tasks), self._node_map())

    def kill(self, container_id: str, signal: str = "SIGKILL") -> None:
        """SIGKILL stops the sandbox (its service is scaled to none; the service stays, as a killed container does).

        Swarm cannot signal a task. The one other signal we send, SIGUSR1 for a takeover, is not needed here:
        the relay cut the agent's connection when the new owner opened the endpoint.
        """
        if signal != "SIGKILL":
            logger.debug("service %s: %s not sent (Swarm cannot signal a task)", container_id[:12], signal)
            return
        with engine_errors(f"stopping service {container_id[:12]}"), contextlib.suppress(docker.errors.NotFound):
            self.client.services.get(container_id).scale(0)

    def remove(self, container: str) -> None:
        """Remove the sandbox's service, its directory on its node and its network; a missing one is fine.

        The network can go only once the task has left it, so that is done on a thread of its own (retried);
        networks of sandboxes whose controller died first, and directories whose node's relay did not answer
        (a drained or stopped node), are swept by every later removal (``_sweep_leftovers``).
        """
        with engine_errors(f"removing service {container[:12]}"):
            try:
                service = self.client.api.inspect_service(container)
            except docker.errors.NotFound:
                return
            task = _newest(self.client.api.tasks(filters={"service": service["ID"]}))
            with contextlib.suppress(docker.errors.NotFound):
                self.client.api.remove_service(service["ID"])
        sandbox_id = (service["Spec"].get("Labels") or {}).get(SANDBOX_ID)
        node = self._node_map().get(str(task.get("NodeID"))) if task else None
        if sandbox_id and node is not None:
            try:
                self._relays.client(node).remove(sandbox_id)
            except RelayUnavailable as exc:
                logger.warning(
                    "sandbox %s: its directory on node %s stays for now (%s); the next removal's sweep removes it "
                    "once that node's relay answers",
                    sandbox_id,
                    node.hostname,
                    exc,
                )
        with self._lock:
            if not self._closing.is_set() and (self._sweep is None or self._sweep.done()):
                self._sweep = self._sweeper.submit(self._sweep_leftovers)  # one pass at a time sweeps them all

    def _sweep_leftovers(self) -> None:
        """One pass over what removed sandboxes left behind: networks, then directories on the nodes."""
        self._sweep_networks()
        if not self._closing.is_set():
            self._sweep_sandbox_dirs()

    def _sweep_networks(self) -> None:
        """Remove this store's sandbox networks whose service is gone, once their tasks have left them."""
        try:
            with engine_errors("sweeping sandbox networks"):
                ours = {MANAGED: "true", STORE_ID: self._scope}
                networks = self.client.api.networks(filters={"label": _label_filter(ours), "driver": "overlay"})
                services = {s["Spec"]["Name"] for s in self.client.api.services(filters={"label": _label_filter(ours)})}
            for network in networks:
                if network["Name"] not in services:
                    self._remove_network(network["Id"])
        except EngineError as exc:
            logger.warning("sandbox networks not swept: %s", exc)

    def _sweep_sandbox_dirs(self) -> None:
        """Have the relay of each ready node that answers delete this store's sandbox directories that no service
        of the store uses and that are older than the grace (``stale_sandbox_dirs``)."""
        grace = leftover_dir_grace(self._settings.timeouts.start)
        try:
            listed = self._sandbox_dirs()
            # After the directories: a sandbox whose service was made while they were listed counts as live.
            live = self._live_sandbox_ids()
        except (EngineError, ConfigError) as exc:
            logger.warning("sandbox directories not swept: %s", exc)
            return
        for node, relay, ages in listed:
            for sandbox_id in stale_sandbox_dirs(ages, live, grace):
                if self._closing.is_set():
                    return
                try:
                    relay.remove(sandbox_id)
                except (RelayUnavailable, ConfigError) as exc:
                    logger.info("sandbox directories on node %s not swept: %s", node.hostname, exc)
                    break
                logger.info(
                    "sandbox %s: removed its directory on node %s (its service is gone)", sandbox_id, node.hostname
                )

    def _sandbox_dirs(self) -> list[tuple[Node, RelayClient, dict[str, float]]]:
        """Each ready node whose relay answers, its relay, and the ages of its sandbox directories; a relay that does
        not answer is skipped (a drained node's relay is stopped as well).

        Raises:
            EngineError: the nodes cannot be listed.
            ConfigError: the relay service cannot be deployed (another store's relay holds its port).
        """
        listed = []
        for node in self._node_map(fresh=True).values():
            if self._closing.is_set():
                break
            if not node.ready:
                continue
            relay = self._relays.client(node)
            try:
                listed.append((node, relay, relay.sandbox_ages()))
            except RelayUnavailable as exc:
                logger.debug("sandbox directories on node %s not swept: %s", node.hostname, exc)
        return listed

    def _live_sandbox_ids(self) -> set[str]:
        """The sandbox ids of this store's services (a killed sandbox's service stays, and so does its directory)."""
        with engine_errors("listing sandbox services"):
            services = self.client.api.services(
                filters={"label": _label_filter({MANAGED: "true", STORE_ID: self._scope})}
            )
        labels = [s["Spec"].get("Labels") or {} for s in services]
        return {str(each[SANDBOX_ID]) for each in labels if SANDBOX_ID in each}

    def _pause(self, seconds: float) -> None:
        """A retry's wait, cut short by ``close``."""
        self._closing.wait(seconds)

    def _remove_network(self, network: str, *, retry: bool = True) -> None:
        """Remove a network; with ``retry``, until its task has left it (up to ``_NETWORK_GONE_SECONDS``, or close)."""
        attempts = Retrying(
            retry=retry_if_exception_type(EngineError),
            stop=stop_after_delay(_NETWORK_GONE_SECONDS if retry else 0) | stop_when_event_set(self._closing),
            wait=wait_fixed(0.5),
            sleep=self._pause,
            reraise=True,
        )
        for attempt in attempts:
            with (
                attempt,
                engine_errors(f"removing network {network[:12]}"),
                contextlib.suppress(docker.errors.NotFound),
            ):
                self.client.api.remove_network(network)

    def find(self, labels: Mapping[str, str]) -> list[ContainerState]:
        """Our sandbox services carrying all of ``labels``, with their tasks' states (three engine calls, one when none
        matches)."""
        wanted = {MANAGED: "true", **labels}
        with engine_errors("listing sandbox services"):
            services = [
                s
                for s in self.client.api.services(filters={"label": _label_filter(wanted)})
                if (s["Spec"].get("Labels") or {}).get(ROLE) != "relay"
            ]
            if not services:  # the usual answer of a check such as identity's: no task or node listing for it
                return []
            tasks = self.client.api.tasks(filters={"service": [s["ID"] for s in services]})
        by_service: dict[str, list[dict[str, Any]]] = {}
        for task in tasks:
            by_service.setdefault(task["ServiceID"], []).append(task)
        nodes = self._node_map()
        return [_state(s, _newest(by_service.get(s["ID"], [])), nodes) for s in services]

    def resource_usage(self, container_ids: Iterable[str]) -> dict[str, ResourceUsage]:
        """Asked of each node's relay, which reads its sandboxes' cgroups (the stats API would take a second per
        task): one task listing for all of them, then one relay request per node (at once). A node whose relay
        does not answer gives no numbers; nothing is raised for them.

        Raises:
            EngineError: the tasks or nodes cannot be listed.
        """
        services = list(container_ids)
        if not services:
            return {}
        with engine_errors("listing the sandboxes' tasks"):
            tasks = self.client.api.tasks(filters={"service": services, "desired-state": "running"})
        nodes = self._node_map()
        on_node: dict[str, dict[str, str]] = {}  # node id -> task container id -> service id
        for task in tasks:
            container = ((task.get("Status") or {}).get("ContainerStatus") or {}).get("ContainerID")
            node = nodes.get(str(task.get("NodeID", "")))
            if isinstance(container, str) and node is not None and node.ready:
                on_node.setdefault(node.id, {})[container] = str(task["ServiceID"])
        if not on_node:
            return {}

        def ask(node_id: str) -> dict[str, ResourceUsage]:
            containers = on_node[node_id]
            try:
                usage = self._relays.client(nodes[node_id]).usage(list(containers))
            except (RelayUnavailable, ConfigError, EngineError) as exc:
                logger.debug("no usage from node %s: %s", nodes[node_id].hostname, exc)
                return {}
            return {containers[c]: ResourceUsage(memory_bytes=m, cpu_seconds=s) for c, (m, s) in usage.items()}

        found: dict[str, ResourceUsage] = {}
        with ThreadPoolExecutor(max_workers=min(len(on_node), _USAGE_NODES), thread_name_prefix="swarm-usage") as pool:
            for answer in pool.map(ask, on_node):
                found.update(answer)
        return found

    def usage(self, container_id: str) -> ContainerUsage | None:
        """Not known: the task's cgroup is on another machine."""
        return None

    def logs(self, container_id: str, tail: int | None) -> str:
        with engine_errors(f"reading the log of service {container_id[:12]}"):
            raw = self.client.api.service_logs(
                container_id, stdout=True, stderr=True, tail="all" if tail is None else tail
            )
            return b"".join(raw).decode("utf-8", errors="replace")

    # -- nodes

    def _node_map(self, *, fresh: bool = False) -> dict[str, Node]:
        """The Swarm's nodes by id (cached for a second unless ``fresh``)."""
        with self._lock:
            taken, nodes = self._nodes
            if fresh or time.monotonic() - taken > _NODES_FRESH_SECONDS:
                with engine_errors("listing the Swarm's nodes"):
                    nodes = {n.id: n for n in map(Node.from_attrs, self.client.api.nodes())}
                self._nodes = (time.monotonic(), nodes)
            return nodes

    def _load(self) -> dict[str, int]:
        """This store's live sandboxes per node id: listed at most once per ``_LOAD_FRESH_SECONDS``, plus those this
        backend placed since."""
        with self._lock:
            taken, load = self._loads
            if time.monotonic() - taken <= _LOAD_FRESH_SECONDS:
                return dict(load)
        listed = self._list_load()
        with self._lock:
            self._loads = (time.monotonic(), listed)
        return dict(listed)

    def _list_load(self) -> Counter[str]:
        """This store's live sandboxes per node id, as the manager has them (two calls, each the size of the store)."""
        with engine_errors("counting sandboxes per node"):
            services = self.client.api.services(
                filters={"label": _label_filter({MANAGED: "true", STORE_ID: self._scope})}
            )
            ids = [s["ID"] for s in services if (s["Spec"].get("Labels") or {}).get(ROLE) != "relay"]
            tasks = self.client.api.tasks(filters={"service": ids, "desired-state": "running"}) if ids else []
        return Counter(str(task.get("NodeID", "")) for task in tasks)

    def _task_of(self, service_id: str) -> dict[str, Any] | None:
        with engine_errors(f"inspecting service {service_id[:12]}"):
            return _newest(self.client.api.tasks(filters={"service": service_id}))


_USAGE_NODES = 16
"""Nodes whose relays ``resource_usage`` asks at once."""


def stale_sandbox_dirs(ages: Mapping[str, float], live: Collection[str], grace: float) -> list[str]:
    """The sandbox directories a sweep deletes, sorted: those of no live sandbox, at least ``grace`` seconds old.

    A directory is made before its sandbox's service exists (``create_endpoint``), so a young one without a service
    may be a sandbox starting right now, not a leftover.

    Args:
        ages: sandbox id -> seconds since its directory last changed (``RelayClient.sandbox_ages``).
        live: the sandbox ids of the store's services.
        grace: the age from which a directory without a service is a leftover.
    """
    return sorted(sandbox_id for sandbox_id, age in ages.items() if sandbox_id not in live and age >= grace)


def _label_filter(labels: Mapping[str, str]) -> list[str]:
    return [f"{key}={value}" for key, value in labels.items()]


def _tmpfs(path: str, options: str) -> Mount:
    """A tmpfs mount from Docker's ``size=256m,mode=1777`` option string."""
    parsed = dict(part.partition("=")[::2] for part in options.split(",") if part)
    size = parse_size(parsed["size"]) if "size" in parsed else None
    mode = int(parsed["mode"], 8) if "mode" in parsed else None
    return Mount(path, None, type="tmpfs", tmpfs_size=size, tmpfs_mode=mode)


def _newest(tasks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The service's current task: the one made last (a one-replica service with no restarts has one)."""
    return max(tasks, key=lambda t: (t.get("CreatedAt", ""), t.get("Version", {}).get("Index", 0)), default=None)


_NOT_YET_ENDED = frozenset({"new", "pending", "assigned", "accepted", "preparing", "ready", "starting", "running"})
"""Task states with no exit code yet: a task on its way to running reports 0 in its container status, which would
read as a container that ended (and a start that failed at once)."""


def _state(service: Mapping[str, Any], task: Mapping[str, Any] | None, nodes: Mapping[str, Node]) -> ContainerState:
    """A sandbox's state the way a container's would read, from its task, the task's desired state and its node."""
    spec = service.get("Spec") or {}
    status = (task or {}).get("Status") or {}
    state = str(status.get("State", "pending"))
    desired = str((task or {}).get("DesiredState", "running"))
    node = nodes.get(str((task or {}).get("NodeID", "")))
    container_status = status.get("ContainerStatus") or {}
    exit_code = container_status.get("ExitCode")
    if node is not None and not node.ready:
        word, phase = f"lost with its node ({node.hostname} is down)", Phase.ENDED
    elif state == "running" and desired != "running":
        word, phase = "removing", Phase.REMOVING  # shutting down: not settled yet
    elif state == "running" and node is not None:
        word, phase = state, Phase.RUNNING
    else:
        word, phase = state, Phase.CREATED if state in _NOT_YET_ENDED else Phase.ENDED
    if status.get("Err"):
        word = f"{word}: {status['Err']}"
    return ContainerState(
        id=str(service["ID"]),
        name=str(spec.get("Name", "")),
        status=word,
        phase=phase,
        running=state == "running" and desired == "running" and node is not None and node.ready,
        exit_code=int(exit_code) if isinstance(exit_code, int) and state not in _NOT_YET_ENDED else None,
        oom_killed=False,  # a task does not say; its exit code (137) and the node's engine would
        labels=dict(spec.get("Labels") or {}),
        node=node.hostname if node else None,
    )


def _describe(node: Node) -> str:
    state = ("ready" if node.ready else "down") + ("" if node.active else ", drained")
    return f"{node.hostname} ({node.role}, {state})"
