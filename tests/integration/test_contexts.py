"""Contexts against a real engine: isolated, each restored after a container kill, cwd and env as asked."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from orchestrator import ConfigError, Context, ContextNotFound, Orchestrator, SandboxCrashed, Session

pytestmark = pytest.mark.docker

ENVIRONMENT = "import os\nos.getcwd(), os.environ.get('PROJECT'), os.environ.get('SHARED')"


def test_contexts_are_isolated_and_each_comes_back_after_a_kill(
    session: Session, kill_container: Callable[[Session], None]
) -> None:
    one = session.create_context(context_id="one")
    two = session.create_context()
    assert [c.id for c in session.contexts] == ["default", *sorted(["one", two.id])]
    assert session.context("one") == one and session.context("default").id == "default"

    session.execute("x = 'default'")
    one.execute("x = 'one'\ndef read():\n    return x\nclass Point:\n    where = 'one'\np = Point()")
    assert two.execute("'x' in globals()").return_value == "False"
    assert two.execute("import json\nx = json.dumps([2])").ok
    assert session.execute("'json' in globals(), 'read' in globals()").return_value == "(False, False)"
    one.add_context("a document for one")
    assert one.get_context_count() == 1 and session.get_context_count() == 0
    assert one.variables == ["Point", "context", "context_0", "p", "read", "x"]
    assert session.variables == ["x"]

    kill_container(session)
    assert session.execute("x").return_value == "'default'"
    # The function refers to its own context's globals, the instance to its own context's class.
    assert one.execute("x = 'one again'\nread(), p.where, type(p) is Point, context").return_value == (
        "('one again', 'one', True, 'a document for one')"
    )
    assert two.execute("json.loads(x)").return_value == "[2]"
    assert session.restore_failures == {}


def test_a_context_runs_in_the_cwd_and_env_it_asked_for(session: Session) -> None:
    project = session.create_context(cwd="work/project", env={"PROJECT": "p1"}, context_id="project")
    plain = session.create_context(context_id="plain")
    assert (project.cwd, project.env) == ("/workspace/work/project", {"PROJECT": "p1"})
    assert plain.cwd == "/workspace/contexts/plain"
    assert project.execute(ENVIRONMENT).return_value == "('/workspace/work/project', 'p1', None)"
    assert plain.execute(ENVIRONMENT).return_value == "('/workspace/contexts/plain', None, None)"
    default = session.execute(ENVIRONMENT).return_value
    assert default is not None and "p1" not in default
    # Files written with relative paths land in the context's directory.
    project.execute("open('notes.txt', 'w').write('hi')")
    assert session.execute("open('work/project/notes.txt').read()").return_value == "'hi'"
    assert plain.execute("import os\nos.path.exists('notes.txt')").return_value == "False"


def test_cwd_and_env_are_created_again_after_a_kill(
    session: Session, kill_container: Callable[[Session], None]
) -> None:
    project = session.create_context(cwd="/tmp/p", env={"PROJECT": "p2", "SHARED": "s"})
    kill_container(session)
    assert project.execute(ENVIRONMENT).return_value == "('/tmp/p', 'p2', 's')"


def test_destroying_one_context_leaves_the_others(session: Session, kill_container: Callable[[Session], None]) -> None:
    keep = session.create_context(context_id="keep")
    doomed = session.create_context(context_id="doomed")
    keep.execute("value = 1")
    doomed.execute("value = 2\nbig = 'x' * 100000")
    session.execute("value = 0")
    doomed.destroy()
    assert [c.id for c in session.contexts] == ["default", "keep"]
    assert not any(name.startswith("doomed/") for name in session._ledger.record.variables)
    assert keep.execute("value").return_value == "1" and session.execute("value").return_value == "0"
    kill_container(session)
    assert keep.execute("value").return_value == "1" and session.execute("value").return_value == "0"
    # The id is free again: a new context under it starts empty.
    again = session.create_context(context_id="doomed")
    assert again.execute("'value' in globals()").return_value == "False"


def test_reset_of_a_context_clears_only_it(session: Session) -> None:
    ctx = session.create_context()
    ctx.execute("a = 1")
    session.execute("a = 2")
    ctx.reset()
    assert ctx.variables == [] and session.variables == ["a"]
    assert ctx.execute("'a' in globals()").return_value == "False"


def test_contexts_are_found_again_after_attach(orch: Orchestrator, session: Session) -> None:
    session.create_context(context_id="kept", env={"PROJECT": "k"}).execute("y = 5")
    again = orch.attach(session.id)
    try:
        assert [c.id for c in again.contexts] == ["default", "kept"]
        kept = again.context("kept")
        assert kept.env == {"PROJECT": "k"}
        assert kept.execute("y, __import__('os').environ['PROJECT']").return_value == "(5, 'k')"
    finally:
        again.close()  # the owner now: the fixture's stale handle cannot remove the container


def test_unknown_and_destroyed_contexts_are_typed_errors(session: Session) -> None:
    with pytest.raises(ContextNotFound, match=r"no context 'nope'.*create_context"):
        session.context("nope")
    with pytest.raises(ContextNotFound, match="no context 'nope'"):
        session.execute("1", context="nope")
    ctx = session.create_context(context_id="gone")
    ctx.destroy()
    for call in (lambda: ctx.execute("1"), ctx.reset, lambda: ctx.add_context("x"), ctx.destroy, lambda: ctx.cwd):
        with pytest.raises(ContextNotFound, match="'gone': it was destroyed or never created"):
            call()
    assert isinstance(ContextNotFound("x"), LookupError)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cwd": "../etc"}, "outside the sandbox's writable directories"),
        ({"cwd": "/etc"}, "outside the sandbox's writable directories"),
        ({"env": {"A=B": "x"}}, "without '='"),
        ({"env": {"A": 1}}, "str value"),
        ({"env": ["A"]}, "mapping"),
        ({"context_id": "default"}, "session's own context"),
        ({"context_id": "a/b"}, "invalid context id"),
    ],
)
def test_bad_context_arguments_are_config_errors(session: Session, kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        session.create_context(**kwargs)
    assert [c.id for c in session.contexts] == ["default"]


def test_a_context_id_in_use_and_the_default_context_cannot_be_destroyed(session: Session) -> None:
    session.create_context(context_id="twice")
    with pytest.raises(ConfigError, match="already has a context 'twice'"):
        session.create_context(context_id="twice")
    default = session.contexts[0]
    assert isinstance(default, Context)
    with pytest.raises(ConfigError, match=r"Session\.close"):
        default.destroy()
    assert default.execute("40 + 2").return_value == "42"


def test_a_worker_crash_in_one_context_restores_every_context(session: Session) -> None:
    ctx = session.create_context(cwd="crash", env={"PROJECT": "c"})
    ctx.execute("kept = 'ctx'")
    session.execute("kept = 'default'")
    with pytest.raises(SandboxCrashed) as info:
        ctx.execute("import os\nos._exit(3)")
    assert info.value.restored
    assert ctx.execute("kept, __import__('os').getcwd(), __import__('os').environ['PROJECT']").return_value == (
        "('ctx', '/workspace/crash', 'c')"
    )
    assert session.execute("kept").return_value == "'default'"
