"""The names of the wire format that both sides share: its version, the message types, the statuses, host calls.

Standard library only: every module of the wire format is copied into sandbox images and must
run on the image's Python (3.9 and later: no ``X | Y`` at run time, no ``match``). The format
is split by job, each module one of them:

- ``framing``: a frame's bytes (prefix, strict-JSON header, raw body), its limits and its I/O;
- ``handshake``: the sandbox secret and the connection's hello / auth exchange;
- ``checkpoint_names``: which keys a checkpoint manifest may hold, and its bounds;
- ``blob_format``: blob digests, host-made blobs, value files and the deferred-value host call;
- ``request_table``: each request defined once for both sides (its type and its reply's, fields,
  builder, reader) and ``REQUESTS``, its row: the reply that answers it, its ladder phase, the
  worker's handler;
- ``reply_types``: the shapes of the replies the agent sends (checked on the host by ``wire/replies.py``).
"""

from __future__ import annotations

from typing import Literal

PROTOCOL_VERSION = 8

# Host calls (docs/protocol.md): their bounds and reserved names.
HOST_CALL_MAX_BYTES = 16 << 20  # default bound of one host call's JSON payload or result
HOST_CALL_HEADER_BYTES = 64 << 10  # a host call's frame header holds its number and handler name
# Why a host call is answered ``error`` without reaching a handler: no exec's cell ran when it was made, or the cell
# that made it ended before its answer came (a late answer is dropped, never given to a later cell).
CALL_NO_CELL = "no cell is running: host calls are answered only while a cell runs"
CALL_ENDED = "the cell that made this host call has ended"
OUTPUT_STREAMS = ("stdout", "stderr")  # the ``stream`` of an ``output`` frame
# input() of a cell is a host call of this reserved name; its wait does not count toward the cell's timeout.
INPUT_CALL = "__input__"
# A value a restore deferred (``defer``) is fetched on first use by a host call of this reserved name: the
# controller answers it itself from the store, with the raw blob as the body (docs/protocol.md, "Deferred values").
BLOB_CALL = "__blob__"
# ... and unpickled while the controller checks the blob against its digest; this call (same payload) asks its
# verdict before the value is bound: the answer is JSON true, or an error saying why the value is lost.
BLOB_CHECK_CALL = "__blob_check__"
# How the controller's refusal of either call begins: the value is lost. Any other failure of the call (no cell
# running, the link or the controller gone) leaves it deferred.
BLOB_REFUSED = "deferred value not served: "
# How the controller's answer to either call begins when it cannot serve the blob now but may later (the host is out
# of descriptors or memory, or the key was handed out as often as it may be until the next restore): the value stays
# deferred. It does not begin with BLOB_REFUSED, so an agent of protocol 7 (which keeps the value on any other
# failure of the call) reads it as this one does: ``DeferredValueUnavailable``.
BLOB_UNAVAILABLE = "deferred value not available now, try later: "

# --- Message types -----------------------------------------------------------------------------------------
# Every frame's ``type`` but the requests' and their replies' (``request_table``, with each request's fields,
# builder, reader and row; the replies' fields are in ``reply_types``).

# Connection set-up (docs/protocol.md): hello (agent), auth (controller), auth_ok (agent).
HELLO = "hello"  # also the worker's first frame to the supervisor: {python, dill, pid}
AUTH = "auth"
AUTH_OK = "auth_ok"
# Requests and their replies: their types are in ``request_table``. Notices the agent sends:
ERROR = "error"  # the reply to a request of a type the agent does not know: status protocol_error, ran false
GOODBYE = "goodbye"
# Worker -> controller on D: the cell finished, checkpointing starts (its own time limit).
CELL_DONE = "cell_done"
# Host calls (docs/protocol.md): worker -> controller on K while a cell runs, and the answer back.
HOST_CALL = "host_call"
HOST_REPLY = "host_reply"
# Output (docs/protocol.md): worker -> controller on K while a cell runs.
OUTPUT = "output"
# Controller -> supervisor: ``interrupt {id, phase}``, the ladder's signal of ``phase`` (SIGINT for a cell or a
# load, SIGUSR2 for a checkpoint).
INTERRUPT = "interrupt"
# The data channel (docs/design/one-hop.md): right after ``auth_ok`` the controller sends, on the connection, a
# ``data_channel`` frame carrying
# (SCM_RIGHTS) one end of each of two socket pairs it made: requests and replies (D), then host calls and output
# (K). The supervisor passes them to its worker, which serves them directly; when the controller closes them the
# worker tells the supervisor ``idle {generation}`` and waits for the next. ``worker_lost {reason, oom}``:
# supervisor -> controller, the worker died or misbehaved and a fresh one replaced it (the data channel died with
# it). The controller keeps the ladder's clock and asks: ``interrupt {id, phase}`` and ``kill {id}``, answered
# ``worker_replaced {id, reason, oom}``.
# A deferred value's blob may come as a descriptor of its file (``host_reply {file}``): offered by an
# agent whose worker maps it; an older one gets the body.
BLOB_FILES = "blob_files"
DATA_CHANNEL = "data_channel"
DATA_CHANNEL_FDS = 2  # requests and replies, host calls: a data_channel frame carries exactly these
WORKER_IDLE = "idle"
WORKER_LOST = "worker_lost"
KILL = "kill"
WORKER_REPLACED = "worker_replaced"
INTERRUPT_PHASES = ("cell", "load", "checkpoint")
# The relayed carrier (docs/design/one-hop.md, "Carriers"): an agent that offers RELAYED in its hello takes it when the
# controller's auth says ``relayed: true``. The ``data_channel`` frame then carries no
# descriptors: the supervisor makes the worker's pairs and forwards their bytes on its connection, both ways, in
# ``relay {stream, channel}`` frames: the body is the stream's next bytes (at most RELAY_CHUNK), an empty one says
# that end closed (agent/control.py builds them).
RELAYED = "relayed"
RELAY = "relay"
RELAY_REQUESTS = "D"  # requests and replies
RELAY_CALLS = "K"  # host calls and output
RELAY_STREAMS = (RELAY_REQUESTS, RELAY_CALLS)
RELAY_CHUNK = 256 << 10

# Outcomes of a request as the agent reports them in ``status``.
STATUS_OK = "ok"
STATUS_ERROR = "error"
STATUS_TIMEOUT = "timeout"
STATUS_CRASHED = "crashed"
STATUS_PROTOCOL_ERROR = "protocol_error"
Status = Literal["ok", "error", "timeout", "crashed", "protocol_error"]


class BadRequest(Exception):
    """A request lacks a field the agent needs, or has it of the wrong type: the agent replies with this reason."""
