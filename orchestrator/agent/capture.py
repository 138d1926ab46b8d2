"""What a cell prints: kept bounded in memory, and sent to the controller as it comes when asked.

Standard library only (runs in the sandbox). Text and ``sys.stdout.buffer`` writes land in one
``CellOutput`` per stream. It keeps the first ``limit`` bytes for the reply and counts the rest.
Bytes also go to the controller as ``output`` frames (docs/protocol.md, "Output") in three cases:
the caller streams the cell (everything, as it comes), the stream went past ``limit`` (then
everything from its first byte, so the controller keeps the whole stream in a file), or the cell
ended and its kept bytes are not UTF-8 (the reply's text would lose them: the controller gets
them as they are). Either way at most ``send_limit`` bytes per stream travel; the rest is only
counted. A cell that prints nothing, or less than ``limit`` of UTF-8 without streaming, sends no
frame at all.

An exec's ``output_cap`` bounds the bytes of both streams together: the write that would pass
it keeps the part up to the cap and raises ``OutputLimitExceeded`` in the code that wrote, and
every later write of the cell raises it again and keeps nothing. A capped cell's text streams
write through to their sinks with no buffer between, so that the write that passes the cap is
the one that raises (a buffer would pass it on later, from a flush); an uncapped cell's output
takes the buffered path, unchanged.
"""

from __future__ import annotations

import contextlib
import io
import threading
from typing import Any, Callable, List, Optional, Tuple

FRAME_BYTES = 256 << 10  # pending bytes past this go out at once, from the writing thread
STREAM_TICK = 0.02  # a streamed cell's output waits at most this long before it is sent

Send = Callable[[str, bytes], None]


class OutputLimitExceeded(BaseException):
    """The cell's output passed the exec's ``output_cap``.

    A BaseException, like KeyboardInterrupt, so that ``except Exception`` in the cell does not swallow it.
    """


class OutputCap(object):
    """The byte budget that a capped cell's two streams share."""

    __slots__ = ("limit", "lock", "reached", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.reached = False  # a write went past the limit: every later one raises
        self.lock = threading.Lock()

    def exceeded(self) -> OutputLimitExceeded:
        return OutputLimitExceeded("the cell's output passed its limit of %d bytes" % self.limit)


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

    def flush(self) -> None:
        """``print(..., flush=True)``: what a streamed cell wrote goes out now, not at the next tick (an
        interpreter that dies right after a flush has sent what it flushed)."""
        if self._sending:
            self.send_pending()

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
        except Exception:  # the link to the controller broke: keep the head, send nothing more
            self._send = None

    def send_if_not_text(self) -> None:
        """The cell ended: kept bytes that are not UTF-8 (``sys.stdout.buffer``) go out as they are, since the
        reply's text would replace them. Already sent, or nothing to send with: nothing to do."""
        with self._lock:
            if self._sending or self._send is None or not self.kept:
                return
            try:
                self.kept.decode("utf-8")
            except UnicodeDecodeError:
                self._queue(self.kept)
                self._flush_locked()

    def text(self) -> str:
        out = self.kept.decode("utf-8", errors="replace")
        if self.total > len(self.kept):
            out += "\n[... output truncated: %d more bytes not shown ...]\n" % (self.total - len(self.kept))
        return out


class CappedCellOutput(CellOutput):
    """A CellOutput whose bytes count against an ``OutputCap`` shared with the cell's other stream."""

    def __init__(
        self, name: str, limit: int, send: Optional[Send], stream: bool, send_limit: int, cap: OutputCap
    ) -> None:
        super().__init__(name, limit, send, stream, send_limit)
        self.cap = cap

    def write(self, data) -> int:  # type: ignore[override]
        if type(data) is not bytes:  # what a buffered stream would pass on: the bytes of any bytes-like object
            with memoryview(data) as view:
                data = view.tobytes()
        cap = self.cap
        size = len(data)
        with cap.lock:
            if cap.reached:
                raise cap.exceeded()
            room = cap.limit - cap.used
            if size <= room:
                cap.used += size
            else:
                cap.used = cap.limit
                cap.reached = True
        if size <= room:
            return CellOutput.write(self, data)
        if room > 0:
            CellOutput.write(self, data[:room])
        raise cap.exceeded()


class _FlushingWriter(io.BufferedWriter):
    """A streamed cell's buffer: its ``flush`` (``print(..., flush=True)``) reaches the sink, which sends at once."""

    def flush(self) -> None:
        super().flush()
        self.raw.flush()


class CellStreams:
    """A cell's stdout and stderr text streams, and a ticker that sends streamed output every ``STREAM_TICK``.

    ``cap`` (bytes, or None): the exec's ``output_cap`` on both streams together.
    """

    def __init__(
        self,
        limit: int,
        send: Optional[Send] = None,
        stream: bool = False,
        send_limit: int = 0,
        cap: Optional[int] = None,
    ) -> None:
        self.sinks: List[CellOutput] = []
        self.buffers: List[Any] = []  # what each text stream writes to: a BufferedWriter, or a capped sink itself
        self.texts: List[io.TextIOWrapper] = []
        self.cap = None if cap is None else OutputCap(cap)
        for name in ("stdout", "stderr"):
            if self.cap is None:
                sink = CellOutput(name, limit, send, stream, send_limit)
                buffered: Any = (_FlushingWriter if stream else io.BufferedWriter)(sink)
            else:
                sink = CappedCellOutput(name, limit, send, stream, send_limit, self.cap)
                buffered = sink  # no buffer: the write that passes the cap raises in the code that made it
            self.sinks.append(sink)
            self.buffers.append(buffered)
            self.texts.append(
                io.TextIOWrapper(buffered, encoding="utf-8", errors="backslashreplace", write_through=True)
            )
        # Only a streamed cell has a ticker, and its event: a cell that is not streamed makes no threading objects.
        self._ticker: Optional[Tuple[threading.Thread, threading.Event]] = None
        if stream and send is not None:
            stop = threading.Event()
            ticker = threading.Thread(target=self._tick, args=(stop,), name="cell-output", daemon=True)
            self._ticker = ticker, stop
            ticker.start()

    @property
    def limited(self) -> bool:
        """The cell's output went past its cap."""
        return self.cap is not None and self.cap.reached

    @property
    def streams(self) -> Tuple[io.TextIOWrapper, io.TextIOWrapper]:
        return self.texts[0], self.texts[1]

    def _tick(self, stop: threading.Event) -> None:
        while not stop.wait(STREAM_TICK):
            self.flush()

    def flush(self) -> None:
        """Send what both streams hold now (input() sends its prompt before it asks)."""
        for index, sink in enumerate(self.sinks):
            with contextlib.suppress(Exception, OutputLimitExceeded):  # the cell may have closed it
                self.buffers[index].flush()
            sink.send_pending()

    def finish(self) -> None:
        """The cell ended: stop the ticker and send everything still held (before ``cell_done`` goes out)."""
        if self._ticker is not None:
            ticker, stop = self._ticker
            stop.set()
            ticker.join()
        for text in self.texts:
            with contextlib.suppress(Exception, OutputLimitExceeded):  # the agent's flushes never raise the cap
                text.flush()
        self.flush()
        for sink in self.sinks:
            sink.send_if_not_text()
