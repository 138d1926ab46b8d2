"""What a cell prints: kept bounded in memory, and sent to the controller as it comes when asked.

Standard library only (runs in the sandbox). Text and ``sys.stdout.buffer`` writes land in one
``CellOutput`` per stream. It keeps the first ``limit`` bytes for the reply and counts the rest.
Bytes also go to the controller as ``output`` frames (docs/protocol.md, "Output") in two cases:
the caller streams the cell (everything, as it comes), or the stream went past ``limit`` (then
everything from its first byte, so the controller keeps the whole stream in a file). Either way
at most ``send_limit`` bytes per stream travel; the rest is only counted. A cell that prints
nothing, or less than ``limit`` without streaming, sends no frame at all.
"""

from __future__ import annotations

import contextlib
import io
import threading
from typing import Callable, List, Optional, Tuple

FRAME_BYTES = 256 << 10  # pending bytes past this go out at once, from the writing thread
STREAM_TICK = 0.02  # a streamed cell's output waits at most this long before it is sent

Send = Callable[[str, bytes], None]


class CellOutput(io.RawIOBase):
    """A write-only raw stream of one cell: the kept head, the count of the rest, the bytes to send."""

    def __init__(self, name: str, limit: int, send: Optional[Send] = None, stream: bool = False, send_limit: int = 0):
        super().__init__()
        self.name = name
        self.limit = limit
        self.kept = bytearray()
        self.total = 0
        self._send = send if send_limit > 0 else None
        self._sending = stream and self._send is not None
        self._send_left = send_limit
        self._pending = bytearray()
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # type: ignore[override]
        size = len(data)
        with self._lock:
            room = self.limit - len(self.kept)
            if room > 0:
                self.kept += bytes(data[:room])
            self.total += size
            if self._send is None:
                return size
            if not self._sending:
                if self.total <= self.limit:
                    return size
                self._sending = True  # past the limit: the whole stream goes to the controller's file
                self._queue(self.kept)
                self._queue(data[max(room, 0) :])
            else:
                self._queue(data)
            if len(self._pending) >= FRAME_BYTES:
                self._flush_locked()
        return size

    def _queue(self, data) -> None:
        take = min(len(data), self._send_left)
        if take:
            self._pending += data[:take]
            self._send_left -= take

    def send_pending(self) -> None:
        """Send what waits (the streaming ticker, and the end of the cell)."""
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if not self._pending or self._send is None:
            return
        chunk, self._pending = bytes(self._pending), bytearray()
        try:
            self._send(self.name, chunk)
        except Exception:  # the link to the supervisor broke: keep the head, send nothing more
            self._send = None

    def text(self) -> str:
        out = self.kept.decode("utf-8", errors="replace")
        if self.total > len(self.kept):
            out += "\n[... output truncated: %d more bytes not shown ...]\n" % (self.total - len(self.kept))
        return out


class CellStreams:
    """A cell's stdout and stderr text streams, and a ticker that sends streamed output every ``STREAM_TICK``."""

    def __init__(self, limit: int, send: Optional[Send] = None, stream: bool = False, send_limit: int = 0) -> None:
        self.sinks: List[CellOutput] = []
        self.buffers: List[io.BufferedWriter] = []
        self.texts: List[io.TextIOWrapper] = []
        for name in ("stdout", "stderr"):
            sink = CellOutput(name, limit, send, stream, send_limit)
            buffered = io.BufferedWriter(sink)
            self.sinks.append(sink)
            self.buffers.append(buffered)
            self.texts.append(
                io.TextIOWrapper(buffered, encoding="utf-8", errors="backslashreplace", write_through=True)
            )
        self._stop = threading.Event()
        self._ticker: Optional[threading.Thread] = None
        if stream and send is not None:
            self._ticker = threading.Thread(target=self._tick, name="cell-output", daemon=True)
            self._ticker.start()

    @property
    def streams(self) -> Tuple[io.TextIOWrapper, io.TextIOWrapper]:
        return self.texts[0], self.texts[1]

    def _tick(self) -> None:
        while not self._stop.wait(STREAM_TICK):
            self.flush()

    def flush(self) -> None:
        """Send what both streams hold now (input() sends its prompt before it asks)."""
        for index, sink in enumerate(self.sinks):
            with contextlib.suppress(Exception):  # the cell may have closed it
                self.buffers[index].flush()
            sink.send_pending()

    def finish(self) -> None:
        """The cell ended: stop the ticker and send everything still held (before ``cell_done`` goes out)."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        for text in self.texts:
            with contextlib.suppress(Exception):
                text.flush()
        self.flush()
