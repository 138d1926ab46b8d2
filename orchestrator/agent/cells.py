"""Running one cell of user code like a REPL does: statements, then the repr of a trailing expression.

Standard library only (runs in the sandbox worker). Errors in user code become data: type,
message, line, the offending source line and a traceback of the user's own frames only.
"""

from __future__ import annotations

import ast
import contextlib
import linecache
import sys
import traceback
from typing import Any, Dict, Optional

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


def error_info(exc: BaseException, skip_frames: int = 0) -> Dict[str, Any]:
    """Describe an exception from user code with only the user's frames."""
    tb = exc.__traceback__
    for _ in range(skip_frames):
        if tb is not None:
            tb = tb.tb_next
    frames = [f for f in traceback.extract_tb(tb) if f.filename.startswith(CELL_PREFIX)]
    line: Optional[int] = None
    snippet = ""
    if isinstance(exc, SyntaxError):
        # A cell can raise its own SyntaxError with anything in these attributes.
        line = exc.lineno if type(exc.lineno) is int else None
        snippet = exc.text.rstrip("\n") if type(exc.text) is str else ""
    elif frames:
        line = frames[-1].lineno
        snippet = frames[-1].line or ""
    text = "".join(traceback.format_list(frames)) + "".join(traceback.format_exception_only(type(exc), exc))
    if frames:
        text = "Traceback (most recent call last):\n" + text
    return {
        "ename": type(exc).__name__,
        "evalue": _clip(_text(exc), _MAX_MESSAGE),
        "line": line,
        "snippet": _clip(snippet, _MAX_MESSAGE),
        "traceback": _clip(text, _MAX_REPR),
    }


def _flush_quietly() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # the cell may have replaced the stream with anything
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
