"""The supervisor's log: one line per event on stderr, which ``docker logs`` shows."""

from __future__ import annotations

import sys


def log(message: str) -> None:
    print("orchestrator agent: %s" % message, file=sys.stderr, flush=True)
