"""What a request's caller hands the wire: one ``Call``, and the interfaces of what it carries.

A request travels with side parts besides its header and body: its deadline, the moment its checkpoint's clock
starts, the running cell's live events (output, ``input()``, interrupts), its host-call desk, the sandbox's deferred
values' blobs and a value file's descriptor. The wire only uses them, through the protocols below; ``runtime/`` and
``api/`` implement them (``CallDesk``, ``LiveCall``, ``DeferredBlobs``), so ``wire/`` imports nothing above it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ..agent import reply_types

Answer = tuple[reply_types.HostReply, bytes]
"""A ``host_reply`` frame for the connection to send: header and JSON body."""


def answer_ok(call: int, result: bytes) -> Answer:
    return reply_types.host_reply(call), result


def answer_error(call: int, message: str) -> Answer:
    """The sandbox's call fails with ``message`` (it raises ``HostCallError``, or ``EOFError`` for input())."""
    return reply_types.host_reply(call, message), b""


class Answering(Protocol):
    """Something whose answers to the sandbox's calls become ready while a request waits: polled on ``wake_fd``."""

    @property
    def wake_fd(self) -> int:
        """Readable when an answer is ready."""

    def answers(self) -> list[Answer]:
        """The answers ready now (each taken once)."""

    def next_expiry(self) -> float:
        """When the next call runs out of time and is answered with an error (``math.inf``: none waits)."""


class HostCallDesk(Answering, Protocol):
    """The running cell's host calls (``runtime.hostcalls.CallDesk``)."""

    def submit(self, call: int, name: str, body: bytearray) -> None:
        """Take one call from the sandbox; its answer comes later, from ``answers``."""


class LiveEvents(Answering, Protocol):
    """The running cell's live side (``api.events.LiveCall``): its output, its ``input()`` and the caller's
    interrupts."""

    @property
    def waiting_for_input(self) -> bool:
        """An ``input()`` waits for its answer: the request's deadline stands still meanwhile."""

    def output(self, stream: str, data: bytearray) -> None:
        """One chunk of the cell's output on ``stream``."""

    def input_request(self, call: int, body: bytearray) -> None:
        """The cell called ``input()``: its call number and prompt."""

    def take_interrupt(self) -> bool:
        """Whether the caller asked for an interrupt since the last look (each asked once)."""


class BlobRefused(Exception):
    """The sandbox asked for a blob it may not have, or its blob is damaged: the message says why (the value is
    lost to the worker)."""


class BlobUnavailable(Exception):
    """The blob cannot be served now but may be later (the host is short of descriptors or memory, or the key was
    handed out as often as it may be until the next restore): the value stays deferred."""


class Served(NamedTuple):
    """A blob handed out: a read-only descriptor of it (``fd``, one hop) or its mapping (``body``), of ``size``
    bytes. The channel that sends the answer owns it and calls ``close`` once it is sent or dropped."""

    size: int
    fd: int | None
    body: memoryview
    close: Callable[[], None]


class BlobServer(Protocol):
    """The blobs of a sandbox's deferred values (``runtime.deferred.DeferredBlobs``)."""

    def serve(self, payload: object, *, as_file: bool = False) -> Served:
        """The blob a ``BLOB_CALL`` asks for (BlobRefused, BlobUnavailable: why not)."""

    def verdict(self, payload: object) -> bool:
        """The answer to a ``BLOB_CHECK_CALL``: whether the blob handed out matched its digest."""


@dataclass(frozen=True)
class Call:
    """One request's side arguments: every byte both ways moves before ``deadline`` (``time.monotonic()``).

    ``checkpoint_seconds``: once the cell ended (the worker's ``cell_done``), the
    deadline moves to that many seconds from then, once. Host calls go to ``desk`` (without one, each is answered
    with an error); output and ``input()`` to ``live``, which may also ask for an interrupt; the agent's requests for
    deferred values' blobs to ``blobs`` (without it, refused). ``value_fd`` (a request without a body, on a carrier
    that passes descriptors): a ``set_value``'s value file, sent with the request.
    """

    deadline: float
    checkpoint_seconds: float | None = None
    desk: HostCallDesk | None = None
    live: LiveEvents | None = None
    blobs: BlobServer | None = None
    value_fd: int | None = None
