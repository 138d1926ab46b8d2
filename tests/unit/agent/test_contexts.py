"""Contexts in the agent: namespaces of one worker, each with its cwd, env and checkpoint keys (docs/protocol.md).

The agent runs as a host subprocess, driven frame by frame with the helpers of
tests/agent_process.py; the same behaviour against a real engine is in
tests/integration/test_contexts.py.
"""

from __future__ import annotations

import os

from agent_process import Agent, blobs_of, load

from orchestrator.agent import protocol, request_table


def create(agent: Agent, context: str, cwd: str, **env: str) -> dict:
    reply, _ = agent.request(request_table.CONTEXT_CREATE, context=context, cwd=cwd, env=env, checkpoint_timeout=10)
    assert reply["type"] == request_table.STATE_REPLY, reply
    return reply


def run_in(agent: Agent, context: str | None, code: str) -> tuple[dict, bytearray]:
    return agent.run(code, **({} if context is None else {"context": context}))


def value_in(agent: Agent, context: str | None, code: str) -> str:
    reply, _ = run_in(agent, context, code)
    assert reply["status"] == "ok", reply
    return reply["return_value"]


def test_contexts_are_isolated_namespaces_with_prefixed_checkpoint_keys(agent, tmp_path):
    assert create(agent, "a", str(tmp_path / "a"))["checkpoint"]["vars"] == {}
    reply, _ = run_in(agent, "a", "x = 1")
    assert reply["checkpoint"]["vars"].keys() == {"a/x"} and reply["checkpoint"]["generation"] == 1
    reply, _ = run_in(agent, None, "x = 2")
    assert reply["checkpoint"]["vars"].keys() == {"x"} and reply["checkpoint"]["generation"] == 2
    assert value_in(agent, "a", "x") == "1"
    assert value_in(agent, None, "x") == "2"
    assert value_in(agent, "a", "import json\n'json' in globals(), __name__") == "(True, '__main__')"
    assert value_in(agent, None, "'json' in globals()") == "False"
    reply, _ = run_in(agent, "a", "del x")
    assert reply["checkpoint"]["deleted"] == ["a/x"] and reply["checkpoint"]["generation"] == 4


def test_a_context_runs_in_its_own_directory_and_environment(agent, tmp_path):
    default_cwd = value_in(agent, None, "import os\nos.getcwd()")
    create(agent, "a", str(tmp_path / "a"), GREETING="hello")
    create(agent, "b", str(tmp_path / "b"))
    code = "import os\nos.getcwd(), os.environ.get('GREETING')"
    assert value_in(agent, "a", code) == repr((str(tmp_path / "a"), "hello"))
    assert value_in(agent, "b", code) == repr((str(tmp_path / "b"), None))
    assert value_in(agent, None, code) == repr((os.path.realpath(eval(default_cwd)), None))
    # A cell's chdir and environment change stay in its context.
    run_in(agent, "b", "os.makedirs('sub'); os.chdir('sub'); os.environ['MINE'] = '1'")
    assert value_in(agent, "a", "os.getcwd(), os.environ.get('MINE')") == repr((str(tmp_path / "a"), None))
    assert value_in(agent, "b", "os.getcwd(), os.environ.get('MINE')") == repr((str(tmp_path / "b" / "sub"), "1"))


def test_functions_and_classes_of_a_context_restore_into_that_context(agent, tmp_path):
    create(agent, "a", str(tmp_path / "a"))
    reply, body = run_in(
        agent,
        "a",
        "y = 10\ndef f():\n    return y\nclass P:\n    kind = 'a'\np = P()",
    )
    saved = blobs_of(reply, body)
    run_in(agent, None, "y = 99\nclass P:\n    kind = 'default'")
    agent.run("import os; os._exit(1)")  # the worker dies; a fresh one is restored below
    agent.request(request_table.RESTORE_BEGIN, generation=2)
    create(agent, "a", str(tmp_path / "a"))
    for key in ("a/y", "a/f", "a/P", "a/p"):
        assert load(agent, key.split("/")[1], saved[key], context="a")["status"] == "ok", key
    agent.request(request_table.RESTORE_END, generation=2)
    assert value_in(agent, "a", "y = 11\nf(), p.kind, type(p) is P") == "(11, 'a', True)"
    assert value_in(agent, None, "'f' in globals(), 'y' in globals()") == "(False, False)"


def test_destroy_deletes_the_context_and_its_names(agent, tmp_path):
    create(agent, "a", str(tmp_path / "a"))
    create(agent, "b", str(tmp_path / "b"))
    run_in(agent, "a", "x = 1\nz = 2")
    run_in(agent, "b", "x = 3")
    reply, _ = agent.request(request_table.CONTEXT_DESTROY, context="a", checkpoint_timeout=10)
    assert sorted(reply["checkpoint"]["deleted"]) == ["a/x", "a/z"] and reply["checkpoint"]["generation"] == 3
    gone, _ = run_in(agent, "a", "x")
    assert gone["status"] == protocol.STATUS_PROTOCOL_ERROR and "'a'" in gone["reason"]
    assert value_in(agent, "b", "x") == "3"
    # Creating an existing context starts it afresh (its old names deleted).
    reply = create(agent, "b", str(tmp_path / "b"))
    assert reply["checkpoint"]["deleted"] == ["b/x"]
    assert value_in(agent, "b", "'x' in globals()") == "False"


def test_restore_begin_drops_every_context(agent, tmp_path):
    create(agent, "a", str(tmp_path / "a"), GREETING="hello")
    run_in(agent, "a", "x = 1")
    agent.request(request_table.RESTORE_BEGIN, generation=1)
    agent.request(request_table.RESTORE_END, generation=1)
    assert run_in(agent, "a", "x")[0]["status"] == protocol.STATUS_PROTOCOL_ERROR
    assert value_in(agent, None, "import os\n'GREETING' in os.environ") == "False"


def test_a_bad_context_request_is_an_error(agent, tmp_path):
    reply, _ = agent.request(request_table.CONTEXT_CREATE, context="a", cwd="relative", env={}, checkpoint_timeout=10)
    assert reply["status"] == "error" and "absolute" in reply["reason"]
    (tmp_path / "file").write_text("")
    reply, _ = agent.request(
        request_table.CONTEXT_CREATE, context="a", cwd=str(tmp_path / "file" / "x"), env={}, checkpoint_timeout=10
    )
    assert reply["status"] == "error" and "cannot create" in reply["reason"]
    reply, _ = agent.request(request_table.CONTEXT_DESTROY, checkpoint_timeout=10)
    assert reply["status"] == "error"


def test_the_checkpoint_quota_is_the_sessions_across_contexts(make_agent, tmp_path):
    agent = make_agent(ORCH_CHECKPOINT_QUOTA="100000")
    create(agent, "a", str(tmp_path / "a"))
    create(agent, "b", str(tmp_path / "b"))
    assert run_in(agent, "a", "half = 'a' * 60000")[0]["checkpoint"]["vars"].keys() == {"a/half"}
    reply, _ = run_in(agent, "b", "half = 'b' * 60000\nsame = 'a' * 60000")
    # b's own value does not fit beside a's; the copy of a's value costs nothing and is not sent again.
    assert reply["checkpoint"]["unsaved"] == {"b/half": "checkpoint quota of 100000 bytes reached"}
    assert reply["checkpoint"]["vars"].keys() == {"b/same"} and reply["checkpoint"]["blobs"] == []
    # Destroying a frees its share of the quota (the blob b holds stays).
    agent.request(request_table.CONTEXT_DESTROY, context="a", checkpoint_timeout=10)
    reply, _ = run_in(agent, "b", "more = 'c' * 30000")
    assert reply["checkpoint"]["vars"].keys() == {"b/more"} and "b/half" in reply["checkpoint"]["unsaved"]
