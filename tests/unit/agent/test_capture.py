"""The worker's output sinks for a live call: what is sent while a cell runs, and what is kept."""

from __future__ import annotations

import threading
import time

from orchestrator.agent import capture


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


def test_only_a_streamed_cell_runs_a_ticker_and_finish_stops_it() -> None:
    before = threading.active_count()
    quiet = capture.CellStreams(100, lambda name, data: None, False, 1000)
    assert threading.active_count() == before
    quiet.finish()
    streamed = capture.CellStreams(100, lambda name, data: None, True, 1000)
    assert threading.active_count() == before + 1
    streamed.finish()
    assert threading.active_count() == before


def test_at_the_end_kept_bytes_that_are_not_utf8_go_out_as_they_are_and_text_sends_nothing() -> None:
    sent: list[tuple[str, bytes]] = []
    streams = capture.CellStreams(1000, lambda name, data: sent.append((name, data)), False, 1000)
    out, err = streams.streams
    out.write("héllo\n")
    err.flush()
    err.buffer.write(b"\xff\x00raw")
    streams.finish()
    assert sent == [("stderr", b"\xff\x00raw")]
    assert streams.sinks[1].text() == "\ufffd\x00raw"


def test_a_stream_that_was_sent_already_is_not_sent_again_at_the_end() -> None:
    sink, sent = _sink(4, stream=False, send_limit=100)
    sink.write(b"\xffabcdef")
    sink.send_pending()
    sink.send_if_not_text()
    assert b"".join(sent) == b"\xffabcdef"
