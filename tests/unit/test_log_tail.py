"""Errors that quote a log's last lines (a failed build, a container that exited at start): bounded, escaped, and
shown by the CLI as lines of their own below the one-line error."""

from __future__ import annotations

import io
import json

from orchestrator import AgentStartFailed, ImageBuildFailed
from orchestrator.cli.output import Exit, Output
from orchestrator.safe_text import last_lines


def test_last_lines_are_bounded_in_count_and_width_and_made_visible() -> None:
    log = "".join(f"line {n}\n" for n in range(100)) + "\n  \n" + "x" * 1000 + "\n\x1b]52;c;aGk=\x07\rforged\n"
    lines = last_lines(log, count=5, width=40)
    assert len(lines) == 5
    assert lines[:3] == ("line 97", "line 98", "line 99")
    assert lines[3] == "x" * 37 + "..."
    assert lines[4] == "\\x1b]52;c;aGk=\\x07\\rforged"
    assert last_lines("\n\n") == ()


def test_the_cli_prints_the_headline_then_the_quoted_lines() -> None:
    exc = ImageBuildFailed("building image t on b failed: it broke", tag="t", base_image="b", log_tail=("a", "b"))
    assert str(exc) == "building image t on b failed: it broke\n  | a\n  | b"  # a Python traceback shows them
    err, out = io.StringIO(), io.StringIO()
    assert Output(out, err).error(exc) == Exit.ENGINE
    assert err.getvalue() == "orchestrator: ImageBuildFailed: building image t on b failed: it broke\n  | a\n  | b\n"
    out = io.StringIO()
    Output(out, io.StringIO(), json_mode=True).error(AgentStartFailed("exited", exit_code=3, log_tail=("bye",)))
    assert json.loads(out.getvalue())["error"]["log_tail"] == ["bye"]
