"""The one rule for checkpoint names, shared by the agent, the ledger and the store."""

from __future__ import annotations

import pytest

from orchestrator.agent import checkpoint_names


@pytest.mark.parametrize(
    "key",
    ["x", "_private", "caf\u00e9", "n" * checkpoint_names.MAX_NAME_CHARS, "ctx-1/x", "A_b-9/y", "c" * 64 + "/z"],
)
def test_checkpoint_keys_that_are_stored(key):
    assert checkpoint_names.checkpoint_key_problem(key) is None


@pytest.mark.parametrize(
    "key",
    [
        "",
        "a b",
        "1x",
        "esc\x1b",
        "x\n",
        "n" * (checkpoint_names.MAX_NAME_CHARS + 1),
        "/x",
        "ctx/",
        "a/b/c",
        "c" * 65 + "/z",
        "-ctx/x",
        "ctx\n/x",
        "x\u202e",
        7,
        None,
    ],
)
def test_checkpoint_keys_that_are_refused(key):
    assert checkpoint_names.checkpoint_key_problem(key) is not None
