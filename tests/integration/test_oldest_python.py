"""The agent on the oldest Python it claims (3.9): the same calls, checkpoints and restores work there.

The base comes from ``ORCH_OLDEST_BASE_IMAGE`` (``scripts/ensure-image`` sets it: python:3.9-slim,
or Debian bullseye built offline). Without it the test is skipped, except under
``ORCH_REQUIRE_DOCKER=1`` (CI), where the missing base is a failure.
"""

from __future__ import annotations

import os

import pytest

from orchestrator import ExecutionTimeout, Orchestrator, Settings

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def oldest(settings: Settings) -> Settings:
    base = os.environ.get("ORCH_OLDEST_BASE_IMAGE")
    if not base:
        if os.environ.get("ORCH_REQUIRE_DOCKER") == "1":
            pytest.fail("ORCH_OLDEST_BASE_IMAGE is not set; run the tests through scripts/test")
        pytest.skip("ORCH_OLDEST_BASE_IMAGE is not set (scripts/ensure-image sets it)")
    return settings.replace(base_image=base)


def test_sessions_work_on_the_oldest_supported_python(oldest: Settings, make_orch, new_session) -> None:
    orch: Orchestrator = make_orch(oldest)
    orch.build_image()
    session = new_session(orch)
    assert session.agent_info["python"].startswith("3.9"), session.agent_info
    code = (
        "import collections\n"
        "class Point:\n    def __init__(self, x):\n        self.x = x\n"
        "p = Point(3)\ncounts = collections.Counter('abca')\ngen = (i for i in range(3))\n"
        "class Bad:\n    def __reduce__(self):\n        return (int, ('not a number',))\nbad = Bad()"
    )
    result = session.execute(code)
    assert result.ok, result.error
    assert set(result.unsaved) == {"gen"}
    assert session.container_id is not None
    orch.backend.kill(session.container_id)
    result = session.execute("p.x, counts['a'], isinstance(p, Point)")
    assert result.return_value == "(3, 2, True)"
    assert set(result.restore_failures) == {"bad"}
    with pytest.raises(ExecutionTimeout):
        session.execute("while True: pass", timeout=1)
    assert session.execute("p.x").return_value == "3"
