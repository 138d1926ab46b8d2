"""A worker that lies about what the host stores: the sizes of blobs it holds, and the ``unsaved`` it reports.

Cell code finds its worker on the stack (the ``handle`` frame) and replaces the worker's ``checkpoint`` in memory,
so every later reply carries the lie in an otherwise honest checkpoint. What it
gains is measured on the host: the bytes of the session's files on disk (not what the record says), and the size
of its ``meta.json``.

- Re-announcing a blob the host stores, with a 1-byte body, would make the record count it as 1 byte, and the
  quota admit another full blob: it is a ``ProtocolError``, and the disk never holds more than the quota.
- Reporting, from the default context, 1,000 unsaved names under another context's prefix at every call would
  have them kept for ever (no later default report replaced them): the record's ``unsaved`` stays at 1,000.
- A context's checkpoint that reports an unsaved name outside its prefix is a ``ProtocolError``.
- 1,000 unsaved names with reasons of 2,000 CJK characters at every call (which were stored as ``\\u`` escapes and
  copied into every kept generation): ``meta.json`` stays under 1 MiB.
"""

from __future__ import annotations

import json
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


REPORT = (
    WORKER
    + """\
def lying(self=worker):
    delta, parts, took = honest(self)
    delta['unsaved'] = {PREFIX + 'n%d_%d' % (self.cell_number, i): REASON for i in range(1000)}
    return delta, parts, took
worker.checkpoint = lying
"""
)


def report(prefix: str, reason: str) -> str:
    """Cell code that makes every later checkpoint report 1,000 new unsaved names ``<prefix>n<cell>_<i>``."""
    return REPORT.replace("PREFIX", repr(prefix)).replace("REASON", repr(reason))


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


def stored_unsaved(settings: Settings, session: Session) -> dict[str, str]:
    return dict(json.loads((session_dir(settings, session) / "meta.json").read_bytes())["unsaved"])


def test_another_contexts_unsaved_names_from_the_default_context_do_not_pile_up(settings: Settings, session) -> None:
    context = session.create_context(context_id="c")
    assert context.execute("x = 1").ok
    assert session.execute(report("c/", "r")).ok
    for i in range(5):
        assert session.execute(f"v{i} = {i}").ok
        unsaved = stored_unsaved(settings, session)
        assert len(unsaved) <= 1000, f"call {i}: {len(unsaved)} unsaved entries in the record"
    assert context.execute("x").return_value == "1"


def test_a_contexts_checkpoint_reporting_a_default_name_is_a_protocol_error(settings: Settings, session) -> None:
    context = session.create_context(context_id="c")
    assert context.execute("x = 1").ok
    with pytest.raises(ProtocolError, match="of context c reports an unsaved name of another"):
        context.execute("y = 2\n" + report("", "r"))  # the checkpoint after this very cell lies
    assert context.execute("x, 'y' in globals()").return_value == "(1, False)"
    assert len(stored_unsaved(settings, session)) <= 1000


def test_huge_utf8_reasons_keep_the_record_small(settings: Settings, session) -> None:
    meta = session_dir(settings, session) / "meta.json"
    assert session.execute(report("", "\u4e2d" * 2000)).ok
    for i in range(4):
        assert session.execute(f"v{i} = {i}").ok  # a new generation: the one before is kept
        assert meta.stat().st_size < 1 << 20, f"call {i}: meta.json holds {meta.stat().st_size} B"
    assert session.execute("v3").return_value == "3"
