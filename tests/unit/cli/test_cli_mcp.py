"""``orchestrator mcp``'s options: the limits, the token, and the address it binds."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.cli import build_parser
from orchestrator.cli.mcp_command import _is_loopback, _limits, _token, run
from orchestrator.errors import ConfigError


def parse(*argv: str):
    return build_parser().parse_args(["mcp", *argv])


def test_defaults_serve_stdio_and_bind_http_to_loopback() -> None:
    args = parse()
    assert (args.http, args.host, args.session, args.force, args.keep) == (False, "127.0.0.1", None, False, False)
    limits = _limits(args)
    assert limits.file_roots == () and limits.max_timeout is None


def test_limits_are_checked(tmp_path: Path) -> None:
    assert _limits(parse("--allow-files", str(tmp_path), "--max-context-bytes", "1KiB")).file_roots == (tmp_path,)
    assert _limits(parse("--max-context-bytes", "1KiB")).max_context_bytes == 1024
    with pytest.raises(ConfigError, match="not a directory"):
        _limits(parse("--allow-files", str(tmp_path / "missing")))
    with pytest.raises(ConfigError, match="at least 2000"):
        _limits(parse("--max-answer-chars", "10"))
    with pytest.raises(ConfigError, match="at least 1"):
        _limits(parse("--max-sessions", "0"))
    with pytest.raises(ConfigError, match="--max-clients must be at least 1"):
        _limits(parse("--max-clients", "0"))
    assert parse().max_clients == 32


def test_the_token_is_made_unless_given_and_a_weak_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORCH_MCP_TOKEN", raising=False)
    made, printed = _token()
    assert printed and len(made) >= 32 and made != _token()[0]
    monkeypatch.setenv("ORCH_MCP_TOKEN", "a-token-of-enough-length")
    assert _token() == ("a-token-of-enough-length", False)
    for weak in ("short", "has a space in it, sadly", ""):
        monkeypatch.setenv("ORCH_MCP_TOKEN", weak)
        with pytest.raises(ConfigError, match="ORCH_MCP_TOKEN"):
            _token()


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("::1", True), ("localhost", True), ("0.0.0.0", False), ("192.168.1.2", False)],
)
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert _is_loopback(host) is loopback


def test_without_the_sdk_the_command_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "orchestrator.mcp.server", raising=False)
    for name in [name for name in sys.modules if name == "mcp" or name.startswith("mcp.")]:
        monkeypatch.setitem(sys.modules, name, None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "mcp", None)
    with pytest.raises(ConfigError, match=re.escape("pip install 'orchestrator-sessions[mcp]'")):
        run(SimpleNamespace(orch=None), parse())
