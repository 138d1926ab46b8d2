"""The relays: one per Swarm node (a global service), each the node-side end of its sandboxes' channels.

A relay runs our sandbox image (``python3 -m orchestrator_agent.node_relay``) with the node's
``Settings.swarm.node_dir`` mounted (and its ``/sys/fs/cgroup``, read-only, for the sandboxes' live usage),
on the node's own network, and serves this store's
controllers over mutual TLS. Its certificate and key reach it as Swarm secrets; the CA and
both certificates are made once per store (``tls.ensure_credentials``). Deploying is
idempotent: the service carries a digest of its spec and is replaced only when that changes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import ssl
import threading
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.types import (
    ContainerSpec,
    DriverConfig,
    Mount,
    Resources,
    RestartPolicy,
    SecretReference,
    ServiceMode,
    TaskTemplate,
)

from ...config import Settings
from ...errors import ConfigError
from ..base import LABEL_PREFIX, MANAGED, STORE_ID
from ..docker import engine_errors
from .nodes import Node
from .relay_client import RelayClient
from .tls import CA_CERT, RELAY_CERT, RELAY_KEY, Credentials, client_context, ensure_credentials

logger = logging.getLogger(__name__)

ROLE = LABEL_PREFIX + "role"
SPEC_DIGEST = LABEL_PREFIX + "relay-spec"
RELAY_PORT = LABEL_PREFIX + "relay-port"
RELAY_DIR = "/relay"
"""Where the node directory appears inside the relay."""
CGROUP_DIR = "/host/cgroup"
"""Where the node's ``/sys/fs/cgroup`` appears inside the relay (read-only): its sandboxes' usage for ``ls``."""
_SECRETS_DIR = "/run/secrets"
_CONTROL_SECONDS = 5.0


class RelayFleet:
    """This store's relay service on the Swarm, and a client for the relay on any node."""

    def __init__(self, client: docker.DockerClient, settings: Settings, *, scope: str, image: str) -> None:
        self._client = client
        self._settings = settings
        self._scope = scope
        self._image = image
        self._credentials: Credentials = ensure_credentials(Path(settings.state_dir) / "swarm-tls")
        self._tls: ssl.SSLContext = client_context(self._credentials)
        self._deployed = False
        self._lock = threading.Lock()

    @property
    def service_name(self) -> str:
        return f"orch-relay-{self._scope}"

    def node_dir(self) -> Path:
        """This store's part of the node directory, as the node (and so a sandbox's bind mount) sees it."""
        return Path(self._settings.swarm.node_dir) / self._scope

    def client(self, node: Node) -> RelayClient:
        """A client for the relay on ``node``; the relay service is deployed (or brought up to date) first."""
        self.ensure()
        return RelayClient(node.address, self._settings.swarm.relay_port, self._tls, timeout=_CONTROL_SECONDS)

    def ensure(self) -> None:
        """Deploy the relay service, or replace it when its spec changed (a relay holds nothing to lose)."""
        with self._lock:
            if self._deployed:
                return
            template, digest = self._task_template()
            with engine_errors(f"deploying the relay service {self.service_name}"):
                relays = self._client.api.services(filters={"label": [f"{MANAGED}=true", f"{ROLE}=relay"]})
                self._check_port_free(relays)
                current = [s for s in relays if s["Spec"]["Name"] == self.service_name]
                if current and current[0]["Spec"].get("Labels", {}).get(SPEC_DIGEST) == digest:
                    self._deployed = True
                    return
                for service in current:
                    self._client.api.remove_service(service["ID"])
                self._client.api.create_service(
                    template,
                    name=self.service_name,
                    labels={**self._labels(), SPEC_DIGEST: digest, RELAY_PORT: str(self._settings.swarm.relay_port)},
                    mode=ServiceMode("global"),
                    networks=["host"],
                )
            logger.info("deployed the relay service %s (port %d)", self.service_name, self._settings.swarm.relay_port)
            self._deployed = True

    def _check_port_free(self, relays: list[dict[str, Any]]) -> None:
        """Relays listen on the nodes' own network: another store's relay on our port would answer in our place."""
        port = str(self._settings.swarm.relay_port)
        for relay in relays:
            labels = relay["Spec"].get("Labels") or {}
            if labels.get(STORE_ID) != self._scope and labels.get(RELAY_PORT) == port:
                raise ConfigError(
                    f"the relay service {relay['Spec']['Name']} of another store already listens on port {port} of "
                    "every node; give this store another Settings.swarm.relay_port (ORCH_SWARM_RELAY_PORT), or remove "
                    f"that service (`docker service rm {relay['Spec']['Name']}`) if its store is gone"
                )

    def _labels(self) -> dict[str, str]:
        return {MANAGED: "true", STORE_ID: self._scope, ROLE: "relay"}

    def _task_template(self) -> tuple[TaskTemplate, str]:
        """The relay's task, and a digest of everything in it that should restart it when it changes."""
        secrets = [self._secret(name, data) for name, data in self._credentials.relay_files().items()]
        environment = {
            "ORCH_RELAY_LISTEN": f"0.0.0.0:{self._settings.swarm.relay_port}",
            "ORCH_RELAY_DIR": f"{RELAY_DIR}/{self._scope}",
            "ORCH_RELAY_CERT": f"{_SECRETS_DIR}/{RELAY_CERT}",
            "ORCH_RELAY_KEY": f"{_SECRETS_DIR}/{RELAY_KEY}",
            "ORCH_RELAY_CA": f"{_SECRETS_DIR}/{CA_CERT}",
            "ORCH_RELAY_CGROUP": CGROUP_DIR,
        }
        # The relay makes its store's directory under the node directory, then serves it.
        command = [
            "sh",
            "-c",
            f"mkdir -p -m 0700 {RELAY_DIR}/{self._scope} && exec python3 -m orchestrator_agent.node_relay",
        ]
        container = ContainerSpec(
            image=self._image,
            command=command,
            env=environment,
            user="0:0",  # it hands each sandbox's directory to the sandbox's uid
            read_only=True,
            init=True,
            cap_drop=["ALL"],
            cap_add=["CHOWN", "DAC_OVERRIDE", "FOWNER"],
            mounts=[
                Mount(RELAY_DIR, str(self._settings.swarm.node_dir), type="bind"),
                Mount(CGROUP_DIR, "/sys/fs/cgroup", type="bind", read_only=True),
                Mount("/tmp", None, type="tmpfs", tmpfs_size=16 << 20),
            ],
            secrets=secrets,
            labels=self._labels(),
        )
        template = TaskTemplate(
            container,
            resources=Resources(mem_limit=256 << 20),
            restart_policy=RestartPolicy(condition="any", delay=1_000_000_000),
            log_driver=DriverConfig("json-file", {"max-size": "1m", "max-file": "1"}),
        )
        digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:16]
        return template, digest

    def _secret(self, filename: str, data: bytes) -> SecretReference:
        """A Swarm secret with ``data`` (made once: secrets are immutable, so the name carries the content's digest)."""
        name = f"orch-relay-{self._scope}-{filename.replace('.', '-')}-{hashlib.sha256(data).hexdigest()[:12]}"
        found: list[dict[str, Any]] = self._client.api.secrets(filters={"name": name})
        match = [s for s in found if s["Spec"]["Name"] == name]
        if match:
            secret_id = match[0]["ID"]
        else:
            try:
                secret_id = self._client.api.create_secret(name, data, labels=self._labels())["ID"]
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # made meanwhile by another controller of this store
                    raise
                secret_id = self._client.api.secrets(filters={"name": name})[0]["ID"]
        return SecretReference(secret_id, name, filename=filename, uid="0", gid="0", mode=0o400)
