"""Text made in a sandbox, made safe for a person's terminal: control characters shown, never obeyed.

Every byte from a sandbox is hostile input (docs/trust.md). A container log, a variable name, an
exception message or an output preview may carry escape sequences that set the clipboard (OSC 52),
clear the screen, move the cursor, or end a line early with a carriage return so the rest of it
forges a line that looks like ours. ``visible`` renders such text inert: every control character
(C0, DEL, C1), every bidirectional override and every other format character becomes a visible
escape (``\\x1b``, ``\\u202e``; ``\\r``, ``\\n`` and ``\\t`` in their short forms). A backslash
stays as it is (reprs are full of them): text that merely looks like an escape is harmless, the
terminal prints it.
Newlines (and tabs, where the caller allows them) stay as they are in multi-line text; one-line
fields (names, a summary in a table) pass ``multiline=False`` and get ``\\n`` instead.

The CLI prints sandbox text through this unless the user asked for the raw bytes (``--raw``), or
when the output is not a terminal and the command documents that it passes bytes through.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import time
import unicodedata
from collections.abc import Iterator

_KEPT_MULTILINE = frozenset("\n\t")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _unsafe(char: str) -> bool:
    """A control (Cc), format (Cf: bidi overrides, zero-width), separator of lines or paragraphs, or surrogate."""
    return unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Cs")


def visible(text: str, *, multiline: bool = True) -> str:
    """``text`` with every character a terminal would act on made visible.

    Args:
        text: Text that came from a sandbox (or anything else not written by us).
        multiline: Keep newlines and tabs as they are (True), or escape them too (one-line fields).

    Returns:
        Printable text: the same string when it held nothing to escape.
    """
    # The usual case at C speed: a cell's honest output is printable apart from its newlines and tabs.
    if (text.replace("\n", "").replace("\t", "") if multiline else text).isprintable():
        return text
    kept = _KEPT_MULTILINE if multiline else frozenset()
    return "".join(char if char in kept or not _unsafe(char) else _escape(char) for char in text)


def last_lines(text: str, count: int = 20, width: int = 300) -> tuple[str, ...]:
    """The last ``count`` non-blank lines of a log (a build's, a container's), each made ``visible`` on one line and
    cut to ``width`` characters: what an error may quote of text that may come from a sandbox or a user's image. Only
    a newline ends a line; a carriage return is shown (``\\r``), so no line can overwrite another."""
    lines = [line for line in text.split("\n") if line.strip()][-count:]
    return tuple(_cut(visible(line.rstrip(), multiline=False), width) for line in lines)


def _cut(line: str, width: int) -> str:
    return line if len(line) <= width else line[: width - 3] + "..."


class VisibleFormatter(logging.Formatter):
    """Log records for a person's terminal (the CLI's ``-v``, the janitor): a message may quote the sandbox (a
    reason, a name, an error), so control characters are made visible, and the lines after the first (a
    traceback, a message with line breaks) are indented: no text in a record can start a line of its own."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record)).replace("\n", "\n    ")


_LOGGED_SESSION: contextvars.ContextVar[str | None] = contextvars.ContextVar("logged_session", default=None)


@contextlib.contextmanager
def logging_session(session_id: str) -> Iterator[None]:
    """Records logged in the block (on this thread) are about ``session_id``: ``JsonFormatter`` says so."""
    token = _LOGGED_SESSION.set(session_id)
    try:
        yield
    finally:
        _LOGGED_SESSION.reset(token)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, for a log collector: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, and ``session_id`` when the record is about one (``extra={"session_id": ...}`` or
    ``logging_session``), ``exception`` with its traceback. ASCII only: a control character or a bidi override a
    message quotes from a sandbox is a JSON escape, never obeyed, and no message can start a line of its own."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        document: dict[str, object] = {
            "time": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        session_id = getattr(record, "session_id", None) or _LOGGED_SESSION.get()
        if session_id is not None:
            document["session_id"] = str(session_id)
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, ensure_ascii=True)


def log_to_stderr(level: int, fmt: str = "%(levelname)s %(name)s: %(message)s", *, as_json: bool = False) -> None:
    """Configure the root logger (only commands do this, never the library): a ``VisibleFormatter``, or with
    ``as_json`` a ``JsonFormatter``."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if as_json else VisibleFormatter(fmt))
    logging.basicConfig(level=level, handlers=[handler])
