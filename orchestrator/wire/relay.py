"""The relayed carrier (docs/design/one-hop.md, "Carriers"): a worker's data channel multiplexed on the supervisor's
connection, for a sandbox no descriptor can reach (Swarm's node relay, a runtime that cannot pass them).

The controller's request loop (``AgentConnection``) runs unchanged on local socket pairs: ``Relay`` owns the real
connection (C) and gives the loop a local control channel and, per worker, a local D and K. One thread pumps:
control frames both ways as they are, and the bytes of D and K as ``relay {stream, channel}`` frames whose body is
the next bytes of that stream (an empty body: its end closed). The supervisor makes the worker's socket pairs itself
and forwards their bytes the same way; it keeps its watchdog role on C as with descriptors.

The supervisor is not trusted: a relay frame for a stream that does not exist, for a data channel that was never
handed over, or over ``RELAY_CHUNK`` ends the connection: the loop reads ``FAILED`` on its control channel and
raises ``ProtocolError``. Memory stays bounded: C is
read only while what waits for each local end is under ``RELAY_BUFFER`` (and nothing waits for the control end),
and a local end is read only while nothing waits to go out on C, so neither direction waits on the other.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading

from ..agent import control as control_frames
from ..agent import framing, protocol
from ..errors import ChannelLost, ProtocolError, TransportError
from .call_link import CallLink
from .data_channel import DataChannel
from .transport import Channel

logger = logging.getLogger(__name__)

FAILED = "relay_failed"
"""What the loop reads on its control channel, with a ``reason``, when the supervisor sent an invalid frame: never
sent on the wire."""
RELAY_BUFFER = 1 << 20
"""Bytes from C that may wait for one local end (D or K) before C is read no more."""
_CLOSE_SECONDS = 2.0  # a closed relay's thread ends at once; past this it is left (a daemon)


class _End:
    """The pump's end of one local stream (D or K) of the current data channel, and what waits to be written to it."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.out = bytearray()
        self.reading = True  # the loop's end has not closed yet
        self.closing = False  # the supervisor's end closed: shut ours down once ``out`` is written

    def write(self) -> None:
        try:
            sent = self.sock.send(self.out)
        except BlockingIOError:
            return
        except OSError:  # the loop closed its end: what waits is dropped
            sent = len(self.out)
        del self.out[:sent]
        if not self.out and self.closing:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.sock.close()


class Relay:
    """The controller's end of the relayed carrier for one connection ``outer`` (handshaken; from now on only the
    pump thread uses it, and closes it). ``control`` is the loop's control channel."""

    passes_descriptors = False

    def __init__(self, outer: Channel) -> None:
        max_header, max_body = outer.limits
        outer.limit_body(max(protocol.RELAY_CHUNK, framing.MAX_HEADER_BYTES))  # control frames have tiny bodies
        self._outer = outer
        self._limits = max_header, max_body
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.control = Channel(ours, max_header, max_body)
        self._inner = Channel(theirs, max_header, max_body)  # the loop's frames are the controller's own
        self._lock = threading.Lock()
        self._number = 0  # of the data channel last handed over
        self._current = 0  # of the data channel whose ends the pump holds
        self._ends: dict[str, _End] = {}
        self._new: tuple[int, dict[str, _End]] | None = None
        self._closed = False
        self._wake_r, self._wake_w = socket.socketpair()
        for sock in (self._wake_r, self._wake_w):
            sock.setblocking(False)
        self._thread = threading.Thread(target=self._run, name="relay-carrier", daemon=True)
        self._thread.start()

    def hand_over(self, control: Channel, *, deadline: float) -> DataChannel:
        """A new data channel: local pairs for D and K (the pump keeps one end of each), and ``data_channel
        {channel}`` on ``control`` for the supervisor, which makes the worker's pairs itself.

        Raises:
            AgentTimeoutError, ChannelLost: as ``Channel.send``; ChannelLost also when no pair can be made.
        """
        pairs: list[tuple[socket.socket, socket.socket]] = []
        try:
            for _ in range(protocol.DATA_CHANNEL_FDS):
                pairs.append(socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM))
        except OSError as exc:
            for pair in pairs:
                for sock in pair:
                    sock.close()
            raise ChannelLost(f"no data channel could be made on this host: {exc}") from exc
        (requests, pumped_d), (calls, pumped_k) = pairs
        with self._lock:
            self._number += 1
            number = self._number
            self._new = number, {protocol.RELAY_REQUESTS: _End(pumped_d), protocol.RELAY_CALLS: _End(pumped_k)}
        self._wake()
        max_header, max_body = self._limits
        data = DataChannel(
            Channel(requests, max_header, max_body),
            CallLink(Channel(calls, protocol.HOST_CALL_HEADER_BYTES, protocol.HOST_CALL_MAX_BYTES), blob_files=False),
        )
        try:
            control.send(control_frames.data_channel_message(number), deadline=deadline)
        except BaseException:
            data.close()
            raise
        return data

    def close(self) -> None:
        """Stop the pump and close C (idempotent); the loop's ends see EOF."""
        with self._lock:
            self._closed = True
        self._wake()
        if threading.current_thread() is not self._thread:
            self._thread.join(_CLOSE_SECONDS)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    # -- the pump thread

    def _run(self) -> None:
        try:
            while self._round():
                pass
        except ProtocolError as exc:  # the loop raises it, naming the reason, when it reads this on its control channel
            logger.warning("the supervisor broke the relayed connection: %s", exc)
            with contextlib.suppress(TransportError):
                self._inner.enqueue({"type": FAILED, "reason": str(exc)[:500]})
        except TransportError as exc:
            logger.info("the relayed connection ended: %s", exc)
        except Exception:  # a bug must not leave the loop waiting: it sees the connection end
            logger.exception("the relay of a connection failed")
        finally:
            with contextlib.suppress(TransportError):
                self._inner.flush()  # what came before the end (a goodbye): a small frame the socket takes
            for end in self._ends.values():
                end.close()
            if self._new is not None:
                for end in self._new[1].values():
                    end.close()
            for channel in (self._inner, self._outer):
                channel.close()
            for sock in (self._wake_r, self._wake_w):
                sock.close()

    def _round(self) -> bool:
        """Wait for something to move, move it; False once the relay ends."""
        with self._lock:
            if self._closed:
                return False
            if self._new is not None:
                number, ends = self._new
                self._new = None
                for end in self._ends.values():
                    end.close()
                self._ends = ends
                self._current = number
        outer, inner, ends = self._outer, self._inner, self._ends
        take_outer = not inner.has_queued and all(len(end.out) < RELAY_BUFFER for end in ends.values())
        if take_outer and outer.buffered:
            self._from_outer()
            return True
        interest = {
            self._wake_r.fileno(): select.POLLIN,
            outer.fileno(): (select.POLLIN if take_outer else 0) | (select.POLLOUT if outer.has_queued else 0),
            inner.fileno(): (select.POLLIN if not outer.has_queued else 0)
            | (select.POLLOUT if inner.has_queued else 0),
        }
        for end in ends.values():
            reading = select.POLLIN if end.reading and not outer.has_queued else 0
            interest[end.sock.fileno()] = reading | (select.POLLOUT if end.out else 0)
        poller = select.poll()
        for fd, events in interest.items():
            if events:  # a socket polled for nothing would still wake the pump at every hang-up
                poller.register(fd, events)
        ready = dict(poller.poll())
        if self._wake_r.fileno() in ready:
            with contextlib.suppress(BlockingIOError):
                while self._wake_r.recv(4096):
                    pass
        if ready.get(inner.fileno(), 0) & select.POLLOUT:
            inner.flush()
        for end in ends.values():
            if end.out and ready.get(end.sock.fileno(), 0) & (select.POLLOUT | select.POLLERR | select.POLLHUP):
                end.write()
        if ready.get(outer.fileno(), 0) & select.POLLOUT:
            outer.flush()
        if not outer.has_queued:
            if ready.get(inner.fileno(), 0) & (select.POLLIN | select.POLLHUP | select.POLLERR):
                self._from_inner()
            for stream, end in ends.items():
                if end.reading and ready.get(end.sock.fileno(), 0) & (select.POLLIN | select.POLLHUP | select.POLLERR):
                    self._from_end(stream, end)
            outer.flush()
        if take_outer and ready.get(outer.fileno(), 0) & (select.POLLIN | select.POLLHUP | select.POLLERR):
            self._from_outer()
        return True

    def _from_inner(self) -> None:
        """The loop's control frames, to C as they are (EOF: the connection is closed, the relay ends)."""
        while (frame := self._inner.poll_recv()) is not None:
            self._outer.enqueue(*frame)

    def _from_end(self, stream: str, end: _End) -> None:
        """The next bytes the loop wrote on D or K, to C in a relay frame (none: its end closed)."""
        try:
            data = end.sock.recv(protocol.RELAY_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            end.reading = False
        self._outer.enqueue(control_frames.relay_message(stream, self._current), data)

    def _from_outer(self) -> None:
        """Frames from the supervisor: relay frames to their local end, the others to the loop's control channel;
        until a local end has ``RELAY_BUFFER`` waiting or a control frame waits."""
        outer, inner = self._outer, self._inner
        while not inner.has_queued and all(len(end.out) < RELAY_BUFFER for end in self._ends.values()):
            frame = outer.poll_recv()
            if frame is None:
                return
            header, body = frame
            if header.get("type") != protocol.RELAY:
                inner.enqueue(header, body)
                inner.flush()
                continue
            stream, number = header.get("stream"), header.get("channel")
            if stream not in protocol.RELAY_STREAMS or type(number) is not int or not 0 < number <= self._number:
                raise _Refused(f"a relay frame for stream {str(stream)[:16]!r} of data channel {str(number)[:16]}")
            end = self._ends.get(stream)
            if number != self._current or end is None or end.closing:
                continue  # a data channel the loop dropped already: its worker is gone
            if body:
                end.out += body
                end.write()
            else:
                end.closing = True
                end.write()


class _Refused(ProtocolError):
    """The supervisor sent a relay frame it may not: the connection ends."""
