"""add_context / set_value of str and bytes: the host writes the value's blob itself, and the value never travels back.

The blob is a pickle the controller writes around the raw bytes, named by a random ``h...`` id
(docs/protocol.md, "Host-made blobs"): it restores like any other blob, after a kill, for a
second controller, and prune treats it like any other.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support import kill_and_wait

from orchestrator import CheckpointQuotaExceeded, Orchestrator, Session, Settings
from orchestrator.agent import blob_format

pytestmark = pytest.mark.docker

HOST_ID = re.compile(r"^h[0-9a-f]{32}$")
DIGEST = re.compile(r"^[0-9a-f]{32}$")
TEXT = "héllo wörld ✓ 𝄞 lone \ud800 and \udfff surrogates, ascii after\n" * 150_000  # ~9 MB as UTF-8
DATA = os.urandom(1 << 20) + b"\x00" * (4 << 20)
HOUR = 3600.0


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()


HASH = (  # an expression: the sandbox's namespace keeps no name of it
    "(lambda v: __import__('hashlib').sha256(v.encode('utf-8', 'surrogatepass') if isinstance(v, str) else v)"
    ".hexdigest())({})"
)


def sandbox_hash(s: Session, expression: str) -> str:
    result = s.execute(HASH.format(expression))
    assert result.ok, result.error
    assert result.return_value is not None
    return result.return_value.strip("'")


def blobs_dir(settings: Settings, s: Session) -> Path:
    return settings.state_dir / "sessions" / s.id / "blobs"


def blob_names(settings: Settings, s: Session) -> set[str]:
    return {p.name for p in blobs_dir(settings, s).iterdir()}


def stored(settings: Settings, s: Session) -> dict[str, str]:
    """The session's manifest as the store holds it (name -> blob id)."""
    return dict(json.loads((settings.state_dir / "sessions" / s.id / "meta.json").read_bytes())["variables"])


def test_host_made_values_are_stored_once_and_survive_a_kill(
    session: Session, settings: Settings, kill_container: Callable[[Session], None]
) -> None:
    assert session.add_context(TEXT) == 0
    session.set_value("raw", DATA, aliases=["raw_alias"])
    session.add_history([{"role": "user", "content": "hi"}])
    proj = session.create_context(context_id="proj")
    proj.add_context("a document of the proj context ✓")
    manifest = stored(settings, session)

    # context and context_0 name one host-made blob; so do raw and raw_alias; JSON is pickled by the agent.
    assert HOST_ID.match(manifest["context"]) and manifest["context"] == manifest["context_0"]
    assert HOST_ID.match(manifest["raw"]) and manifest["raw"] == manifest["raw_alias"]
    assert DIGEST.match(manifest["history_0"]) and manifest["history"] == manifest["history_0"]
    assert HOST_ID.match(manifest["proj/context_0"]) and manifest["proj/context"] == manifest["proj/context_0"]
    assert blob_names(settings, session) == set(manifest.values())  # one file per blob, no temp file left
    with (blobs_dir(settings, session) / manifest["context"]).open("rb") as fh:
        assert pickle.load(fh) == TEXT  # a plain pickle of the str (the test may unpickle what its host made)
    assert (blobs_dir(settings, session) / manifest["raw"]).stat().st_size == len(DATA) + blob_format.HOST_BLOB_OVERHEAD

    # Cells that leave the values alone send nothing for them.
    assert sandbox_hash(session, "context") == text_hash(TEXT)
    generation = session.generation
    assert session.execute("n = len(context)").ok
    assert session.generation == generation + 1
    assert stored(settings, session) == {**manifest, "n": stored(settings, session)["n"]}
    assert session.execute("alias = context").ok  # a new name for the same str takes the same blob
    assert stored(settings, session)["alias"] == manifest["context"]

    generation = session.generation
    kill_container(session)
    assert sandbox_hash(session, "context") == text_hash(TEXT)
    assert session.generation == generation
    assert session.execute("context is context_0 is alias, raw is raw_alias, history").return_value == (
        "(True, True, [{'role': 'user', 'content': 'hi'}])"
    )
    assert sandbox_hash(session, "raw") == hashlib.sha256(DATA).hexdigest()
    assert proj.execute("context").return_value == repr("a document of the proj context ✓")
    assert session.restore_failures == {}
    # Restored values count as saved: the next cell sends none of them again.
    before = blob_names(settings, session)
    assert session.execute("m = 1").ok
    assert blob_names(settings, session) - before == {stored(settings, session)["m"]}


def test_replacing_a_context_drops_its_old_blob_once_no_generation_keeps_it(
    session: Session,
    settings: Settings,
    settings_for: Callable[..., Settings],
    make_orch: Callable[[Settings], Orchestrator],
    new_session: Callable[..., Session],
) -> None:
    session.add_context("first ✓ " * 1000)
    first = stored(settings, session)["context_0"]
    session.add_context(b"second", index=0)
    second = stored(settings, session)["context_0"]
    assert first != second and HOST_ID.match(second)
    assert blob_names(settings, session) == {first, second}  # the generation before still names the first

    keeps_none = settings_for(limits=settings.limits.replace(history_generations=0))
    forgetful = new_session(make_orch(keeps_none))
    forgetful.add_context("first ✓ " * 1000)
    forgetful.add_context(b"second", index=0)
    assert blob_names(keeps_none, forgetful) == {stored(keeps_none, forgetful)["context_0"]}
    assert forgetful.execute("context, context_0").return_value == "(b'second', b'second')"
    forgetful.reset()
    assert blob_names(keeps_none, forgetful) == set() and stored(keeps_none, forgetful) == {}


def test_a_value_over_the_quota_is_refused_before_it_is_sent(
    make_orch: Callable[[Settings], Orchestrator],
    settings: Settings,
    settings_for: Callable[..., Settings],
    new_session,
) -> None:
    quota = 1 << 20
    private = settings_for(limits=settings.limits.replace(checkpoint_quota=quota))
    orch = make_orch(private)
    s = new_session(orch)
    s.add_context("x" * (600 << 10))
    before = (stored(private, s), blob_names(private, s), s.generation, s.checkpoint_bytes)
    with pytest.raises(CheckpointQuotaExceeded) as caught:
        s.add_context("y" * (600 << 10))
    error = caught.value
    assert error.quota == quota and error.size == (600 << 10) + blob_format.HOST_BLOB_OVERHEAD
    assert error.held == 2 * error.size and "checkpoint_quota" in str(error) and str(quota) in str(error)
    with pytest.raises(CheckpointQuotaExceeded):
        s.set_value("big", b"z" * (quota + 1))
    # Nothing was sent or stored: no blob or temp file, same manifest, generation and counters.
    assert (stored(private, s), blob_names(private, s), s.generation, s.checkpoint_bytes) == before
    assert s.get_context_count() == 1
    assert s.execute("'context_1' in globals(), 'big' in globals(), len(context)").return_value == (
        f"(False, False, {600 << 10})"
    )
    # Replacing the value that holds the room fits.
    s.add_context("y" * (600 << 10), index=0)
    assert s.execute("context[0]").return_value == "'y'"


def test_a_second_controller_sees_the_value(
    orch: Orchestrator, session: Session, make_orch: Callable[[Settings], Orchestrator], settings: Settings
) -> None:
    session.add_context(TEXT)
    session.set_value("raw", DATA)
    orch2 = make_orch(settings)
    # Live takeover: the agent holds the values; then a restore from the host-made blobs.
    s2 = orch2.attach(session.id, force=True)
    assert sandbox_hash(s2, "context") == text_hash(TEXT)
    assert s2.execute("more = 1").ok
    container = s2.container_id
    assert container is not None
    orch2.backend.remove(container)
    s3 = orch.attach(session.id, force=True)  # s2 is stale now; s3 closes the session
    try:
        assert s3.container_id != container and s3.restore_failures == {}
        assert sandbox_hash(s3, "context") == text_hash(TEXT)
        assert sandbox_hash(s3, "raw") == hashlib.sha256(DATA).hexdigest()
        assert s3.execute("more, context is context_0").return_value == "(1, True)"
    finally:
        s3.close()


def test_prune_keeps_named_host_blobs_and_removes_unnamed_ones(
    make_orch: Callable[[Settings], Orchestrator], settings_for: Callable[..., Settings], new_session
) -> None:
    private = settings_for()
    orch = make_orch(private)
    s = new_session(orch)
    s.add_context(TEXT)
    s.set_value("raw", DATA)
    named = blob_names(private, s)
    junk = [
        blobs_dir(private, s) / ("h" + "ab" * 16),  # a host-made blob no manifest names (a commit that failed)
        blobs_dir(private, s) / ".tmp-staged",  # a staged blob whose controller died before the commit
    ]
    for path in junk:
        path.write_bytes(b"\x80\x04junk" * 100)

    report = orch.prune(idle_for=HOUR, now=time.time())
    assert report.failed == [], report.to_json()
    actions = {(a.action, a.target) for a in report.actions}
    assert actions == {("remove-orphan-blobs", s.id)}, report.to_json()
    assert blob_names(private, s) == named and not any(p.exists() for p in junk)
    kill_and_wait(orch, s.container_id)
    assert sandbox_hash(s, "context") == text_hash(TEXT)
    assert sandbox_hash(s, "raw") == hashlib.sha256(DATA).hexdigest()
