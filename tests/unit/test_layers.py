"""Imports point down the layers of docs/architecture.md; the few that do not yet are listed here, one by one."""

from __future__ import annotations

from pathlib import Path

from shape_support import RANK, cycles, modules, upward_imports

import orchestrator

PACKAGE = Path(orchestrator.__file__).parent

UPWARD: set[tuple[str, str]] = set()
"""Imports that point up today: each is a candidate to move, and nothing may join them unnoticed."""


def test_every_layer_has_a_rank():
    layers = {path.stem for path in PACKAGE.glob("*.py")} | {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert layers - {"__init__", "__main__", "aio"} == set(RANK)


def test_imports_point_down_but_for_the_listed_ones():
    assert upward_imports(modules(PACKAGE)) == UPWARD


CYCLES: list[list[str]] = []
"""Groups of modules that import each other (counting imports in functions and under TYPE_CHECKING)."""


def test_no_import_cycle_but_for_the_listed_ones():
    # a listed group may shrink as its imports are fixed; a module may not join one, nor a new group appear
    found = cycles(modules(PACKAGE))
    assert [group for group in found if not any(set(group) <= set(listed) for listed in CYCLES)] == []
