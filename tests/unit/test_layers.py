"""Imports point down the layers of docs/architecture.md; the few that do not yet are listed here, one by one."""

from __future__ import annotations

import ast
from pathlib import Path

import orchestrator

PACKAGE = Path(orchestrator.__file__).parent

RANK = {
    # the top-level helpers and the agent (stdlib only, copied into the image) are below everything
    "errors": 0,
    "extras": 0,
    "config": 0,
    "checks": 0,
    "files": 0,
    "units": 0,
    "spelling": 0,
    "safe_text": 0,
    "metrics": 0,
    "metrics_http": 0,
    "bearer": 0,
    "slots": 0,
    "agent": 0,
    "wire": 1,
    "backends": 2,
    "state": 3,
    "runtime": 4,
    "ops": 5,
    "api": 6,
    "evaluation": 7,
    "rlm": 7,
    "cli": 7,
    "mcp": 7,
}
"""A module may import its own layer's modules and those of a lower rank."""

UPWARD = {
    ("api.manager", "evaluation"),  # Orchestrator.evaluate runs the evaluation, which runs on sessions
    ("api.manager", "evaluation.evaluator"),
    ("api.aio", "evaluation"),  # AsyncOrchestrator.evaluate, the twin of Orchestrator.evaluate: its argument types
    ("api.aio", "evaluation.evaluator"),
    ("ops.janitor", "api.manager"),  # the janitor is a service built on an Orchestrator
    ("ops.prune", "evaluation.evaluator"),  # the label of an eval run's containers
    ("backends.swarm.backend", "ops"),  # the relays run the sandbox image (ops.images)
    ("state.ledger", "runtime"),  # runtime.background: the thread that writes a host-made blob
    ("state.controllers", "runtime.discard"),  # a dead controller's sandboxes are discarded
}
"""Imports that point up today: each is a candidate to move, and nothing may join them unnoticed."""


def _imports(path: Path, module: str) -> set[str]:
    """Modules of the package that ``module`` imports, relative to ``orchestrator`` ("wire.replies")."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            parts = ["orchestrator", *package.split(".")] if package else ["orchestrator"]
            base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            names = [f"{base}.{alias.name}" for alias in node.names] if node.module is None else [base]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found |= {name.removeprefix("orchestrator.") for name in names if name.startswith("orchestrator.")}
    return found


def _layer(module: str) -> str:
    return module.split(".")[0]


def _upward_imports() -> set[tuple[str, str]]:
    upward = set()
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if _layer(module) not in RANK:
            continue  # the package's own __init__, aio and __main__ re-export the public API
        for target in _imports(path, module):
            if _layer(target) in RANK and RANK[_layer(target)] > RANK[_layer(module)]:
                upward.add((module, target))
    return upward


def test_every_layer_has_a_rank():
    layers = {path.stem for path in PACKAGE.glob("*.py")} | {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert layers - {"__init__", "__main__", "aio"} == set(RANK)


def test_imports_point_down_but_for_the_listed_ones():
    assert _upward_imports() == UPWARD
