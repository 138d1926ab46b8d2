"""``safe_text.visible``: what a terminal would obey becomes text it prints."""

from __future__ import annotations

import unicodedata

import pytest

from orchestrator.safe_text import visible


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain text, ünïcode ✓ 𝄞", "plain text, ünïcode ✓ 𝄞"),
        ("\x1b]52;c;aGk=\x07", "\\x1b]52;c;aGk=\\x07"),  # OSC 52 sets the clipboard
        ("\x1b[2J", "\\x1b[2J"),  # clears the screen
        ("\x9b31m", "\\x9b31m"),  # C1 CSI
        ("a\u202eexe.txt", "a\\u202eexe.txt"),  # a bidi override
        ("zero\u200bwidth", "zero\\u200bwidth"),
        ("line\u2028sep", "line\\u2028sep"),
        ("\rforged", "\\rforged"),  # a carriage return never takes the line back
        ("a\\x1b b", "a\\x1b b"),  # text that only looks like an escape stays
        ("two\nlines\tand a tab", "two\nlines\tand a tab"),
    ],
)
def test_visible_multiline(text: str, shown: str) -> None:
    assert visible(text) == shown


def test_one_line_fields_escape_newlines_and_tabs_too() -> None:
    assert visible("a\nb\tc\rd", multiline=False) == "a\\nb\\tc\\rd"


def test_nothing_a_terminal_acts_on_is_left() -> None:
    every = "".join(chr(c) for c in range(0x0, 0x30000) if not 0xD800 <= c < 0xE000)
    left = {unicodedata.category(c) for c in visible(every, multiline=False)}
    assert not left & {"Cc", "Cf", "Zl", "Zp", "Cs"}
