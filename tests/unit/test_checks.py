"""The shared type checks (orchestrator.checks): a bool is never an integer, a count or a number."""

from __future__ import annotations

import math

from orchestrator.checks import is_count, is_integer, is_number


def test_a_bool_is_none_of_them():
    for flag in (True, False):
        assert not is_integer(flag) and not is_count(flag) and not is_number(flag)


def test_integers_counts_and_numbers():
    assert is_integer(-3) and is_integer(1 << 80) and not is_integer(1.0) and not is_integer("1")
    assert is_count(0) and is_count(7) and not is_count(-1) and not is_count(2.0)
    assert is_number(1) and is_number(0.5) and is_number(math.inf) and not is_number("1") and not is_number(None)
