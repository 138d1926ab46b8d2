"""The replies the agent sends: their fields besides ``type`` and ``id`` (docs/protocol.md says what each means).

The host trusts none of them: wire/replies.py checks every field it returns in these shapes,
and fills in the optional ones it uses.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple, TypedDict

from .protocol import HOST_REPLY, STATUS_ERROR, STATUS_OK, Status


class _HostReplyFields(TypedDict):
    type: str
    call: int  # the host call's number
    status: str  # STATUS_OK (the body is the JSON result) or STATUS_ERROR


class HostReply(_HostReplyFields, total=False):
    """The controller's answer to a host call, on the worker's call link (K)."""

    error: str  # why it failed (status error): the cell's host_call raises HostCallError with it
    file: int  # a BLOB_CALL's answer only: no body, the blob is the read-only file that came with the
    # frame's first byte (SCM_RIGHTS), and this is its size


def host_reply(call: int, error: Optional[str] = None) -> HostReply:
    """The answer to host call ``call``: ok (its result is the body), or failed with ``error``."""
    if error is None:
        return HostReply(type=HOST_REPLY, call=call, status=STATUS_OK)
    return HostReply(type=HOST_REPLY, call=call, status=STATUS_ERROR, error=error)


def host_reply_file(call: int, size: int) -> HostReply:
    """The answer to a ``BLOB_CALL`` whose blob comes as a descriptor of its file, of ``size`` bytes."""
    return HostReply(type=HOST_REPLY, call=call, status=STATUS_OK, file=size)


class Goodbye(TypedDict):
    """The agent leaves this connection for another controller's (docs/protocol.md, "Takeover")."""

    reason: str
    in_flight: Optional[str]  # the id of the request it abandoned, if one ran


class BlobEntry(TypedDict):
    digest: str  # blob_digest of the blob: the blobs travel in the reply's body in this order
    size: int


FileChange = Tuple[str, str, int, int, str, int]
"""A workspace path's new state: path, kind ("f", "d", "l"), mode, mtime_ns, ref (a file's blob digest, a link's
target, "" for a directory), size (a file's bytes, else 0); on the wire a JSON array."""


class FilesDelta(TypedDict):
    """What a request changed under /workspace (docs/design/workspace.md, "The delta")."""

    changed: List[FileChange]
    deleted: List[str]  # paths; a directory takes what it held with it
    unsaved: Dict[str, str]  # path -> why it is not saved: every such path of the workspace, whenever files is sent


class _CheckpointDeltaFields(TypedDict):
    generation: int
    blobs: List[BlobEntry]
    vars: Dict[str, str]  # checkpoint key -> blob id
    deleted: List[str]
    unsaved: Dict[str, str]  # checkpoint key -> why it is not saved


class CheckpointDelta(_CheckpointDeltaFields, total=False):
    """What a request changed in the checkpoint (docs/protocol.md, "Requests and replies")."""

    files: FilesDelta  # absent: no file changed, and the workspace's unsaved paths are as they were


class _ExecReplyFields(TypedDict):
    status: Status
    stdout: str  # the first output_limit bytes of each stream ...
    stderr: str
    stdout_bytes: int  # ... of this many the cell wrote
    stderr_bytes: int
    return_value: Optional[str]  # the repr of the cell's last expression
    error: Optional[Dict[str, Any]]  # what the cell raised
    duration: float
    checkpoint_duration: float
    checkpoint: CheckpointDelta


class ExecReply(_ExecReplyFields, total=False):
    """The reply to ``exec``."""

    scaffold: Optional[Dict[str, Any]]  # what the scaffold's after_cell returned
    output_limited: bool  # true: the cell's output passed the exec's ``output_cap``


class _LoadReplyFields(TypedDict):
    status: Status


class LoadReply(_LoadReplyFields, total=False):
    """The reply to ``load``."""

    reason: str  # why it failed
