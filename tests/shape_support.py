"""The shape of the package as ast sees it: imports, cycles, long functions, wide signatures, big classes.

One reader for ``scripts/shape`` (the figures of a checkout) and the tests that keep them
(``tests/unit/test_layers.py``, ``tests/unit/test_shape.py``). Standard library only: it reads the
source and never imports the package, so it measures any checkout.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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
    "background": 0,
    "agent": 0,
    "wire": 1,
    "backends": 2,
    "state": 3,
    "runtime": 4,
    "ops": 5,
    "api": 6,
    # beside api/, not on it: a second public API on ops/ and runtime/ (pooled sandboxes, no Session), sharing
    # api's values (a cell's ExecError, the LiveCall that streams its output); Orchestrator.evaluate runs it
    "evaluation": 6,
    "rlm": 7,
    "cli": 7,
    "mcp": 7,
}
"""A module may import its own layer's modules and those of a lower rank."""

MAX_PARAMETERS = 7
"""A function takes at most this many parameters (``self`` and ``cls`` aside)."""

MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 500
"""Outside ``agent/``, which runs in the sandbox and keeps to the standard library."""

MAX_MODULE_LINES = 500

_VALUE_BASES = {"NamedTuple", "TypedDict"}


@dataclass(frozen=True)
class Block:
    """A function or class: where it is and how long (its ``def`` or ``class`` line to its last)."""

    kind: str
    """``"function"`` (methods and nested functions too) or ``"class"``."""
    module: str
    """Relative to the package, ``""`` for its ``__init__``: ``"cli.commands"``."""
    name: str
    """Qualified within the module: ``"Session.__init__"``."""
    lines: int
    parameters: int = 0
    """Functions only: how many it takes, ``self`` and ``cls`` aside (``*args`` and ``**kwargs`` count one each)."""
    value_constructor: bool = False
    """An ``__init__`` of a value object: a dataclass, NamedTuple or TypedDict, or one that only sets attributes
    (itself or through its base class's ``__init__``)."""

    def __str__(self) -> str:
        return f"{self.module}:{self.name}"


@dataclass(frozen=True)
class Module:
    """One ``.py`` file of the package, parsed."""

    name: str
    """Relative to the package: ``"wire.replies"``; ``"api"`` for ``api/__init__.py``; ``""`` for the package's."""
    path: Path
    tree: ast.Module
    lines: int

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"

    @property
    def layer(self) -> str:
        return self.name.split(".")[0]


def modules(package: Path) -> dict[str, Module]:
    """Every module of ``package`` (the ``orchestrator`` directory of a checkout), by name."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        text = path.read_text()
        found[name] = Module(name, path, ast.parse(text, str(path)), len(text.splitlines()))
    return found


def imports(module: Module, known: set[str] | None = None) -> set[str]:
    """Modules of the package that ``module`` imports anywhere in it (in functions and ``TYPE_CHECKING`` too).

    Names are relative to the package (``"wire.replies"``, ``""`` for its ``__init__``). Given the
    ``known`` modules, ``from .wire import replies`` names the module ``wire.replies`` and ``from .. import
    Session`` the package's ``__init__`` (``""``); without them, a ``from`` import names what follows ``from``
    and each imported name beneath it, as the layer check needs.
    """
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = ["orchestrator", *package.split(".")] if package else ["orchestrator"]
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names = [f"{base}.{alias.name}" for alias in node.names]
            if known is not None:  # the submodules it names, and the package if it names anything else
                modules_named = [name for name in names if _relative(name) in known]
                names = modules_named + ([base] if len(modules_named) < len(names) else [])
            elif node.module:
                names = [base]
            found |= {_relative(name) for name in names if _inside(name)}
        elif isinstance(node, ast.Import):
            found |= {_relative(alias.name) for alias in node.names if _inside(alias.name)}
    if known is not None:
        found = {_nearest(name, known) for name in found}
    return found


def _inside(name: str) -> bool:
    return name == "orchestrator" or name.startswith("orchestrator.")


def _relative(name: str) -> str:
    return name.removeprefix("orchestrator").removeprefix(".")


def _nearest(name: str, known: set[str]) -> str:
    """The module ``name`` is, or the package holding the name it imports (``api.session.Session``: ``api.session``)."""
    while name not in known and name:
        name = name.rpartition(".")[0]
    return name


def upward_imports(found: dict[str, Module]) -> set[tuple[str, str]]:
    """(importer, imported) for each import of a higher layer than the importer's, per ``RANK``."""
    upward = set()
    for module in found.values():
        if module.layer not in RANK:
            continue  # the package's own __init__, aio and __main__ re-export the public API
        for target in imports(module):
            layer = target.split(".")[0]
            if layer in RANK and RANK[layer] > RANK[module.layer]:
                upward.add((module.name, target))
    return upward


def cycles(found: dict[str, Module]) -> list[list[str]]:
    """The groups of modules that import each other, directly or not (Tarjan's strongly connected components)."""
    known = set(found)
    graph = {name: sorted(imports(module, known) - {name}) for name, module in found.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups = []

    def visit(start: str) -> None:
        # iterative, so a deep chain of imports cannot exhaust the interpreter's stack
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            name, targets = work[-1]
            target = next(targets, None)
            if target is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[name])
                if low[name] == index[name]:
                    group = []
                    while not group or group[-1] != name:
                        group.append(stack.pop())
                    if len(group) > 1:
                        groups.append(sorted(group))
            elif target not in index:
                index[target] = low[target] = len(index)
                stack.append(target)
                work.append((target, iter(graph[target])))
            elif target in stack:
                low[name] = min(low[name], index[target])

    for name in graph:
        if name not in index:
            visit(name)
    return sorted(groups)


def shortest_cycle(found: dict[str, Module], group: list[str]) -> list[str]:
    """One shortest loop of imports through the group's first module, for the reader: ``[a, b, a]``."""
    known = set(found)
    members = set(group)
    start = group[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for name in frontier:
            for target in sorted(imports(found[name], known) & members):
                if target == start:
                    return [*paths[name], start]
                if target not in paths:
                    paths[target] = [*paths[name], target]
                    following.append(target)
        frontier = following
    return group


def blocks(module: Module) -> Iterator[Block]:
    """Every function (methods and nested ones too) and class of the module, with its size."""
    yield from _blocks(module.name, module.tree.body, prefix="", owner=None)


def _blocks(module: str, body: list[ast.stmt], prefix: str, owner: ast.ClassDef | None) -> Iterator[Block]:
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = prefix + node.name
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            value = node.name == "__init__" and owner is not None and _is_value_object(owner, node)
            yield Block("function", module, name, lines, _parameters(node, method=owner is not None), value)
            yield from _blocks(module, node.body, f"{name}.", owner=None)
        elif isinstance(node, ast.ClassDef):
            name = prefix + node.name
            yield Block("class", module, name, (node.end_lineno or node.lineno) - node.lineno + 1)
            yield from _blocks(module, node.body, f"{name}.", owner=node)
        else:
            for child in ast.iter_child_nodes(node):  # a def under an if or try
                if isinstance(child, ast.stmt):
                    yield from _blocks(module, [child], prefix, owner)


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> int:
    arguments = node.args
    named = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    if method and named and named[0].arg in ("self", "cls"):
        named = named[1:]
    return len(named) + (arguments.vararg is not None) + (arguments.kwarg is not None)


def _is_value_object(owner: ast.ClassDef, init: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    decorators = {_name(decorator) for decorator in owner.decorator_list}
    if "dataclass" in decorators or {_name(base) for base in owner.bases} & _VALUE_BASES:
        return True
    return all(_sets_attributes(statement) for statement in init.body)


def _sets_attributes(statement: ast.stmt) -> bool:
    """A docstring, an assignment whose every target is an attribute of ``self``, or the base class's ``__init__``
    given names only (``super().__init__(message, restored=restored)``: the base sets its attributes)."""
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
        return True
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        call = statement.value
        names = [*call.args, *(keyword.value for keyword in call.keywords)]
        return (
            isinstance(call.func, ast.Attribute)
            and call.func.attr == "__init__"
            and all(isinstance(name, ast.Name) for name in names)
        )
    if isinstance(statement, ast.Assign):
        return all(_is_self_attribute(target) for target in statement.targets)
    if isinstance(statement, ast.AnnAssign):
        return _is_self_attribute(statement.target)
    return False


def _is_self_attribute(target: ast.expr) -> bool:
    if isinstance(target, ast.Tuple):
        return all(_is_self_attribute(element) for element in target.elts)
    return isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"


def _name(node: ast.expr) -> str:
    """``dataclass`` for ``@dataclass``, ``@dataclass(frozen=True)`` and ``@dataclasses.dataclass``."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


@dataclass(frozen=True)
class Shape:
    """The figures of one package: what ``scripts/shape`` prints and the tests keep."""

    modules: dict[str, Module]
    functions: list[Block]
    classes: list[Block]

    @classmethod
    def of(cls, package: Path) -> Shape:
        found = modules(package)
        every = [block for module in found.values() for block in blocks(module)]
        return cls(found, [b for b in every if b.kind == "function"], [b for b in every if b.kind == "class"])

    def wide(self) -> list[Block]:
        """Functions with more than ``MAX_PARAMETERS`` parameters, value objects' constructors aside."""
        return [f for f in self.functions if f.parameters > MAX_PARAMETERS and not f.value_constructor]

    def wide_constructors(self) -> list[Block]:
        """The value objects' constructors that take more than ``MAX_PARAMETERS`` (allowed)."""
        return [f for f in self.functions if f.parameters > MAX_PARAMETERS and f.value_constructor]

    def long_functions(self) -> list[Block]:
        return [f for f in self.functions if f.lines > MAX_FUNCTION_LINES]

    def big_classes(self) -> list[Block]:
        """Classes over ``MAX_CLASS_LINES`` outside the agent."""
        return [c for c in self.classes if c.lines > MAX_CLASS_LINES and c.module.split(".")[0] != "agent"]

    def big_modules(self) -> list[Module]:
        return [m for m in self.modules.values() if m.lines > MAX_MODULE_LINES]
