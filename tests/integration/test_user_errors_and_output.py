"""Errors in user code are data, not exceptions; output is captured safely and bounded."""

from __future__ import annotations

import pytest

from orchestrator import ConfigError, Session, Settings

pytestmark = pytest.mark.docker


def test_syntax_error_is_data(shared_session: Session) -> None:
    result = shared_session.execute("a = 1\nb = (2 +\nc = 3")
    assert not result.ok
    assert result.error is not None
    assert result.error.type == "SyntaxError"
    assert result.error.line in (2, 3)
    assert result.error.snippet
    assert "SyntaxError" in result.error.traceback
    assert result.return_value is None
    # Nothing of the cell ran, and the session goes on.
    assert shared_session.execute("'a' in globals()").return_value == "False"


def test_exception_in_nested_function(shared_session: Session) -> None:
    code = (
        "def inner(n):\n"
        "    if n > 2:\n"
        "        raise ValueError(f'too big: {n}')\n"
        "    return n\n"
        "def outer(n):\n"
        "    return inner(n + 1)\n"
        "before = 'set before the error'\n"
        "outer(5)\n"
        "after = 'never set'\n"
    )
    result = shared_session.execute(code)
    error = result.error
    assert error is not None
    assert error.type == "ValueError"
    assert error.message == "too big: 6"
    assert error.line == 3
    assert error.snippet.strip() == "raise ValueError(f'too big: {n}')"
    assert str(error) == "ValueError: too big: 6 (line 3: raise ValueError(f'too big: {n}'))"
    tb = error.traceback
    assert tb.startswith("Traceback (most recent call last):\n")
    assert tb.rstrip().endswith("ValueError: too big: 6")
    frames = [line for line in tb.splitlines() if line.lstrip().startswith("File ")]
    assert len(frames) == 3  # <module>, outer, inner: only the user's frames
    assert all('"<cell-' in line for line in frames)
    assert "in outer" in tb and "in inner" in tb
    for internal in ("orchestrator", "worker.py", "cells.py", "supervisor", "exec("):
        assert internal not in tb
    # The code before the raise ran and its state persists; the code after did not run.
    assert shared_session.execute("before, 'after' in globals()").return_value == "('set before the error', False)"


def test_exception_raised_from_library_code_keeps_only_user_frames(shared_session: Session) -> None:
    result = shared_session.execute("import json\njson.loads('{not json')")
    assert result.error is not None
    assert result.error.type == "JSONDecodeError"
    assert result.error.line == 2
    assert "json/decoder.py" not in result.error.traceback
    assert "orchestrator" not in result.error.traceback


def test_output_before_an_error_is_kept(shared_session: Session) -> None:
    result = shared_session.execute("print('partial')\n1 / 0")
    assert result.stdout == "partial\n"
    assert result.error is not None and result.error.type == "ZeroDivisionError"


@pytest.mark.parametrize(
    ("code", "ename", "message"),
    [
        ("raise SystemExit(3)", "SystemExit", "3"),
        ("import sys; sys.exit('bye')", "SystemExit", "bye"),
        ("exit()", "SystemExit", "None"),
        ("raise KeyboardInterrupt", "KeyboardInterrupt", ""),
        ("raise GeneratorExit", "GeneratorExit", ""),
    ],
)
def test_base_exceptions_are_data_too(shared_session: Session, code: str, ename: str, message: str) -> None:
    before = shared_session.container_id
    result = shared_session.execute("survivor = 'yes'\n" + code)
    assert result.error is not None
    assert result.error.type == ename
    assert result.error.message == message
    assert shared_session.execute("survivor").return_value == "'yes'"
    assert shared_session.container_id == before


def test_bad_repr_of_the_trailing_expression(shared_session: Session) -> None:
    code = "class Ugly:\n    def __repr__(self):\n        raise RuntimeError('no repr')\nUgly()"
    result = shared_session.execute(code)
    assert result.ok
    assert result.return_value == "<repr failed: RuntimeError: no repr>"


def test_invalid_utf8_and_lone_surrogates_in_output(shared_session: Session) -> None:
    code = (
        "import sys\n"
        "sys.stdout.write('before ')\n"
        "sys.stdout.flush()\n"
        "sys.stdout.buffer.write(b'\\xff\\xfe')\n"
        "sys.stdout.buffer.flush()\n"
        "print(' lone \\udc80 surrogate')\n"
        "print('err \\ud800', file=sys.stderr)\n"
        "'done'"
    )
    result = shared_session.execute(code)
    assert result.ok, result.error
    assert result.return_value == "'done'"
    # Invalid bytes become U+FFFD; a lone surrogate written as text is escaped with a backslash.
    assert result.stdout == "before \ufffd\ufffd lone \\udc80 surrogate\n"
    assert result.stderr == "err \\ud800\n"
    assert shared_session.execute("1 + 1").return_value == "2"


def test_lone_surrogates_in_values_and_errors(shared_session: Session) -> None:
    result = shared_session.execute("s = '\\ud800'\ns")
    assert result.ok
    assert result.return_value == "'\\ud800'"  # a repr escapes the surrogate
    result = shared_session.execute("raise ValueError('bad \\udc80 text')")
    assert result.error is not None
    assert result.error.type == "ValueError"
    assert result.error.message == "bad \ufffd text"
    result.error.message.encode("utf-8")
    result.error.traceback.encode("utf-8")
    result = shared_session.execute("class R:\n    def __repr__(self):\n        return 'r\\ud800'\nR()")
    assert result.ok
    assert result.return_value == "r\ufffd"
    assert shared_session.execute("s == chr(0xD800)").return_value == "True"


def test_huge_output_is_truncated_to_the_limit(shared_session: Session, settings: Settings) -> None:
    limit = settings.limits.max_output_bytes
    result = shared_session.execute(
        "import sys\nsys.stdout.write('a' * 10_000_000)\nsys.stderr.write('b' * 3_000_000)\n'finished'"
    )
    assert result.ok
    assert result.return_value == "'finished'"
    kept, _, marker = result.stdout.partition("\n[")
    assert kept == "a" * len(kept) and len(kept) > limit // 3, "the preview starts with the head of the output"
    assert "truncated" in marker and str(result.stdout_path) in marker
    shown = len(kept) + len(result.stdout.rpartition(" ...]\n")[2])
    assert str(10_000_000 - shown) in marker
    assert len(result.stdout) <= limit
    assert result.stdout_path is not None and result.stdout_path.stat().st_size == 10_000_000
    assert result.stderr.partition("\n[")[0] == "b" * len(result.stderr.partition("\n[")[0])
    assert "truncated" in result.stderr and result.stderr_path is not None


def test_many_small_prints_are_truncated_too(shared_session: Session, settings: Settings) -> None:
    limit = settings.limits.max_output_bytes
    result = shared_session.execute("for i in range(200_000):\n    print('0123456789')")
    assert result.ok
    assert result.stdout.startswith("0123456789\n" * 10)
    assert "truncated" in result.stdout
    assert len(result.stdout.encode()) < limit + 200


def test_code_with_lone_surrogates_is_a_config_error(shared_session: Session) -> None:
    with pytest.raises(ConfigError, match="valid Unicode"):
        shared_session.execute("x = '\ud800'")
    assert shared_session.execute("'\\ud800' == chr(0xD800)").return_value == "True"


def test_huge_return_value_is_clipped(shared_session: Session) -> None:
    result = shared_session.execute("'y' * 1_000_000")
    assert result.ok
    assert result.return_value is not None
    assert result.return_value.startswith("'yyy")
    assert len(result.return_value) < 70_000
    assert "more characters" in result.return_value
