"""Each request defined once: what the controller builds the agent reads, and one row per request in
request_table.REQUESTS whose handler the worker has."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent import blob_format, framing, handshake, protocol, reply_types, request_table

AGENT_DIR = Path(protocol.__file__).parent
HOST_BLOB = "h" + "0" * 32
HOST_BLOB_SIZE = 3 + blob_format.HOST_BLOB_OVERHEAD  # of a 3-byte value


def _wire(header: Any) -> dict[str, Any]:
    """The header as the agent gets it: encoded and decoded as a frame header."""
    return framing.decode_header(framing.encode_header(header))


_REQUESTS = {
    "exec", "set_value", "reset", "restore_begin", "load", "defer", "restore_end", "install", "context_create",
    "context_destroy", "files_put", "file_write", "file_remove", "ping",
}  # fmt: skip
_REPLIES = {"exec_reply", "state_reply", "load_reply", "restore_reply", "install_reply", "pong"}


# --- builders and readers ---------------------------------------------------------------------


_BUILT = [
    request_table.exec_request("x", 2.0, request_table.ExecOptions(checkpoint=False, send_limit=9, output_cap=9)),
    request_table.set_value_request("x", "json", ["y"], 60.0),
    {
        **request_table.set_value_request("s", "str", [], 60.0),
        "context": "c",
        "blob": HOST_BLOB,
        "blob_size": HOST_BLOB_SIZE,
    },
    request_table.load_request("x", "0" * 32, 5.0),
    request_table.load_request("x", HOST_BLOB, 5.0, "ctx"),
    request_table.defer_request("x", "0" * 32, 9),
    request_table.defer_request("x", HOST_BLOB, 0, "ctx"),
    request_table.restore_end_request(7),
    request_table.install_request("def before_cell(ns): pass", ["llm_query"], 30.0),
    request_table.context_create_request("ctx", "/tmp/ctx", {"A": "1"}, 60.0),
    request_table.context_destroy_request("ctx", 60.0),
    request_table.files_put_request([["d", "d", 0o755, 0, "", 0], ["d/f", "f", 0o644, 0, "0" * 32, 3]], 30.0),
    {**request_table.file_write_request("d/f", 0o600, 60.0), "context": "ctx"},
    request_table.file_remove_request("d", True, 60.0),
]


@pytest.mark.parametrize("built", _BUILT, ids=lambda built: built["type"])
def test_what_a_builder_sends_its_rows_reader_reads_whole(built: dict[str, Any]) -> None:
    assert request_table.REQUESTS[built["type"]].read(_wire(built), 3) == built  # a body of 3 B


def test_an_exec_as_a_session_builds_it_is_in_its_order() -> None:
    options = request_table.ExecOptions(checkpoint_timeout=60.0, send_limit=1 << 20, stream=True, input=True)
    built = request_table.exec_request("x = 1", 5.0, options)
    assert list(built.items()) == [
        ("type", "exec"), ("code", "x = 1"), ("timeout", 5.0), ("checkpoint_timeout", 60.0),
        ("stream", True), ("input", True), ("send_limit", 1 << 20),
    ]  # fmt: skip


def test_an_exec_as_the_grader_builds_it_is_read_whole() -> None:
    options = request_table.ExecOptions(checkpoint=False, stream=True, send_limit=9, output_cap=9, stdin="")
    request = request_table.read_exec(_wire(request_table.exec_request("print(1)", 2.0, options)))
    assert request.get("checkpoint") is False and request.get("stdin") == "" and "input" not in request


def test_an_exec_without_options_has_none() -> None:
    request = request_table.read_exec(_wire(request_table.exec_request("1", 1.0)))
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
    request = request_table.read_exec({"type": "exec", "code": "1", **option})
    assert not set(option) & set(request)


@pytest.mark.parametrize("code", [None, 1, b"x", ["x"]])
def test_an_exec_without_code_is_refused(code: Any) -> None:
    header = {"type": "exec"} if code is None else {"type": "exec", "code": code}
    with pytest.raises(protocol.BadRequest, match="no code"):
        request_table.read_exec(header)


def test_a_set_value_without_aliases_has_none() -> None:
    request = request_table.read_set_value({"type": "set_value", "name": "x", "kind": "json"}, 2)
    assert request["aliases"] == []


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"name": ""}, "bad variable name"),
        ({"name": 3}, "bad variable name"),
        ({"name": "__x__"}, "bad variable name"),
        ({"aliases": "y"}, "bad variable name"),
        ({"aliases": ["y", None]}, "bad variable name"),
        ({"blob": HOST_BLOB, "blob_size": 4 + blob_format.HOST_BLOB_OVERHEAD}, "a host-made blob needs"),
        (
            {"blob": HOST_BLOB, "blob_size": 3 + blob_format.HOST_BLOB_OVERHEAD, "kind": "json"},
            "a host-made blob needs",
        ),
        ({"blob": "0" * 32, "blob_size": 3 + blob_format.HOST_BLOB_OVERHEAD}, "a host-made blob needs"),
    ],
)
def test_a_bad_set_value_is_refused(changes: dict[str, Any], reason: str) -> None:
    header = {"type": "set_value", "name": "x", "kind": "str", "aliases": [], **changes}
    with pytest.raises(protocol.BadRequest, match=reason):
        request_table.read_set_value(header, 3)


@pytest.mark.parametrize("changes", [{"name": ""}, {"name": None}, {"digest": 5}, {"name": "__builtins__"}])
def test_a_bad_load_is_refused(changes: dict[str, Any]) -> None:
    header = {"type": "load", "name": "x", "digest": "0" * 32, **changes}
    with pytest.raises(protocol.BadRequest, match="needs a name and a digest"):
        request_table.read_load(header)


def test_a_bad_restore_end_generation_is_refused() -> None:
    for generation in (-1, True, "7", 7.0, None):
        with pytest.raises(protocol.BadRequest, match="needs a generation"):
            request_table.read_restore_end({"type": "restore_end", "generation": generation})


@pytest.mark.parametrize("changes", [{"size": -1}, {"size": None}, {"size": 1.5}, {"size": True}, {"name": ""}])
def test_a_bad_defer_is_refused(changes: dict[str, Any]) -> None:
    header = {"type": "defer", "name": "x", "digest": "0" * 32, "size": 3, **changes}
    with pytest.raises(protocol.BadRequest, match="needs a"):
        request_table.read_defer(header)


def test_a_blob_call_is_read_and_a_bad_one_refused() -> None:
    built = blob_format.blob_call("ctx/x", "0" * 32)
    assert blob_format.read_blob_call(framing.decode_json(framing.encode_header(built))) == built
    for payload in (None, [1], {"key": "x"}, {"key": 1, "digest": "d"}, {"key": "x", "digest": ["d"]}):
        with pytest.raises(protocol.BadRequest, match="needs a key and a digest"):
            blob_format.read_blob_call(payload)


@pytest.mark.parametrize(
    ("header", "body_size", "reason"),
    [
        ({"type": "files_put", "entries": "x"}, 0, "list of at most"),
        ({"type": "files_put", "entries": [["a", "f", 0o644, 0, "r"]]}, 0, r"\[path, kind"),
        ({"type": "files_put", "entries": [["a", "f", 0o644, 0, "r", 3]]}, 2, "body must hold"),
        ({"type": "files_put", "entries": [["a", "f", 0o644, 0, "r", -1]]}, 0, r"\[path, kind"),
        ({"type": "file_write", "path": "", "mode": 0o644}, 0, "needs a path and a mode"),
        ({"type": "file_write", "path": "a", "mode": 0o1777}, 0, "needs a path and a mode"),
        ({"type": "file_remove", "path": "a", "recursive": 1}, 0, "needs a path and recursive"),
        ({"type": "file_remove", "path": None, "recursive": True}, 0, "needs a path and recursive"),
    ],
)
def test_bad_workspace_requests_are_refused(header: dict[str, Any], body_size: int, reason: str) -> None:
    with pytest.raises(protocol.BadRequest, match=reason):
        request_table.REQUESTS[header["type"]].read(header, body_size)


def test_bad_install_fields_are_refused() -> None:
    built = request_table.install_request("def before_cell(ns): pass", ["llm_query"], 30.0)
    for changes in ({"code": None}, {"names": "x"}, {"names": [1]}):
        with pytest.raises(protocol.BadRequest, match="install needs code"):
            request_table.read_install({**built, **changes})


def test_bad_context_request_fields_are_refused() -> None:
    created = request_table.context_create_request("ctx", "/tmp/ctx", {"A": "1"}, 60.0)
    assert "checkpoint_timeout" not in request_table.context_create_request("ctx", "/tmp/ctx", {})
    for changes, reason in (
        ({"context": ""}, "needs a context id"),
        ({"context": "a/b"}, "needs a context id"),
        ({"context": 1}, "needs a context id"),
        ({"cwd": "tmp/ctx"}, "absolute cwd"),
        ({"env": {"A": 1}}, "absolute cwd"),
        ({"env": ["A"]}, "absolute cwd"),
    ):
        with pytest.raises(protocol.BadRequest, match=reason):
            request_table.read_context({**created, **changes})


def test_the_controllers_other_messages() -> None:
    assert handshake.auth_message("n", "p") == {"type": protocol.AUTH, "nonce": "n", "proof": "p"}
    assert reply_types.host_reply(3) == {"type": protocol.HOST_REPLY, "call": 3, "status": protocol.STATUS_OK}
    failed = reply_types.host_reply(3, "no")
    assert failed == {"type": protocol.HOST_REPLY, "call": 3, "status": protocol.STATUS_ERROR, "error": "no"}
    assert request_table.reset_request(1.0) == {"type": request_table.RESET, "checkpoint_timeout": 1.0}
    assert request_table.restore_begin_request(0) == {"type": request_table.RESTORE_BEGIN, "generation": 0}


# --- the request table ---------------------------------------------------------------------------


def test_every_request_has_a_row_whose_handler_the_worker_has() -> None:
    assert set(request_table.REQUESTS) == _REQUESTS
    assert {row.reply for row in request_table.REQUESTS.values()} == _REPLIES
    assert protocol.ERROR not in _REQUESTS | _REPLIES and request_table.reply_type("nope") == protocol.ERROR
    worker = next(
        n for n in ast.parse((AGENT_DIR / "worker.py").read_text()).body if getattr(n, "name", "") == "Worker"
    )
    methods = {node.name for node in ast.walk(worker) if isinstance(node, ast.FunctionDef)}
    assert {row.handler for row in request_table.REQUESTS.values()} - methods == {None}  # ping: the supervisor's


def test_every_request_shape_is_a_request_of_the_union() -> None:
    shapes = {shape.__name__ for shape in request_table.Request.__args__}  # type: ignore[attr-defined]
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
    assert written == []  # request_table.REQUESTS has a row per request: EXEC: Row(EXEC_REPLY, ...)
