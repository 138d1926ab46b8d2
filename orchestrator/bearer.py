"""Bearer tokens of the controller's HTTP endpoints (``orchestrator mcp --http``, ``/metrics``): one rule for what
a token may be, one check of a request's ``Authorization`` header.

A token is given in the environment (``ORCH_MCP_TOKEN``, ``ORCH_METRICS_TOKEN``), never on a command line,
which every user of the machine can read (``ps``).
"""

from __future__ import annotations

import hmac

RULE = "at least 16 printable characters without spaces"
"""What a token must be (``acceptable``), for error messages."""

REFUSAL = "401 Unauthorized: send the server's token as 'Authorization: Bearer <token>'\n"
"""The body of a refused request's 401 answer (with ``WWW-Authenticate: Bearer``)."""


def acceptable(token: str) -> bool:
    """Whether ``token`` follows ``RULE``: long enough not to be guessed, and sendable as one header value."""
    return len(token) >= 16 and token.isprintable() and " " not in token


class Bearer:
    """Checks that a request carries ``Authorization: Bearer <token>``, exactly, compared in constant time."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("the bearer token must not be empty")
        self._expected = f"Bearer {token}".encode()

    def admits(self, authorization: bytes | str | None) -> bool:
        """Whether ``authorization`` (the header's value; None: there was none) is the token's."""
        given = authorization.encode("latin-1", "replace") if isinstance(authorization, str) else authorization or b""
        return hmac.compare_digest(given, self._expected)
