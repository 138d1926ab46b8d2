"""Value files: a local ``set_value`` whose host-made blob comes to the worker as a descriptor on its data channel.

The controller sends ``file`` with an empty body and the file's descriptor attached (docs/protocol.md, "Value
files"); here the test plays the controller. A file that is missing, of another size, not a blob's frame or misnamed
is an error reply (the worker keeps serving, and keeps no descriptor); a descriptor is never left open in the worker.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from orchestrator.agent import blob_format, protocol, request_table

TEXT = "a document ✓ with a lone \ud800 surrogate\n" * 60_000  # ~2.3 MB as UTF-8


def blob_of(kind: str, raw: bytes) -> bytes:
    return b"".join(bytes(part) for part in blob_format.host_blob_parts(kind, raw))


def put_value(directory: Path, blob: bytes) -> str:
    """A value file of ``blob`` in the channel directory, as ``Sandbox.request`` links it; returns its blob id."""
    blob_id = "h" + secrets.token_hex(16)
    path = directory / blob_format.value_file_name(blob_id)
    path.write_bytes(blob)
    path.chmod(0o644)
    return blob_id


def set_value(agent, blob_id: str, size: int, kind: str = "str", name: str = "doc", **fields) -> dict:
    """A set_value of the value file of ``blob_id`` (its descriptor attached, if the file is there)."""
    fields.setdefault("file", blob_format.value_file_name(blob_id))
    reply, body = request_with_file(
        agent, blob_id, request_table.SET_VALUE, name=name, kind=kind, blob_size=size, **fields
    )
    assert not body  # nothing travels back
    return reply


def request_with_file(agent, blob_id: str, type_: str, **fields) -> tuple[dict, bytearray]:
    path = agent.directory / blob_format.value_file_name(blob_id)
    fds = [os.open(path, os.O_RDONLY)] if path.exists() else []
    try:
        return agent.request(type_, fds=fds, aliases=[], blob=blob_id, **fields)
    finally:
        for fd in fds:
            os.close(fd)


def open_value_files(agent) -> list[str]:
    """What the worker's descriptors point to among value files."""
    fd_dir = Path(f"/proc/{agent.hello['worker_pid']}/fd")
    targets = []
    for fd in fd_dir.iterdir():
        try:
            targets.append(os.readlink(fd))
        except OSError:
            continue
    return [t for t in targets if "value-h" in t]


def test_a_value_file_is_mapped_adopted_and_closed(agent):
    raw = TEXT.encode("utf-8", "surrogatepass")
    blob = blob_of("str", raw)
    blob_id = put_value(agent.directory, blob)
    reply = set_value(agent, blob_id, len(blob))
    assert reply["status"] == "ok", reply
    assert reply["checkpoint"]["vars"] == {"doc": blob_id}  # adopted as the host's blob: nothing pickled
    assert agent.value("doc == " + repr(TEXT)) == "True"
    assert open_value_files(agent) == []

    data = os.urandom(1 << 20)
    blob = blob_of("bytes", data)
    blob_id = put_value(agent.directory, blob)
    assert set_value(agent, blob_id, len(blob), kind="bytes", name="data")["status"] == "ok"
    assert agent.value(f"data == bytes.fromhex({data.hex()!r})") == "True"


@pytest.mark.parametrize(
    ("spoil", "reason"),
    [
        ("missing", "did not arrive"),
        ("shorter", "not the"),
        ("longer", "not the"),
        ("unframed", "not a whole host-made blob"),
    ],
)
def test_a_value_file_that_is_not_the_announced_blob_is_an_error_and_the_worker_goes_on(agent, spoil, reason):
    raw = b"x" * 100_000
    blob = blob_of("bytes", raw)
    blob_id = "h" + secrets.token_hex(16)
    path = agent.directory / blob_format.value_file_name(blob_id)
    if spoil == "shorter":
        path.write_bytes(blob[:-10])
    elif spoil == "longer":
        path.write_bytes(blob + b"extra")
    elif spoil == "unframed":
        path.write_bytes(b"\x00" * len(blob))
    reply = set_value(agent, blob_id, len(blob), kind="bytes", name="v")
    assert reply["status"] == protocol.STATUS_ERROR and reason in reply["reason"], reply
    assert agent.value("'v' in globals()") == "False"
    assert open_value_files(agent) == []
    fine = put_value(agent.directory, blob)
    assert set_value(agent, fine, len(blob), kind="bytes", name="v")["status"] == "ok"
    assert agent.value("len(v)") == "100000"


@pytest.mark.parametrize(
    "name", ["../secret", "secret", "value-h" + "0" * 32, "value-" + "x" * 33, "/etc/passwd", "value-h" + "0" * 31]
)
def test_a_value_file_named_otherwise_than_its_blob_is_refused(agent, name):
    raw = b"y" * 1000
    blob = blob_of("bytes", raw)
    blob_id = put_value(agent.directory, blob)
    reply = set_value(agent, blob_id, len(blob), kind="bytes", name="w", file=name)
    assert reply["status"] == protocol.STATUS_ERROR and "named after its host-made blob" in reply["reason"], reply
    assert agent.value("'w' in globals()") == "False"


def test_a_value_file_with_a_body_or_without_a_blob_is_refused(agent):
    blob = blob_of("bytes", b"z" * 1000)
    blob_id = put_value(agent.directory, blob)
    reply, _ = agent.request(
        request_table.SET_VALUE,
        b"body",
        name="w",
        kind="bytes",
        blob=blob_id,
        blob_size=len(blob),
        file=blob_format.value_file_name(blob_id),
    )
    assert reply["status"] == protocol.STATUS_ERROR and "empty body" in reply["reason"], reply
    reply, _ = agent.request(request_table.SET_VALUE, name="w", kind="bytes", file=blob_format.value_file_name(blob_id))
    assert reply["status"] == protocol.STATUS_ERROR, reply
    assert open_value_files(agent) == []


def test_a_value_file_that_comes_with_another_request_is_closed(agent):
    blob_id = put_value(agent.directory, blob_of("bytes", b"q" * 1000))
    reply, _ = request_with_file(agent, blob_id, request_table.EXEC, code="x = 1", timeout=10, checkpoint_timeout=10)
    assert reply["status"] == "ok"
    assert open_value_files(agent) == []


def test_a_huge_declared_size_is_refused_without_mapping_anything(agent):
    blob = blob_of("bytes", b"h" * 1000)
    blob_id = put_value(agent.directory, blob)
    reply = set_value(agent, blob_id, 1 << 40, kind="bytes", name="h")
    assert reply["status"] == protocol.STATUS_ERROR and "not the 1099511627776 announced" in reply["reason"], reply
    assert agent.value("'h' in globals()") == "False"
    assert open_value_files(agent) == []
