"""How blobs are named and framed on both sides: content digests, host-made blobs, value files, the blob call.

A checkpoint's values travel and are stored as blobs, each named by its content digest; a str
or bytes value the controller made is a host-made blob (docs/protocol.md, "Host-made blobs").
"""

from __future__ import annotations

import hashlib
import re
import struct
from typing import Any, List, TypedDict, Union, cast

from .framing import Body
from .protocol import BadRequest

# Host-made blobs (docs/protocol.md, "Host-made blobs"): a str or bytes value the controller made
# (set_value with ``blob``) is checkpointed as a protocol-4 pickle the controller writes by hand
# around the raw bytes, and named by a fresh random id of its own shape, not by a content digest.
HOST_BLOB_KINDS = ("str", "bytes")
HOST_BLOB_ID = re.compile(r"h[0-9a-f]{32}")  # content digests are 32 lowercase hex: never an "h"
HOST_BLOB_OVERHEAD = 12  # PROTO 4 (2 bytes), BINUNICODE8 or BINBYTES8 with its 8-byte length (9), STOP (1)
_HOST_BLOB_OPCODES = {"str": b"\x8d", "bytes": b"\x8e"}  # pickle.BINUNICODE8, pickle.BINBYTES8 (PEP 3154)
_HOST_BLOB_LENGTH = struct.Struct("<Q")


def blob_hash(data: Union[bytes, bytearray, memoryview] = b"") -> Any:
    """A running content digest of blob bytes (``.update``, ``.hexdigest``): blob names on both sides of the channel."""
    return hashlib.blake2b(data, digest_size=16)


def blob_digest(data: Union[bytes, bytearray, memoryview]) -> str:
    """The content digest naming a blob."""
    return str(blob_hash(data).hexdigest())


def is_host_blob(blob_id: object) -> bool:
    """True for the id of a host-made blob (``h`` and 32 lowercase hex), False for a content digest or anything else."""
    return isinstance(blob_id, str) and HOST_BLOB_ID.fullmatch(blob_id) is not None


def host_blob_parts(kind: str, raw: Union[bytes, bytearray, memoryview]) -> List[Body]:
    """The blob of a host-made str (``raw`` its UTF-8 with surrogatepass) or bytes value, as parts, ``raw`` not copied.

    Back to back they are a protocol-4 pickle (``PROTO 4``, ``BINUNICODE8`` or ``BINBYTES8`` and
    the 8-byte little-endian length, the bytes, ``STOP``) that ``pickle.loads`` turns into the value.
    """
    return [b"\x80\x04" + _HOST_BLOB_OPCODES[kind] + _HOST_BLOB_LENGTH.pack(len(raw)), raw, b"."]


def host_blob_framed(blob: Union[bytes, bytearray, memoryview]) -> bool:
    """True when ``blob`` has the frame of a host-made blob, whole (it has no digest to check)."""
    view = memoryview(blob).cast("B")
    size = len(view)
    return (
        size >= HOST_BLOB_OVERHEAD
        and view[0] == 0x80
        and view[1] == 4
        and bytes(view[2:3]) in (b"\x8d", b"\x8e")
        and _HOST_BLOB_LENGTH.unpack_from(view, 3)[0] == size - HOST_BLOB_OVERHEAD
        and view[size - 1] == 0x2E
    )


VALUE_FILE_MIN_BYTES = 1 << 20
"""A host-made blob at least this big goes to a local sandbox as a file, not as the frame's body."""


def value_file_name(blob_id: str) -> str:
    """A value file's name (``set_value``'s ``file``): ``value-<blob id>``."""
    return "value-" + blob_id


class BlobCall(TypedDict):
    """The payload of a ``BLOB_CALL`` host call: the checkpoint key of a deferred value and its blob."""

    key: str  # the checkpoint key (``<context>/<name>`` in a context)
    digest: str  # the blob the ``defer`` named


def blob_call(key: str, digest: str) -> BlobCall:
    return BlobCall(key=key, digest=digest)


def read_blob_call(payload: object) -> BlobCall:
    """A ``BLOB_CALL``'s payload, as the controller reads it (it comes from the sandbox: hostile).

    Raises:
        BadRequest: it is not an object with a str key and a str digest.
    """
    if not isinstance(payload, dict) or not isinstance(payload.get("key"), str):
        raise BadRequest("a blob call needs a key and a digest")
    if not isinstance(payload.get("digest"), str):
        raise BadRequest("a blob call needs a key and a digest")
    return cast(BlobCall, payload)
