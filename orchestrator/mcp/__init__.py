"""``orchestrator mcp``: persistent sessions as tools of MCP clients (docs/mcp.md).

``workspace`` holds one client's sessions and builds each tool's answer (it needs only the
public API); ``server`` offers them through the official ``mcp`` SDK, an optional dependency
(``pip install 'orchestrator[mcp]'``).
"""

from __future__ import annotations

INSTALL_HINT = "orchestrator mcp needs the MCP SDK: pip install 'orchestrator[mcp]'"
"""What to do when the ``mcp`` package is missing."""
