"""The exec request's one-shot options (docs/protocol.md): ``output_cap``, ``stdin`` and ``checkpoint: false``.

The output cap is pinned on the worker's pieces in this process (``capture.CellStreams`` and
``cells.run_cell``); ``stdin`` and ``checkpoint: false`` on the agent as a host subprocess,
driven frame by frame with the helpers of tests/agent_process.py.
"""

from __future__ import annotations

import array
import io
import sys
import time

import pytest
from agent_process import SLOW_REDUCE
from reply_support import exec_reply

from orchestrator import ExecResult, ProtocolError
from orchestrator.agent import capture, cells, request_table
from orchestrator.wire.replies import parse_exec_reply

EMPTY_DELTA = {"generation": 0, "blobs": [], "vars": {}, "deleted": [], "unsaved": {}}


def _totals(streams: capture.CellStreams) -> tuple[int, int]:
    return streams.sinks[0].total, streams.sinks[1].total


# --- the output cap, in the worker's capture ----------------------------------------------------------------


def test_one_big_write_keeps_the_part_up_to_the_cap_and_raises() -> None:
    streams = capture.CellStreams(1000, cap=10)
    out, _ = streams.streams
    with pytest.raises(capture.OutputLimitExceeded, match="the cell's output passed its limit of 10 bytes"):
        out.write("x" * 25)
    assert _totals(streams) == (10, 0) and bytes(streams.sinks[0].kept) == b"x" * 10
    assert streams.limited and streams.sinks[0].text() == "x" * 10
    assert not isinstance(capture.OutputLimitExceeded("m"), Exception)
    assert isinstance(capture.OutputLimitExceeded("m"), BaseException)


def test_many_small_writes_raise_at_the_one_that_passes_the_cap() -> None:
    streams = capture.CellStreams(1000, cap=7)
    out, _ = streams.streams
    for _ in range(3):
        out.write("ab")  # 6 bytes: under the cap, each handled at once (no buffer in between)
    assert _totals(streams) == (6, 0) and not streams.limited
    with pytest.raises(capture.OutputLimitExceeded):
        out.write("ab")
    assert _totals(streams) == (7, 0) and bytes(streams.sinks[0].kept) == b"abababa"


def test_a_write_that_reaches_the_cap_exactly_does_not_raise() -> None:
    streams = capture.CellStreams(1000, cap=4)
    out, _ = streams.streams
    out.write("abcd")
    out.write("")
    assert not streams.limited
    with pytest.raises(capture.OutputLimitExceeded):
        out.write("e")
    assert _totals(streams) == (4, 0)


def test_stdout_and_stderr_count_against_one_cap() -> None:
    streams = capture.CellStreams(1000, cap=10)
    out, err = streams.streams
    out.write("123456")
    with pytest.raises(capture.OutputLimitExceeded):
        err.write("abcdef")
    assert _totals(streams) == (6, 4) and streams.sinks[1].text() == "abcd"


def test_the_cap_counts_encoded_bytes_and_the_binary_buffer() -> None:
    streams = capture.CellStreams(1000, cap=12)
    out, err = streams.streams
    out.write("é")  # 2 bytes of UTF-8
    out.buffer.write(bytearray(b"ab"))
    err.buffer.write(memoryview(b"cd"))
    err.buffer.write(array.array("h", [1, 2]))  # the 4 bytes of its buffer, as a buffered stream would count them
    assert _totals(streams) == (4, 6) and not streams.limited
    with pytest.raises(TypeError):
        out.buffer.write("text")  # not bytes-like: refused as BufferedWriter refuses it, nothing counted
    with pytest.raises(capture.OutputLimitExceeded):
        out.buffer.write(b"xyz")
    assert _totals(streams) == (6, 6)


def test_every_later_write_keeps_nothing_and_raises_again() -> None:
    streams = capture.CellStreams(1000, cap=3)
    out, err = streams.streams
    with pytest.raises(capture.OutputLimitExceeded):
        out.write("abcdef")
    for write in (out.write, err.write):
        with pytest.raises(capture.OutputLimitExceeded):
            write("more")
    with pytest.raises(capture.OutputLimitExceeded):
        out.buffer.write(b"bytes too")
    with pytest.raises(capture.OutputLimitExceeded):
        out.write("")
    assert _totals(streams) == (3, 0) and bytes(streams.sinks[0].kept) == b"abc"


def test_a_cap_of_zero_allows_no_output() -> None:
    streams = capture.CellStreams(1000, cap=0)
    out, _ = streams.streams
    out.write("")
    with pytest.raises(capture.OutputLimitExceeded, match="limit of 0 bytes"):
        out.write("x")
    assert _totals(streams) == (0, 0) and streams.limited


def test_the_agents_own_flushes_never_raise_the_cap() -> None:
    sent: list[tuple[str, bytes]] = []
    streams = capture.CellStreams(4, lambda name, data: sent.append((name, data)), True, 1000, cap=6)
    out, err = streams.streams
    with pytest.raises(capture.OutputLimitExceeded):
        out.write("0123456789")
    with pytest.raises(capture.OutputLimitExceeded):
        err.write("late")
    out.flush()
    err.flush()
    streams.flush()
    time.sleep(3 * capture.STREAM_TICK)  # the ticker flushes too
    streams.finish()
    streams.finish()
    assert b"".join(d for n, d in sent if n == "stdout") == b"012345"  # streamed: exactly what was kept
    assert not [d for n, d in sent if n == "stderr"]
    assert streams.sinks[0].text() == "0123\n[... output truncated: 2 more bytes not shown ...]\n"


def test_without_a_cap_the_streams_are_buffered_as_before() -> None:
    streams = capture.CellStreams(1000)
    out, _ = streams.streams
    assert streams.cap is None and type(streams.sinks[0]) is capture.CellOutput
    assert all(type(buffer) is io.BufferedWriter for buffer in streams.buffers)
    out.write("x" * 5000)
    streams.finish()
    assert not streams.limited and _totals(streams) == (5000, 0)


def _run_capped(code: str, cap: int, monkeypatch: pytest.MonkeyPatch) -> tuple[dict, dict, capture.CellStreams]:
    streams = capture.CellStreams(1000, cap=cap)
    namespace: dict = {}
    with monkeypatch.context() as patch:
        patch.setattr(sys, "stdout", streams.streams[0])
        patch.setattr(sys, "stderr", streams.streams[1])
        outcome = cells.run_cell(code, namespace, 1)
    streams.finish()
    return outcome, namespace, streams


def test_except_exception_in_the_cell_does_not_catch_it(monkeypatch: pytest.MonkeyPatch) -> None:
    code = "try:\n    print('x' * 100)\nexcept Exception:\n    caught = True\nafter = True\n"
    outcome, namespace, streams = _run_capped(code, 10, monkeypatch)
    error = outcome["error"]
    assert error["ename"] == "OutputLimitExceeded" and error["line"] == 2
    assert error["evalue"] == "the cell's output passed its limit of 10 bytes"
    assert "caught" not in namespace and "after" not in namespace
    assert streams.sinks[0].text() == "x" * 10 and streams.limited


def test_a_cell_that_catches_it_goes_on_but_cannot_print(monkeypatch: pytest.MonkeyPatch) -> None:
    code = (
        "import sys\n"
        "try:\n    print('x' * 100)\nexcept BaseException as exc:\n    first = type(exc).__name__\n"
        "try:\n    print('again', file=sys.stderr)\nexcept BaseException as exc:\n    second = type(exc).__name__\n"
        "first, second\n"
    )
    outcome, _, streams = _run_capped(code, 5, monkeypatch)
    assert outcome == {"return_value": "('OutputLimitExceeded', 'OutputLimitExceeded')", "error": None}
    assert _totals(streams) == (5, 0)


def test_a_stream_the_cell_wraps_does_not_make_the_final_flush_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    code = (
        "import sys\n"
        "class Late:\n"
        "    def __init__(self, inner): self.inner, self.held = inner, []\n"
        "    def write(self, text): self.held.append(text)\n"
        "    def flush(self): self.inner.write(''.join(self.held))\n"
        "sys.stdout = Late(sys.stdout)\n"
        "print('x' * 50)\n"
        "'done'\n"
    )
    outcome, _, streams = _run_capped(code, 10, monkeypatch)
    assert outcome == {"return_value": "'done'", "error": None}
    assert streams.limited and _totals(streams) == (10, 0)


# --- the reply's output_limited, parsed by the controller ---------------------------------------------------

REPLY = exec_reply(duration=0.01, checkpoint_duration=0, checkpoint=EMPTY_DELTA)


def test_output_limited_is_optional_and_must_be_a_bool() -> None:
    assert parse_exec_reply(REPLY)["output_limited"] is False
    assert parse_exec_reply({**REPLY, "output_limited": False})["output_limited"] is False
    parsed = parse_exec_reply({**REPLY, "output_limited": True})
    assert parsed["output_limited"] is True
    assert ExecResult.from_reply(parsed, {}, 0, {}).ok
    for bad in (1, "yes", {}):
        with pytest.raises(ProtocolError):
            parse_exec_reply({**REPLY, "output_limited": bad})


# --- the agent: exec with output_cap, stdin, checkpoint: false ----------------------------------------------


def test_a_plain_exec_reply_has_exactly_the_fields_it_had(agent):
    reply, _ = agent.run("print('hi')")
    assert set(reply) == {
        *("type", "id", "status", "stdout", "stderr", "stdout_bytes", "stderr_bytes", "return_value", "error"),
        *("duration", "checkpoint_duration", "checkpoint"),
    }
    assert parse_exec_reply(reply)["output_limited"] is False


def test_a_capped_cell_stops_at_the_cap_and_says_so(agent):
    pid = agent.value("import os\nos.getpid()")
    reply, _ = agent.run("import sys\nprint('a' * 8)\nprint('b' * 100, file=sys.stderr)\nafter = 1", output_cap=12)
    assert reply["status"] == "error" and reply["output_limited"] is True
    assert reply["error"]["ename"] == "OutputLimitExceeded" and reply["error"]["line"] == 3
    assert reply["stdout"] == "a" * 8 + "\n" and reply["stderr"] == "bbb"
    assert reply["stdout_bytes"] + reply["stderr_bytes"] == 12
    parsed = parse_exec_reply(reply)
    assert parsed["output_limited"] is True and ExecResult.from_reply(parsed, {}, 0, {}).error is not None
    reply, _ = agent.run("print('x' * 100)\n'quiet'", output_cap=1000)
    assert reply["status"] == "ok" and "output_limited" not in reply
    assert agent.value("import os\n(os.getpid(), 'after' in globals())") == repr((int(pid), False))


def test_a_scaffold_hook_that_prints_past_the_cap_does_not_break_the_worker(agent):
    pid = agent.value("import os\nos.getpid()")
    scaffold = "def after_cell(namespace):\n    print('after the cell')\n    return {'seen': True}\n"
    reply, _ = agent.request(request_table.INSTALL, code=scaffold, names=[], timeout=10)
    assert reply["status"] == "ok", reply
    reply, _ = agent.run("try:\n    print('x' * 50)\nexcept BaseException:\n    pass\n'ran'", output_cap=5)
    assert reply["status"] == "ok" and reply["return_value"] == "'ran'" and reply["output_limited"] is True
    assert "scaffold" not in reply and reply["stdout"] == "xxxxx" and reply["stderr"] == ""
    reply, _ = agent.run("import os\nos.getpid()")
    assert reply["return_value"] == pid and reply["scaffold"] == {"seen": True}


def test_stdin_feeds_input_and_sys_stdin(agent):
    code = (
        "name = input('name? ')\n"
        "age = int(input())\n"
        "try:\n    input('more? ')\nexcept EOFError as exc:\n    eof = str(exc)\n"
        "(name, age, eof)\n"
    )
    reply, _ = agent.run(code, stdin="alice\n42\n")
    assert reply["status"] == "ok", reply
    assert reply["return_value"] == repr(("alice", 42, "EOF when reading a line"))
    assert reply["stdout"] == "name? more? "
    reply, _ = agent.run("import sys\nfirst = input()\n(first, sys.stdin.read(), sys.stdin.read())", stdin="a\nb\nc")
    assert reply["return_value"] == repr(("a", "b\nc", ""))
    reply, _ = agent.run("input('prompt> ')", stdin="")
    assert reply["status"] == "error" and reply["error"]["ename"] == "EOFError" and reply["stdout"] == "prompt> "


def test_stdin_is_put_back_after_the_cell(agent):
    before = agent.value("import sys\n(type(sys.stdin).__name__, sys.stdin.fileno())")
    reply, _ = agent.run("import io, sys\nisinstance(sys.stdin, io.StringIO)", stdin="x\n")
    assert reply["return_value"] == "True"
    assert agent.value("import sys\n(type(sys.stdin).__name__, sys.stdin.fileno())") == before
    reply, _ = agent.run("input()")  # the host call again, and no one to answer it
    assert reply["error"]["ename"] == "EOFError" and "no one to answer it" in reply["error"]["evalue"]


def test_stdin_that_is_not_text_is_ignored(agent):
    for value in (5, None, ["line"], {"text": "x"}):
        reply, _ = agent.run("input()", stdin=value)
        assert reply["error"]["ename"] == "EOFError" and "no one to answer it" in reply["error"]["evalue"], value


def test_checkpoint_false_replies_an_empty_delta_and_pickles_nothing(agent):
    started = time.monotonic()
    reply, body = agent.run(SLOW_REDUCE + "slow = Slow()\nx = 1\n'done'", checkpoint=False)
    assert time.monotonic() - started < 5, "the cell's values were pickled"
    assert reply["status"] == "ok" and reply["return_value"] == "'done'"
    assert reply["checkpoint"] == EMPTY_DELTA and reply["checkpoint_duration"] == 0 and bytes(body) == b""
    assert agent.cell_done == []  # no checkpoint, so no cell_done
    parsed = parse_exec_reply(reply)
    assert parsed["checkpoint"] == EMPTY_DELTA and parsed["checkpoint_duration"] == 0.0
    assert ExecResult.from_reply(parsed, {}, 0, {}).return_value == "'done'"
    # The worker is in step: the next requests get their own replies, and the namespace kept the cell's work.
    reply, _ = agent.run("del slow\nx + 1", checkpoint=False)
    assert reply["return_value"] == "2" and reply["checkpoint"] == EMPTY_DELTA


def test_a_later_checkpoint_saves_what_an_unsaved_cell_changed(agent):
    reply, _ = agent.run("a = 1")
    assert reply["checkpoint"]["generation"] == 1
    reply, _ = agent.run("b = 2\ndel a", checkpoint=False)
    assert reply["checkpoint"] == {**EMPTY_DELTA, "generation": 1}
    reply, _ = agent.run("c = 3", checkpoint=True)
    delta = reply["checkpoint"]
    assert delta["generation"] == 2 and set(delta["vars"]) == {"b", "c"} and delta["deleted"] == ["a"]


def test_the_options_together(agent):
    code = "import sys\nfor line in sys.stdin:\n    print(line.strip().upper())\n"
    reply, body = agent.run(code, stdin="ab\ncd\nef\n", output_cap=6, checkpoint=False)
    assert reply["status"] == "error" and reply["error"]["ename"] == "OutputLimitExceeded"
    assert reply["stdout"] == "AB\nCD\n" and reply["output_limited"] is True
    assert reply["checkpoint"] == EMPTY_DELTA and bytes(body) == b""


@pytest.mark.parametrize(
    "result",
    ["{'x': float('nan')}", "{'x': float('inf')}", "{'x': eval('[' * 40 + ']' * 40)}"],
    ids=["nan", "infinity", "deep"],
)
def test_a_scaffold_result_strict_json_cannot_carry_is_reported_not_sent(agent, result):
    """The reply's header must be strict JSON: such a result goes to stderr, and the reply is valid."""
    scaffold = f"def after_cell(namespace):\n    return {result}\n"
    reply, _ = agent.request(request_table.INSTALL, code=scaffold, names=[], timeout=10)
    assert reply["status"] == "ok", reply
    reply, _ = agent.run("1 + 1")
    assert reply["status"] == "ok" and reply["return_value"] == "2" and "scaffold" not in reply
    assert "after_cell failed" in reply["stderr"]
    parse_exec_reply(reply)
