"""Did-you-mean for a mistyped name (a command, a field, an ``ORCH_`` variable): the closest known one, if any."""

from __future__ import annotations

from collections.abc import Iterable


def closest(word: str, known: Iterable[str]) -> str | None:
    """The name of ``known`` closest to ``word`` (``difflib``'s ratio 0.6 or more), or None."""
    import difflib  # only on the error path: parsing a command line stays cheap

    found = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """`` (did you mean X?)`` for the closest name of ``known``, or "" when none is close."""
    match = closest(word, known)
    return "" if match is None else f" (did you mean {match}?)"
