"""The errors a new user's first cells meet by design (no pip, no network) say what works instead (issue 38)."""

from __future__ import annotations

import pytest

from orchestrator import ExecError, ExecResult
from orchestrator.api.hints import NO_NETWORK, NO_PACKAGE, hint
from orchestrator.api.tools import PythonTool
from tests.unit.api.test_tools import FakeSession


@pytest.mark.parametrize(
    ("error_type", "message", "expected"),
    [
        ("ModuleNotFoundError", "No module named 'pip'", NO_PACKAGE),  # import pip; pip.main([...])
        ("ModuleNotFoundError", "No module named 'numpy'", NO_PACKAGE),
        ("FileNotFoundError", "[Errno 2] No such file or directory: 'pip'", NO_PACKAGE),  # subprocess.run(["pip", ...])
        ("URLError", "<urlopen error [Errno -3] Temporary failure in name resolution>", NO_NETWORK),
        ("gaierror", "[Errno -2] Name or service not known", NO_NETWORK),
        ("OSError", "[Errno 101] Network is unreachable", NO_NETWORK),
        ("ConnectionError", "Failed to resolve 'example.test' ([Errno -3] ...)", NO_NETWORK),  # requests
        ("NameError", "name 'y' is not defined", None),
        ("FileNotFoundError", "[Errno 2] No such file or directory: 'data.csv'", None),
    ],
)
def test_the_hint_of_an_error(error_type: str, message: str, expected: str | None) -> None:
    assert hint(error_type, message) == expected


def test_the_tool_answer_carries_the_hint_after_the_error() -> None:
    error = ExecError("ModuleNotFoundError", "No module named 'pip'", 1, "import pip", "")
    text = PythonTool(FakeSession(ExecResult(error=error))).handle("execute_code", {"code": "import pip"})
    assert f"hint: {NO_PACKAGE}" in text.splitlines()
