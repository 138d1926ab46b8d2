"""Contexts on the host: ids, working directories, environments, checkpoint keys, and the stored record."""

from __future__ import annotations

import json

import pytest

from orchestrator.api.contexts import (
    checkpoint_key,
    local_names,
    names_of,
    new_context_id,
    resolve_cwd,
    validate_context_id,
    validate_env,
    writable_dirs,
)
from orchestrator.config import Confinement, Settings
from orchestrator.errors import CheckpointError, ConfigError, ProtocolError
from orchestrator.state.store import SessionRecord

D1 = "1" * 32
SPEC = {"cwd": "/workspace/contexts/a", "env": {"K": "v"}, "context_count": 0, "history_count": 0}


@pytest.mark.parametrize("good", ["a", "ctx-1", "Project_2", "x" * 64, new_context_id()])
def test_good_context_ids(good):
    assert validate_context_id(good) == good


@pytest.mark.parametrize("bad", ["", "default", "a/b", "../x", ".x", "-x", "x" * 65, "é", 3, None])
def test_bad_context_ids_are_config_errors(bad):
    with pytest.raises(ConfigError, match=r"context id|session's own"):
        validate_context_id(bad)


ROOTS = ("/workspace", "/tmp")


@pytest.mark.parametrize(
    ("cwd", "resolved"),
    [
        (None, "/workspace/contexts/a"),
        ("project", "/workspace/project"),
        ("work/./p/../q", "/workspace/work/q"),
        ("/tmp/x", "/tmp/x"),
        ("/tmp", "/tmp"),
        (".", "/workspace"),
    ],
)
def test_cwd_resolves_inside_a_writable_dir(cwd, resolved):
    assert resolve_cwd(ROOTS, "a", cwd) == resolved


@pytest.mark.parametrize("cwd", ["..", "../etc", "/etc", "/tmpx", "/workspacex", "/tmp/../root", "", "a\x00b", 5])
def test_cwd_outside_the_writable_dirs_is_refused(cwd):
    with pytest.raises(ConfigError, match="/workspace or /tmp"):
        resolve_cwd(ROOTS, "a", cwd)


def test_the_writable_dirs_are_the_workspace_then_the_tmpfs_mounts():
    assert writable_dirs(Settings()) == ROOTS
    assert writable_dirs(Settings(confinement=Confinement(tmpfs={}))) == ("/workspace",)


def test_env_is_checked_and_copied():
    given = {"A": "1", "PATH_EXTRA": ""}
    checked = validate_env(given)
    assert checked == given and checked is not given
    assert validate_env(None) == {}
    for bad, message in [
        ([("A", "1")], "mapping"),
        ({"": "x"}, "non-empty"),
        ({"A=B": "x"}, "without '='"),
        ({"A": None}, "str value"),
        ({"A": "x\x00"}, "without NUL"),
        ({1: "x"}, "non-empty str"),
        ({"A": "x" * (300 << 10)}, "more than"),
    ]:
        with pytest.raises(ConfigError, match=message):
            validate_env(bad)


def test_checkpoint_keys_of_contexts():
    assert checkpoint_key(None, "x") == "x" and checkpoint_key("a", "x") == "a/x"
    keys = ["x", "a/x", "a/y", "ab/z"]
    assert names_of(keys, None) == ["x"] and names_of(keys, "a") == ["x", "y"] and names_of(keys, "ab") == ["z"]
    assert local_names({"a/x": "why", "y": "because"}) == {"x": "why", "y": "because"}


def test_contexts_are_stored_with_the_manifest_and_read_back(store, ledger):
    delta = {"generation": 1, "blobs": [{"digest": D1, "size": 3}], "vars": {"a/x": D1}, "deleted": [], "unsaved": {}}
    ledger.commit(delta, bytearray(b"one"), contexts={"a": SPEC})  # type: ignore[arg-type]
    loaded = store.load("s-test")
    assert loaded.contexts == {"a": SPEC} and loaded.variables == {"a/x": D1}
    # A change of the contexts alone is stored too.
    empty = {"generation": 1, "blobs": [], "vars": {}, "deleted": [], "unsaved": {}}
    ledger.commit(empty, bytearray(), contexts={"a": SPEC, "b": SPEC})  # type: ignore[arg-type]
    assert store.load("s-test").contexts.keys() == {"a", "b"}
    # A destroy that leaves the context's variables, or a delta naming a context the session lacks, is refused.
    with pytest.raises(ProtocolError, match="told to destroy"):
        ledger.commit(empty, bytearray(), contexts={"b": SPEC})  # type: ignore[arg-type]
    forged = {**empty, "generation": 2, "vars": {"zz/x": D1}}
    with pytest.raises(ProtocolError, match="does not have"):
        ledger.commit(forged, bytearray())  # type: ignore[arg-type]
    gone = {**empty, "generation": 2, "deleted": ["a/x"]}
    ledger.commit(gone, bytearray(), contexts={"b": SPEC})  # type: ignore[arg-type]
    assert store.load("s-test").contexts.keys() == {"b"} and store.load("s-test").variables == {}


def test_old_records_without_contexts_load():
    record = SessionRecord(session_id="s-test", image="i", created_at=0.0, last_used_at=0.0)
    data = json.loads(record.to_json())
    del data["contexts"]
    assert SessionRecord.from_json(data, "s-test").contexts == {}


@pytest.mark.parametrize(
    "change",
    [
        {"contexts": {"../x": SPEC}},
        {"contexts": {"default/": SPEC}},
        {"contexts": {"a": {**SPEC, "cwd": "relative"}}},
        {"contexts": {"a": {**SPEC, "env": {"K": 1}}}},
        {"contexts": {"a": {**SPEC, "context_count": -1}}},
        {"contexts": {"a": {**SPEC, "extra": 1}}},
        {"contexts": []},
        {"variables": {"b/x": D1}, "blob_sizes": {D1: 1}, "contexts": {"a": SPEC}},
    ],
)
def test_a_crafted_context_record_is_refused(store, ledger, change):
    path = store.root / "s-test" / "meta.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, **change}))
    with pytest.raises(CheckpointError, match="contexts"):
        store.load("s-test")
