"""Which paths a workspace's record may hold: one rule for the agent that saves files and the host that stores them.

A path is relative to ``/workspace``, ``/``-separated, and ``str``: the name's bytes decoded as UTF-8 with
``surrogateescape``, so a name that is not UTF-8 survives the round trip; it is valid only in the one form that
encodes back to its bytes, so two keys can never name one file (docs/design/workspace.md, "The record").
Standard library only: the agent imports it.
"""

from __future__ import annotations

from typing import Optional

MAX_PATH_BYTES = 4096  # a path or a link target, in bytes as the filesystem holds it (PATH_MAX)
MAX_NAME_BYTES = 255  # one name of a path (NAME_MAX)


def file_name_bytes(text: str) -> Optional[bytes]:
    """The bytes of the file name ``text`` is, when it is that name's one form (None: no name, or another form)."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return None
    return raw if raw.decode("utf-8", "surrogateescape") == text else None


def path_problem(path: object) -> Optional[str]:
    """Why ``path`` cannot be a path of the record, or None when it can."""
    if not isinstance(path, str):
        return "a path is not a str"
    if len(path) > MAX_PATH_BYTES:  # before any encoding: a character is at least a byte
        return "a path is longer than %d bytes" % MAX_PATH_BYTES
    raw = file_name_bytes(path)
    if raw is None:
        return "a path holds text no file name encodes to"
    if len(raw) > MAX_PATH_BYTES:
        return "a path is longer than %d bytes" % MAX_PATH_BYTES
    if b"\0" in raw:
        return "a path holds a NUL"
    for name in raw.split(b"/"):
        if name in (b"", b".", b".."):
            return "a path is absolute or has an empty, '.' or '..' component"
        if len(name) > MAX_NAME_BYTES:
            return "a path has a name longer than %d bytes" % MAX_NAME_BYTES
    return None
