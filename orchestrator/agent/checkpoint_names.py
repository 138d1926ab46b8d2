"""Which keys a checkpoint manifest may hold, and its bounds: one rule for the agent, the controller and the store.

Contexts (docs/protocol.md): more namespaces in the one worker; requests name theirs in ``context``.
"""

from __future__ import annotations

import re
from typing import Any, Optional

CONTEXT_SEPARATOR = "/"  # a context's variable ``x`` is ``<context>/x`` in checkpoints (names have no "/")
CONTEXT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")  # a context id: also a directory name and a key prefix
# The checkpoint manifest's bounds (docs/trust.md, "Names"): the agent keeps within them by itself (a name past
# them is reported in ``unsaved``), and the controller refuses a delta that would take the manifest past them.
MAX_NAME_CHARS = 128  # a variable name in a checkpoint: an identifier of at most this many characters
MAX_CHECKPOINT_NAMES = 10000  # names (keys) in a session's checkpoint, all contexts together
MAX_CHECKPOINT_NAME_BYTES = 1 << 20  # UTF-8 bytes of those keys together
MAX_UNSAVED_NAMES = 1000  # entries of a delta's ``unsaved``: the agent lists this many at most
MAX_UNSAVED_KEY_CHARS = 64 + 1 + MAX_NAME_CHARS + 16  # an ``unsaved`` key: a context, "/", a name shown clipped
MAX_REASON_CHARS = 2000  # a reason in ``unsaved`` (the agent clips its own to 200)


def name_problem(name: object) -> Optional[str]:
    """Why ``name`` cannot be a variable name in a checkpoint, or None when it can (an identifier, not too long)."""
    if not isinstance(name, str):
        return "the name is not a str"
    if len(name) > MAX_NAME_CHARS:
        return "the name is longer than %d characters" % MAX_NAME_CHARS
    if not name.isidentifier():
        return "the name is not a Python identifier"
    return None


def checkpoint_key_problem(key: object) -> Optional[str]:
    """Why ``key`` cannot be a key of a checkpoint manifest, or None when it can: a name, or ``<context id>/<name>``.

    The one rule for stored names (docs/trust.md): the agent reports a name that breaks it in
    ``unsaved``, the controller refuses a delta naming one before it commits anything, and the
    store refuses a record holding one, so whatever is committed can be read back.
    """
    if not isinstance(key, str):
        return "the name is not a str"
    context, separator, name = key.rpartition(CONTEXT_SEPARATOR)
    if separator and CONTEXT_ID.fullmatch(context) is None:
        return "the context id is not 1-64 letters, digits, '_' and '-'"
    return name_problem(name)


def key_bytes(key: str) -> int:
    """What a checkpoint key counts against MAX_CHECKPOINT_NAME_BYTES: its UTF-8 length."""
    return len(key.encode("utf-8", "surrogatepass"))


def is_internal(name: Any) -> bool:
    """Names the checkpoint leaves out: dunders such as __builtins__ belong to the runtime."""
    return isinstance(name, str) and name.startswith("__") and name.endswith("__")
