"""A call's output on the host: whole in a file once it passes the output limit, a preview for the reply.

The worker keeps the first ``max_output_bytes`` of each stream for its reply. Past that, it
sends the whole stream as ``output`` frames (docs/protocol.md, "Output"), at most
``max_output_file_bytes``; a ``StreamRecorder`` writes them to
``<state_dir>/sessions/<id>/outputs/<call>.<stream>``, and the call's result holds a
head-and-tail preview with a marker naming the file. Streamed calls send every byte as it
comes; the recorder holds up to the limit in memory and opens the file only when it passes it.
Files go with the session; past ``max_output_files`` per session the oldest are removed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from pathlib import Path

from ..units import describe_bytes

_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class StreamRecorder:
    """One stream of one call: the bytes that came, in memory up to ``limit``, then in a file of ``directory``."""

    def __init__(self, directory: Path, stream: str, limit: int, file_limit: int | None = None) -> None:
        """``file_limit``: bytes kept in all (the file's cap, ``max_output_file_bytes``), measured here: the agent is
        asked to send no more, but a sandbox's word bounds nothing on the host's disk (docs/trust.md)."""
        self.directory = directory
        self.stream = stream
        self.path: Path | None = None  # named when the stream passes the limit (a quiet call costs nothing)
        self.limit = limit
        self.file_limit = file_limit
        self.received = 0  # bytes kept (in memory, then in the file)
        self.dropped = 0  # bytes that came past ``file_limit``
        self._head = bytearray()
        self._tail = bytearray()
        self._fd: int | None = None

    def write(self, data: bytes | bytearray) -> None:
        if self.file_limit is not None and self.received + len(data) > self.file_limit:
            room = max(0, self.file_limit - self.received)
            self.dropped += len(data) - room
            data = data[:room]
            if not data:
                return
        self.received += len(data)
        if self.path is None:
            self._head += data
            if len(self._head) <= self.limit:
                return
            self.path, self._fd = _new_file(self.directory, self.stream)
            _write_all(self._fd, self._head)
            self._tail = self._head[-(self.limit // 2) :]
            del self._head[self.limit // 2 :]
            return
        assert self._fd is not None, "written after close"
        _write_all(self._fd, data)
        self._tail += data
        if len(self._tail) > self.limit:
            del self._tail[: len(self._tail) - self.limit // 2]

    @property
    def spilled(self) -> bool:
        """The stream passed the limit: it is in ``path`` (and the result holds a preview)."""
        return self.path is not None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def text(self) -> str:
        """What came so far: all of it within the limit, else the preview."""
        return self.preview(self.received) if self.spilled else self._head.decode("utf-8", "replace")

    def data(self, produced: int) -> bytes:
        """What came, byte for byte: all of it within the limit, else the preview's bytes (``preview_bytes``)."""
        return self.preview_bytes(produced) if self.spilled else bytes(self._head)

    def preview(self, produced: int) -> str:
        """``preview_bytes`` as text (UTF-8; a byte that is not, or a character cut at the head's or the tail's
        edge, is U+FFFD)."""
        return self.preview_bytes(produced).decode("utf-8", "replace")

    def preview_bytes(self, produced: int) -> bytes:
        """The head and the tail of a stream kept in the file, as they came, with a marker between that names the
        file: at most ``limit`` bytes in all, as a result that did not pass the limit.

        ``produced``: how many bytes the cell wrote, as the agent counts them (more than were received when the
        file's cap was hit); never less than what came here.
        """
        produced = max(produced, self.received + self.dropped)
        where = f"the whole output ({describe_bytes(self.received)}) is in {self.path}"
        if produced > self.received:
            where = (
                f"the first {describe_bytes(self.received)} of {describe_bytes(produced)} are in {self.path} "
                "(the rest passed the per-call file limit and was dropped)"
            )
        marker = "\n[... output truncated: {hidden} bytes not shown; " + where + " ...]\n"
        half = max(0, (self.limit - len(marker.encode()) - 20) // 2)
        head, tail = bytes(self._head[:half]), bytes(self._tail[len(self._tail) - half :])
        hidden = self.received - len(head) - len(tail)
        return head + marker.format(hidden=hidden).encode() + tail


def save_output(directory: Path, kind: str, data: bytes) -> Path:
    """A new private file of ``directory`` (``<time>-<n>.<kind>``) holding ``data``: text kept whole for whoever reads
    a shortened view of it (``PythonTool``'s answers)."""
    path, fd = _new_file(directory, kind)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)
    return path


def _new_file(directory: Path, kind: str) -> tuple[Path, int]:
    """A new file of ``directory`` (made 0700 if missing), open to write: 0600, never through a link or over a file."""
    directory.mkdir(mode=0o700, exist_ok=True)
    path = directory / f"{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}.{kind}"
    return path, os.open(path, _FILE_FLAGS, 0o600)


def _write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def keep_newest(directory: Path, count: int) -> None:
    """Remove all but the ``count`` newest files of ``directory`` (output files of earlier calls)."""
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.stat(follow_symlinks=False).st_mtime_ns)
    except FileNotFoundError:
        return
    for entry in entries[: max(0, len(entries) - count)]:
        with contextlib.suppress(OSError):
            os.unlink(entry.path)
