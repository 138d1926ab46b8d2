"""The ``pip install`` commands a user reads: in the docs' code (fences and inline code), the scripts, and the
strings of the package (its error hints). See test_install_lines.py."""

from __future__ import annotations

import ast
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_COMMAND = re.compile(r"\bpip3?\s+install\b(?P<rest>(?:(?!\s\d*>)[^;|&#)>`\n\"])*)")
"""``pip install`` and its words, up to the end of the shell command, the code span or the string."""
_FENCE = re.compile(r"^\s*`{3,}")
_TAKES_VALUE = frozenset({"-r", "--requirement", "-c", "--constraint", "-i", "--index-url", "-t", "--target"})
_EDITABLE = frozenset({"-e", "--editable"})


@dataclass(frozen=True)
class InstallLine:
    """One ``pip install`` command and where it is written."""

    where: str
    command: str

    @property
    def requirements(self) -> list[str]:
        """What it installs: each requirement as written, quotes removed, an editable path included."""
        rest = _COMMAND.search(self.command)
        assert rest is not None
        try:
            words = shlex.split(rest["rest"])
        except ValueError:  # a quote the excerpt cut off
            words = [word.strip("'\"") for word in rest["rest"].split()]
        found, skip = [], False
        for word in words:
            if skip:
                skip = False
            elif word in _TAKES_VALUE:
                skip = True
            elif not word.startswith("-"):
                found.append(word)
        return found


def in_markdown(path: Path, root: Path) -> Iterator[InstallLine]:
    """Fenced lines one by one; prose a paragraph at a time (a code span may wrap)."""
    name = path.relative_to(root).as_posix()
    in_fence, paragraph, start = False, [], 0
    for number, line in enumerate([*path.read_text(encoding="utf-8").splitlines(), ""], start=1):
        if _FENCE.match(line) or (not in_fence and not line.strip()):
            yield from _commands(f"{name}:{start}", " ".join(paragraph))
            paragraph = []
            if _FENCE.match(line):
                in_fence = not in_fence
        elif in_fence:
            yield from _commands(f"{name}:{number}", line)
        else:
            paragraph.append(line.strip())
            start = start if len(paragraph) > 1 else number


def in_python(path: Path, root: Path) -> Iterator[InstallLine]:
    """String literals but docstrings and other bare strings (f-strings with their fields as ``{name}``): what the
    code prints."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    unprinted = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            unprinted.add(id(node.value))  # a docstring, of a module, class, function or attribute
        elif isinstance(node, ast.JoinedStr):
            unprinted.update(id(part) for part in node.values)  # read with the f-string
    name = path.relative_to(root).as_posix()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(str(part.value) if isinstance(part, ast.Constant) else _field(part) for part in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in unprinted:
            text = node.value
        else:
            continue
        yield from _commands(f"{name}:{node.lineno}", text)


def _field(part: ast.expr) -> str:
    assert isinstance(part, ast.FormattedValue)
    return "{" + ast.unparse(part.value) + "}"


def in_lines(path: Path, root: Path) -> Iterator[InstallLine]:
    """A script, line by line."""
    name = path.relative_to(root).as_posix()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        yield from _commands(f"{name}:{number}", line)


def _commands(where: str, text: str) -> Iterator[InstallLine]:
    for match in _COMMAND.finditer(text):
        yield InstallLine(where, match[0].strip())
