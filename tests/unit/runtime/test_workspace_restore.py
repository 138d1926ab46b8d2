"""runtime/workspace_restore.py: the stored workspace sent as files_put batches, in path order, within bounds."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import pytest

from orchestrator.agent import blob_format
from orchestrator.errors import CheckpointError
from orchestrator.runtime import workspace_restore
from orchestrator.state.files import Entry

BLOBS = {blob_format.blob_digest(data): data for data in (b"", b"abc", b"x" * 10)}
DIGEST = {data: digest for digest, data in BLOBS.items()}
SIZES = {digest: len(data) for digest, data in BLOBS.items()}


@contextlib.contextmanager
def _open(digest: str) -> Iterator[memoryview]:
    if digest not in BLOBS:
        raise CheckpointError("gone")
    yield memoryview(BLOBS[digest])


def _put_all(files: dict[str, Entry], sizes: dict[str, int] = SIZES) -> tuple[list[tuple[list[str], bytes]], dict]:
    sent: list[tuple[list[str], bytes]] = []

    def put(entries: list[list[object]], body: Sequence[memoryview]) -> None:
        sent.append(([str(entry[0]) for entry in entries], b"".join(bytes(part) for part in body)))

    return sent, workspace_restore.put_workspace(files, sizes, _open, put)


def test_entries_go_parents_first_with_their_bytes() -> None:
    files: dict[str, Entry] = {
        "d/x": ("f", 0o600, 5, DIGEST[b"abc"]),
        "d": ("d", 0o755, 1, ""),
        "d-e": ("f", 0o644, 2, DIGEST[b""]),
        "d/link": ("l", 0o777, 3, "x"),
    }
    sent, failed = _put_all(files)
    assert sent == [(["d", "d-e", "d/link", "d/x"], b"abc")] and failed == {}
    batch = next(workspace_restore.batches(files, SIZES))
    assert batch[3] == ["d/x", "f", 0o600, 5, DIGEST[b"abc"], 3]


def test_batches_keep_the_bounds_and_a_big_file_goes_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workspace_restore, "MAX_FILES_PUT_ENTRIES", 2)
    monkeypatch.setattr(workspace_restore, "MAX_FILES_PUT_BYTES", 6)
    files: dict[str, Entry] = {
        "a": ("f", 0o644, 0, DIGEST[b"abc"]),
        "b": ("f", 0o644, 0, DIGEST[b"abc"]),
        "c": ("f", 0o644, 0, DIGEST[b"abc"]),
        "d": ("f", 0o644, 0, DIGEST[b"x" * 10]),
        "e": ("d", 0o755, 0, ""),
        "f": ("d", 0o755, 0, ""),
        "g": ("d", 0o755, 0, ""),
    }
    sent, _ = _put_all(files)
    assert [names for names, _ in sent] == [["a", "b"], ["c"], ["d"], ["e", "f"], ["g"]]
    assert sent[2][1] == b"x" * 10


def test_a_damaged_or_missing_blob_is_left_out_and_named() -> None:
    lost = "0" * 32
    files: dict[str, Entry] = {
        "bad": ("f", 0o644, 0, DIGEST[b"abc"]),
        "gone": ("f", 0o644, 0, lost),
        "ok": ("f", 0o644, 0, DIGEST[b"x" * 10]),
    }
    sent, failed = _put_all(files, {**SIZES, DIGEST[b"abc"]: 4, lost: 1})
    assert sent == [(["ok"], b"x" * 10)]
    assert failed["/workspace/bad"] == workspace_restore.DAMAGED
    assert failed["/workspace/gone"].startswith("its stored blob is missing")


def test_an_empty_workspace_sends_nothing() -> None:
    assert _put_all({}) == ([], {})
