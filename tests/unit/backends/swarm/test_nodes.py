"""Node choice for Swarm sandboxes: constraints evaluated as Swarm does, spread by load, placement validated; and
which sandbox directories on a node a sweep deletes."""

from __future__ import annotations

import pytest

from orchestrator.backends.base import Placement
from orchestrator.backends.swarm.backend import SwarmBackend, stale_sandbox_dirs
from orchestrator.backends.swarm.nodes import Node, choose, parse_constraint, satisfies
from orchestrator.errors import ConfigError


def node(node_id: str, **changes: object) -> Node:
    fields: dict[str, object] = {
        "id": node_id,
        "hostname": f"host-{node_id}",
        "address": "127.0.0.1",
        "role": "worker",
        "ready": True,
        "active": True,
        "labels": {"zone": "eu"},
    }
    fields.update(changes)
    return Node(**fields)  # type: ignore[arg-type]


def test_node_from_the_engine_listing() -> None:
    attrs = {
        "ID": "n1",
        "Spec": {"Role": "manager", "Availability": "drain", "Labels": {"zone": "us"}},
        "Description": {"Hostname": "h1", "Platform": {"OS": "linux", "Architecture": "x86_64"}, "Engine": {}},
        "Status": {"State": "ready", "Addr": "127.0.0.2"},
    }
    parsed = Node.from_attrs(attrs)
    assert (parsed.id, parsed.hostname, parsed.address, parsed.role) == ("n1", "h1", "127.0.0.2", "manager")
    assert parsed.ready and not parsed.active
    assert parsed.attribute("node.labels.zone") == "us"
    assert parsed.attribute("node.labels.missing") is None


@pytest.mark.parametrize(
    ("constraint", "expected"),
    [
        ("node.labels.zone==eu", True),
        ("node.labels.zone == EU", True),
        ("node.labels.zone!=eu", False),
        ("node.labels.missing==x", False),
        ("node.labels.missing!=x", True),
        ("node.role==worker", True),
        ("node.role!=manager", True),
        ("node.hostname==host-a", True),
        ("node.id==b", False),
    ],
)
def test_constraints_read_as_swarm_reads_them(constraint: str, expected: bool) -> None:
    assert satisfies(node("a"), [constraint]) is expected


@pytest.mark.parametrize("bad", ["zone", "node.labels.zone=eu", "node.labels.zone==", "node.color==red"])
def test_a_constraint_we_cannot_evaluate_is_a_config_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="constraint"):
        parse_constraint(bad)
    with pytest.raises(ConfigError, match="constraint"):
        SwarmBackend.__new__(SwarmBackend).check_placement(Placement((bad,)))  # the constraints alone


def test_choose_skips_down_drained_avoided_and_excluded_nodes_and_spreads_by_load() -> None:
    nodes = [
        node("a"),
        node("b"),
        node("c", ready=False),
        node("d", active=False),
        node("e", labels={"zone": "us"}),
        node("f"),
    ]
    chosen = choose(nodes, ["node.labels.zone==eu"], {"a": 3, "b": 1, "f": 2}, avoid={"f"})
    assert [n.id for n in chosen] == ["b", "a"]
    assert choose(nodes, ["node.labels.zone==mars"], {}, avoid=set()) == []


def test_placement_round_trips_through_a_record_and_checks_its_values() -> None:
    placement = Placement(("node.role==worker",), 0.5, "256m")
    assert Placement.from_json(placement.to_json()) == placement
    assert Placement().to_json() == {}
    with pytest.raises(ConfigError, match="reserve_cpus"):
        Placement(reserve_cpus=0)
    with pytest.raises(ConfigError, match="size"):
        Placement(reserve_memory="lots")


def test_a_sweep_deletes_the_directories_of_no_live_sandbox_once_past_the_grace() -> None:
    ages = {"sb-live": 9000.0, "sb-left": 9000.0, "sb-at-grace": 60.0, "sb-starting": 59.9, "sb-a-left": 61.0}
    assert stale_sandbox_dirs(ages, {"sb-live", "sb-elsewhere"}, grace=60.0) == ["sb-a-left", "sb-at-grace", "sb-left"]
    assert stale_sandbox_dirs(ages, set(), grace=1e9) == []  # all too young to tell
    assert stale_sandbox_dirs(ages, set(ages), grace=0.0) == []  # all live
    assert stale_sandbox_dirs({}, set(), grace=0.0) == []
