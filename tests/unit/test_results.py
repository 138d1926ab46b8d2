"""Agent replies are validated field by field; anything malformed is a ProtocolError."""

from __future__ import annotations

import pytest

from orchestrator import ExecResult, ProtocolError

GOOD = {"stdout": "hi\n", "stderr": "", "return_value": "42", "error": None, "duration": 0.01}


def test_good_reply():
    r = ExecResult.from_reply(GOOD, {}, 3)
    assert r.ok and r.return_value == "42" and r.stdout == "hi\n" and r.generation == 3


def test_error_is_data():
    err = {"ename": "ValueError", "evalue": "bad", "line": 2, "snippet": "raise ValueError('bad')", "traceback": "tb"}
    r = ExecResult.from_reply({**GOOD, "return_value": None, "error": err}, {}, 1)
    assert not r.ok and r.error is not None and r.error.type == "ValueError"
    assert str(r.error) == "ValueError: bad (line 2: raise ValueError('bad'))"


@pytest.mark.parametrize(
    "bad",
    [
        {**GOOD, "stdout": 5},
        {**GOOD, "duration": "fast"},
        {**GOOD, "duration": True},
        {**GOOD, "error": "boom"},
        {**GOOD, "error": {"ename": "X"}},
        {k: v for k, v in GOOD.items() if k != "stderr"},
    ],
)
def test_malformed_replies(bad):
    with pytest.raises(ProtocolError):
        ExecResult.from_reply(bad, {}, 0)
