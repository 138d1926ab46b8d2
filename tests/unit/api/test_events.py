"""A live call's events on the host: output decoded as it arrives, input requests answered, waited on and bounded."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from orchestrator.agent import protocol
from orchestrator.api.events import InputRequest, LiveCall, OutputEvent
from orchestrator.errors import ConfigError, InputRequestNotFound
from orchestrator.runtime.output import StreamRecorder
from orchestrator.wire.wakeup import Wakeup


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
    assert events == [
        OutputEvent("stdout", "", b"\xc3"),
        OutputEvent("stdout", "é", b"\xa9\xe2"),
        OutputEvent("stdout", "€", b"\x82\xac"),
        OutputEvent("stderr", "\ufffd", b"\xff"),
    ]
    live.close()


def test_the_bytes_of_each_piece_are_the_cells_and_a_cut_character_ends_as_text_only(tmp_path: Path) -> None:
    events: list[OutputEvent] = []
    live = _live(tmp_path, events.append)
    written = bytes(range(256)) + "€".encode()[:2]
    for start in range(0, len(written), 7):
        live.output("stdout", bytearray(written[start : start + 7]))
    live.finish_output()
    assert b"".join(e.data for e in events) == written
    assert "".join(e.text for e in events) == written.decode("utf-8", "replace")
    assert events[-1] == OutputEvent("stdout", "\ufffd")
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
