"""What to do instead, for the errors a new user's first cells meet in a sandbox (issue 38).

A sandbox has no network and no pip, by design: ``pip install`` in a cell fails with "No module named pip", a URL
with "Temporary failure in name resolution", and neither says what works. The hint names the way that does.
"""

from __future__ import annotations

import re

NO_PACKAGE = (
    "a sandbox has no pip and no network: packages come from its image. Build one on a base that has them "
    '(`orchestrator image build --base BASE`, README "Images") and start the session on it'
)
NO_NETWORK = (
    "a sandbox has no network (only `lo`, no route out): bring data in from the host instead "
    "(`session.add_context(...)`, `session.set_value(...)`)"
)

_NETWORK = re.compile(
    r"Temporary failure in name resolution|Name or service not known|No address associated with hostname"
    r"|Network is unreachable|\[Errno (101|-2|-3|-5)\]|Failed to resolve|NameResolutionError",
)
_PIP = re.compile(r"No module named '?pip'?|No such file or directory: '(pip|pip3)'")


def hint(error_type: str, message: str) -> str | None:
    """The hint for a cell's exception (its class name and message), or None when it is not one of these."""
    if _PIP.search(message) or error_type == "ModuleNotFoundError":
        return NO_PACKAGE
    if _NETWORK.search(message) or error_type == "gaierror":
        return NO_NETWORK
    return None
