"""The package keeps its shape: no wide signature, no long function, no big class (the figures of scripts/shape)."""

from __future__ import annotations

from pathlib import Path

import pytest
from shape_support import Shape

import orchestrator

PACKAGE = Path(orchestrator.__file__).parent

WIDE = {
    "rlm.environment:DockerREPL.__init__",  # rlms' own DockerREPL's signature, which the drop-in keeps
}
"""Functions that take more than seven parameters, value objects' constructors aside, each with its reason."""

LONG: set[str] = set()
"""Functions over 80 lines. A declarative table (a parser's, say) may join, with a comment saying so."""

BIG: set[str] = set()
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
