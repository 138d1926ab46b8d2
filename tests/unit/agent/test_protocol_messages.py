"""The messages of agent/protocol.py: what the controller builds the agent reads, one reply type per request,
and every message type the agent sends is defined and documented."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent import protocol

AGENT_DIR = Path(protocol.__file__).parent
DOC = Path(__file__).resolve().parents[3] / "docs" / "protocol.md"
HOST_BLOB = "h" + "0" * 32


def _wire(header: Any) -> dict[str, Any]:
    """The header as the agent gets it: encoded and decoded as a frame header."""
    return protocol.decode_header(protocol.encode_header(header))


def _never_reserved(name: str) -> bool:
    return False


def _message_types() -> dict[str, str]:
    """NAME -> value of every message type constant: the assignments in protocol.py's "Messages" section."""
    source = Path(protocol.__file__).read_text()
    section = source[source.index("# --- Messages") : source.index("REPLY_TYPES = {")]
    return dict(re.findall(r'^([A-Z_]+) = "([a-z_]+)"', section, re.MULTILINE))


_REQUESTS = {
    protocol.EXEC, protocol.SET_VALUE, protocol.RESET, protocol.RESTORE_BEGIN, protocol.LOAD, protocol.DEFER,
    protocol.RESTORE_END, protocol.INSTALL, protocol.CONTEXT_CREATE, protocol.CONTEXT_DESTROY, protocol.PING,
}  # fmt: skip
_REPLIES = {
    protocol.EXEC_REPLY, protocol.STATE_REPLY, protocol.LOAD_REPLY, protocol.RESTORE_REPLY,
    protocol.INSTALL_REPLY, protocol.PONG,
}  # fmt: skip


# --- builders and readers ---------------------------------------------------------------------


def test_an_exec_as_a_session_builds_it_is_read_whole() -> None:
    built = protocol.exec_request("x = 1", 5.0, checkpoint_timeout=60.0, send_limit=1 << 20, stream=True, input=True)
    assert protocol.read_exec(_wire(built)) == built
    assert built == {
        "type": "exec", "code": "x = 1", "timeout": 5.0, "checkpoint_timeout": 60.0,
        "send_limit": 1 << 20, "stream": True, "input": True,
    }  # fmt: skip


def test_an_exec_as_the_grader_builds_it_is_read_whole() -> None:
    built = protocol.exec_request("print(1)", 2.0, checkpoint=False, stream=True, send_limit=9, output_cap=9, stdin="")
    request = protocol.read_exec(_wire(built))
    assert request == built
    assert request.get("checkpoint") is False and request.get("stdin") == "" and "input" not in request


def test_an_exec_without_options_has_none() -> None:
    request = protocol.read_exec(_wire(protocol.exec_request("1", 1.0)))
    assert set(request) == {"type", "code", "timeout"}


@pytest.mark.parametrize(
    "option",
    [
        {"send_limit": 0},
        {"send_limit": True},
        {"send_limit": 1.5},
        {"output_cap": -1},
        {"output_cap": "9"},
        {"stdin": 7},
        {"stream": 1},
        {"stream": False},
        {"input": "yes"},
        {"checkpoint": 0},
        {"checkpoint": True},
    ],
)
def test_an_exec_option_of_the_wrong_type_counts_as_absent(option: dict[str, Any]) -> None:
    request = protocol.read_exec({"type": "exec", "code": "1", **option})
    assert not set(option) & set(request)


@pytest.mark.parametrize("code", [None, 1, b"x", ["x"]])
def test_an_exec_without_code_is_refused(code: Any) -> None:
    header = {"type": "exec"} if code is None else {"type": "exec", "code": code}
    with pytest.raises(protocol.BadRequest, match="no code"):
        protocol.read_exec(header)


def test_a_set_value_is_read_whole_with_or_without_a_host_made_blob() -> None:
    built = protocol.set_value_request("x", "json", ["y"], 60.0)
    assert protocol.read_set_value(_wire(built), 10, _never_reserved) == built
    built = protocol.set_value_request("s", "str", [], 60.0)
    built["blob"], built["blob_size"] = HOST_BLOB, 3 + protocol.HOST_BLOB_OVERHEAD
    built["context"] = "ctx"
    assert protocol.read_set_value(_wire(built), 3, _never_reserved) == built


def test_a_set_value_without_aliases_has_none() -> None:
    request = protocol.read_set_value({"type": "set_value", "name": "x", "kind": "json"}, 2, _never_reserved)
    assert request["aliases"] == []


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"name": ""}, "bad variable name"),
        ({"name": 3}, "bad variable name"),
        ({"name": "__x__"}, "bad variable name"),
        ({"aliases": "y"}, "bad variable name"),
        ({"aliases": ["y", None]}, "bad variable name"),
        ({"blob": HOST_BLOB, "blob_size": 4 + protocol.HOST_BLOB_OVERHEAD}, "a host-made blob needs"),
        ({"blob": HOST_BLOB, "blob_size": 3 + protocol.HOST_BLOB_OVERHEAD, "kind": "json"}, "a host-made blob needs"),
        ({"blob": "0" * 32, "blob_size": 3 + protocol.HOST_BLOB_OVERHEAD}, "a host-made blob needs"),
    ],
)
def test_a_bad_set_value_is_refused(changes: dict[str, Any], reason: str) -> None:
    header = {"type": "set_value", "name": "x", "kind": "str", "aliases": [], **changes}
    with pytest.raises(protocol.BadRequest, match=reason):
        protocol.read_set_value(header, 3, lambda name: name.startswith("__"))


def test_a_load_is_read_whole_in_a_context_or_not() -> None:
    for built in (protocol.load_request("x", "0" * 32, 5.0), protocol.load_request("x", HOST_BLOB, 5.0, "ctx")):
        assert protocol.read_load(_wire(built), _never_reserved) == built
    assert protocol.load_request("x", HOST_BLOB, 5.0, "ctx")["context"] == "ctx"


@pytest.mark.parametrize("changes", [{"name": ""}, {"name": None}, {"digest": 5}, {"name": "__builtins__"}])
def test_a_bad_load_is_refused(changes: dict[str, Any]) -> None:
    header = {"type": "load", "name": "x", "digest": "0" * 32, **changes}
    with pytest.raises(protocol.BadRequest, match="needs a name and a digest"):
        protocol.read_load(header, lambda name: name.startswith("__"))


def test_a_restore_end_is_read_and_a_bad_generation_refused() -> None:
    built = protocol.restore_end_request(7)
    assert protocol.read_restore_end(_wire(built)) == built
    for generation in (-1, True, "7", 7.0, None):
        with pytest.raises(protocol.BadRequest, match="needs a generation"):
            protocol.read_restore_end({"type": "restore_end", "generation": generation})


def test_a_defer_is_read_whole_in_a_context_or_not() -> None:
    for built in (protocol.defer_request("x", "0" * 32, 9), protocol.defer_request("x", HOST_BLOB, 0, "ctx")):
        assert protocol.read_defer(_wire(built), _never_reserved) == built
    assert protocol.defer_request("x", HOST_BLOB, 5, "ctx")["context"] == "ctx"


@pytest.mark.parametrize("changes", [{"size": -1}, {"size": None}, {"size": 1.5}, {"size": True}, {"name": ""}])
def test_a_bad_defer_is_refused(changes: dict[str, Any]) -> None:
    header = {"type": "defer", "name": "x", "digest": "0" * 32, "size": 3, **changes}
    with pytest.raises(protocol.BadRequest, match="needs a"):
        protocol.read_defer(header, _never_reserved)


def test_a_blob_call_is_read_and_a_bad_one_refused() -> None:
    built = protocol.blob_call("ctx/x", "0" * 32)
    assert protocol.read_blob_call(protocol.decode_json(protocol.encode_header(built))) == built
    for payload in (None, [1], {"key": "x"}, {"key": 1, "digest": "d"}, {"key": "x", "digest": ["d"]}):
        with pytest.raises(protocol.BadRequest, match="needs a key and a digest"):
            protocol.read_blob_call(payload)


def test_an_install_is_read_and_bad_fields_refused() -> None:
    built = protocol.install_request("def before_cell(ns): pass", ["llm_query"], 30.0)
    assert protocol.read_install(_wire(built)) == built
    for changes in ({"code": None}, {"names": "x"}, {"names": [1]}):
        with pytest.raises(protocol.BadRequest, match="install needs code"):
            protocol.read_install({**built, **changes})


def test_context_requests_are_read_and_bad_fields_refused() -> None:
    created = protocol.context_create_request("ctx", "/tmp/ctx", {"A": "1"}, 60.0)
    assert protocol.read_context(_wire(created)) == created
    assert "checkpoint_timeout" not in protocol.context_create_request("ctx", "/tmp/ctx", {})
    destroyed = protocol.context_destroy_request("ctx", 60.0)
    assert protocol.read_context(_wire(destroyed)) == destroyed
    for changes, reason in (
        ({"context": ""}, "needs a context id"),
        ({"context": "a/b"}, "needs a context id"),
        ({"context": 1}, "needs a context id"),
        ({"cwd": "tmp/ctx"}, "absolute cwd"),
        ({"env": {"A": 1}}, "absolute cwd"),
        ({"env": ["A"]}, "absolute cwd"),
    ):
        with pytest.raises(protocol.BadRequest, match=reason):
            protocol.read_context({**created, **changes})


def test_the_controllers_other_messages() -> None:
    assert protocol.auth_message("n", "p") == {"type": protocol.AUTH, "nonce": "n", "proof": "p"}
    assert protocol.interrupt_message("r1") == {"type": protocol.INTERRUPT, "id": "r1"}
    assert protocol.host_reply(3) == {"type": protocol.HOST_REPLY, "call": 3, "status": protocol.STATUS_OK}
    failed = protocol.host_reply(3, "no")
    assert failed == {"type": protocol.HOST_REPLY, "call": 3, "status": protocol.STATUS_ERROR, "error": "no"}
    assert protocol.reset_request(1.0) == {"type": protocol.RESET, "checkpoint_timeout": 1.0}
    assert protocol.restore_begin_request(0) == {"type": protocol.RESTORE_BEGIN, "generation": 0}


def test_an_auth_is_read_and_a_bad_one_refused() -> None:
    built = protocol.auth_message(protocol.new_nonce(), "proof")
    assert protocol.read_auth(_wire(built)) == built
    for changes in ({"type": "hello"}, {"nonce": ""}, {"nonce": 5}, {"nonce": "n" * (protocol.MAX_NONCE_CHARS + 1)}):
        with pytest.raises(protocol.BadRequest):
            protocol.read_auth({**built, **changes})


# --- the request-to-reply map ---------------------------------------------------------------------


def test_every_request_has_exactly_one_reply_type() -> None:
    assert set(protocol.REPLY_TYPES) == _REQUESTS
    assert set(protocol.REPLY_TYPES.values()) == _REPLIES
    assert protocol.ERROR not in _REQUESTS | _REPLIES


def test_every_request_shape_is_a_request_of_the_union() -> None:
    shapes = {shape.__name__ for shape in protocol.Request.__args__}  # type: ignore[attr-defined]
    names = {f"{''.join(part.title() for part in kind.split('_'))}Request" for kind in _REQUESTS}
    assert shapes == names


def _maps_a_request_to_its_reply(node: ast.Dict) -> bool:
    pairs = zip(node.keys, node.values, strict=True)
    return any(
        isinstance(k, ast.Attribute) and k.attr == "EXEC" and isinstance(v, ast.Attribute) and v.attr == "EXEC_REPLY"
        for k, v in pairs
    )


def test_the_request_to_reply_map_is_written_once() -> None:
    package = AGENT_DIR.parent
    written = [
        str(path.relative_to(package))
        for path in sorted(package.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Dict) and _maps_a_request_to_its_reply(node)
    ]
    assert written == []  # protocol.py spells it with bare names: EXEC: EXEC_REPLY


# --- every message type the agent sends is defined, and documented ---------------------------------


def _sent_types(path: Path) -> list[ast.expr]:
    """The value of every ``"type"`` key of a dict display in an agent module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Dict):
            pairs = zip(node.keys, node.values, strict=True)
            found += [v for k, v in pairs if isinstance(k, ast.Constant) and k.value == "type"]
    return found


@pytest.mark.parametrize("path", sorted(AGENT_DIR.glob("*.py")), ids=lambda path: path.name)
def test_the_agent_sends_only_message_types_the_protocol_defines(path: Path) -> None:
    defined = _message_types()
    for value in _sent_types(path):
        assert not isinstance(value, ast.Constant), f"{path.name}:{value.lineno}: a type spelled as a literal"
        if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "protocol":
            assert value.attr in defined, f"{path.name}:{value.lineno}: protocol.{value.attr} is no message type"


def test_every_message_type_is_documented() -> None:
    text = DOC.read_text()
    missing = [value for value in _message_types().values() if f"`{value}" not in text]
    assert not missing


def test_the_message_types_are_distinct_and_include_the_error_reply() -> None:
    types = _message_types()
    assert len(set(types.values())) == len(types)
    assert types["ERROR"] == "error"
