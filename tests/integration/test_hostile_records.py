"""A worker that lies about what the host stores: the sizes of blobs it holds, and the ``unsaved`` it reports.

Cell code finds its worker on the stack (the ``handle`` frame) and replaces the worker's ``checkpoint`` in memory,
so every later reply carries the lie in an otherwise honest checkpoint, on either path (one hop and two). What it
gains is measured on the host: the bytes of the session's files on disk (not what the record says), and the size
of its ``meta.json``.

- Re-announcing a blob the host stores, with a 1-byte body, would make the record count it as 1 byte, and the
  quota admit another full blob: it is a ``ProtocolError``, and the disk never holds more than the quota.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import tree_bytes

from orchestrator import ProtocolError, Session, Settings

pytestmark = pytest.mark.docker

QUOTA = 4 << 20
SLACK = 64 << 10  # meta.json, the lock and lease files: the record around the blobs

WORKER = """\
import sys
frame = sys._getframe()
while frame.f_code.co_name != 'handle':
    frame = frame.f_back
worker = frame.f_locals['self']
honest = type(worker).checkpoint
"""
"""Cell code that finds the worker (``worker``) and its honest ``checkpoint`` method (``honest``)."""

SHRINK = (
    WORKER
    + """\
worker.tracker.quota = 0  # the worker's own quota check would refuse what the host is made to let in
announced = []
def lying(self=worker):
    delta, parts, took = honest(self)
    sent = [entry['digest'] for entry in delta['blobs']]
    for digest in announced:  # every big blob the host stores already, again, as one byte
        if digest not in sent:
            delta['blobs'].append({'digest': digest, 'size': 1})
            parts.append(b'x')
    announced.extend(entry['digest'] for entry in delta['blobs'] if entry['size'] > 100_000)
    return delta, parts, took
worker.checkpoint = lying
"""
)


@pytest.fixture(scope="module")
def quota_settings(settings: Settings, settings_for) -> Settings:
    return settings_for(limits=settings.limits.replace(checkpoint_quota=QUOTA))


def session_dir(settings: Settings, session: Session) -> Path:
    return settings.state_dir / "sessions" / session.id


def test_a_stored_blob_announced_again_smaller_is_refused_and_the_disk_stays_in_the_quota(
    make_orch, quota_settings: Settings, new_session
) -> None:
    s = new_session(make_orch(quota_settings))
    directory = session_dir(quota_settings, s)
    assert s.execute("import os\nkept = 1").ok
    assert s.execute(SHRINK).ok
    refused = 0
    for i in range(5):
        try:
            s.execute(f"v{i} = os.urandom(3_000_000)")
        except ProtocolError as exc:
            assert "size" in str(exc) or "bytes" in str(exc), exc
            refused += 1
        on_disk = tree_bytes(directory)
        assert on_disk <= QUOTA + SLACK, f"call {i}: {on_disk} B on the host's disk against a quota of {QUOTA} B"
        assert s.checkpoint_bytes <= QUOTA
    assert refused == 1, "re-announcing a stored blob with another size must be refused"
    assert s.execute("kept, len(v0)").return_value == "(1, 3000000)"  # what was acknowledged before the lie
