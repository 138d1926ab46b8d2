"""Running one cell of user code like a REPL does: statements, then the repr of a trailing expression.

Standard library only (runs in the sandbox worker). Errors in user code become data: type,
message, line and column, the offending source line and a traceback of the user's own frames only.
"""

from __future__ import annotations

import ast
import contextlib
import linecache
import sys
import traceback
from typing import Any, Dict, List, Optional, Tuple

from .capture import OutputLimitExceeded

CELL_PREFIX = "<cell-"
_MAX_REPR = 64 << 10
_MAX_MESSAGE = 8 << 10


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "... [%d more characters]" % (len(text) - limit)


def _register_source(filename: str, code: str) -> None:
    # Tracebacks and inspect.getsource read cell sources from linecache.
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)


def _text(obj: object) -> str:
    """str() of a user object, which may raise anything."""
    try:
        return str(obj)
    except BaseException:
        return "<str() failed>"


# (line, column, end_column, snippet): 1-based; end_column is one past the range, on the same line.
_Location = Tuple[Optional[int], Optional[int], Optional[int], str]
_NOWHERE: _Location = (None, None, None, "")


def _positive(value: object) -> Optional[int]:
    # A cell can raise its own SyntaxError with anything in its attributes.
    return value if type(value) is int and value > 0 else None


def _char_offset(line: str, byte_offset: int) -> int:
    """A 0-based UTF-8 byte offset into ``line`` as a 0-based character offset."""
    if line.isascii():
        return byte_offset
    return len(line.encode("utf-8", "replace")[:byte_offset].decode("utf-8", "ignore"))


def _is_cell(filename: object) -> bool:
    return type(filename) is str and filename.startswith(CELL_PREFIX)


def _syntax_location(exc: SyntaxError) -> _Location:
    line = _positive(exc.lineno)
    column = _positive(exc.offset)
    end_column = _positive(getattr(exc, "end_offset", None)) if getattr(exc, "end_lineno", None) == line else None
    text = exc.text if type(exc.text) is str else None
    if text is None and line is not None and _is_cell(exc.filename):
        # The compiler (unlike the parser) leaves the text unset and counts offsets in UTF-8 bytes.
        text = linecache.getline(exc.filename, line)
        column = None if column is None else _char_offset(text, column - 1) + 1
        end_column = None if end_column is None else _char_offset(text, end_column - 1) + 1
    if column is None or end_column is None or end_column <= column:
        end_column = None
    return line, column, end_column, (text or "").rstrip("\r\n")


def _frame_location(frame: traceback.FrameSummary) -> _Location:
    line = frame.lineno
    source = linecache.getline(frame.filename, line).rstrip("\r\n") if line else ""
    if not source:  # the cell's lines are gone from linecache: the frame's copy has lost its indentation
        return line, None, None, frame.line or ""
    colno = getattr(frame, "colno", None)  # Python 3.11+: a 0-based UTF-8 byte offset
    if type(colno) is not int or colno < 0:
        return line, None, None, source
    column = _char_offset(source, colno) + 1
    end_colno = getattr(frame, "end_colno", None)
    end_column = None
    if getattr(frame, "end_lineno", None) == line and type(end_colno) is int and end_colno > colno:
        end_column = _char_offset(source, end_colno) + 1
    return line, column, end_column, source


def _location(exc: BaseException, frames: List[traceback.FrameSummary]) -> _Location:
    """Where in the cell the error is: a SyntaxError in the cell itself, else the last user frame."""
    try:
        if isinstance(exc, SyntaxError) and (not frames or _is_cell(exc.filename)):
            return _syntax_location(exc)
        if frames:
            return _frame_location(frames[-1])
    except Exception:  # attributes of a cell's own exception class may raise anything
        pass
    return _NOWHERE


def _message(exc: BaseException) -> str:
    """str() of the exception; a SyntaxError's own message, without the file and line str() adds."""
    if isinstance(exc, SyntaxError):
        try:
            if type(exc.msg) is str:
                return exc.msg
        except Exception:
            pass
    return _text(exc)


def error_info(exc: BaseException, skip_frames: int = 0) -> Dict[str, Any]:
    """Describe an exception from user code with only the user's frames.

    ``snippet`` is the source line as written (indentation kept) and ``column`` (1-based, or None)
    indexes it: a SyntaxError's offset, else where the failing expression starts (Python 3.11+).
    ``end_column``, when known, is one past the end of the failing range on the same line.
    """
    tb = exc.__traceback__
    for _ in range(skip_frames):
        if tb is not None:
            tb = tb.tb_next
    frames = [f for f in traceback.extract_tb(tb) if f.filename.startswith(CELL_PREFIX)]
    line, column, end_column, snippet = _location(exc, frames)
    try:
        last = "".join(traceback.format_exception_only(type(exc), exc))
    except Exception:  # e.g. a cell's own SyntaxError with junk attributes
        last = "%s: %s\n" % (type(exc).__name__, _text(exc))
    text = "".join(traceback.format_list(frames)) + last
    if frames:
        text = "Traceback (most recent call last):\n" + text
    if column is not None and column > _MAX_MESSAGE:  # past the part of the line that is sent
        column = end_column = None
    elif end_column is not None:
        end_column = min(end_column, _MAX_MESSAGE + 1)
    return {
        "ename": type(exc).__name__,
        "evalue": _clip(_message(exc), _MAX_MESSAGE),
        "line": line,
        "column": column,
        "end_column": end_column,
        "snippet": _clip(snippet, _MAX_MESSAGE),
        "traceback": _clip(text, _MAX_REPR),
    }


def _flush_quietly() -> None:
    for stream in (sys.stdout, sys.stderr):
        # The cell may have replaced the stream with anything (even one that writes to the capped stream on flush).
        with contextlib.suppress(Exception, OutputLimitExceeded):
            stream.flush()


def run_cell(code: str, namespace: Dict[str, Any], cell_number: int) -> Dict[str, Any]:
    """Execute ``code`` in ``namespace``; return {"return_value": repr or None, "error": dict or None}.

    KeyboardInterrupt is reported like any other error, so an interrupted cell leaves the
    namespace as a REPL would: with whatever ran before the interrupt. (An interrupt that lands
    in this function's own code, outside the user's, escapes; the caller reports it the same way.)
    """
    filename = "%s%d>" % (CELL_PREFIX, cell_number)
    _register_source(filename, code)
    try:
        tree = ast.parse(code, filename, "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:  # ValueError: NUL bytes; too deep
        return {"return_value": None, "error": error_info(exc)}
    trailing = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    try:
        if tree.body or trailing is None:  # a cell that is one expression has no statements to run first
            exec(compile(tree, filename, "exec"), namespace)
        value = None
        if trailing is not None:
            value = eval(compile(ast.Expression(trailing.value), filename, "eval"), namespace)
    except BaseException as exc:
        return {"return_value": None, "error": error_info(exc, 1)}
    finally:
        _flush_quietly()
    if value is None:
        return {"return_value": None, "error": None}
    try:
        text = repr(value)
    except BaseException as exc:
        text = "<repr failed: %s: %s>" % (type(exc).__name__, _text(exc))
    return {"return_value": _clip(text, _MAX_REPR), "error": None}
