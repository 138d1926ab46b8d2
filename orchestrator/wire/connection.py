"""An authenticated connection to one agent and its request loop (docs/design/one-hop.md): the controller talks to
the worker directly, one request at a time, under one deadline.

Knows nothing of containers or sessions. ``open`` waits for the agent on an ``Endpoint`` (``opening.py``: the
handshake, the first data channel). The supervisor's authenticated connection (C) is the control channel: it carries
the worker's data channel once per worker (``Carrier.hand_over``), the ladder's interrupts and kills, and the
supervisor's ``goodbye`` and ``worker_lost``. A request and its reply go on D, the running cell's output and host
calls on K (``call_link.py``); the worker (cell code) holds the other ends of both, so everything read there is
checked here. The controller keeps each request's ladder (``agent/ladder.py``). A ``goodbye`` (another controller
took the sandbox over) ends the connection with ``TakenOver``.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
import secrets
import select
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..agent import control as control_frames
from ..agent import framing, protocol, request_table
from ..agent.handshake import Hello
from ..agent.ladder import KILL, Ladder
from ..agent.reply_types import Goodbye
from ..config import Timeouts
from ..errors import AgentTimeoutError, ChannelLost, OrchestratorError, ProtocolError, TransportError
from .call import Call
from .data_channel import Carrier, DataChannel
from .endpoint import Endpoint
from .host_link import OutputBudget, due_answers, wait_for_sandbox
from .opening import accept_agent
from .replies import TakenOver, is_signal_name, parse_goodbye, reply_reason
from .transport import Channel, FrameBody

Header = dict[str, Any]
Body = FrameBody
_GOODBYE_WAIT = 1.0
_HAND_OVER_SECONDS = 5.0  # the supervisor takes a data channel at once
_REPLACE_SECONDS = 5.0  # at least this long for worker_replaced: the supervisor answers once the fresh worker runs

_request_ids = itertools.count()
_id_prefix = secrets.token_hex(8)


def _new_id_prefix() -> None:
    global _id_prefix
    _id_prefix = secrets.token_hex(8)


os.register_at_fork(after_in_child=_new_id_prefix)  # a forked child must not repeat its parent's ids


def new_request_id() -> str:
    """A request id unique to this process (a random prefix, then a counter): 32 hex digits, like a UUID's.

    Cheaper than ``uuid.uuid4()`` (no system call), which the trivial cell notices.
    """
    return f"{_id_prefix}{next(_request_ids):016x}"


def _goodbye_behind(control: Channel) -> Goodbye | None:
    """The ``goodbye`` a takeover left on the supervisor's connection (read for up to ``_GOODBYE_WAIT``), if that is
    what it sent: a write there broke, or it spoke unasked."""
    try:
        message, _ = control.recv(deadline=time.monotonic() + _GOODBYE_WAIT)
    except TransportError:
        return None
    return parse_goodbye(message) if message.get("type") == protocol.GOODBYE else None


def _made_up_reply(header: request_table.Request, **fields: object) -> framing.Header:
    """A reply the controller makes for ``header`` when the worker could not give one (its worker was lost or
    replaced): the reply type and id of the request, and ``fields``."""
    return {"type": request_table.reply_type(header["type"]), "id": header["id"], **fields}


class _WorkerLost(Exception):
    """The supervisor said ``worker_lost`` on C during a request (its message)."""

    def __init__(self, message: framing.Header) -> None:
        super().__init__("the worker was lost")
        self.message = message


class _SupervisorSpoke(ProtocolError):
    """The supervisor, not its worker, sent something invalid on C: only a new sandbox helps."""


class AgentConnection:
    """One authenticated agent: its supervisor's connection (``control``) and its current worker's data channel."""

    def __init__(
        self,
        hello: Hello,
        carrier: Carrier,
        control: Channel,
        data: DataChannel,
        interrupt_grace: float = Timeouts.interrupt_grace,
        frame_seconds: float = Timeouts.frame,
    ) -> None:
        """``control``: the supervisor's connection, or the relayed carrier's local end of it."""
        self.hello = hello
        self._carrier = carrier  # how each fresh worker's data channel comes
        self._control = control
        self._data: DataChannel | None = data
        self._grace = interrupt_grace  # between the ladder's interrupt and its kill: the supervisor's
        self._frame_seconds = frame_seconds  # a frame the worker began on D may stall this long
        self._lost: framing.Header | None = None  # the worker died between calls: how (the next request says so)

    @property
    def passes_descriptors(self) -> bool:
        """Descriptors reach the worker (the descriptors carrier): a value file, a blob's file."""
        return self._carrier.passes_descriptors

    @classmethod
    def open(
        cls,
        endpoint: Endpoint,
        *,
        sandbox_id: str,
        deadline: float,
        carrier: str = "descriptors",
        interrupt_grace: float = Timeouts.interrupt_grace,
        frame_seconds: float = Timeouts.frame,
    ) -> AgentConnection:
        """Wait for the agent of ``sandbox_id`` on ``endpoint``, authenticate both ends and hand its worker a data
        channel on ``carrier`` (``opening.accept_agent``: what it raises). The controller keeps each request's
        ladder: ``interrupt_grace`` (the sandbox's, as its agent was started with) between the interrupt and the
        kill; a frame its worker begins on D must not stall for ``frame_seconds`` (``Settings.timeouts.frame``)."""
        opened = accept_agent(endpoint, sandbox_id=sandbox_id, deadline=deadline, carrier=carrier)
        return cls(*opened, interrupt_grace, frame_seconds)

    def request(self, header: request_table.Request, body: Body, call: Call) -> tuple[Header, bytearray]:
        """Send one request and return its reply; every byte both ways must move before ``call.deadline``.

        ``call`` carries the request's side parts (``wire/call.py``). While an ``input()`` waits for its answer the
        deadline stands still. The request and its reply go on D, the cell's calls and output on K, control on C;
        ``call.value_fd`` (a request without a body: a ``set_value``'s value file) goes with the request's first
        bytes.

        The controller keeps the request's ladder (``agent/ladder.py``): at the phase's own limit it has the
        supervisor interrupt the worker, after the grace kill and replace it (``replace_worker``): the reply is then
        ``timeout, worker_restarted: true``. A worker lost (the supervisor's ``worker_lost``, or D broke: the worker
        is replaced, in case it lives) is answered ``crashed``; a K that broke is only closed (``CallLink``).
        ``call.deadline`` is the final word: past it, ``AgentTimeoutError`` (the sandbox is replaced), as for a
        broken C or an invalid frame on it. A forged or invalid frame on D, or one that stalls there for
        ``frame_seconds``, has the worker replaced and is answered ``protocol_error`` (``_worker_misbehaved``).

        Raises:
            TakenOver: the supervisor said goodbye (the request was not kept); D and K are closed.
            AgentTimeoutError: the deadline passed.
            ChannelLost: the agent's end closed, or this host failed the channel (``OSError``: out of descriptors or
                memory).
            ProtocolError: the supervisor sent an invalid frame.
        """
        if "id" not in header:
            header["id"] = new_request_id()
        try:
            return self._request(header, body, call)
        except TakenOver:
            self._drop_data()  # at once, not when the session is dropped: the worker goes back to its supervisor
            raise
        except OSError as exc:
            if isinstance(exc, OrchestratorError):  # typed already (a ``TimeoutError``, a ``ConnectionError``)
                raise
            # The host, not the sandbox, failed (out of descriptors or memory): the channel is out of step.
            raise ChannelLost(f"the channel to the agent failed on this host: {exc}") from exc

    def _request(self, header: request_table.Request, body: Body, call: Call) -> tuple[Header, bytearray]:
        if self._control.buffered or self._control.has_pending():  # its supervisor spoke since the last call
            self._idle_worker_lost()  # (a relayed request would not fail to reach a dead worker: it is lost on the way)
        lost, self._lost = self._lost, None
        if lost is not None:  # the worker died between calls (check_idle): the request never runs on it
            return self._crashed(header, lost, ran=False), bytearray()
        data = self._data
        if data is None:
            raise ChannelLost("the worker's data channel could not be handed over after its last worker was lost")
        deadline = call.deadline
        try:
            if call.value_fd is None:
                data.requests.send(header, body, deadline=deadline)
            else:
                data.requests.send_fds(header, [call.value_fd], deadline=deadline)
        except ChannelLost:  # the worker died between calls, or a cell closed D: the request never ran
            lost = self.replace_worker(header["id"], deadline=deadline)
            return self._crashed(header, lost, ran=False), bytearray()
        try:
            return self._reply(data, header, call)
        except _WorkerLost as exc:
            self._drop_data()
            self._hand_over()
            return self._crashed(header, exc.message, ran=True), bytearray()
        except ChannelLost:  # D broke: the worker died (the supervisor says so), or its cell closed it
            lost = self.replace_worker(header["id"], deadline=deadline)
            return self._crashed(header, lost, ran=True), bytearray()
        except _SupervisorSpoke:
            raise
        except ProtocolError as exc:  # the worker (cell code) wrote it on D or K: the supervisor replaces it
            if self._data is not data:  # unless C failed while the ladder had the worker replaced: the supervisor's
                raise
            return self._worker_misbehaved(header, exc, deadline)

    def _worker_misbehaved(
        self, header: request_table.Request, exc: ProtocolError, deadline: float
    ) -> tuple[framing.Header, bytearray]:
        """A forged or invalid frame on D or K (cell code holds their other ends): the worker is replaced through C
        and the request answered ``protocol_error``, so recovery restores into the same sandbox. Raises what
        ``replace_worker`` raises."""
        replaced = self.replace_worker(header["id"], deadline=deadline)
        reason = f"{str(exc)[:200]}; it was killed"
        reply = _made_up_reply(
            header,
            status=protocol.STATUS_PROTOCOL_ERROR,
            reason=reason,
            oom=replaced.get("oom") is True,
            ran=True,
            worker_restarted=True,
        )
        return reply, bytearray()

    def _reply(
        self,
        data: DataChannel,
        header: request_table.Request,
        call: Call,
    ) -> tuple[framing.Header, bytearray]:
        """Wait for the reply of the request sent on D under its ladder, serving K and watching C meanwhile."""
        request_id, deadline, live = header["id"], call.deadline, call.live
        requests, calls, control = data.requests, data.calls, self._control
        ladder = Ladder.for_request(header, self._grace, functools.partial(self._interrupt, request_id))
        output = OutputBudget(live, ladder.cancel)  # a flood of output frames: its next step is due now
        cell_ended = False  # the worker said cell_done: the checkpoint runs
        paused_at: float | None = None
        ready: set[int] = set()  # the reply cannot have come yet: wait before the first read
        stalled = math.inf  # when a frame the worker began on D, and stopped feeding, makes it a forger
        while True:
            if control.fileno() in ready or control.buffered:
                self._read_control(control)
            if calls.readable(ready):
                refusal = self._refusal(header, cell_ended)
                calls.read(call, refusal=refusal, output=output, deadline=deadline)
            if requests.fileno() in ready or requests.buffered:
                frame = requests.poll_recv()
                if frame is None and requests.fileno() in ready:  # more of it came
                    stalled = time.monotonic() + self._frame_seconds
                elif frame is None and time.monotonic() >= stalled:
                    raise ProtocolError("the worker stopped in the middle of a frame on its data channel")
                if frame is not None:
                    stalled = math.inf
                    reply, reply_body = frame
                    if reply.get("id") != request_id:
                        raise ProtocolError(
                            f"the worker sent a frame for {str(reply.get('id'))[:64]!r} that does not answer request "
                            f"{request_id!r}"
                        )
                    if reply.get("type") == protocol.CELL_DONE and not reply_body:
                        if cell_ended:
                            raise ProtocolError(f"the worker said twice that the cell of {request_id!r} ended")
                        cell_ended = True  # the checkpoint's clock runs now, once
                        calls.end_cell()
                        if ladder.in_cell:
                            ladder.cell_done()
                        if call.checkpoint_seconds is not None:
                            deadline = time.monotonic() + call.checkpoint_seconds
                        continue
                    calls.after_reply(output)
                    if ladder.interrupted or ladder.cell_interrupted:
                        self._interrupts_delivered(deadline)
                    if ladder.stopped_by_interrupt(reply.get("status")):
                        reply.update(status=protocol.STATUS_TIMEOUT, worker_restarted=False)
                        reply.setdefault("phase", "load" if header["type"] == request_table.LOAD else "cell")
                    return reply, reply_body
            if live is not None:  # after K was read: an input() asked for just now stops the clock from now
                waiting = live.waiting_for_input
                ladder.follow_input(waiting)
                if waiting and paused_at is None:
                    paused_at = time.monotonic()
                elif paused_at is not None and not waiting:
                    deadline += time.monotonic() - paused_at
                    paused_at = None
            if ladder.expired() == KILL:  # (at its deadline it was interrupted, and has the grace to stop)
                lost = self.replace_worker(request_id, deadline=deadline)
                if lost.get("type") == protocol.WORKER_LOST:  # it died by itself just before: a crash
                    return self._crashed(header, lost, ran=True), bytearray()
                return _made_up_reply(header, **ladder.killed_reply()), bytearray()
            rung = ladder.wait_seconds()
            rung_at = min(stalled, math.inf if rung is None else time.monotonic() + rung)
            ready = self._wait(data, math.inf if paused_at is not None else deadline, rung_at, call)
            if live is not None and live.take_interrupt():
                ladder.cancel()  # the caller's interrupt: the ladder's next step is due now

    def _interrupt(self, request_id: str, phase: str) -> None:
        """The ladder's interrupt: the supervisor signals the worker (SIGINT for a cell or load, SIGUSR2 for a
        checkpoint); queued on C, which every wait flushes. A restore's or install's ("request") is a SIGINT (the worker
        heeds it only in a cell or a load: the kill follows)."""
        phase = phase if phase in protocol.INTERRUPT_PHASES else "cell"
        self._control.enqueue(control_frames.phase_interrupt_message(request_id, phase))
        with self._writing_control():
            self._control.flush()

    def _interrupts_delivered(self, deadline: float) -> None:
        """After a reply to a request that was interrupted: wait until the supervisor has sent the worker every
        interrupt asked for (it answers C in order: a ``ping``'s ``pong``). A signal it sent is then pending in the
        worker, which takes it while idle (and ignores it there) before it can read the next request, so an
        interrupt that crossed the reply never stops the next cell.

        Raises:
            TakenOver: the supervisor said goodbye first (the request is not kept, as a takeover during it).
        """

        def lost(message: framing.Header) -> None:  # the worker died after its reply, which counts
            self._drop_data()
            self._hand_over()
            self._lost = self._lost or message  # the next request is told

        deadline = max(deadline, time.monotonic() + _HAND_OVER_SECONDS)
        self._ask(
            control_frames.ping_message(secrets.token_hex(16)),
            request_table.PONG,
            deadline,
            lost,
            "was asked for a pong",
        )

    def _read_control(self, control: Channel) -> None:
        """What the supervisor said on C during a request: a goodbye or a lost worker end it; nothing else is sent."""
        try:
            frame = control.poll_recv()
        except ProtocolError as exc:
            raise _SupervisorSpoke(str(exc)) from exc
        if frame is None:
            return
        message, _ = frame
        kind = message.get("type")
        if kind == protocol.GOODBYE:
            raise TakenOver(parse_goodbye(message))
        if kind == protocol.WORKER_LOST:
            raise _WorkerLost(message)
        reason = message.get("reason")  # the relayed carrier's own ``relay.FAILED`` gives one
        why = f": {reason[:500]}" if isinstance(reason, str) else ""
        raise _SupervisorSpoke(f"the supervisor sent {str(kind)[:64]!r} on its connection during a request{why}")

    @staticmethod
    def _crashed(header: request_table.Request, lost: framing.Header, *, ran: bool) -> framing.Header:
        """The reply to a request whose worker died (or was replaced because its data channel broke), made from
        ``lost``, the supervisor's ``worker_lost`` or ``worker_replaced``: recovery restores into the fresh worker (and
        sends a request that never ran once more)."""
        signal = lost.get("signal")
        reply = _made_up_reply(
            header,
            status=protocol.STATUS_CRASHED,
            reason=reply_reason(lost, "the worker died"),
            oom=lost.get("oom") is True,
            ran=ran,
            worker_restarted=True,
        )
        if is_signal_name(signal):  # what ended it, as the supervisor saw it (eval reports it)
            reply["signal"] = signal
        return reply

    def replace_worker(self, kill_id: str | None = None, *, deadline: float) -> framing.Header:
        """Have the supervisor kill this worker and start a fresh one, and hand that one a new data channel.

        The way out of whatever leaves the worker's data channel unusable while the supervisor is sound: a cell that
        ignored its interrupt, a forged or invalid frame on D, a D the cell closed (a broken K is only closed:
        ``CallLink``). Our ends of the old D and K are closed first, so nothing the old worker (or a process it left
        behind) wrote there is ever read.
        ``kill {id}`` goes on C; the supervisor answers ``worker_replaced {id, reason, oom}`` once the fresh worker
        runs (a ``worker_lost`` before it is the old worker's death, which the kill outran: the kill replaces the
        fresh one too). ``kill_id`` is the request's id during a request, else a fresh one is made. Waits until
        ``deadline``, or ``_REPLACE_SECONDS`` if that is later.

        Returns:
            What the supervisor said of the old worker's end (``reason``, ``oom``: its word, not the worker's): its
            ``worker_lost`` if the worker died before the kill came, else its ``worker_replaced`` (which names the
            death too when the supervisor found the worker dead at the kill).

        Raises:
            TakenOver: the supervisor said goodbye instead (another controller took the sandbox over).
            AgentTimeoutError, ChannelLost, ProtocolError: C failed or said something else; the sandbox must be
                replaced (no data channel is left in use).
        """
        kill_id = kill_id if kill_id is not None else secrets.token_hex(16)
        self._drop_data()
        deaths: list[framing.Header] = []
        deadline = max(deadline, time.monotonic() + _REPLACE_SECONDS)
        kill = control_frames.kill_message(kill_id)  # behind an interrupt still queued, if any
        replaced = self._ask(kill, protocol.WORKER_REPLACED, deadline, deaths.append, "replaced its worker")
        self._hand_over()
        return deaths[0] if deaths else replaced

    def _ask(
        self,
        question: control_frames.ControlRequest,
        answer_type: str,
        deadline: float,
        lost: Callable[[framing.Header], None],
        what: str,
    ) -> framing.Header:
        """Send ``question`` on C and return the supervisor's answer of ``answer_type`` with its id; each
        ``worker_lost`` that comes first goes to ``lost``.

        Raises:
            TakenOver: the supervisor said goodbye instead.
            ProtocolError: it said anything else (``what`` it was doing names the moment).
            AgentTimeoutError, ChannelLost: C failed.
        """
        control = self._control
        control.enqueue(question)
        with self._writing_control():
            control.flush(deadline=deadline)
        while True:
            message, _ = control.recv(deadline=deadline)
            kind = message.get("type")
            if kind == answer_type and message.get("id") == question["id"]:
                return message
            if kind == protocol.GOODBYE:
                raise TakenOver(parse_goodbye(message))
            if kind != protocol.WORKER_LOST:
                raise ProtocolError(f"the supervisor sent {str(kind)[:64]!r} while it {what}")
            lost(message)

    def _drop_data(self) -> None:
        """Close our ends of the worker's data channel; until the next is handed over there is none to use."""
        if self._data is not None:
            self._data.close()
            self._data = None

    @contextlib.contextmanager
    def _writing_control(self) -> Iterator[None]:
        """A write on C that breaks may be a takeover's: its goodbye waits behind the pipe (``TakenOver`` then), else
        the ``ChannelLost`` stands."""
        try:
            yield
        except ChannelLost:
            goodbye = _goodbye_behind(self._control)
            if goodbye is None:
                raise
            self._drop_data()
            raise TakenOver(goodbye) from None

    def _hand_over(self) -> None:
        """Hand the supervisor's fresh worker a new data channel (the old one went with its worker)."""
        deadline = time.monotonic() + _HAND_OVER_SECONDS
        with self._writing_control():
            self._control.flush(deadline=deadline)  # an interrupt still queued goes first: descriptors on their own
            self._data = self._carrier.hand_over(self._control, deadline=deadline)

    @staticmethod
    def _refusal(header: request_table.Request, cell_ended: bool) -> str | None:
        """Why a host call that comes now is answered ``error`` at once: none while an exec's cell runs."""
        if header["type"] != request_table.EXEC:
            return protocol.CALL_NO_CELL
        return protocol.CALL_ENDED if cell_ended else None

    def _wait(self, data: DataChannel, deadline: float, rung_at: float, call: Call) -> set[int]:
        """Until D, K or C is readable (or K and C writable with answers queued), an answer is ready, the ladder's
        next step is due (``rung_at``) or the deadline; the descriptors that are ready."""
        poller = select.poll()
        for channel in (data.requests, self._control):
            poller.register(channel.fileno(), select.POLLIN | (select.POLLOUT if channel.has_queued else 0))
        if events := data.calls.poll_events():  # none once K was closed
            poller.register(data.calls.fileno(), events)
        ready = wait_for_sandbox(poller, deadline, call, wake_at=min(deadline, rung_at), what="the worker")
        data.calls.answer(due_answers(ready, call))
        data.calls.flush_now()
        if self._control.has_queued:
            with self._writing_control():
                self._control.flush()
        return ready

    def check_idle(self) -> None:
        """Between calls the supervisor says nothing on C but ``goodbye`` or ``worker_lost``, and the worker is silent
        on D; on K a thread an earlier cell left may call (answered ``error``, its output dropped: ``CallLink.idle``). A
        worker lost, or one that hung up or wrote on D, is replaced (the latter by ``replace_worker``) and the next
        request is answered ``crashed, ran: false`` without being sent.

        Raises:
            TakenOver: the supervisor said goodbye.
            ChannelLost: C broke or carried something else (the sandbox is not usable as is).
        """
        try:
            self._idle_worker_lost()
        except (AgentTimeoutError, ProtocolError) as exc:  # no call failed: the sandbox is replaced before the next
            raise ChannelLost(f"the worker could not be replaced between calls: {exc}") from exc
        if self._data is not None:
            self._data.calls.idle()

    def _idle_worker_lost(self) -> None:
        """``check_idle``'s part for a worker lost between calls (``worker_lost`` on C) or one that hung up or wrote on
        D, which is replaced: the next request learns how from ``_lost``."""
        control = self._control
        while control.has_pending():
            message, _ = control.recv(deadline=time.monotonic() + _HAND_OVER_SECONDS)  # a control frame comes whole
            kind = message.get("type")
            if kind == protocol.GOODBYE:
                raise TakenOver(parse_goodbye(message))
            if kind != protocol.WORKER_LOST:
                raise ChannelLost(f"the supervisor sent {str(kind)[:64]!r} on its connection between calls")
            self._drop_data()
            self._hand_over()
            self._lost = self._lost or message
        data = self._data
        if data is not None and data.requests.has_pending():
            lost = self.replace_worker(deadline=time.monotonic())
            if lost.get("type") == protocol.WORKER_REPLACED:
                why = "the worker hung up or wrote unasked on its data channel between calls"
                lost = {**lost, "reason": f"{why}; {reply_reason(lost, 'it was replaced')}"}
            self._lost = self._lost or lost

    def close(self) -> None:
        """Close D, K and C: the worker sees EOF, goes back to its supervisor and reports itself idle."""
        self._drop_data()
        self._control.close()
        self._carrier.close()
