"""Text for a model within a budget: sandbox text cut to its head and tail with a marker, every character made safe.

A tool's answer (``PythonTool``'s) goes into a model's context, which is finite and paid per token:
an answer has a cap in characters (``limit``) and never passes it, whatever a cell printed. An
``Answer`` is built from lines we wrote (short) and *sections* of sandbox text (stdout, stderr,
a repr, a traceback...). At ``render`` the budget left after our lines is shared among the
sections, max-min fair: a section shorter than its fair share is shown whole and leaves the rest
to the others. A section longer than its share keeps its head and its tail (cut at a line
break when one is near), with a marker line in between that says how much was left out, and is
followed by a note that names the file on the host holding all of it: the session's output file
when the session kept one (``ExecResult.stdout_path``), else one ``keep`` saves.

Every byte from a sandbox is hostile (docs/trust.md): control characters, escape sequences and
bidirectional overrides become visible escapes (``safe_text.visible``) before anything is
measured, so a cell full of them cannot pass the cap by expanding, nor act on a terminal that
shows the transcript.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ..safe_text import visible

FIELD_CHARS = 300
"""The most characters of one sandbox field on one of our lines (a name, an error's first line, a source line)."""
_MARKER_ROOM = 100  # the longest marker line: "[... 1,000,000,000,000 characters (...) left out ...]"
_SNAP = 4  # a cut moves to a line break within the last (first) 1/_SNAP of a head (tail)
Keep = Callable[[str, str], "Path | None"]
"""Saves the whole text of a section that was cut (label, text) and returns the file, or None (not kept)."""


def field(text: str, limit: int = FIELD_CHARS) -> str:
    """Sandbox text for one of our lines: visible, on one line, at most ``limit`` characters (then ``...``)."""
    shown, used = _visible_part(text, limit, multiline=False)
    if used == len(text):
        return shown
    trimmed, _ = _visible_part(text, limit - 3, multiline=False)
    return trimmed + "..."


def listed_names(listed: Iterable[str], limit: int) -> str:
    """``a, b, c``: sandbox names made safe (``field``), sorted, within about ``limit`` characters, the rest counted
    (``and 12 more``); ``(none)`` for none."""
    every = sorted(listed)
    shown: list[str] = []
    size = 0
    for name in every:
        text = field(name, FIELD_CHARS // 3)
        if size + len(text) > limit and shown:
            return ", ".join(shown) + f" and {len(every) - len(shown):,} more"
        shown.append(text)
        size += len(text) + 2
    return ", ".join(shown) or "(none)"


@dataclass(frozen=True)
class _Section:
    label: str
    text: str
    file: Path | None  # all of it on the host; ``text`` is then the session's preview, used if the file is gone
    inline: bool  # ``label: text`` on one line when the text has one line (else the label above the text)


class Answer:
    """An answer being built in order: our lines and sections of sandbox text; ``render`` fits it to a limit."""

    def __init__(self) -> None:
        self._items: list[str | _Section] = []

    def line(self, text: str) -> None:
        """One of our lines (sandbox fragments in it passed through ``field``); a newline is added."""
        self._items.append(text + "\n")

    def section(self, label: str, text: str, *, file: Path | None = None, inline: bool = False) -> None:
        """Sandbox text under ``label``; ``file``: the host's file with all of it when ``text`` is only a preview."""
        self._items.append(_Section(label, text, file, inline))

    def render(self, limit: int, keep: Keep) -> str:
        """The answer in at most ``limit`` characters; ``keep`` saves the whole text of a section that was cut."""
        sections = [item for item in self._items if isinstance(item, _Section)]
        fixed = sum(len(item) for item in self._items if isinstance(item, str))
        room = limit - fixed - sum(map(_overhead, sections))
        shares = dict(zip(map(id, sections), _fair_shares([_demand(s) for s in sections], max(0, room)), strict=True))
        parts: list[str] = []
        for item in self._items:
            parts += [item] if isinstance(item, str) else _render_section(item, shares[id(item)], keep)
        text = "".join(parts)
        return text if len(text) <= limit else _hard_cut(text, limit)


def _demand(section: _Section) -> int:
    if section.file is not None:
        with contextlib.suppress(OSError):
            return section.file.stat().st_size
    return len(visible(section.text))  # what it takes to show: an escape is longer than the character it shows


def _fair_shares(demands: list[int], budget: int) -> list[int]:
    """Max-min fair: the smallest demands are met whole, the rest split what is left equally."""
    shares = [0] * len(demands)
    left = budget
    order = sorted(range(len(demands)), key=demands.__getitem__)
    for done, index in enumerate(order):
        shares[index] = min(demands[index], left // (len(order) - done))
        left -= shares[index]
    return shares


_NOTE = "note: {label} was cut to fit this answer: {left} left out; {where}.\n"
_NOTE_ROOM = len(_NOTE) + 40 + 300  # the numbers, and the sentence that names the file (a path of up to ~300 chars)


def _overhead(section: _Section) -> int:
    """Characters of a section besides its text: the label (twice: above the text and in a note) and the note."""
    return 2 * len(section.label) + 3 + _NOTE_ROOM


def _render_section(section: _Section, share: int, keep: Keep) -> tuple[str, str]:
    """The section within ``share`` characters (its label aside), and the note when it was cut ("" if whole)."""
    label, file = section.label, section.file
    if file is None:
        return _render_text(section, section.text, share, lambda: _in(keep(label, section.text)))
    try:
        head, tail, size = _ends_of_file(file, share)
    except OSError as exc:  # removed meanwhile (older than the session's newest files): the preview has to do
        gone = f"all of it was in the file {file} on the host, which cannot be read now ({exc.strerror})"
        body, note = _render_text(section, section.text, share, lambda: gone)
        return body, note or f"note: {label} above is the session's head-and-tail preview; {gone}.\n"
    if size <= _WHOLE_BYTES * (share + 1):
        return _render_text(section, head, share, lambda: _in(file))
    shown_head, shown_tail, head_used, tail_used = _cut(head, tail, share)
    left = f"{size - _utf8_len(head[:head_used]) - _utf8_len(tail[len(tail) - tail_used :]):,} bytes"
    return _cut_section(section, shown_head, left, shown_tail, _in(file))


def _render_text(section: _Section, text: str, share: int, where: Callable[[], str]) -> tuple[str, str]:
    """``text`` whole if it fits ``share``, else cut, with a note saying ``where()`` all of it is."""
    shown, used = _visible_part(text, share + 1)
    if used == len(text) and len(shown) <= share:
        return _frame(section, shown), ""
    shown_head, shown_tail, head_used, tail_used = _cut(text[: share + 1], text[-(share + 1) :], share)
    lines = text.count("\n", head_used, len(text) - tail_used)
    left = f"{len(text) - head_used - tail_used:,} characters" + (f" ({lines:,} lines)" if lines else " of one line")
    return _cut_section(section, shown_head, left, shown_tail, where())


def _in(file: Path | None) -> str:
    return "it was not kept" if file is None else f"all of it is in the file {file} on the host"


def _cut_section(section: _Section, head: str, left: str, tail: str, where: str) -> tuple[str, str]:
    """A section cut to its ``head`` and ``tail`` around a marker saying what was ``left`` out, and its note."""
    body = head + ("" if head.endswith("\n") or not head else "\n") + f"[... {left} left out ...]\n" + tail
    return _frame(section, body), _NOTE.format(label=section.label, left=left, where=where)


_WHOLE_BYTES = 4  # a file of at most 4 bytes per character of the share is read whole (UTF-8 has at most 4 a character)


def _cut(head: str, tail: str, share: int) -> tuple[str, str, int, int]:
    """The start of ``head`` and the end of ``tail``, made visible, to show around a marker in ``share`` characters,
    cut at a line break when one is near; and how many characters of ``head`` and of ``tail`` they show."""
    room = max(0, share - _MARKER_ROOM - 2)
    shown_head, head_used = _visible_part(head, room - room // 2)
    snap = head.rfind("\n", head_used - head_used // _SNAP, head_used)
    if snap >= 0:
        head_used = snap + 1
        shown_head = visible(head[:head_used])
    _, tail_used = _visible_part(tail[::-1], room // 2)
    tail_text = tail[len(tail) - tail_used :]
    snap = tail_text.find("\n", 0, tail_used // _SNAP)
    if snap >= 0:
        tail_used -= snap + 1
        tail_text = tail_text[snap + 1 :]
    return shown_head, visible(tail_text), head_used, tail_used


def _visible_part(text: str, room: int, *, multiline: bool = True) -> tuple[str, int]:
    """The longest start of ``text`` whose visible form fits ``room`` characters: that form, and how many characters of
    ``text`` it shows. (Each character is escaped on its own, so the same count holds for a reversed text.)"""
    part = text[: max(0, room)]
    shown = visible(part, multiline=multiline)
    if len(shown) <= room:
        return shown, len(part)
    pieces: list[str] = []
    used = 0
    for count, char in enumerate(part):
        piece = visible(char, multiline=multiline)
        if used + len(piece) > room:
            return "".join(pieces), count
        pieces.append(piece)
        used += len(piece)
    return "".join(pieces), len(part)


def _ends_of_file(path: Path, share: int) -> tuple[str, str, int]:
    """The first and last bytes of a file as text (bytes that are not UTF-8 kept as escapes), and its size: all of it
    when it is small (at most ``_WHOLE_BYTES * (share + 1)`` bytes), else ``share + 1`` bytes at each end."""
    with open(path, "rb", buffering=0) as file:
        size = os.fstat(file.fileno()).st_size
        if size <= _WHOLE_BYTES * (share + 1):
            whole = file.read(size).decode("utf-8", "surrogateescape")
            return whole, whole, size
        head = _whole_characters_at_end(file.read(share + 1))
        file.seek(size - share - 1)
        tail = _whole_characters_at_start(file.read(share + 1))
    return head.decode("utf-8", "surrogateescape"), tail.decode("utf-8", "surrogateescape"), size


def _whole_characters_at_end(data: bytes) -> bytes:
    """``data`` without a UTF-8 character the read cut at its end (else it would show as escapes of its bytes)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # the last character's first byte: how long is that character?
            length = 1 if byte < 0xC0 else 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data[:-back] if length > back else data
    return data


def _whole_characters_at_start(data: bytes) -> bytes:
    """``data`` without the continuation bytes of a UTF-8 character the read cut at its start."""
    skip = 0
    while skip < min(3, len(data)) and data[skip] & 0xC0 == 0x80:
        skip += 1
    return data[skip:]


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape"))


def _frame(section: _Section, body: str) -> str:
    """``label: text`` for a one-line inline section, else the label on a line of its own above the text."""
    body = body.rstrip("\n")
    if section.inline and "\n" not in body:
        return f"{section.label}: {body}\n"
    return f"{section.label}:\n{body}\n"


def _hard_cut(text: str, limit: int) -> str:
    """The last guard: an answer whose own lines passed the limit (a tiny limit, a long path), cut at the limit."""
    marker = "\n[... answer cut at its limit ...]\n"
    return text[: max(0, limit - len(marker))] + marker[:limit]
