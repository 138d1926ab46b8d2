"""Bounded capture of what a cell prints, so megabytes of output cannot exhaust memory.

Standard library only (runs in the sandbox). Text and ``sys.stdout.buffer`` writes land in
one byte buffer that keeps the first ``limit`` bytes and counts the rest; the controller
receives the kept bytes decoded with replacement characters plus a truncation marker.
"""

from __future__ import annotations

import io


class BoundedSink(io.RawIOBase):
    """A write-only raw stream that keeps at most ``limit`` bytes and counts the overflow."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.kept = bytearray()
        self.dropped = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # type: ignore[override]
        size = len(data)
        room = self.limit - len(self.kept)
        if room > 0:
            self.kept += bytes(data[:room])
        self.dropped += max(0, size - max(room, 0))
        return size

    def text(self) -> str:
        out = self.kept.decode("utf-8", errors="replace")
        if self.dropped:
            out += "\n[... output truncated: %d more bytes not shown ...]\n" % self.dropped
        return out


def open_capture(limit: int) -> tuple:
    """Return (text stream to install as sys.stdout/stderr, the sink that holds its bytes)."""
    sink = BoundedSink(limit)
    stream = io.TextIOWrapper(
        io.BufferedWriter(sink), encoding="utf-8", errors="backslashreplace", line_buffering=False, write_through=True
    )
    return stream, sink
