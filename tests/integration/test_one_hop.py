"""One hop against a real engine (docs/design/one-hop.md, steps 1 and 2): cells, values, output, host calls, a
worker's death and the controller's timeout ladder. Measures nothing; the unit tests
(tests/unit/wire/test_connection.py) check the connection itself against the host agent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support import passes_descriptors

from orchestrator import ExecutionTimeout, Orchestrator, SandboxCrashed, Session, Settings
from orchestrator.runtime.hostcalls import HostCalls
from orchestrator.runtime.sandbox import Sandbox, ValueFile

pytestmark = pytest.mark.docker


@pytest.fixture
def hop(
    settings_for: Callable[..., Settings],
    make_orch: Callable[[Settings], Orchestrator],
    new_session: Callable[..., Session],
) -> Session:
    session = new_session(make_orch(settings_for()))
    session.execute("1")  # the sandbox starts with the first call
    return session


def test_cells_values_and_output_in_one_hop(hop: Session) -> None:
    assert hop.execute("x = 41").ok
    assert hop.execute("x + 1").return_value == "42"
    result = hop.execute("print('hi')\n1 / 0")
    assert result.error is not None and result.error.type == "ZeroDivisionError" and result.stdout == "hi\n"
    hop.set_value("big", b"v" * (2 << 20))  # a value file's size: a descriptor on D
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
    assert hop.execute("sum(kept)").return_value == "6"  # the fresh worker got a data channel of its own


def test_a_big_value_goes_to_the_worker_as_a_descriptor_on_its_data_channel(
    hop: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller opens the staged blob itself and attaches it to the ``set_value`` on D: no link in the channel
    directory, no body; the worker maps it, and what is stored is what a restore brings back."""
    sent: list[int | None] = []
    open_value_file = Sandbox._open_value_file

    def spy(sandbox: Sandbox, value: ValueFile) -> int | None:
        sent.append(open_value_file(sandbox, value))
        return sent[-1]

    if not passes_descriptors(hop):
        pytest.skip("the relayed carrier: a value goes as the request's body")
    monkeypatch.setattr(Sandbox, "_open_value_file", spy)
    sandbox = hop._sandbox.sandbox
    assert sandbox is not None
    hop.set_value("big", b"v" * (2 << 20) + b"end")
    assert len(sent) == 1 and sent[0] is not None
    assert not [p for p in sandbox._endpoint.directory.iterdir() if p.name.startswith("value-")]
    assert hop.execute("len(big), big[-3:]").return_value == "(2097155, b'end')"
    hop.set_value("small", "s" * 1000)  # under VALUE_FILE_MIN_BYTES: the body, as always
    assert len(sent) == 1
    with pytest.raises(SandboxCrashed):
        hop.execute("import os\nos._exit(1)")
    assert hop.execute("len(big), big[-3:], len(small)").return_value == "(2097155, b'end', 1000)"


def test_the_controllers_ladder_interrupts_then_kills_in_the_same_sandbox(hop: Session) -> None:
    assert hop.execute("kept = [1, 2, 3]").ok
    container = hop.container_id
    with pytest.raises(ExecutionTimeout) as info:
        hop.execute("progress = 'reached'\nwhile True:\n    pass", timeout=1)
    assert info.value.restored is False and "interrupted" in str(info.value)  # the namespace stays
    assert hop.execute("sum(kept), progress").return_value == "(6, 'reached')"
    swallow = (
        "lost = 1\nwhile True:\n    try:\n        while True:\n            pass\n"
        + "    except KeyboardInterrupt:\n        pass"
    )
    with pytest.raises(ExecutionTimeout) as info:
        hop.execute(swallow, timeout=1)
    assert info.value.restored is True and "ignored the interrupt" in str(info.value)
    assert hop.container_id == container  # the kill went through the supervisor: only the worker was replaced
    assert hop.execute("sum(kept), 'lost' in globals()").return_value == "(6, False)"
