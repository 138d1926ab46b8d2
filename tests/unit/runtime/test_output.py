"""The host's recorder of a cell's output: small output in memory, the rest in a bounded private file."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.runtime.output import StreamRecorder, keep_newest


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


def test_the_recorder_keeps_no_more_than_its_file_limit_whatever_the_sandbox_sends(tmp_path: Path) -> None:
    """The agent is asked to send at most the file limit; a sandbox that sends more fills no more of the disk."""
    recorder = StreamRecorder(tmp_path, "stdout", 10, file_limit=25)
    for _ in range(10):
        recorder.write(bytearray(b"0123456789"))
    recorder.close()
    assert recorder.path is not None and recorder.path.read_bytes() == (b"0123456789" * 3)[:25]
    assert (recorder.received, recorder.dropped) == (25, 75)
    assert "the first 25 B of 100 B" in recorder.preview(3)  # a claim below what came counts for nothing
