"""One hop against a real engine (docs/design/one-hop.md, step 1): cells, values, output, host calls and a worker's
death with ``Settings.one_hop`` on. Measures nothing; the unit tests (tests/unit/wire/test_one_hop_connection.py)
check the connection itself against the host agent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support import one_hop

from orchestrator import Orchestrator, SandboxCrashed, Session, Settings
from orchestrator.runtime.hostcalls import HostCalls

pytestmark = pytest.mark.docker


@pytest.fixture
def hop(
    settings_for: Callable[..., Settings],
    make_orch: Callable[[Settings], Orchestrator],
    new_session: Callable[..., Session],
) -> Session:
    session = new_session(make_orch(settings_for(one_hop=True)))
    session.execute("1")  # the sandbox starts with the first call
    return session


def test_cells_values_and_output_in_one_hop(hop: Session) -> None:
    assert one_hop(hop)
    assert hop.execute("x = 41").ok
    assert hop.execute("x + 1").return_value == "42"
    result = hop.execute("print('hi')\n1 / 0")
    assert result.error is not None and result.error.type == "ZeroDivisionError" and result.stdout == "hi\n"
    hop.set_value("big", b"v" * (2 << 20))  # a value file's size: in one hop it goes as the body
    assert hop.execute("len(big), x").return_value == "(2097152, 41)"


def test_host_calls_in_one_hop(hop: Session) -> None:
    hop.set_scaffold("def before_cell(ns):\n    ns['ask'] = host_call\n", names=("ask",))

    def double(payload: Any) -> Any:
        return payload * 2

    assert hop.execute("ask('double', 21)", host_calls=HostCalls({"double": double})).return_value == "42"


def test_a_worker_death_in_one_hop_restores_into_a_fresh_worker_of_the_same_sandbox(hop: Session) -> None:
    assert hop.execute("kept = [1, 2, 3]").ok
    container = hop.container_id
    with pytest.raises(SandboxCrashed) as info:
        hop.execute("import os\nos._exit(1)")
    assert info.value.restored is True and "exited with status 1" in str(info.value)
    assert hop.container_id == container  # the supervisor's worker_lost: only the worker was replaced
    assert hop.execute("sum(kept)").return_value == "6"
    assert one_hop(hop)  # the fresh worker got a data channel of its own
