"""Pure logic of live calls: the worker's output sinks, the host's recorders, and the per-call event desk."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from orchestrator.agent import capture, protocol
from orchestrator.api.events import InputRequest, LiveCall, OutputEvent
from orchestrator.errors import ConfigError, InputRequestNotFound
from orchestrator.runtime.output import StreamRecorder, keep_newest
from orchestrator.wire.wakeup import Wakeup


def _sink(limit: int, stream: bool, send_limit: int) -> tuple[capture.CellOutput, list[bytes]]:
    sent: list[bytes] = []
    return capture.CellOutput("stdout", limit, lambda name, data: sent.append(data), stream, send_limit), sent


def test_a_quiet_unstreamed_cell_sends_nothing() -> None:
    sink, sent = _sink(10, stream=False, send_limit=100)
    sink.write(b"0123456789")
    sink.send_pending()
    assert sent == [] and sink.text() == "0123456789"


def test_past_the_limit_the_whole_stream_goes_out_from_its_first_byte() -> None:
    sink, sent = _sink(4, stream=False, send_limit=100)
    sink.write(b"abc")
    sink.write(b"defg")
    sink.write(b"h")
    sink.send_pending()
    assert b"".join(sent) == b"abcdefgh"
    assert sink.total == 8 and bytes(sink.kept) == b"abcd"
    assert "4 more bytes not shown" in sink.text()


def test_the_send_limit_bounds_what_travels_but_not_the_count() -> None:
    sink, sent = _sink(2, stream=True, send_limit=5)
    for _ in range(4):
        sink.write(b"xyz")
    sink.send_pending()
    assert b"".join(sent) == b"xyzxy" and sink.total == 12


def test_a_broken_link_stops_sending_and_keeps_the_head() -> None:
    def broken(name: str, data: bytes) -> None:
        raise OSError("gone")

    sink = capture.CellOutput("stderr", 3, broken, True, 100)
    sink.write(b"abcdef")
    sink.send_pending()
    sink.write(b"more")
    sink.send_pending()
    assert bytes(sink.kept) == b"abc" and sink.total == 10


def test_cell_streams_send_text_before_finish_returns() -> None:
    sent: list[tuple[str, bytes]] = []
    streams = capture.CellStreams(100, lambda name, data: sent.append((name, data)), True, 1000)
    out, err = streams.streams
    out.write("héllo\n")
    err.write("oops")
    time.sleep(3 * capture.STREAM_TICK)
    assert ("stdout", "héllo\n".encode()) in sent, "the ticker did not send within a few ticks"
    streams.finish()
    assert b"".join(d for n, d in sent if n == "stderr") == b"oops"


def test_the_recorder_keeps_small_output_in_memory(tmp_path: Path) -> None:
    recorder = StreamRecorder(tmp_path / "outputs", "stdout", 10)
    recorder.write(b"short")
    assert not recorder.spilled and recorder.path is None and not (tmp_path / "outputs").exists()


def test_the_recorder_spills_to_a_private_file_with_a_head_and_tail_preview(tmp_path: Path) -> None:
    limit = 400
    recorder = StreamRecorder(tmp_path / "outputs", "stdout", limit)
    data = bytes(range(65, 91)) * 100  # 2,600 bytes of A-Z
    for start in range(0, len(data), 300):
        recorder.write(data[start : start + 300])
    recorder.close()
    path = recorder.path
    assert path is not None and path.parent == tmp_path / "outputs" and path.name.endswith(".stdout")
    assert path.read_bytes() == data
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    preview = recorder.preview(len(data))
    head, _, rest = preview.partition("\n[... output truncated: ")
    marker, _, tail = rest.partition(" ...]\n")
    assert data.decode().startswith(head) and data.decode().endswith(tail) and head and tail
    assert marker.startswith(f"{len(data) - len(head) - len(tail)} bytes not shown; the whole output (2.5 KiB) is in ")
    assert len(preview.encode()) <= limit
    assert "per-call file limit" in recorder.preview(10_000)


def test_keep_newest_removes_the_oldest_files(tmp_path: Path) -> None:
    for index in range(5):
        (tmp_path / f"f{index}").write_text("x")
        os.utime(tmp_path / f"f{index}", ns=(index * 10**9, index * 10**9))
    keep_newest(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f3", "f4"]
    keep_newest(tmp_path / "missing", 2)


def _live(tmp_path: Path, on_output: object = None, timeout: float = 300.0) -> LiveCall:
    return LiveCall(
        lambda stream: StreamRecorder(tmp_path, stream, 100),
        on_output,  # type: ignore[arg-type]
        timeout,
        owner=object(),
        wakeup=Wakeup(),
    )


def test_output_is_decoded_across_chunk_boundaries(tmp_path: Path) -> None:
    events: list[object] = []
    live = _live(tmp_path, events.append)
    data = "é€".encode()
    live.output("stdout", bytearray(data[:1]))
    live.output("stdout", bytearray(data[1:3]))
    live.output("stdout", bytearray(data[3:]))
    live.output("stderr", bytearray(b"\xff"))
    live.finish_output()
    assert events == [OutputEvent("stdout", "é"), OutputEvent("stdout", "€"), OutputEvent("stderr", "\ufffd")]
    live.close()


def test_an_input_request_answered_by_the_callback(tmp_path: Path) -> None:
    live = _live(tmp_path, lambda e: "yes" if isinstance(e, InputRequest) else None)
    live.input_request(7, bytearray(json.dumps({"prompt": "ok?"}).encode()))
    [(header, body)] = live.answers()
    assert header == {"type": protocol.HOST_REPLY, "call": 7, "status": "ok"} and json.loads(body) == "yes"
    assert not live.waiting_for_input
    live.close()


def test_input_requests_wait_then_end_with_eof_and_bad_answers_are_refused(tmp_path: Path) -> None:
    requests: list[InputRequest] = []
    live = _live(tmp_path, lambda e: requests.append(e) if isinstance(e, InputRequest) else None, timeout=0.05)
    live.input_request(1, bytearray(b'{"prompt": "a"}'))
    live.input_request(2, bytearray(b"not json"))
    assert [r.prompt for r in requests] == ["a", ""] and live.waiting_for_input
    with pytest.raises(ConfigError):
        live.submit(requests[0].request_id, 5)  # type: ignore[arg-type]
    with pytest.raises(InputRequestNotFound):
        live.submit("in-nope", "x")
    live.submit(requests[0].request_id, "A")
    with pytest.raises(InputRequestNotFound):
        live.submit(requests[0].request_id, "again")
    time.sleep(0.06)
    answers = live.answers()
    assert [(h["call"], h["status"]) for h, _ in answers] == [(1, "ok"), (2, "error")]
    assert "input idle timeout of 0.05 s" in answers[1][0]["error"]
    live.close()
    assert live.interrupt() is False


def test_a_raising_callback_is_noted_not_raised(tmp_path: Path) -> None:
    def broken(event: object) -> None:
        raise ValueError("bad")

    live = _live(tmp_path, broken)
    live.output("stdout", bytearray(b"x"))
    assert live.callback_errors == ["ValueError: bad"]
    assert live.interrupt() and live.take_interrupt() and not live.take_interrupt()
    live.close()


def test_the_recorder_keeps_no_more_than_its_file_limit_whatever_the_sandbox_sends(tmp_path: Path) -> None:
    """The agent is asked to send at most the file limit; a sandbox that sends more fills no more of the disk."""
    recorder = StreamRecorder(tmp_path, "stdout", 10, file_limit=25)
    for _ in range(10):
        recorder.write(bytearray(b"0123456789"))
    recorder.close()
    assert recorder.path is not None and recorder.path.read_bytes() == (b"0123456789" * 3)[:25]
    assert (recorder.received, recorder.dropped) == (25, 75)
    assert "the first 25 B of 100 B" in recorder.preview(3)  # a claim below what came counts for nothing


@pytest.mark.parametrize(
    "body",
    [b"[" * 100_000 + b"]" * 100_000, b'{"prompt": NaN}', b'{"prompt": ["x"]}', b'{"prompt": "a", "prompt": "b"}'],
    ids=["deep", "nan", "not-a-str", "twice"],
)
def test_a_hostile_input_prompt_is_an_empty_prompt(tmp_path: Path, body: bytes) -> None:
    requests: list[InputRequest] = []
    live = _live(tmp_path, lambda e: requests.append(e) if isinstance(e, InputRequest) else None)
    live.input_request(1, bytearray(body))
    assert [r.prompt for r in requests] == [""]
    live.close()


def test_input_requests_waiting_at_once_are_bounded(tmp_path: Path) -> None:
    requests: list[InputRequest] = []
    live = _live(tmp_path, lambda e: requests.append(e) if isinstance(e, InputRequest) else None)
    for call in range(1000):
        live.input_request(call, bytearray(b'{"prompt": "?"}'))
    assert len(requests) == 16
    refused = live.answers()
    assert len(refused) == 1000 - 16 and all(h["status"] == "error" for h, _ in refused)
    assert "wait for answers already" in refused[0][0]["error"]
    live.close()
