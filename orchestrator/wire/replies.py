"""Typed views of the agent's messages: one parse function per kind, each validating every field it returns.

The host never trusts what an agent sends (cell code can forge frames): a field of the wrong
type or size is a ``ProtocolError`` here, so the code above handles typed values only. The
messages and the shapes both sides share are defined in ``agent/reply_types.py`` (docs/protocol.md);
the views here that differ from a message (clipped, defaults filled in) are the host's own.
"""

from __future__ import annotations

import re
from typing import Any, TypedDict, TypeVar, cast

from ..agent import checkpoint_names, framing, protocol, request_table
from ..agent.handshake import Hello
from ..agent.protocol import Status
from ..agent.reply_types import BlobEntry, CheckpointDelta, ExecReply, FileChange, FilesDelta, Goodbye, LoadReply
from ..errors import ProtocolError, TransportError
from ..safe_text import visible

DIGEST = re.compile(r"^[0-9a-f]{32}\Z")
"""A content digest: the id of a blob the agent made."""
BLOB_ID = re.compile(r"^h?[0-9a-f]{32}\Z")
"""Any blob id: a content digest, or the ``h``-prefixed random id of a host-made blob (``blob_format.HOST_BLOB_ID``)."""

MAX_FILE_ENTRIES = 100_000
"""Entries of a workspace (files, directories, links), whatever a session's ``workspace_files``; so of a delta's
``files`` lists too."""
MAX_PATH_CHARS = 4096
"""A workspace path or link target: 4,096 bytes (PATH_MAX), so at most as many characters."""

T = TypeVar("T")
_MAX_ENTRIES = (
    4 * checkpoint_names.MAX_CHECKPOINT_NAMES
)  # of a delta's lists: past the manifest's bound, work stays bounded
_MAX_REASON = checkpoint_names.MAX_REASON_CHARS
_MAX_COUNT = (1 << 63) - 1  # generations, byte counts: what the agent can count in a lifetime
_MAX_SECONDS = 10_000_000.0  # a reported duration past this (115 days) is a lie; the host clamps it anyway
_MAX_TEXT = 64  # versions, ids, phases: short labels
_MAX_INSTALL_REASON = 10_000  # a scaffold's traceback (the agent sends at most 8000 characters)

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
    if type(value) is kind:  # the usual case, decided without building a tuple
        return value
    if value is None and optional:
        return value  # type: ignore[return-value]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise ProtocolError(f"agent message field {key!r} should be {kind}, got {type(value).__name__}")
    return value  # type: ignore[return-value]


def expect_count(header: dict[str, Any], key: str, limit: int = _MAX_COUNT, *, optional: bool = False) -> int:
    """An integer from 0 to ``limit`` (a size, a count, a generation), else ProtocolError."""
    value = expect(header, key, int, optional=optional)
    if value is not None and not 0 <= value <= limit:
        raise ProtocolError(f"agent message field {key!r} should be from 0 to {limit}, got {value}")
    return value


def expect_seconds(header: dict[str, Any], key: str) -> float:
    """A duration: a finite number of seconds from 0 to _MAX_SECONDS, else ProtocolError (strict JSON has no NaN)."""
    value: float = expect(header, key, (int, float))
    if not 0 <= value <= _MAX_SECONDS:  # False for NaN too; an int is compared before float() could overflow
        raise ProtocolError(
            f"agent message field {key!r} should be from 0 to {_MAX_SECONDS:g} seconds, got {_shown(value)}"
        )
    return float(value)


def _shown(value: float) -> str:
    """A number for an error message: an int too large for a float (or for ``str``) by its size."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    return f"{value:.6g}"


def expect_str_map(
    header: dict[str, Any], key: str, *, entries: int = _MAX_ENTRIES, key_chars: int, value_chars: int
) -> dict[str, str]:
    """A JSON object of string to string (variable names to digests or reasons), every part bounded."""
    value = expect(header, key, dict)
    if value and (  # most are empty: no generator to make
        len(value) > entries
        or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= key_chars and len(v) <= value_chars
            for k, v in value.items()
        )
    ):
        raise ProtocolError(
            f"agent message field {key!r} should map at most {entries} names of at most {key_chars} characters "
            f"to strings of at most {value_chars}"
        )
    return value


def _label(header: dict[str, Any], key: str, default: str = "") -> str:
    """A short label (a version, a phase): clipped, control characters made visible (it is logged)."""
    value = header.get(key, default)
    return visible(value[:_MAX_TEXT], multiline=False) if isinstance(value, str) else default


def reply_reason(header: dict[str, Any], default: str) -> str:
    """Why the agent says something failed: its text, clipped (anything but a str is the default)."""
    value = header.get("reason", default)
    return value[:_MAX_REASON] if isinstance(value, str) else default


def _expect_type(header: dict[str, Any], *kinds: str) -> str:
    kind = header.get("type")
    if kind not in kinds:
        raise ProtocolError(f"expected {' or '.join(kinds)} from the agent, got {str(kind)[:64]!r}")
    return cast(str, kind)


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
        sandbox_id=expect(header, "sandbox_id", str)[:_MAX_TEXT],
        generation=expect_count(header, "generation"),
        python=_label(header, "python"),
        dill=_label(header, "dill"),
        nonce=nonce,
        capabilities=_capabilities(header),
    )


_MAX_CAPABILITIES = 8


def _capabilities(header: dict[str, Any]) -> list[str]:
    """What the agent offers besides its version: a few short strings; anything else is ignored, never an error."""
    offered = header.get("capabilities")
    if not isinstance(offered, list):
        return []
    return [item for item in offered[:_MAX_CAPABILITIES] if isinstance(item, str) and len(item) <= _MAX_TEXT]


def parse_auth_ok(header: dict[str, Any]) -> str:
    """The agent's proof that it knows the sandbox's secret."""
    _expect_type(header, protocol.AUTH_OK)
    return expect(header, "proof", str)


class TakenOver(TransportError):
    """The agent said goodbye: another controller owns this sandbox now."""

    def __init__(self, goodbye: Goodbye) -> None:
        super().__init__(f"the agent moved to another controller ({goodbye['reason']})")
        self.goodbye = goodbye


def parse_goodbye(header: dict[str, Any]) -> Goodbye:
    _expect_type(header, protocol.GOODBYE)
    in_flight = header.get("in_flight")
    return Goodbye(
        reason=_label(header, "reason"), in_flight=in_flight[:_MAX_TEXT] if isinstance(in_flight, str) else None
    )


def parse_delta(header: dict[str, Any]) -> CheckpointDelta:
    """The ``checkpoint`` of a reply, every field typed and bounded; the names themselves the ledger checks."""
    delta = expect(header, "checkpoint", dict)
    listed = expect(delta, "blobs", list)
    if len(listed) > _MAX_ENTRIES:
        raise ProtocolError(f"checkpoint lists {len(listed)} blobs, more than {_MAX_ENTRIES}")
    entries: list[BlobEntry] = []
    for entry in listed:
        if not isinstance(entry, dict):
            raise ProtocolError("checkpoint blob entries must be objects")
        blob_digest = expect(entry, "digest", str)
        size = expect_count(entry, "size", framing.MAX_BODY_BYTES)
        if not DIGEST.match(blob_digest):
            raise ProtocolError("checkpoint blob entries need a 32-hex digest")
        entries.append(BlobEntry(digest=blob_digest, size=size))
    if entries and len({entry["digest"] for entry in entries}) != len(entries):
        raise ProtocolError("checkpoint lists a blob twice")
    key_chars = checkpoint_names.MAX_UNSAVED_KEY_CHARS
    changed = expect_str_map(delta, "vars", key_chars=key_chars, value_chars=33)
    if changed and not all(BLOB_ID.match(d) for d in changed.values()):  # a content digest, or a host-made blob's id
        raise ProtocolError("checkpoint names must map to blob ids (32-hex digests or host-made ids)")
    deleted = expect(delta, "deleted", list)
    if deleted and (
        len(deleted) > _MAX_ENTRIES or not all(isinstance(name, str) and len(name) <= key_chars for name in deleted)
    ):
        raise ProtocolError(f"checkpoint 'deleted' must list at most {_MAX_ENTRIES} names")
    parsed = CheckpointDelta(
        generation=expect_count(delta, "generation"),
        blobs=entries,
        vars=changed,
        deleted=deleted,
        unsaved=_unsaved(delta, key_chars),
    )
    if delta.get("files") is not None:
        parsed["files"] = _parse_files(expect(delta, "files", dict))
    return parsed


def _parse_files(files: dict[str, Any]) -> FilesDelta:
    """A delta's ``files``, typed and bounded, no path listed twice; the paths and entries the ledger checks
    (``state/files.py``)."""
    listed, deleted = expect(files, "changed", list), expect(files, "deleted", list)
    if len(listed) > MAX_FILE_ENTRIES or len(deleted) > MAX_FILE_ENTRIES:
        raise ProtocolError(f"checkpoint files list more than {MAX_FILE_ENTRIES} paths")
    changed = [_file_change(entry) for entry in listed]
    if not all(isinstance(path, str) and len(path) <= MAX_PATH_CHARS for path in deleted):
        raise ProtocolError(f"checkpoint files 'deleted' must list paths of at most {MAX_PATH_CHARS} characters")
    if len({entry[0] for entry in changed}) != len(changed) or len(set(deleted)) != len(deleted):
        raise ProtocolError("checkpoint files list a path twice")
    return FilesDelta(changed=changed, deleted=deleted, unsaved=_unsaved(files, MAX_PATH_CHARS))


def _unsaved(header: dict[str, Any], key_chars: int) -> dict[str, str]:
    """An ``unsaved`` report: at most ``MAX_UNSAVED_NAMES`` names of ``key_chars`` with their reasons."""
    return expect_str_map(
        header,
        "unsaved",
        entries=checkpoint_names.MAX_UNSAVED_NAMES,
        key_chars=key_chars,
        value_chars=checkpoint_names.MAX_REASON_CHARS,
    )


def _file_change(entry: object) -> FileChange:
    """``[path, kind, mode, mtime_ns, ref, size]``: strings bounded, numbers ints, the size one a body can carry."""
    if not isinstance(entry, list) or len(entry) != 6:
        raise ProtocolError("checkpoint files 'changed' entries must be [path, kind, mode, mtime_ns, ref, size]")
    path, kind, mode, mtime_ns, ref, size = entry
    if not (
        isinstance(path, str)
        and len(path) <= MAX_PATH_CHARS
        and isinstance(kind, str)
        and len(kind) == 1
        and isinstance(ref, str)
        and len(ref) <= MAX_PATH_CHARS
        and all(type(number) is int for number in (mode, mtime_ns, size))
        and 0 <= size <= framing.MAX_BODY_BYTES
    ):
        raise ProtocolError(
            f"checkpoint files 'changed' entries need a path and ref of at most {MAX_PATH_CHARS} characters, a "
            f"one-letter kind, an integer mode and mtime and a size from 0 to {framing.MAX_BODY_BYTES}"
        )
    return (path, kind, mode, mtime_ns, ref, size)


class WorkerFailure(TypedDict):
    """A reply saying the worker did not finish the request normally (it was replaced, or the cell timed out)."""

    status: Status
    reason: str
    oom: bool
    ran: bool
    worker_restarted: bool
    phase: str
    signal: str | None
    """The signal that ended the worker, as its supervisor saw it from ``waitpid`` (None: it exited, or the field is
    not a signal's name)."""


_SIGNAL_NAME = re.compile(r"SIG[A-Z0-9]{1,12}\Z")


def is_signal_name(value: object) -> bool:
    """Whether ``value`` is a signal's name as the agent writes it (``SIGSEGV``, ``SIG40``)."""
    return isinstance(value, str) and _SIGNAL_NAME.match(value) is not None


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
        reason=reply_reason(header, "the worker died"),
        oom=header.get("oom") is True,
        ran=header.get("ran") is not False,
        worker_restarted=restarted,
        phase=_label(header, "phase", "cell"),
        signal=header["signal"] if is_signal_name(header.get("signal")) else None,
    )


def parse_exec_reply(header: dict[str, Any]) -> ExecReply:
    """A completed (or interrupted) cell, its optional fields filled in; call ``worker_failure`` first."""
    _expect_type(header, request_table.EXEC_REPLY)
    error = header.get("error")
    if error is not None and not isinstance(error, dict):
        raise ProtocolError("agent reply field 'error' should be an object")
    return ExecReply(
        status=parse_status(header),
        stdout=expect(header, "stdout", str),
        stderr=expect(header, "stderr", str),
        stdout_bytes=expect_count(header, "stdout_bytes"),
        stderr_bytes=expect_count(header, "stderr_bytes"),
        return_value=expect(header, "return_value", str, optional=True),
        error=error,
        duration=expect_seconds(header, "duration"),
        checkpoint_duration=expect_seconds(header, "checkpoint_duration"),
        checkpoint=parse_delta(header),
        scaffold=expect(header, "scaffold", dict, optional=True),
        output_limited=expect(header, "output_limited", bool, optional=True) is True,
    )


def parse_install_reply(header: dict[str, Any]) -> str | None:
    """None when the scaffold was installed, else why not; call ``worker_failure`` first."""
    _expect_type(header, request_table.INSTALL_REPLY)
    if parse_status(header) == protocol.STATUS_OK:
        return None
    return expect(header, "reason", str)[:_MAX_INSTALL_REASON]


def parse_state_reply(header: dict[str, Any]) -> CheckpointDelta:
    _expect_type(header, request_table.STATE_REPLY)
    return parse_delta(header)


def parse_load_reply(header: dict[str, Any]) -> LoadReply:
    """The outcome of a load, with a ``reason`` ("" when the agent gave none)."""
    _expect_type(header, request_table.LOAD_REPLY, request_table.EXEC_REPLY)
    return LoadReply(status=parse_status(header), reason=reply_reason(header, ""))


def parse_restore_reply(header: dict[str, Any]) -> int | None:
    """The generation a ``restore_end`` set (None for ``restore_begin``)."""
    _expect_type(header, request_table.RESTORE_REPLY)
    if parse_status(header) != protocol.STATUS_OK:
        raise ProtocolError(f"restore failed in the agent: {reply_reason(header, '')}")
    return expect_count(header, "generation", optional=True)
