"""The Swarm's nodes as the controller sees them, and the choice of one for a new sandbox.

The controller picks the node itself, because a sandbox's channel directory must exist on its
node before the service starts (the relay there makes it, and a bind mount whose source is
missing gets the task rejected, never retried). So the placement constraints a session asks for
are evaluated here, in the same words as Swarm's, and then passed to Swarm as well.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import ConfigError

_CONSTRAINT = re.compile(r"\s*([A-Za-z][\w.-]*)\s*(==|!=)\s*(.*?)\s*")


@dataclass(frozen=True)
class Node:
    """One Swarm node, from the manager's node listing."""

    id: str
    hostname: str
    address: str
    """Where its relay answers (the node's address in the Swarm)."""
    role: str
    ready: bool
    """Its state is ``ready``: a stopped node turns ``down`` only ~15 s later, so this alone is not proof of life."""
    active: bool
    """Its availability is ``active`` (not drained or paused): new tasks may go there."""
    labels: Mapping[str, str] = field(default_factory=dict)
    engine_labels: Mapping[str, str] = field(default_factory=dict)
    os: str = "linux"
    arch: str = ""

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> Node:
        """Parse one entry of ``GET /nodes``."""
        spec = attrs.get("Spec") or {}
        description = attrs.get("Description") or {}
        status = attrs.get("Status") or {}
        engine = description.get("Engine") or {}
        platform = description.get("Platform") or {}
        return cls(
            id=str(attrs["ID"]),
            hostname=str(description.get("Hostname", "")),
            address=str(status.get("Addr", "")),
            role=str(spec.get("Role", "")),
            ready=status.get("State") == "ready",
            active=spec.get("Availability") == "active",
            labels=dict(spec.get("Labels") or {}),
            engine_labels=dict(engine.get("Labels") or {}),
            os=str(platform.get("OS", "linux")).lower(),
            arch=str(platform.get("Architecture", "")).lower(),
        )

    def attribute(self, name: str) -> str | None:
        """The value Swarm compares for a constraint attribute, or None when the node has no such attribute."""
        fixed = {
            "node.id": self.id,
            "node.hostname": self.hostname,
            "node.role": self.role,
            "node.platform.os": self.os,
            "node.platform.arch": self.arch,
        }
        if name in fixed:
            return fixed[name]
        for prefix, labels in (("node.labels.", self.labels), ("engine.labels.", self.engine_labels)):
            if name.startswith(prefix):
                return labels.get(name[len(prefix) :])
        return None


def parse_constraint(text: str) -> tuple[str, bool, str]:
    """(attribute, wants equal, value) of ``node.labels.zone==eu``.

    Raises:
        ConfigError: not a constraint of a kind this controller can evaluate.
    """
    match = _CONSTRAINT.fullmatch(text)
    if not match or not match.group(3):
        raise ConfigError(f"placement constraint {text!r} is not like 'node.labels.zone==eu' or 'node.role!=manager'")
    name, operator, value = match.groups()
    known = name in ("node.id", "node.hostname", "node.role", "node.platform.os", "node.platform.arch")
    if not known and not name.startswith(("node.labels.", "engine.labels.")):
        raise ConfigError(
            f"placement constraint {text!r}: {name!r} is not a node attribute this controller knows "
            "(node.id, node.hostname, node.role, node.platform.os, node.platform.arch, node.labels.*, engine.labels.*)"
        )
    return name, operator == "==", value


def satisfies(node: Node, constraints: Iterable[str]) -> bool:
    """Whether Swarm would place a task with ``constraints`` on ``node`` (values compare case-insensitively,
    as Swarm's do; a missing label never equals anything)."""
    for constraint in constraints:
        name, equal, value = parse_constraint(constraint)
        actual = node.attribute(name)
        same = actual is not None and actual.lower() == value.lower()
        if same != equal:
            return False
    return True


def choose(nodes: Sequence[Node], constraints: Sequence[str], load: Mapping[str, int], avoid: set[str]) -> list[Node]:
    """The nodes a new sandbox may go to, best first: ready, active, allowed by ``constraints``, not in ``avoid``
    (relays that did not answer), fewest of our sandboxes (``load``: node id -> count) first, ties in random order.

    Raises:
        ConfigError: a constraint cannot be evaluated.
    """
    for constraint in constraints:
        parse_constraint(constraint)
    eligible = [n for n in nodes if n.ready and n.active and n.id not in avoid and satisfies(n, constraints)]
    random.shuffle(eligible)
    return sorted(eligible, key=lambda n: load.get(n.id, 0))
