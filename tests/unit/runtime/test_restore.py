"""A restore's work is linear in the values stored, whatever the agent answers: every byte from it is hostile."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.agent import protocol, request_table
from orchestrator.config import Settings
from orchestrator.runtime.sandbox import _RESTORE_LOADS_PER_VALUE, _RESTORE_LOADS_SLACK, Sandbox


class _ScriptedSandbox(Sandbox):
    """A sandbox whose agent answers every load with ``status`` (no engine, no channel)."""

    def __init__(self, status: str, honest: set[str] | None = None) -> None:
        self._settings = Settings()
        self.sandbox_id = "sbx-test"
        self.status = status
        self.honest = honest or set()
        self.loads = 0

    def request(self, header: Any, body: Any = b"", **_: Any) -> tuple[dict[str, Any], bytes]:
        if header["type"] == request_table.LOAD:
            self.loads += 1
            status = protocol.STATUS_OK if header["name"] in self.honest else self.status
            return {"type": request_table.LOAD_REPLY, "status": status, "reason": "lied"}, b""
        return {"type": request_table.RESTORE_REPLY, "status": protocol.STATUS_OK, "generation": 1}, b""


@contextlib.contextmanager
def _blob(_digest: str) -> Iterator[memoryview]:
    yield memoryview(b"")


def _manifest(count: int) -> dict[str, str]:
    return {f"v{i}": f"h{i:032x}" for i in range(count)}


@pytest.mark.parametrize("status", [protocol.STATUS_CRASHED, protocol.STATUS_ERROR])
def test_an_agent_failing_every_load_costs_at_most_the_budget(status: str) -> None:
    manifest = _manifest(300)
    sandbox = _ScriptedSandbox(status)
    failed = sandbox.restore(manifest, 1, _blob)
    assert set(failed) == set(manifest)
    assert sandbox.loads <= _RESTORE_LOADS_PER_VALUE * len(manifest) + _RESTORE_LOADS_SLACK


def test_values_that_load_are_not_named_failed() -> None:
    manifest = _manifest(50)
    sandbox = _ScriptedSandbox(protocol.STATUS_CRASHED, honest={"v7", "v42"})
    failed = sandbox.restore(manifest, 1, _blob)
    assert "v7" not in failed and "v42" not in failed
    assert sandbox.loads <= _RESTORE_LOADS_PER_VALUE * len(manifest) + _RESTORE_LOADS_SLACK
