"""The sandbox pool against the real engine: each sandbox handed out once, loopback-only network slots lent one
at a time, nothing left after close."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orchestrator import Orchestrator, Settings
from orchestrator.agent import protocol, request_table
from orchestrator.ops.pool import SandboxPool, SandboxTemplate
from orchestrator.runtime.sandbox import Sandbox

pytestmark = pytest.mark.docker

LABELS = {"orchestrator.role": "pool-test"}


def _run(sandbox: Sandbox, code: str) -> str:
    header = {"type": request_table.EXEC, "code": code, "timeout": 10.0, "checkpoint": False}
    reply, _ = sandbox.request(header, seconds=20)
    assert reply["status"] == protocol.STATUS_OK, reply
    return str(reply["return_value"])


@pytest.fixture
def pool(orch: Orchestrator) -> Iterator[SandboxPool]:
    with SandboxPool(
        orch.backend, orch.settings, SandboxTemplate(orch.default_image, "pooltest", LABELS), size=2
    ) as made:
        yield made


def test_every_sandbox_is_new_and_nothing_is_left(orch: Orchestrator, pool: SandboxPool, settings: Settings) -> None:
    seen = set()
    for _ in range(4):
        with pool.sandbox() as sandbox:
            assert sandbox.sandbox_id not in seen
            seen.add(sandbox.sandbox_id)
            assert _run(sandbox, "import os; len(os.listdir('/tmp'))") == "0"  # nothing of an earlier one
            _run(sandbox, "open('/tmp/mark', 'w').write('x')")
    pool.close()
    assert orch.backend.find(LABELS) == []
    assert not any(entry.name in seen for entry in settings.runtime_dir.iterdir())


def test_a_network_slot_is_loopback_only_and_lent_to_one_sandbox_at_a_time(pool: SandboxPool) -> None:
    namespace = "import os; os.readlink('/proc/self/ns/net')"
    first, second = pool.take(), pool.take()
    try:
        assert _run(first, namespace) != _run(second, namespace)  # two at once never share one
        links = _run(first, "sorted(line.split(':')[0].strip() for line in open('/proc/net/dev').readlines()[2:])")
        assert links == "['lo']"
        assert _run(first, "[l.split()[1] for l in open('/proc/net/route').readlines()[1:]]") == "[]"
        used = {_run(first, namespace)}
        _run(first, "import socket; s = socket.socket(); s.bind(('127.0.0.1', 5555)); s.listen()")
    finally:
        pool.discard(first)
        pool.discard(second)
    for _ in range(2):
        with pool.sandbox() as later:
            if _run(later, namespace) in used:  # the slot came back: the listener went with its sandbox
                code = "import socket; s = socket.socket(); s.bind(('127.0.0.1', 5555)); s.close(); 'free'"
                assert _run(later, code) == "'free'"
