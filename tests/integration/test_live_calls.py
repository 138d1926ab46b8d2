"""Calls as they happen, against a real engine: streamed output, input(), interrupts, output kept whole, asyncio."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from orchestrator import ConfigError, ExecResult, ExecutionTimeout, InputRequestNotFound, Session
from orchestrator.api.aio import AsyncOrchestrator
from orchestrator.api.events import InputRequest, OutputEvent

pytestmark = pytest.mark.docker

PRINT_SLEEP_PRINT = """
import sys, time
print("first")
print("err-1", file=sys.stderr)
time.sleep(1.5)
for i in range(200):
    print(i)
    print("e%d" % i, file=sys.stderr)
"done"
"""


@pytest.fixture
def session(orch, new_session) -> Session:
    return new_session(orch)


def _timed_events(session: Session, code: str, **kwargs: Any) -> tuple[float, list[tuple[float, Any]], ExecResult]:
    events: list[tuple[float, Any]] = []
    started = time.monotonic()
    result = session.execute(code, on_output=lambda e: events.append((time.monotonic(), e)), **kwargs)
    return started, events, result


def _text(events: list[tuple[float, Any]], stream: str) -> str:
    return "".join(e.text for _, e in events if isinstance(e, OutputEvent) and e.stream == stream)


def test_output_is_streamed_while_the_cell_runs_in_order_per_stream(session: Session) -> None:
    started, events, result = _timed_events(session, PRINT_SLEEP_PRINT)
    ended = time.monotonic()
    first = next(t for t, e in events if isinstance(e, OutputEvent) and "first" in e.text)
    assert first - started < 1.0, "the first print reached the caller only after the sleep"
    assert ended - first > 1.0, "the first chunk did not arrive before the cell ended"
    assert _text(events, "stdout") == "first\n" + "".join(f"{i}\n" for i in range(200))
    assert _text(events, "stderr") == "err-1\n" + "".join(f"e{i}\n" for i in range(200))
    assert result.stdout == _text(events, "stdout") and result.return_value == "'done'"
    assert result.callback_errors == ()


def test_stream_iterator_yields_events_then_the_result(session: Session) -> None:
    items = list(session.stream("print('a')\nimport sys\nprint('b', file=sys.stderr)\n7"))
    assert isinstance(items[-1], ExecResult) and items[-1].return_value == "7"
    assert [(e.stream, e.text) for e in items[:-1]] == [("stdout", "a\n"), ("stderr", "b\n")] or sorted(
        (e.stream, e.text) for e in items[:-1]
    ) == [("stderr", "b\n"), ("stdout", "a\n")]


def test_leaving_a_stream_early_interrupts_the_cell(session: Session) -> None:
    started = time.monotonic()
    for event in session.stream("import time\nprint('go', flush=True)\nn = 1\ntime.sleep(60)\nn = 2"):
        assert isinstance(event, OutputEvent)
        break
    assert time.monotonic() - started < 30
    assert session.execute("n").return_value == "1", "the interrupted cell ran on, or the session was lost"


def test_input_answered_by_the_callback_and_by_submit_input(session: Session) -> None:
    def answer(event: Any) -> str | None:
        return "ada" if isinstance(event, InputRequest) else None

    result = session.execute("name = input('who? ')\nname.upper()", on_output=answer)
    assert result.return_value == "'ADA'" and result.stdout == "who? "

    seen: list[Any] = []
    for event in session.stream("a = input('one')\nb = input('two')\na + b"):
        seen.append(event)
        if isinstance(event, InputRequest):
            session.submit_input(event.request_id, event.prompt * 2)
    requests = [e for e in seen if isinstance(e, InputRequest)]
    assert [r.prompt for r in requests] == ["one", "two"]
    assert requests[0].idle_timeout == session._settings.timeouts.input
    assert seen[-1].return_value == "'oneonetwotwo'"
    with pytest.raises(InputRequestNotFound):
        session.submit_input(requests[0].request_id, "again")  # answered, and its cell is over


def test_input_without_a_handler_raises_eof_at_once(session: Session) -> None:
    started = time.monotonic()
    result = session.execute("input('name: ')")
    assert time.monotonic() - started < 5
    assert result.error is not None and result.error.type == "EOFError"
    assert "without an input handler" in result.error.message and "on_output" in result.error.message
    assert session.execute("1 + 1").return_value == "2"


def test_unanswered_input_ends_with_eof_after_the_idle_timeout(
    orch, settings, settings_for, make_orch, new_session
) -> None:
    session = new_session(make_orch(settings_for(timeouts=settings.timeouts.replace(input=1.0))))
    requests: list[InputRequest] = []
    started = time.monotonic()
    result = session.execute(
        "try:\n    input('?')\nexcept EOFError as e:\n    caught = str(e)\ncaught",
        on_output=lambda e: requests.append(e) if isinstance(e, InputRequest) else None,
    )
    assert 1.0 <= time.monotonic() - started < 10
    assert "no answer within the input idle timeout of 1 s" in (result.return_value or "")
    assert len(requests) == 1
    with pytest.raises(InputRequestNotFound):
        session.submit_input(requests[0].request_id, "too late")
    assert session.execute("caught").return_value == result.return_value


def test_an_input_wait_longer_than_the_timeout_does_not_time_the_cell_out(session: Session) -> None:
    def answer_later(event: Any) -> None:
        if isinstance(event, InputRequest):
            threading.Timer(2.5, session.submit_input, (event.request_id, "late")).start()

    result = session.execute("import time\ntime.sleep(0.5)\nv = input()\nv", timeout=1.5, on_output=answer_later)
    assert result.return_value == "'late'"
    with pytest.raises(ExecutionTimeout):  # the clock still runs while the cell itself runs
        session.execute("import time\ntime.sleep(5)", timeout=1.0, on_output=answer_later)


def test_bad_input_answers_are_refused_with_typed_errors(session: Session) -> None:
    with pytest.raises(InputRequestNotFound, match="no cell"):
        session.submit_input("in-000000000000", "x")
    problems: list[BaseException] = []

    def answer(event: Any) -> None:
        if not isinstance(event, InputRequest):
            return
        for bad in (("in-unknown", "x"), (event.request_id, 42)):
            try:
                session.submit_input(*bad)
            except (InputRequestNotFound, ConfigError) as exc:
                problems.append(exc)
        session.submit_input(event.request_id, "ok")

    assert session.execute("input()", on_output=answer).return_value == "'ok'"
    assert [type(p) for p in problems] == [InputRequestNotFound, ConfigError]


def test_a_raising_callback_loses_nothing_and_is_reported(session: Session) -> None:
    def broken(event: Any) -> None:
        raise RuntimeError("callback bug")

    result = session.execute("for i in range(3):\n    print(i)\nx = 5\nx", on_output=broken)
    assert result.ok and result.return_value == "5" and result.stdout == "0\n1\n2\n"
    assert result.callback_errors and "RuntimeError: callback bug" in result.callback_errors[0]

    def reenter(event: Any) -> None:
        session.execute("1")

    result = session.execute("print('hi')", on_output=reenter)
    assert result.ok and "called back into that session" in result.callback_errors[0]
    assert session.execute("x").return_value == "5"


def test_interrupt_from_another_thread_stops_only_the_cell(session: Session) -> None:
    session.execute("n = 0")
    threading.Timer(0.5, session.interrupt).start()
    with pytest.raises(ExecutionTimeout) as caught:
        session.execute("import time\nn = 1\ntime.sleep(60)\nn = 2", timeout=120)
    assert caught.value.restored is False
    assert session.execute("n").return_value == "1"
    assert session.interrupt() is False  # no cell runs


def test_output_past_the_limit_is_kept_whole_in_a_file(orch, session: Session) -> None:
    size = 50 * 1000 * 1000
    result = session.execute(
        f"import sys\nline = 'y' * 999 + '\\n'\nfor _ in range({size // 1000}):\n    sys.stdout.write(line)"
    )
    limit = orch.settings.limits.max_output_bytes
    assert result.stdout_path is not None and result.stderr_path is None
    assert result.stdout_path.stat().st_size == size
    with open(result.stdout_path, "rb") as fh:
        assert fh.read(1000) == b"y" * 999 + b"\n"
    assert len(result.stdout) < limit + 1000
    assert str(result.stdout_path) in result.stdout and result.stdout.startswith("y" * 999)
    assert result.stdout.endswith("y" * 999 + "\n")
    assert oct(result.stdout_path.stat().st_mode & 0o777) == "0o600"
    session.close()
    assert not result.stdout_path.exists(), "the output file outlived its session"


def test_the_file_cap_bounds_what_travels_and_says_so(settings, settings_for, make_orch, new_session) -> None:
    limits = settings.limits.replace(max_output_bytes=1000, max_output_file_bytes=100_000)
    session = new_session(make_orch(settings_for(limits=limits)))
    streamed: list[str] = []
    result = session.execute(
        "import sys\nsys.stderr.write('z' * 300_000)",
        on_output=lambda e: streamed.append(e.text) if isinstance(e, OutputEvent) else None,
    )
    assert result.stderr_path is not None and result.stderr_path.stat().st_size == 100_000
    assert "the first 97.7 KiB of 293.0 KiB are in" in result.stderr
    assert "per-call file limit" in result.stderr
    assert len("".join(streamed)) == 100_000


def test_async_sessions_run_concurrently_and_cancel_interrupts_only_that_cell(settings_for, image) -> None:
    async def scenario() -> None:
        async with AsyncOrchestrator(settings_for()) as orch:
            sessions = await asyncio.gather(*[orch.create_session() for _ in range(20)])
            try:

                async def count(s: Any, n: int) -> str | None:
                    for i in range(n):
                        await s.execute(f"k = {i}")
                    return (await s.execute("k")).return_value

                assert await asyncio.gather(*[count(s, 10) for s in sessions]) == ["9"] * 20
                victim, bystander = sessions[0], sessions[1]
                doomed = asyncio.ensure_future(victim.execute("import time\nk = -1\ntime.sleep(60)\nk = -2"))
                other = asyncio.ensure_future(bystander.execute("import time\ntime.sleep(2)\n'kept'"))
                await asyncio.sleep(0.7)
                doomed.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await doomed
                assert (await other).return_value == "'kept'"
                assert (await victim.execute("k")).return_value == "-1"
                chunks = [e async for e in bystander.stream("print('x')\n1")]
                assert isinstance(chunks[0], OutputEvent) and chunks[-1].return_value == "1"
            finally:
                await asyncio.gather(*[s.close() for s in sessions])

    asyncio.run(scenario())


def test_a_context_streams_and_takes_input_like_the_session(session: Session) -> None:
    ctx = session.create_context(env={"WHO": "ctx"})
    items = list(ctx.stream("import os\nprint(os.environ['WHO'])\n9"))
    assert [(e.stream, e.text) for e in items[:-1]] == [("stdout", "ctx\n")] and items[-1].return_value == "9"
    answer = ctx.execute("v = input()\nv", on_output=lambda e: "x" if isinstance(e, InputRequest) else None)
    assert answer.return_value == "'x'"
    assert session.execute("'v' in globals()").return_value == "False"


# Frames written on the worker's host-call link of the moment: its data channel's own link (K,
# docs/design/one-hop.md).
FORGE_ON_CALL_LINK = """
import gc, json, os, struct, sys, time
fd = next(o for o in gc.get_objects() if type(o).__name__ == 'Worker').calls._sock.fileno()
def frame(header, body=b""):
    head = json.dumps(header).encode()
    os.write(fd, struct.pack('!4sII', b'ORC1', len(head), len(body)) + head + body)
"""


def test_a_cell_forging_input_requests_cannot_stop_its_clock(session: Session) -> None:
    """Without on_output the exec allows no input: forged __input__ calls are refused and the timeout holds."""
    started = time.monotonic()
    with pytest.raises(ExecutionTimeout):
        session.execute(
            FORGE_ON_CALL_LINK
            + "for i in range(20):\n    frame({'type': 'host_call', 'call': 9000 + i, 'name': '__input__'}, b'{}')\n"
            + "time.sleep(60)",
            timeout=1.5,
        )
    assert time.monotonic() - started < 20
    assert session.execute("2 + 2").return_value == "4"


def test_forged_output_frames_are_only_output(session: Session) -> None:
    """Output frames a cell writes itself are relayed as its output; a bad one closes the call link, nothing else."""
    events: list[Any] = []
    result = session.execute(
        FORGE_ON_CALL_LINK
        + "frame({'type': 'output', 'stream': 'stdout', 'id': 'not-the-exec'}, b'forged\\n')\n"
        + "frame({'type': 'output', 'stream': 'nowhere'}, b'x')\n"
        + "time.sleep(0.2)\n'done'",
        on_output=events.append,
    )
    assert result.return_value == "'done'"
    assert "forged\n" in _text([(0.0, e) for e in events], "stdout")
    assert session.execute("print('after')", on_output=events.append).stdout == "after\n"
