"""An honest exec reply, as an agent sends it, for tests to change one field at a time."""

from __future__ import annotations

from typing import Any

from orchestrator.agent import request_table

D1 = "1" * 32


def exec_reply(**changes: Any) -> dict[str, Any]:
    reply: dict[str, Any] = {
        "type": request_table.EXEC_REPLY,
        "status": "ok",
        "stdout": "",
        "stderr": "",
        "stdout_bytes": 0,
        "stderr_bytes": 0,
        "return_value": None,
        "error": None,
        "duration": 0.25,
        "checkpoint_duration": 0.0,
        "checkpoint": {
            "generation": 1,
            "blobs": [{"digest": D1, "size": 3}],
            "vars": {"x": D1},
            "deleted": [],
            "unsaved": {},
        },
    }
    for path, value in changes.items():
        target = reply
        *parents, last = path.split("__")
        for parent in parents:
            target = target[parent]
        target[last] = value
    return reply
