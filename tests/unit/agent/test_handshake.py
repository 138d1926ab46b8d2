"""The connection's set-up: the sandbox secret's file, and the controller's auth as the agent reads it."""

from __future__ import annotations

import pytest

from orchestrator.agent import framing, handshake, protocol


def test_secret_round_trip_and_malformed_secrets():
    key = bytes(range(32))
    text = handshake.format_secret(key)
    assert len(text) == 64 and handshake.parse_secret(text) == key == handshake.parse_secret(text + b"\n")
    for bad in [b"", text[:-2], text + b"00", b"zz" * 32, b"aa " * 21 + b"a", "é".encode() * 32]:
        with pytest.raises(ValueError):
            handshake.parse_secret(bad)


def test_an_auth_is_read_and_a_bad_one_refused() -> None:
    built = handshake.auth_message(handshake.new_nonce(), "proof")
    assert handshake.read_auth(framing.decode_header(framing.encode_header(built))) == built
    for changes in ({"type": "hello"}, {"nonce": ""}, {"nonce": 5}, {"nonce": "n" * (handshake.MAX_NONCE_CHARS + 1)}):
        with pytest.raises(protocol.BadRequest):
            handshake.read_auth({**built, **changes})
