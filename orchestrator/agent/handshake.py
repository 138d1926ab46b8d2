"""The connection's set-up (docs/protocol.md, "Connection set-up"): the sandbox secret, hello, auth and its proofs.

Each side proves it knows the sandbox's secret with an HMAC bound to both sides' nonces, so a
proof cannot be replayed on another connection.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import List, TypedDict, cast

from .framing import Header
from .protocol import AUTH, BadRequest

SECRET_BYTES = 32  # the sandbox secret: this many random bytes, stored as twice as many hex characters
NONCE_BYTES = 16


def new_nonce() -> str:
    """A fresh random challenge for the connection handshake (hex)."""
    import secrets

    return secrets.token_hex(NONCE_BYTES)


def auth_proof(secret: bytes, role: str, agent_nonce: str, controller_nonce: str) -> str:
    """Proof that ``role`` ("controller" or "agent") knows the sandbox's secret, bound to both nonces."""
    message = ("%s|%s|%s" % (role, agent_nonce, controller_nonce)).encode("ascii", "replace")
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def proof_matches(expected: str, given: object) -> bool:
    """Constant-time comparison of a handshake proof."""
    return isinstance(given, str) and hmac.compare_digest(
        expected.encode("ascii", "replace"), given.encode("ascii", "replace")
    )


def format_secret(key: bytes) -> bytes:
    """The contents of a sandbox's ``secret`` file for a key of SECRET_BYTES random bytes (lower-case hex)."""
    if len(key) != SECRET_BYTES:
        raise ValueError("a sandbox secret is %d bytes, got %d" % (SECRET_BYTES, len(key)))
    return key.hex().encode("ascii")


def parse_secret(text: bytes) -> bytes:
    """The key (SECRET_BYTES raw bytes, what ``auth_proof`` takes) from a ``secret`` file's contents.

    Raises:
        ValueError: the contents are not 2 * SECRET_BYTES hex characters (a final newline is allowed).
    """
    text = text[:-1] if text.endswith(b"\n") else text
    try:
        key = bytes.fromhex(text.decode("ascii"))
    except ValueError:  # UnicodeDecodeError included
        key = b""
    if len(text) != 2 * SECRET_BYTES or len(key) != SECRET_BYTES:
        raise ValueError("a sandbox secret file holds %d hex characters" % (2 * SECRET_BYTES))
    return key


class Auth(TypedDict):
    """The controller's answer to the hello (docs/protocol.md, "Connection set-up")."""

    type: str
    nonce: str
    proof: str  # auth_proof(secret, "controller", agent nonce, this nonce)


def auth_message(nonce: str, proof: str) -> Auth:
    return Auth(type=AUTH, nonce=nonce, proof=proof)


MAX_NONCE_CHARS = 256  # a nonce the agent takes (the controller's are 2 * NONCE_BYTES hex characters)


def read_auth(header: Header) -> Auth:
    """The controller's auth frame; its proof is checked by ``proof_matches`` (any value, in constant time).

    Raises:
        BadRequest: not an auth frame, or its nonce is not a str of 1 to MAX_NONCE_CHARS characters.
    """
    nonce = header.get("nonce")
    if header.get("type") != AUTH or not isinstance(nonce, str) or not 0 < len(nonce) <= MAX_NONCE_CHARS:
        raise BadRequest("not an auth frame with a nonce")
    return cast(Auth, header)


class _HelloFields(TypedDict):
    protocol: int  # PROTOCOL_VERSION
    sandbox_id: str
    generation: int  # the checkpoint generation the agent's memory holds (0: a fresh worker)
    python: str
    dill: str
    nonce: str  # the agent's challenge for the handshake


class Hello(_HelloFields, total=False):
    """The agent's first frame on a connection (docs/protocol.md, "Connection set-up")."""

    agent_pid: int  # for a person reading logs: the controller does not use them
    worker_pid: int
    capabilities: List[str]  # what the agent can do besides the protocol's version: BLOB_FILES, RELAYED
