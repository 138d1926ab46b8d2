"""The package keeps its shape: no wide signature, no long function, no big class (the figures of scripts/shape)."""

from __future__ import annotations

from pathlib import Path

import pytest
from shape_support import Shape

import orchestrator

PACKAGE = Path(orchestrator.__file__).parent

WIDE = {
    "rlm.environment:DockerREPL.__init__",  # being fixed by issue 35 (host-ops)
    "agent.protocol:exec_request",  # being fixed by issue 35 (agent-table)
    "ops.survey:survey",  # being fixed by issue 35 (backend-neutral)
    "ops.pool:SandboxPool.__init__",  # being fixed by issue 35 (backend-neutral)
    "runtime.restore:SessionSandbox.__init__",  # being fixed by issue 35 (backend-neutral)
    "backends.swarm.relay_client:RelayEndpoint.create",  # being fixed by issue 35 (backend-neutral)
    "backends.swarm.relay_client:RelayEndpoint.open",  # being fixed by issue 35 (backend-neutral)
    "wire.connection:AgentConnection.request",  # being fixed by issue 35 (carrier)
    "wire.connection:AgentConnection._request",  # being fixed by issue 35 (carrier)
    "wire.one_hop:OneHop.request",  # being fixed by issue 35 (carrier)
}
"""Functions that take more than seven parameters today, value objects' constructors aside (a fixed one goes)."""

LONG = {
    "api.session:Session.execute",  # being fixed by issue 35 (host-ops)
    "rlm.environment:DockerREPL.__init__",  # being fixed by issue 35 (host-ops)
    "ops.survey:survey",  # being fixed by issue 35 (backend-neutral)
    "agent.checkpoint:Tracker.delta",  # being fixed by issue 35 (agent-table)
}
"""Functions over 80 lines today. A declarative table (a parser's, say) may join, with a comment saying so."""

BIG = {
    "api.session:Session",  # being fixed by issue 35 (host-ops)
    "api.manager:Orchestrator",  # being fixed by issue 35 (backend-neutral)
}
"""Classes over 500 lines outside the agent today."""


@pytest.fixture(scope="module")
def shape() -> Shape:
    return Shape.of(PACKAGE)


def test_no_function_takes_more_than_seven_parameters_but_value_constructors(shape: Shape):
    assert {str(function) for function in shape.wide()} - WIDE == set()


def test_no_function_is_over_80_lines(shape: Shape):
    assert {str(function) for function in shape.long_functions()} - LONG == set()


def test_no_class_outside_the_agent_is_over_500_lines(shape: Shape):
    assert {str(block) for block in shape.big_classes()} - BIG == set()


def test_only_a_constructor_that_just_stores_its_arguments_is_excepted(tmp_path: Path):
    (tmp_path / "values.py").write_text(
        "class Point:\n"
        "    def __init__(self, a, b, c, d, e, f, g, h):\n"
        '        """Eight coordinates."""\n'
        "        self.a, self.b = a, b\n"
        "class Error(Exception):\n"
        "    def __init__(self, a, b, c, d, e, f, g, h):\n"
        "        super().__init__(a, b=b)\n"
        "        self.c = c\n"
        "class Worker:\n"
        "    def __init__(self, a, b, c, d, e, f, g, h):\n"
        "        self.start()\n"
    )
    shape = Shape.of(tmp_path)
    assert [str(f) for f in shape.wide_constructors()] == ["values:Point.__init__", "values:Error.__init__"]
    assert [str(f) for f in shape.wide()] == ["values:Worker.__init__"]
