"""``safe_text.visible``: what a terminal would obey becomes text it prints."""

from __future__ import annotations

import json
import logging
import sys
import unicodedata

import pytest

from orchestrator.safe_text import JsonFormatter, logging_session, visible


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


# ---------------------------------------------------------------- JSON logs (--log-json)


def _record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("orchestrator.test", logging.WARNING, __file__, 1, message, args, None)
    record.__dict__.update(extra)
    return record


def test_a_json_record_is_one_line_of_its_fields() -> None:
    line = JsonFormatter().format(_record("session %s: could not restore %s", "s1", "f"))
    document = json.loads(line)
    assert set(document) == {"time", "level", "logger", "message"}
    assert document["level"] == "WARNING" and document["logger"] == "orchestrator.test"
    assert document["message"] == "session s1: could not restore f"
    assert document["time"].endswith("Z") and "T" in document["time"]


def test_a_json_record_names_its_session() -> None:
    assert json.loads(JsonFormatter().format(_record("removed", session_id="s9")))["session_id"] == "s9"
    with logging_session("s7"):
        assert json.loads(JsonFormatter().format(_record("restored")))["session_id"] == "s7"
    assert "session_id" not in json.loads(JsonFormatter().format(_record("after")))


def test_sandbox_text_in_a_json_record_is_escaped_and_stays_on_its_line() -> None:
    hostile = 'name\x1b]52;c;aGk=\x07\n{"level": "forged"}\u202e'
    line = JsonFormatter().format(_record("could not restore %s", hostile))
    assert "\n" not in line and line.isascii() and "\x1b" not in line
    assert json.loads(line)["message"] == f"could not restore {hostile}"


def test_a_json_record_carries_its_traceback() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = _record("failed")
        record.exc_info = sys.exc_info()
    document = json.loads(JsonFormatter().format(record))
    assert "ValueError: boom" in document["exception"]
