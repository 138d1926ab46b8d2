"""Type checks for values from callers, files and JSON, where ``isinstance`` alone is wrong: a bool is an int.

``True`` passes ``isinstance(value, int)``, yet it is never meant as a count, a size or a number of
seconds; these say what is meant, once.
"""

from __future__ import annotations

from typing import TypeGuard


def is_integer(value: object) -> TypeGuard[int]:
    """An int, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_count(value: object) -> TypeGuard[int]:
    """An int (not a bool) of at least 0."""
    return is_integer(value) and value >= 0


def is_number(value: object) -> TypeGuard[int | float]:
    """An int or a float, not a bool (NaN and infinities included: bound them where it matters)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
