"""Typed views of the agent's messages: one parse function per kind, each validating every field it returns.

The host never trusts what an agent sends (cell code can forge frames): a field of the wrong
type or size is a ``ProtocolError`` here, so the code above handles typed values only. The
wire format itself is ``agent/protocol.py`` (see docs/protocol.md).
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict, TypeVar, cast

from .agent import protocol
from .errors import ProtocolError
from .store import BLOB_ID, DIGEST

T = TypeVar("T")
_MAX_NAMES = 100_000
_MAX_REASON = 2000

Status = Literal["ok", "error", "timeout", "crashed", "protocol_error"]
_STATUSES = {
    protocol.STATUS_OK,
    protocol.STATUS_ERROR,
    protocol.STATUS_TIMEOUT,
    protocol.STATUS_CRASHED,
    protocol.STATUS_PROTOCOL_ERROR,
}


def expect(header: dict[str, Any], key: str, kind: type[T] | tuple[type, ...], *, optional: bool = False) -> T:
    """Return ``header[key]`` if it has the expected type, else raise ProtocolError."""
    value = header.get(key)
    if value is None and optional:
        return value  # type: ignore[return-value]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise ProtocolError(f"agent message field {key!r} should be {kind}, got {type(value).__name__}")
    return value  # type: ignore[return-value]


def expect_str_map(header: dict[str, Any], key: str) -> dict[str, str]:
    """A JSON object of string to string (variable names to digests or reasons)."""
    value = expect(header, key, dict)
    if len(value) > _MAX_NAMES or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ProtocolError(f"agent message field {key!r} should map names to strings")
    return value


def _expect_type(header: dict[str, Any], *kinds: str) -> str:
    kind = header.get("type")
    if kind not in kinds:
        raise ProtocolError(f"expected {' or '.join(kinds)} from the agent, got {str(kind)[:64]!r}")
    return cast(str, kind)


class Hello(TypedDict):
    protocol: int
    sandbox_id: str
    generation: int
    python: str
    dill: str
    nonce: str


def parse_hello(header: dict[str, Any]) -> Hello:
    _expect_type(header, protocol.HELLO)
    version = expect(header, "protocol", int)
    if version != protocol.PROTOCOL_VERSION:
        raise ProtocolError(
            f"the agent speaks protocol {version}, this controller {protocol.PROTOCOL_VERSION}: "
            "rebuild the image with `orchestrator image build`"
        )
    nonce = expect(header, "nonce", str)
    if not 16 <= len(nonce) <= 128:
        raise ProtocolError("the agent's hello carries no usable nonce")
    return Hello(
        protocol=version,
        sandbox_id=expect(header, "sandbox_id", str),
        generation=expect(header, "generation", int),
        python=str(header.get("python", ""))[:64],
        dill=str(header.get("dill", ""))[:64],
        nonce=nonce,
    )


def parse_auth_ok(header: dict[str, Any]) -> str:
    """The agent's proof that it knows the sandbox's secret."""
    _expect_type(header, protocol.AUTH_OK)
    return expect(header, "proof", str)


class Goodbye(TypedDict):
    reason: str
    in_flight: str | None


def parse_goodbye(header: dict[str, Any]) -> Goodbye:
    _expect_type(header, protocol.GOODBYE)
    in_flight = header.get("in_flight")
    return Goodbye(
        reason=str(header.get("reason", ""))[:200], in_flight=in_flight if isinstance(in_flight, str) else None
    )


class BlobEntry(TypedDict):
    digest: str
    size: int


class CheckpointDelta(TypedDict):
    generation: int
    blobs: list[BlobEntry]
    vars: dict[str, str]
    deleted: list[str]
    unsaved: dict[str, str]


def parse_delta(header: dict[str, Any]) -> CheckpointDelta:
    delta = expect(header, "checkpoint", dict)
    entries: list[BlobEntry] = []
    for entry in expect(delta, "blobs", list):
        if not isinstance(entry, dict):
            raise ProtocolError("checkpoint blob entries must be objects")
        blob_digest = expect(entry, "digest", str)
        size = expect(entry, "size", int)
        if not DIGEST.match(blob_digest) or size < 0:
            raise ProtocolError("checkpoint blob entries need a 32-hex digest and a size >= 0")
        entries.append(BlobEntry(digest=blob_digest, size=size))
    changed = expect_str_map(delta, "vars")
    if not all(BLOB_ID.match(d) for d in changed.values()):  # a content digest, or a host-made blob's id
        raise ProtocolError("checkpoint names must map to blob ids (32-hex digests or host-made ids)")
    deleted = expect(delta, "deleted", list)
    if len(deleted) > _MAX_NAMES or not all(isinstance(name, str) for name in deleted):
        raise ProtocolError("checkpoint 'deleted' must list names")
    return CheckpointDelta(
        generation=expect(delta, "generation", int),
        blobs=entries,
        vars=changed,
        deleted=deleted,
        unsaved=expect_str_map(delta, "unsaved"),
    )


class WorkerFailure(TypedDict):
    """A reply saying the worker did not finish the request normally (it was replaced, or the cell timed out)."""

    status: Status
    reason: str
    oom: bool
    ran: bool
    worker_restarted: bool
    phase: str


def parse_status(header: dict[str, Any]) -> Status:
    status = header.get("status")
    if status not in _STATUSES:
        raise ProtocolError(f"unknown reply status {str(status)[:64]!r}")
    return cast(Status, status)


def worker_failure(header: dict[str, Any]) -> WorkerFailure | None:
    """The failure a reply reports; None when the worker answered (``ok``, ``error``, a cell stopped by SIGINT)."""
    status = parse_status(header)
    restarted = header.get("worker_restarted") is not False
    if status in (protocol.STATUS_OK, protocol.STATUS_ERROR) or (status == protocol.STATUS_TIMEOUT and not restarted):
        return None
    return WorkerFailure(
        status=status,
        reason=str(header.get("reason", "the worker died"))[:_MAX_REASON],
        oom=header.get("oom") is True,
        ran=header.get("ran") is not False,
        worker_restarted=restarted,
        phase=str(header.get("phase", "cell"))[:32],
    )


class ExecReply(TypedDict):
    status: Status
    stdout: str
    stderr: str
    stdout_bytes: int
    stderr_bytes: int
    return_value: str | None
    error: dict[str, Any] | None
    duration: float
    checkpoint_duration: float
    checkpoint: CheckpointDelta
    scaffold: dict[str, Any] | None
    output_limited: bool  # the cell's output passed the exec's ``output_cap`` (absent in the header: False)


def parse_exec_reply(header: dict[str, Any]) -> ExecReply:
    """A completed (or interrupted) cell; call ``worker_failure`` first."""
    _expect_type(header, protocol.EXEC_REPLY)
    error = header.get("error")
    if error is not None and not isinstance(error, dict):
        raise ProtocolError("agent reply field 'error' should be an object")
    return ExecReply(
        status=parse_status(header),
        stdout=expect(header, "stdout", str),
        stderr=expect(header, "stderr", str),
        stdout_bytes=expect(header, "stdout_bytes", int),
        stderr_bytes=expect(header, "stderr_bytes", int),
        return_value=expect(header, "return_value", str, optional=True),
        error=error,
        duration=float(expect(header, "duration", (int, float))),
        checkpoint_duration=float(expect(header, "checkpoint_duration", (int, float))),
        checkpoint=parse_delta(header),
        scaffold=expect(header, "scaffold", dict, optional=True),
        output_limited=expect(header, "output_limited", bool, optional=True) is True,
    )


def parse_install_reply(header: dict[str, Any]) -> str | None:
    """None when the scaffold was installed, else why not; call ``worker_failure`` first."""
    _expect_type(header, protocol.INSTALL_REPLY)
    if parse_status(header) == protocol.STATUS_OK:
        return None
    return expect(header, "reason", str)


def parse_state_reply(header: dict[str, Any]) -> CheckpointDelta:
    _expect_type(header, protocol.STATE_REPLY)
    return parse_delta(header)


class LoadReply(TypedDict):
    status: Status
    reason: str


def parse_load_reply(header: dict[str, Any]) -> LoadReply:
    _expect_type(header, protocol.LOAD_REPLY, protocol.EXEC_REPLY)
    return LoadReply(status=parse_status(header), reason=str(header.get("reason", ""))[:_MAX_REASON])


def parse_restore_reply(header: dict[str, Any]) -> int | None:
    """The generation a ``restore_end`` set (None for ``restore_begin``)."""
    _expect_type(header, protocol.RESTORE_REPLY)
    if parse_status(header) != protocol.STATUS_OK:
        raise ProtocolError(f"restore failed in the agent: {str(header.get('reason', ''))[:_MAX_REASON]}")
    return expect(header, "generation", int, optional=True)
