"""The fenced blocks of a Markdown document and the steps of a console transcript (see tests/docs/README.md).

A fence is three or more backticks at the start of a line (indented as a list item's may be),
with an optional language; it ends at a line of at least as many backticks. The line before a
fence (blank lines between are allowed) may hold ``<!-- not run: why -->``: the block is then
collected as skipped with that reason, so a reader of the source sees why and pytest reports it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

RUN = frozenset({"python", "py", "sh", "bash", "console"})
"""Languages whose blocks are run: Python in the document's namespace, sh/bash as a script,
console as a transcript (``$ `` commands)."""

PARSED = frozenset({"json"})
"""Languages whose blocks are checked without running: a JSON block must parse."""

NOT_EXAMPLES = frozenset({"", "text"})
"""Blocks that are not examples: diagrams, synopses, sample output."""

_OPEN = re.compile(r"^(?P<indent> *)(?P<fence>`{3,})(?P<info>[^`]*)$")
_ERROR_LINE = re.compile(r"^orchestrator: (?:[^:\s]+: )?([A-Z][A-Za-z]*):")
_NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(?P<why>.*?)\s*-->\s*$")


class FenceError(ValueError):
    """A document whose fences the docs tests cannot read (unclosed, or a "not run" marker without a reason)."""


@dataclass(frozen=True)
class Fence:
    """One fenced block of a document."""

    path: Path
    line: int
    """1-based line of the block's first line of content (the line after the opening fence)."""
    language: str
    """The info string's first word, lower case ("" for a bare fence)."""
    source: str
    """The content, with the fence's indentation removed."""
    not_run: str | None
    """The reason of a ``<!-- not run: ... -->`` marker before the fence, else None."""

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"


def read_fences(path: Path) -> list[Fence]:
    """Every fenced block of the Markdown file at ``path``, in document order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    fences: list[Fence] = []
    index = 0
    while index < len(lines):
        opening = _OPEN.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, ticks = len(opening["indent"]), opening["fence"]
        info = opening["info"].strip().split()
        end = index + 1
        while end < len(lines) and not _closes(lines[end], ticks):
            end += 1
        if end == len(lines):
            raise FenceError(f"{path.name}:{index + 1}: a fence that is never closed")
        body = [_dedent(line, indent) for line in lines[index + 1 : end]]
        fences.append(
            Fence(
                path=path,
                line=index + 2,
                language=info[0].lower() if info else "",
                source="\n".join(body) + "\n",
                not_run=_marker(path, lines, index),
            )
        )
        index = end + 1
    return fences


def _dedent(line: str, indent: int) -> str:
    """``line`` without the fence's indentation (or what it has of it)."""
    spaces = len(line) - len(line.lstrip(" "))
    return line[min(spaces, indent) :]


def _closes(line: str, ticks: str) -> bool:
    stripped = line.strip()
    return stripped.startswith(ticks) and set(stripped) == {"`"}


def _marker(path: Path, lines: list[str], fence_index: int) -> str | None:
    """The reason of the "not run" marker just above the fence at ``fence_index``, if any."""
    before = fence_index - 1
    while before >= 0 and not lines[before].strip():
        before -= 1
    if before < 0:
        return None
    marker = _NOT_RUN.match(lines[before])
    if marker is None:
        return None
    if not marker["why"]:
        raise FenceError(f"{path.name}:{before + 1}: a 'not run' marker must say why: <!-- not run: <reason> -->")
    return str(marker["why"])


@dataclass
class Transcript:
    """One ``$ `` command of a console block and what the block shows after it."""

    command: str
    output: list[str]

    @property
    def errors_shown(self) -> list[str]:
        """The error kinds the command is shown to report (``orchestrator: [ID: ]Kind: ...``)."""
        return [match[1] for line in self.output if (match := _ERROR_LINE.match(line))]

    @property
    def typed_input(self) -> str | None:
        """What a transcript shows typed at an interactive prompt (``>>> `` / ``... `` lines), as stdin; else None."""
        typed = [line[4:] for line in self.output if line.startswith((">>> ", "... ")) or line in (">>>", "...")]
        typed = [line for line in typed if line != "^D"]
        return "\n".join(typed) + "\n" if typed else None


def read_transcript(source: str) -> list[Transcript]:
    """The commands of a console block, each with the lines it shows (its output, or typed input)."""
    steps: list[Transcript] = []
    for line in source.splitlines():
        if line.startswith("$ "):
            steps.append(Transcript(line[2:], []))
        elif steps:
            steps[-1].output.append(line)
    return steps
