"""The grading harness in the sandbox: the records a child sends it, and what strict mode offers the tests (every
input may come from hostile code)."""

from __future__ import annotations

import json
import math

import pytest

from orchestrator.agent import grading

# -- what a child sends the harness


def test_a_childs_record_is_checked_and_clipped() -> None:
    error = {"ename": "E" * 500, "evalue": "v" * 20000, "snippet": "s", "traceback": "t", "line": 10**12}
    record = grading._parse_record(json.dumps({"phase": "code", "error": error}).encode(), "code")
    assert record is not None
    assert len(record["error"]["ename"]) == 200 and len(record["error"]["evalue"]) == 8192
    assert record["error"]["line"] is None
    assert grading._parse_record(b'{"phase": "code", "error": null}', "code") == {"error": None}


@pytest.mark.parametrize(
    "raw",
    [
        b'{"phase": "tests", "error": null}',
        b'{"phase": "code", "error": "x"}',
        b'{"phase": "code", "error": {"ename": 1}}',
        b'{"phase": "code", "error": {"ename": "", "evalue": "", "snippet": "", "traceback": ""}}',
        b'{"phase": "code", "error": NaN}',
        b"\xff",
        b"[]",
    ],
)
def test_a_record_that_is_not_one_is_refused(raw: bytes) -> None:
    assert grading._parse_record(raw, "code") is None


# -- what S offers the tests in strict mode, and what T takes


def test_the_code_namespace_is_offered_as_stubs_modules_and_data() -> None:
    namespace = {
        "__builtins__": {},
        "math": math,
        "add": lambda a, b: a + b,
        "Point": type("Point", (), {}),
        "LIMIT": 10,
        "table": {"a": (1, 2)},
        "handle": object(),
        "abs": lambda x: 0,
    }
    callables, modules, data = grading._exposed(namespace)
    assert sorted(callables) == ["Point", "abs", "add"]
    assert modules == {"math": "math"}
    assert data == {"LIMIT": 10, "table": {"a": (1, 2)}}


def test_the_tests_never_take_a_name_that_shadows_a_builtin() -> None:
    assert grading._given("add") and grading._given("_helper")
    for name in ("abs", "len", "isinstance", "AssertionError", "__import__", "not an identifier", 3, "x" * 300):
        assert not grading._given(name), name
