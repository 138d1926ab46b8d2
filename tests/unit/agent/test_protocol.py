"""The wire format as a whole: the agent's imports, the Python it parses as, the spec document pinned to it, and
every message type the agent sends defined and documented."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from orchestrator.agent import blob_format, checkpoint_names, framing, handshake, protocol, reply_types, request_table

AGENT_DIR = Path(protocol.__file__).parent
DOC = Path(__file__).resolve().parents[3] / "docs" / "protocol.md"


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", sorted(AGENT_DIR.glob("*.py")), ids=lambda p: p.name)
def test_agent_uses_only_stdlib_and_dill(path):
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    if path.name in ("worker.py", "checkpoint.py"):
        allowed.add("dill")
    assert _imports(path) <= allowed, f"{path.name} imports {_imports(path) - allowed}"


# --- the spec document and the agent's Python ------------------------------------------------


def test_the_spec_document_is_pinned_to_the_protocol_version():
    text = DOC.read_text()
    title = text.splitlines()[0]
    assert title == f"# The agent protocol, version {protocol.PROTOCOL_VERSION}"
    assert f"`PROTOCOL_VERSION` there is {protocol.PROTOCOL_VERSION}" in text
    assert f"(depth {framing.MAX_HEADER_DEPTH})" in text


@pytest.mark.parametrize(
    "module", [protocol, framing, handshake, request_table, reply_types, checkpoint_names, blob_format]
)
def test_the_wire_format_parses_as_python_3_8(module):
    # The controller and the image's Python both import it: no match statements, no parenthesized context managers.
    ast.parse(Path(module.__file__).read_text(), feature_version=(3, 8))


def _message_types() -> dict[str, str]:
    """NAME -> value of every message type constant: the assignments in the "... types" sections of protocol.py
    (every message but the requests and their replies) and request_table.py (those)."""
    protocol_source, table_source = Path(protocol.__file__).read_text(), Path(request_table.__file__).read_text()
    section = protocol_source[protocol_source.index("# --- Message types") : protocol_source.index("STATUS_OK = ")]
    section += table_source[table_source.index("# --- Request types") : table_source.index("# In the shapes below")]
    return dict(re.findall(r'^([A-Z_]+) = "([a-z_]+)"', section, re.MULTILINE))


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
        if isinstance(value, ast.Attribute) and getattr(value.value, "id", "") in ("protocol", "request_table"):
            assert value.attr in defined, f"{path.name}:{value.lineno}: {value.attr} is no message type"


def test_every_message_type_is_documented() -> None:
    text = DOC.read_text()
    missing = [value for value in _message_types().values() if f"`{value}" not in text]
    assert not missing


def test_the_message_types_are_distinct_and_include_the_error_reply() -> None:
    types = _message_types()
    assert len(set(types.values())) == len(types)
    assert types["ERROR"] == "error"
