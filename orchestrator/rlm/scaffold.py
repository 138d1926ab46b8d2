"""The scaffold one DockerREPL installs in its session: the sandbox-side module and its configuration.

``sandbox_scaffold.py`` is sent as source text (the sandbox runs it on its own Python; the
host never imports it), with one line appended that hands it this environment's settings as
JSON, so no host object and no pickle crosses into the sandbox.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from .tools import ToolPlan

HELPERS = ("llm_query", "llm_query_batched", "rlm_query", "rlm_query_batched", "SHOW_VARS")
"""Functions the scaffold puts into the namespace before every cell (the same tuple is in the sandbox module)."""
COMPACTION_NAME = "_rlm_history"
"""Where the compaction list is stored; ``history`` is bound to it before every cell."""
EMPTY_ANSWER = {"content": "", "ready": False}
"""The ``answer`` dict of a new turn."""

_SOURCE = Path(__file__).with_name("sandbox_scaffold.py")


@functools.cache
def module_source() -> str:
    """The sandbox module's source text."""
    return _SOURCE.read_text(encoding="utf-8")


def scaffold_source(*, compaction: bool, tools: ToolPlan) -> str:
    """The code for ``Session.set_scaffold``: the sandbox module, configured for these tools."""
    config = {"compaction": compaction, "code_tools": dict(tools.code), "host_tools": list(tools.host)}
    return f"{module_source()}\n_configure(json.loads({json.dumps(config)!r}))\n"


def owned_names(tools: ToolPlan) -> tuple[str, ...]:
    """User-namespace names the scaffold owns (never checkpointed; it puts them back before every cell)."""
    return (*HELPERS, *tools.code, *tools.host)
