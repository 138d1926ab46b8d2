"""Custom tools sorted by how they reach the sandbox: code runs there, JSON data is copied there, callables cannot go.

The sandbox is another process in another container, so a host function cannot be handed to
it. Like the peer, a string that is code defining the tool (``"def square(x): ..."``, a
``lambda``, a class) runs in the sandbox, and other values are copied as JSON. Unlike the
peer, a host callable is not skipped in silence: its name is bound in the sandbox to a stub
whose error says what happened, and a warning is logged when the environment is made.
"""

from __future__ import annotations

import ast
import json
import keyword
import logging
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._upstream import extract_tool_value

logger = logging.getLogger(__name__)

_CODE_STARTS = ("def ", "class ", "lambda", "async def ")


@dataclass(frozen=True)
class ToolPlan:
    """Custom tools by kind.

    Attributes:
        code: name -> source that defines it; it runs in the sandbox.
        data: name -> JSON value; stored in the session as a variable.
        host: names of host callables; bound in the sandbox to a stub that raises with an explanation.
    """

    code: dict[str, str] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    host: tuple[str, ...] = ()


def _defined_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _code_source(name: str, text: str) -> str | None:
    """The source to run when ``text`` is code that defines ``name`` (or is a lambda); None when it is data.

    Raises:
        ValueError: ``text`` starts like code (def, class, lambda) but does not compile or define ``name``.
    """
    source = textwrap.dedent(text).strip("\n")
    starts_like_code = source.lstrip().startswith(_CODE_STARTS)
    if not starts_like_code and "\n" not in source:
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        if starts_like_code:
            raise ValueError(f"custom tool {name!r} looks like code but does not compile: {exc}") from None
        return None  # multi-line text, not Python
    body = tree.body
    if len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Lambda):
        return source
    if name in _defined_names(tree):
        return source
    if starts_like_code:
        raise ValueError(f"custom tool {name!r}: its code does not define {name!r} (nor is it one lambda expression)")
    return None


def _json_copy(name: str, value: Any) -> Any:
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"custom tool {name!r} ({type(value).__name__}) can go into the sandbox only as JSON data or as code "
            f"(a str that defines it), and it is neither: {exc}"
        ) from None


def plan_tools(custom_tools: Mapping[str, Any] | None) -> ToolPlan:
    """Sort ``custom_tools`` (values or ``{"tool": value, "description": ...}``) by how they reach the sandbox.

    Raises:
        ValueError: a name is not a Python identifier, code does not compile or define its
            name, or a value is neither code, JSON data nor callable.
    """
    plan = ToolPlan()
    host: list[str] = []
    for name, entry in (custom_tools or {}).items():
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise ValueError(f"custom tool name {name!r} is not a Python identifier")
        value = extract_tool_value(entry)
        source = _code_source(name, value) if isinstance(value, str) else None
        if source is not None:
            plan.code[name] = source
        elif callable(value):
            host.append(name)
            logger.warning(
                "custom tool %r is a callable of this host process and cannot run in the Docker sandbox; "
                "calling it there raises an error that says so. Pass its source code as a string instead.",
                name,
            )
        else:
            plan.data[name] = _json_copy(name, value)
    return ToolPlan(code=plan.code, data=plan.data, host=tuple(host))
