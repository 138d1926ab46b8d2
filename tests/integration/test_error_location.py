"""A real session places errors in the cell: line, column, the source line as written and a caret line under it.

The same checks run on the oldest Python the agent supports (ORCH_OLDEST_BASE_IMAGE, 3.9), where
a SyntaxError has a column but a runtime error has none (frames carry columns from 3.11 on).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from orchestrator import Orchestrator, Session, Settings

pytestmark = pytest.mark.docker


def python_version(session: Session) -> tuple[int, int]:
    major, minor = session.agent_info["python"].split(".")[:2]
    return int(major), int(minor)


def check_errors(session: Session) -> None:
    version = python_version(session)
    error = session.execute("total = 0\nfor i in range(2)\n    total += i").error
    assert error is not None and error.type == "SyntaxError"
    assert (error.line, error.column, error.snippet) == (2, 18, "for i in range(2)")
    assert error.pointer == " " * 17 + "^"
    assert error.summary == "SyntaxError at line 2, column 18: " + (
        "expected ':'" if version >= (3, 10) else "invalid syntax"
    )
    assert session.execute("'total' in globals()").return_value == "False"  # nothing of the cell ran

    error = session.execute("def half(n):\n    return n / zero\nvalue = 1\nhalf(value)").error
    assert error is not None and error.type == "NameError"
    assert (error.line, error.snippet) == (2, "    return n / zero")
    if version >= (3, 11):
        assert (error.column, error.end_column) == (16, 20)
        assert error.pointer == " " * 15 + "^^^^"
        assert error.summary == "NameError at line 2, column 16: name 'zero' is not defined"
    else:
        assert (error.column, error.pointer) == (None, "")
        assert error.summary == "NameError at line 2: name 'zero' is not defined"
    assert "in half" in error.traceback and "orchestrator" not in error.traceback


def test_errors_are_located_in_a_real_session(session: Session) -> None:
    check_errors(session)


def test_errors_are_located_on_the_oldest_python(
    settings: Settings, make_orch: Callable[[Settings], Orchestrator], new_session: Callable[..., Session]
) -> None:
    base = os.environ.get("ORCH_OLDEST_BASE_IMAGE")
    if not base:
        if os.environ.get("ORCH_REQUIRE_DOCKER") == "1":
            pytest.fail("ORCH_OLDEST_BASE_IMAGE is not set; run the tests through scripts/test")
        pytest.skip("ORCH_OLDEST_BASE_IMAGE is not set (scripts/ensure-image sets it)")
    orch = make_orch(settings.replace(base_image=base))
    orch.build_image()
    session = new_session(orch)
    assert python_version(session) == (3, 9), session.agent_info
    check_errors(session)
