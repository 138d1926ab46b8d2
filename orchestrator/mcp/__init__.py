"""``orchestrator mcp``: persistent sessions as tools of MCP clients (docs/mcp.md).

``workspace`` holds one client's sessions and builds each tool's answer (it needs only the
public API); ``server`` offers them through the official ``mcp`` SDK, an optional dependency
(the ``mcp`` extra: ``pip install 'orchestrator-sessions[mcp]'``).
"""

from __future__ import annotations

EXTRA = "mcp"
"""The optional dependencies of ``orchestrator mcp`` (pyproject.toml)."""
NEEDS = "orchestrator mcp needs the MCP SDK"
"""The start of the one line ``orchestrator mcp`` prints without them (``orchestrator.extras.needs``)."""
