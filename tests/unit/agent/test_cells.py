"""Errors in user code say where they are: line, column, the source line as written, and a caret line under it."""

from __future__ import annotations

import sys

import pytest

from orchestrator import ProtocolError
from orchestrator.agent import cells
from orchestrator.api.results import ExecError

COLUMNS_AT_RUN_TIME = sys.version_info >= (3, 11)  # traceback.FrameSummary.colno


def run(code: str) -> ExecError:
    error = cells.run_cell(code, {}, 1)["error"]
    assert error is not None
    return ExecError.from_reply(error)


@pytest.mark.parametrize(
    ("code", "line", "column", "snippet"),
    [
        ("for i in range(2)\n    print(i)", 1, 18, "for i in range(2)"),  # ':' expected just past the end
        ("x = 1\nif x > 0\n    y = 2", 2, 9, "if x > 0"),
        ("x = [1, 2 3]", 1, 9, "x = [1, 2 3]"),  # the '2 3' pair (3.9, in the sandbox: at '3')
        ("def f():\n  return 1\n    x = 2", 3, 4, "    x = 2"),  # unexpected indent, indentation kept
        ("s = 'éé' ; return 5", 1, 12, "s = 'éé' ; return 5"),  # compiler error: bytes turned into characters
        ("nonlocal q", 1, 1, "nonlocal q"),
    ],
)
def test_syntax_errors_point_at_the_column(code: str, line: int, column: int, snippet: str) -> None:
    error = run(code)
    assert error.type in ("SyntaxError", "IndentationError")
    assert (error.line, error.column, error.snippet) == (line, column, snippet)
    assert error.pointer.startswith(" " * (column - 1) + "^")


def test_syntax_error_summary_and_pointer() -> None:
    error = run("for i in range(2)\n    print(i)")
    assert error.pointer == " " * 17 + "^"
    assert error.message == "expected ':'"  # the parser's own message, not "... (<cell-1>, line 1)"
    assert error.summary == "SyntaxError at line 1, column 18: expected ':'"


def test_an_unclosed_bracket() -> None:
    error = run("a = 1\nb = (2 +\nc = 3")
    assert (error.line, error.column, error.snippet, error.message) == (2, 5, "b = (2 +", "'(' was never closed")
    assert error.pointer == "    ^"


def test_a_range_on_one_line_gets_several_carets() -> None:
    error = run("print 'hi'")
    assert (error.column, error.end_column) == (1, 11)
    assert error.pointer == "^" * 10


@pytest.mark.parametrize(
    ("code", "ename", "line", "snippet", "pointer"),
    [
        ("x = 1\ny = x + undefined_name", "NameError", 2, "y = x + undefined_name", " " * 8 + "^" * 14),
        ("s = 'éé'; 1 / 0", "ZeroDivisionError", 1, "s = 'éé'; 1 / 0", " " * 10 + "^" * 5),
        ("def f(n):\n    return n / 0\nf(1)", "ZeroDivisionError", 2, "    return n / 0", " " * 11 + "^" * 5),
        ("d = {}\nd['k']", "KeyError", 2, "d['k']", "^" * 6),  # the trailing expression, evaluated apart
    ],
)
def test_runtime_errors_point_at_the_failing_expression(
    code: str, ename: str, line: int, snippet: str, pointer: str
) -> None:
    error = run(code)
    assert (error.type, error.line, error.snippet) == (ename, line, snippet)
    if COLUMNS_AT_RUN_TIME:
        assert error.pointer == pointer
        assert error.column == len(pointer) - len(pointer.lstrip()) + 1
        assert error.summary.startswith(f"{ename} at line {line}, column {error.column}: ")
    else:
        assert error.column is None and error.pointer == ""
        assert error.summary.startswith(f"{ename} at line {line}: ")


def test_a_syntax_error_from_other_code_is_placed_at_the_cell_line_that_ran_it() -> None:
    error = run("x = 1\nexec('a b')")
    assert (error.type, error.line, error.snippet) == ("SyntaxError", 2, "exec('a b')")
    assert "<string>" in error.traceback


def test_junk_in_a_cells_own_syntax_error_is_ignored() -> None:
    error = run("raise SyntaxError('m', ('<cell-1>', 'one', [], 5))")
    assert (error.line, error.column, error.snippet, error.pointer) == (None, None, "", "")
    assert "SyntaxError: m" in error.traceback  # Python 3.9's formatting raises on such junk: our own line
    ugly = run("class E(SyntaxError):\n    @property\n    def lineno(self):\n        raise ValueError\nraise E('q')")
    assert (ugly.type, ugly.line, ugly.snippet) == ("E", 5, "raise E('q')")


def test_no_location_for_errors_outside_user_code() -> None:
    try:
        raise KeyboardInterrupt  # as when an interrupt lands in the worker's code, not the cell's
    except KeyboardInterrupt as exc:
        error = ExecError.from_reply(cells.error_info(exc))
    assert (error.line, error.column, error.snippet, error.pointer) == (None, None, "", "")
    assert error.summary == "KeyboardInterrupt"


def make(snippet: str, column: int | None, end_column: int | None = None, line: int | None = 1) -> ExecError:
    return ExecError("E", "m", line, snippet, "", column, end_column)


def test_pointer_rules() -> None:
    assert make("abc", 2).pointer == " ^"
    assert make("abc", 4).pointer == "   ^"  # just past the end (a missing ':')
    assert make("abc", 1, 3).pointer == "^^"
    assert make("abc", 2, 99).pointer == " ^^"  # a range past the end stops at the end
    assert make("abc", 2, 1).pointer == " ^"  # an end before the start is ignored
    assert make("\t\tx = 1 +", 9).pointer == "\t\t      ^"  # tabs copied, so the caret lines up
    for junk in (None, 0, -3, 5, 10**12):
        assert make("abc", junk).pointer == ""
    assert make("", 1).pointer == ""


def test_summary_and_str() -> None:
    assert make("abc", 2).summary == "E at line 1, column 2: m"
    assert make("abc", None).summary == "E at line 1: m"
    assert make("", None, line=None).summary == "E: m"
    assert ExecError("KeyboardInterrupt", "", None, "", "").summary == "KeyboardInterrupt"
    assert ExecError("E", "first\nsecond", 3, "x", "").summary == "E at line 3: first ..."
    assert str(make("    abc", 5)) == "E: m (line 1: abc)"


def test_from_reply_checks_the_columns() -> None:
    base = {"ename": "E", "evalue": "m", "line": 1, "snippet": "abc", "traceback": ""}
    assert ExecError.from_reply(base).column is None  # an older agent sends no column
    assert ExecError.from_reply({**base, "column": 2, "end_column": 3}).pointer == " ^"
    for bad in ({"column": "2"}, {"column": True}, {"end_column": 1.5}):
        with pytest.raises(ProtocolError):
            ExecError.from_reply({**base, **bad})


def test_a_cell_that_is_one_expression_is_evaluated_like_any_other() -> None:
    namespace: dict[str, object] = {}
    assert cells.run_cell("40 + 2", namespace, 1) == {"return_value": "42", "error": None}
    assert "__builtins__" in namespace  # as when statements run before the expression
    assert cells.run_cell("", namespace, 2) == {"return_value": None, "error": None}
    error = run("1 / 0")  # an expression alone that raises is placed like any failing line
    assert (error.type, error.line) == ("ZeroDivisionError", 1)
