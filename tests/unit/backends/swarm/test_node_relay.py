"""The node relay as a real process on 127.0.0.1: its requests, mutual TLS, the bridge, takeover and restart.

Also the relay's credentials (``backends/swarm/tls.py``), the controller's client (``swarm/relay_client.py``), and the
Swarm backend's sweep of the directories removals left (on a fake engine, with the real relay).
Nothing here leaves the machine: the relay listens on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from relay_support import RelayProcess, connect_agent

from orchestrator import Settings
from orchestrator.agent import framing, handshake
from orchestrator.agent.node_relay import MAX_REQUEST, BadRequest, parse_request
from orchestrator.backends.base import MANAGED, SANDBOX_ID, STORE_ID, Placement, ResourceUsage
from orchestrator.backends.swarm.backend import SwarmBackend
from orchestrator.backends.swarm.nodes import Node
from orchestrator.backends.swarm.relay_client import NodeDirectory, RelayClient, RelayEndpoint
from orchestrator.backends.swarm.tls import RELAY_NAME, Credentials, client_context, ensure_credentials
from orchestrator.errors import AgentTimeoutError, ChannelLost, ConfigError, RelayUnavailable
from orchestrator.wire.endpoint import CHANNEL_MOUNT, SECRET_NAME, SOCKET_NAME
from orchestrator.wire.transport import Channel

SID = "sb-0123456789ab"
NOBODY = 65534
OTHER = 4242
ROOT = os.geteuid() == 0
UID = os.geteuid()  # the fake agents are this process (or its children)
needs_root = pytest.mark.skipif(not ROOT, reason="needs root to give files to other uids")
LIMITS = {"max_header": 1 << 20, "max_body": 1 << 30}


def short_dir(prefix: str) -> Path:
    """A private directory with a short path (a socket path must fit in 107 bytes)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


@pytest.fixture(scope="module")
def credentials() -> Iterator[Credentials]:
    directory = short_dir("rc-")
    yield ensure_credentials(directory / "tls")
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def stranger() -> Iterator[Credentials]:
    """Credentials of another store: another CA."""
    directory = short_dir("rs-")
    yield ensure_credentials(directory / "tls")
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def base() -> Iterator[Path]:
    directory = short_dir("rl-")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def relay(base: Path, credentials: Credentials) -> Iterator[RelayProcess]:
    process = RelayProcess(base / "node", credentials, base / "relay.log")
    process.start()
    try:
        yield process
    finally:
        process.stop()


def endpoint(relay: RelayProcess, uid: int | None = UID, *, take_over: bool = False) -> RelayEndpoint:
    make = RelayEndpoint.open if take_over else RelayEndpoint.create
    return make(
        relay.client(),
        SID,
        node=NodeDirectory("node-1", "/var/lib/orchestrator-relay/store"),
        sandbox_uid=uid,
        sandbox_gid=uid,
        **LIMITS,
    )


def soon(seconds: float = 10.0) -> float:
    return time.monotonic() + seconds


def frame_bytes(header: dict[str, Any], body: bytes = b"") -> bytes:
    return b"".join(bytes(part) for part in framing.frame_parts(header, body))


def recv_exactly(sock: socket.socket, size: int, timeout: float = 20.0) -> bytes:
    sock.settimeout(timeout)
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(min(1 << 20, size - len(data)))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def closed_by_peer(sock: socket.socket, timeout: float = 10.0) -> bool:
    """True when the peer closed ``sock`` (EOF or reset) within ``timeout``; what arrived before is skipped."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


def ping_pong(channel: Channel, agent: socket.socket, n: int = 0) -> None:
    """One frame each way through the bridge."""
    framing.send_frame(agent, {"type": "hello", "n": n})
    assert channel.recv(deadline=soon())[0] == {"type": "hello", "n": n}
    channel.send({"type": "auth", "n": n}, deadline=soon())
    expected = frame_bytes({"type": "auth", "n": n})
    assert recv_exactly(agent, len(expected)) == expected


# --- requests --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_",
    [
        {"op": "create", "sandbox": SID, "uid": 65534, "gid": 65534},
        {"op": "open", "sandbox": SID, "uid": None, "gid": None},
        {"op": "create", "sandbox": SID},
        {"op": "accept", "sandbox": SID, "timeout": 2.5},
        {"op": "accept", "sandbox": SID, "timeout": 0},
        {"op": "remove", "sandbox": SID},
        {"op": "list"},
    ],
)
def test_valid_requests_parse(request_):
    parsed = parse_request(json.dumps(request_).encode())
    assert parsed["op"] == request_["op"]
    if request_["op"] in ("create", "open"):
        assert parsed["uid"] == request_.get("uid") and parsed["gid"] == request_.get("gid")


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (b"not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"op": "format"}', "unknown op"),
        (b'{"sandbox": "sb-1"}', "unknown op"),
        (b'{"op": "list", "extra": 1}', "unexpected fields"),
        (b'{"op": "remove", "sandbox": "../etc"}', "plain name"),
        (b'{"op": "remove", "sandbox": ".hidden"}', "plain name"),
        (b'{"op": "remove", "sandbox": 7}', "plain name"),
        (b'{"op": "remove"}', "plain name"),
        (b'{"op": "create", "sandbox": "sb-1", "uid": -1}', "uid must be"),
        (b'{"op": "create", "sandbox": "sb-1", "uid": true}', "uid must be"),
        (b'{"op": "create", "sandbox": "sb-1", "gid": "0"}', "gid must be"),
        (b'{"op": "create", "sandbox": "sb-1", "uid": 4294967295}', "uid must be"),
        (b'{"op": "create", "sandbox": "sb-1", "uid": 1.0}', "uid must be"),
        (b'{"op": "accept", "sandbox": "sb-1"}', "timeout must be"),
        (b'{"op": "accept", "sandbox": "sb-1", "timeout": -1}', "timeout must be"),
        (b'{"op": "accept", "sandbox": "sb-1", "timeout": 1e9}', "timeout must be"),
        (b'{"op": "accept", "sandbox": "sb-1", "timeout": NaN}', "not JSON"),
        (b'{"op": "accept", "sandbox": "sb-1", "timeout": Infinity}', "not JSON"),
        (b'{"op": "accept", "sandbox": "sb-1", "timeout": "5"}', "timeout must be"),
        (b'{"op": "list", "pad": "' + b"x" * MAX_REQUEST + b'"}', "over 4096 bytes"),
        (b"[" * 5000, "over 4096 bytes"),
        (b"[" * 2000 + b"]" * 2000, "not JSON"),  # deep nesting within the size limit
    ],
)
def test_invalid_requests_are_refused_with_a_reason(line, says):
    with pytest.raises(BadRequest, match=says):
        parse_request(line)


# --- credentials -----------------------------------------------------------------------------------


def test_credentials_are_private_reused_and_what_each_side_needs(base):
    directory = base / "tls"
    made = ensure_credentials(directory)
    assert stat.S_IMODE(os.lstat(directory).st_mode) == 0o700
    for key in (made.ca_key, made.relay_key, made.controller_key):
        assert stat.S_IMODE(os.lstat(key).st_mode) == 0o600, key
    again = ensure_credentials(directory)
    assert again == made  # nothing made anew
    assert made.relay_files() == {
        "relay.crt": made.relay_cert.read_bytes(),
        "relay.key": made.relay_key.read_bytes(),
        "ca.crt": made.ca_cert.read_bytes(),
    }
    ca = x509.load_pem_x509_certificate(made.ca_pem)
    relay = x509.load_pem_x509_certificate(made.relay_cert_pem)
    controller = x509.load_pem_x509_certificate(made.controller_cert.read_bytes())
    for cert in (relay, controller):
        cert.verify_directly_issued_by(ca)
        public = cert.public_key()
        assert isinstance(public, ec.EllipticCurvePublicKey) and public.curve.name == "secp256r1"
        assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days > 3000
    assert relay.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    ) == [RELAY_NAME]
    assert list(relay.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH
    ]
    assert list(controller.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH
    ]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_a_missing_certificate_is_made_again_under_the_same_ca(base):
    made = ensure_credentials(base / "tls")
    made.relay_key.unlink()
    again = ensure_credentials(base / "tls")
    assert again.ca_pem == made.ca_pem
    assert again.relay_key_pem != made.relay_key_pem and again.relay_cert_pem != made.relay_cert_pem
    assert again.controller_cert.read_bytes() == made.controller_cert.read_bytes()


def test_credentials_refuse_a_directory_open_to_others(base):
    (base / "tls").mkdir(mode=0o755)
    (base / "tls").chmod(0o755)
    with pytest.raises(ConfigError, match="chmod 700"):
        ensure_credentials(base / "tls")


# --- create, open, list, remove --------------------------------------------------------------------


def test_create_open_list_and_remove(relay):
    client = relay.client()
    directory = relay.node_dir / SID
    key = client.create(SID, UID, UID)
    assert handshake.parse_secret((directory / SECRET_NAME).read_bytes()) == key
    assert sorted(os.listdir(directory)) == [SOCKET_NAME, SECRET_NAME]
    assert stat.S_ISSOCK(os.lstat(directory / SOCKET_NAME).st_mode)
    assert stat.S_IMODE(os.lstat(relay.node_dir).st_mode) == 0o700
    with pytest.raises(ConfigError, match="already exists"):
        client.create(SID, UID, UID)
    inode = os.lstat(directory / SOCKET_NAME).st_ino
    assert client.open(SID, UID, UID) == key
    assert os.lstat(directory / SOCKET_NAME).st_ino != inode
    assert sorted(os.listdir(directory)) == [SOCKET_NAME, SECRET_NAME]
    client.create("sb-other", None, None)
    ages = client.sandbox_ages()
    assert list(ages) == [SID, "sb-other"] and all(0 <= age < 60 for age in ages.values()), ages
    client.remove(SID)
    assert not os.path.lexists(directory)
    client.remove(SID)  # a missing one is fine
    assert list(client.sandbox_ages()) == ["sb-other"]
    with pytest.raises(ConfigError, match="is gone"):
        client.open(SID, UID, UID)


def test_list_gives_each_directorys_age_by_its_mtime_and_only_sandbox_directories(relay):
    client = relay.client()
    now = time.time()
    for sandbox_id, mtime in (("sb-old", now - 3600), ("sb-new", now), ("sb-future", now + 3600)):
        client.create(sandbox_id, None, None)
        os.utime(relay.node_dir / sandbox_id, (mtime, mtime))
    (relay.node_dir / "sb-file").write_bytes(b"")  # not a directory
    (relay.node_dir / "sb-link").symlink_to(relay.node_dir / "sb-old")
    (relay.node_dir / ".hidden").mkdir()  # not a sandbox id
    ages = client.sandbox_ages()
    assert list(ages) == ["sb-future", "sb-new", "sb-old"]
    assert 3590 < ages["sb-old"] < 3660 and 0 <= ages["sb-new"] < 60
    assert ages["sb-future"] == 0  # a clock set back: not old


@contextlib.contextmanager
def fake_relay(credentials: Credentials, reply: bytes) -> Iterator[RelayClient]:
    """A client of a one-request TLS server with our relay's certificate that answers ``reply`` (a line)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_cert_chain(credentials.relay_cert, credentials.relay_key)
    context.load_verify_locations(cafile=credentials.ca_cert)
    server = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        conn, _ = server.accept()
        with context.wrap_socket(conn, server_side=True) as tls:
            tls.settimeout(10)
            tls.recv(MAX_REQUEST)
            tls.sendall(reply + b"\n")

    thread = threading.Thread(target=answer)
    thread.start()
    try:
        yield RelayClient("127.0.0.1", server.getsockname()[1], client_context(credentials), timeout=5)
    finally:
        thread.join(15)
        server.close()


@pytest.mark.parametrize(
    "sandboxes",
    [
        b'["sb-1"]',  # the ids without their ages
        b'{"../etc": 1}',
        b'{".hidden": 1}',
        b'{"sb-1": -1}',
        b'{"sb-1": "5"}',
        b'{"sb-1": true}',
        b'{"sb-1": null}',
        b'{"sb-1": 1e999}',  # inf
        b"null",
    ],
)
def test_a_malformed_list_is_relay_unavailable(credentials, sandboxes):
    reply = b'{"ok": true, "sandboxes": ' + sandboxes + b"}"
    with fake_relay(credentials, reply) as client, pytest.raises(RelayUnavailable, match="malformed list"):
        client.sandbox_ages()


def test_a_well_formed_list_from_any_relay(credentials):
    with fake_relay(credentials, b'{"ok": true, "sandboxes": {"sb-1": 5, "sb-2": 0.25}}') as client:
        ages = client.sandbox_ages()
    assert ages == {"sb-1": 5.0, "sb-2": 0.25} and all(type(age) is float for age in ages.values())


@needs_root
def test_as_root_the_directory_is_given_to_the_sandbox_user(relay):
    relay.client().create(SID, NOBODY, NOBODY)
    directory = relay.node_dir / SID
    for path, mode in [(directory, 0o700), (directory / SECRET_NAME, 0o400), (directory / SOCKET_NAME, 0o600)]:
        st = os.lstat(path)
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (mode, NOBODY, NOBODY), path


def test_the_relay_refuses_a_node_directory_open_to_others(base, credentials):
    (base / "node").mkdir()
    (base / "node").chmod(0o755)
    process = RelayProcess(base / "node", credentials, base / "relay.log")
    with pytest.raises(AssertionError, match="exited with 2"):
        process.start()
    assert "chmod 700" in process.log() and "ORCH_RELAY_DIR" in process.log()


def test_endpoint_mounts_environment_and_constraints(relay):
    made = endpoint(relay)
    assert made.sandbox_id == SID and made.node_id == "node-1"
    assert made.mounts() == {f"/var/lib/orchestrator-relay/store/{SID}": CHANNEL_MOUNT}
    assert made.environment() == {
        "ORCH_CHANNEL": "/run/orchestrator/channel.sock",
        "ORCH_SECRET_FILE": "/run/orchestrator/secret",
    }
    assert made.constraints() == ["node.id==node-1"]
    made.close()
    with pytest.raises(ChannelLost, match="closed"):
        made.accept(soon(1))
    made.remove()
    assert not os.path.lexists(relay.node_dir / SID)


def test_an_unreachable_relay_is_relay_unavailable_with_advice(credentials, caplog):
    with socket.socket() as placeholder:  # a port nothing listens on
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
    client = RelayClient("127.0.0.1", port, client_context(credentials), timeout=2)
    with pytest.raises(RelayUnavailable, match=r"no relay answers at 127\.0\.0\.1:.*relay service runs"):
        client.create(SID, None, None)
    with pytest.raises(RelayUnavailable):
        client.connect(SID, soon(1))
    gone = RelayEndpoint(client, SID, bytes(32), node=NodeDirectory("n", "/n"), **LIMITS)
    gone.remove()  # clean-up: logged, not raised
    assert any("stays" in r.getMessage() for r in caplog.records)


# --- mutual TLS ------------------------------------------------------------------------------------


def _context(trust: Credentials, cert: Path | None, key: Path | None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cadata=trust.ca_pem.decode())
    if cert is not None and key is not None:
        context.load_cert_chain(cert, key)
    return context


def _exchange(port: int, line: bytes, context: ssl.SSLContext | None) -> bytes:
    """Send ``line`` (over TLS with ``context``, or plaintext) and return every byte that came back."""
    received = bytearray()
    sock = socket.create_connection(("127.0.0.1", port), timeout=15)
    try:
        if context is not None:
            sock = context.wrap_socket(sock, server_hostname=RELAY_NAME)
        sock.sendall(line)
        while chunk := sock.recv(65536):
            received += chunk
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        pass
    finally:
        sock.close()
    return bytes(received)


def test_clients_without_our_certificate_are_refused_and_learn_nothing(relay, credentials, stranger):
    client = relay.client()
    secret_text = handshake.format_secret(client.create(SID, UID, UID))
    inode = os.lstat(relay.node_dir / SID / SOCKET_NAME).st_ino
    refused = {
        "no certificate": _context(credentials, None, None),
        "another CA's certificate": _context(credentials, stranger.controller_cert, stranger.controller_key),
        "the relay's own certificate (serverAuth only)": _context(
            credentials, credentials.relay_cert, credentials.relay_key
        ),
    }
    for what, context in refused.items():
        rogue = RelayClient("127.0.0.1", relay.port, context, timeout=5)
        with pytest.raises(RelayUnavailable, match=r"refused|closed the connection"):
            rogue.open(SID, UID, UID)
        with pytest.raises(RelayUnavailable):
            rogue.create("sb-rogue", None, None)
        for op in ("open", "create", "list"):
            line = json.dumps({"op": op, "sandbox": SID} if op != "list" else {"op": op}).encode() + b"\n"
            answer = _exchange(relay.port, line, context)
            assert secret_text not in answer and b"ok" not in answer, what
    for line in (b'{"op": "open", "sandbox": "%s"}\n' % SID.encode(), b'{"op": "create", "sandbox": "sb-plain"}\n'):
        answer = _exchange(relay.port, line, None)  # plaintext
        assert secret_text not in answer and b"ok" not in answer
    assert sorted(os.listdir(relay.node_dir)) == [SID]  # nothing was made
    assert os.lstat(relay.node_dir / SID / SOCKET_NAME).st_ino == inode  # nothing was taken over
    log = relay.log()
    assert log.count("TLS handshake failed") >= 2, log
    assert list(client.sandbox_ages()) == [SID]  # and the relay serves us as before


def test_the_controller_refuses_a_relay_of_another_store(relay, stranger):
    client = RelayClient("127.0.0.1", relay.port, client_context(stranger), timeout=5)
    with pytest.raises(RelayUnavailable, match="does not trust"):
        client.create(SID, None, None)
    assert not os.path.lexists(relay.node_dir / SID)


def test_bad_requests_over_tls_get_a_reason_and_the_relay_serves_on(relay, credentials):
    context = client_context(credentials)
    for line, says in [
        (b"not json\n", "not JSON"),
        (b'{"op": "remove", "sandbox": "../../etc"}\n', "plain name"),
        (b"x" * (MAX_REQUEST + 10), "over 4096 bytes"),
    ]:
        reply = json.loads(_exchange(relay.port, line, context))
        assert reply["ok"] is False and reply["kind"] == "invalid" and says in reply["error"], reply
    assert relay.client().sandbox_ages() == {}
    assert relay.process is not None and relay.process.poll() is None


def test_connections_over_the_limit_are_closed_until_one_ends(base, credentials):
    relay = RelayProcess(base / "node", credentials, base / "relay.log", ORCH_RELAY_MAX_CONNECTIONS="2")
    relay.start()
    try:
        idle = [socket.create_connection(("127.0.0.1", relay.port)) for _ in range(2)]  # no handshake: slots held
        try:
            time.sleep(0.3)
            with pytest.raises(RelayUnavailable):
                relay.client().sandbox_ages()
            assert "2 connections are open already" in relay.log()
        finally:
            for sock in idle:
                sock.close()
        time.sleep(0.3)
        assert relay.client().sandbox_ages() == {}
    finally:
        relay.stop()


# --- accept and the bridge -------------------------------------------------------------------------


def test_bytes_cross_the_bridge_unchanged_both_ways(relay):
    made = endpoint(relay)
    agent = connect_agent(relay.node_dir / SID / SOCKET_NAME)
    channel = made.accept(soon())
    try:
        ping_pong(channel, agent)
        up = os.urandom(10 << 20)
        down = os.urandom(10 << 20)
        expected_up = frame_bytes({"type": "set_value"}, up)
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.append(recv_exactly(agent, len(expected_up), 60)))
        writer = threading.Thread(target=lambda: framing.send_frame(agent, {"type": "state_reply"}, down))
        reader.start()
        writer.start()
        channel.send({"type": "set_value"}, up, deadline=soon(60))
        header, body = channel.recv(deadline=soon(60))
        reader.join(60)
        writer.join(60)
        assert header == {"type": "state_reply"} and body == down
        assert got == [expected_up]
        ping_pong(channel, agent, 1)  # the bridge works on after a big frame each way
    finally:
        channel.close()
        agent_closed = closed_by_peer(agent)
        agent.close()
    assert agent_closed  # closing the controller's side closed the agent's
    time.sleep(0.2)
    assert "bridge to" in relay.log() and "ended" in relay.log()


def rss(pid: int) -> int:
    """Resident memory of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_an_agent_that_stops_reading_stalls_the_controller_and_nothing_piles_up_in_the_relay(relay):
    made = endpoint(relay)
    agent = connect_agent(relay.node_dir / SID / SOCKET_NAME)
    channel = made.accept(soon())
    try:
        ping_pong(channel, agent)
        assert relay.process is not None
        before = rss(relay.process.pid)
        with pytest.raises(AgentTimeoutError, match="did not take"):
            channel.send({"type": "set_value"}, bytes(200 << 20), deadline=soon(3))
        assert rss(relay.process.pid) - before < 16 << 20  # each direction holds one chunk, not the frame
    finally:
        channel.close()
        agent.close()


def test_an_agent_closing_its_side_closes_the_controllers(relay):
    made = endpoint(relay)
    agent = connect_agent(relay.node_dir / SID / SOCKET_NAME)
    channel = made.accept(soon())
    try:
        framing.send_frame(agent, {"type": "goodbye"})
        agent.close()  # right after a last frame: that frame still arrives
        assert channel.recv(deadline=soon())[0] == {"type": "goodbye"}
        with pytest.raises(ChannelLost):
            channel.recv(deadline=soon())
    finally:
        channel.close()


def test_accept_times_out_at_the_deadline(relay):
    made = endpoint(relay)
    started = time.monotonic()
    with pytest.raises(AgentTimeoutError, match=f"no agent of sandbox {SID} connected"):
        made.accept(started + 0.5)
    assert 0.5 <= time.monotonic() - started < 2.0
    agent = connect_agent(relay.node_dir / SID / SOCKET_NAME)  # the relay still listens for the next accept
    try:
        made.accept(soon()).close()
    finally:
        agent.close()


def test_accept_of_a_sandbox_without_a_directory_says_it_is_gone(relay):
    client = relay.client()
    with pytest.raises(ConfigError, match="is gone"):
        client.connect(SID, soon(1))


_CONNECT_AS_OTHER = f"""
import os, socket
os.setgroups([])
os.setgid({OTHER})
os.setuid({OTHER})
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect("{SOCKET_NAME}")
s.sendall(b"from {OTHER}")
s.settimeout(20)
print(s.recv(100).decode(), flush=True)
"""


@needs_root
def test_agents_of_another_uid_are_refused(relay):
    made = endpoint(relay, uid=OTHER)
    directory = relay.node_dir / SID
    intruder = connect_agent(directory / SOCKET_NAME)  # root: not the sandbox's uid
    try:
        with pytest.raises(AgentTimeoutError):
            made.accept(soon(1))
        assert closed_by_peer(intruder, 5)
    finally:
        intruder.close()
    child = subprocess.Popen(
        [sys.executable, "-c", _CONNECT_AS_OTHER], cwd=directory, stdout=subprocess.PIPE, text=True
    )
    try:
        channel = made.accept(soon())
        try:
            assert recv_exactly(_raw(channel), len(f"from {OTHER}")) == f"from {OTHER}".encode()
            _raw(channel).sendall(b"welcome")
            assert child.communicate(timeout=20)[0].strip() == "welcome"
        finally:
            channel.close()
    finally:
        child.kill()
        child.wait()
    assert "refused a connection from pid" in relay.log()


def _raw(channel: Channel) -> socket.socket:
    """The channel's socket, for tests that move bytes without frames."""
    sock: socket.socket = channel._sock
    sock.setblocking(True)
    return sock


# --- takeover and restart --------------------------------------------------------------------------


def test_takeover_closes_the_old_bridge_and_the_agent_reconnects_to_the_new_socket(relay):
    first = endpoint(relay)
    path = relay.node_dir / SID / SOCKET_NAME
    agent = connect_agent(path)
    channel = first.accept(soon())
    waiting: list[BaseException] = []
    try:
        ping_pong(channel, agent)
        inode = os.lstat(path).st_ino
        second = endpoint(relay, take_over=True)
        assert second.secret == first.secret
        assert os.lstat(path).st_ino != inode
        with pytest.raises(ChannelLost):
            channel.recv(deadline=soon())
        assert closed_by_peer(agent)  # the agent's side was closed: it reconnects, to the new socket
        agent.close()
        agent = connect_agent(path)
        new_channel = second.accept(soon())
        ping_pong(new_channel, agent, 2)
        # An accept that waits (the previous owner's) when a third controller takes over is refused at once.
        new_channel.close()

        def wait_for_agent() -> None:
            try:
                second.accept(soon(20))
            except BaseException as exc:
                waiting.append(exc)

        thread = threading.Thread(target=wait_for_agent)
        thread.start()
        time.sleep(0.3)
        started = time.monotonic()
        endpoint(relay, take_over=True)
        thread.join(10)
        assert time.monotonic() - started < 5
    finally:
        channel.close()
        agent.close()
    assert len(waiting) == 1 and isinstance(waiting[0], ChannelLost), waiting
    assert "took the sandbox" in str(waiting[0])


def test_remove_closes_the_bridge_and_deletes_the_directory(relay):
    made = endpoint(relay)
    agent = connect_agent(relay.node_dir / SID / SOCKET_NAME)
    channel = made.accept(soon())
    try:
        made.remove()
        assert not os.path.lexists(relay.node_dir / SID)
        with pytest.raises(ChannelLost):
            channel.recv(deadline=soon())
        assert closed_by_peer(agent)
    finally:
        channel.close()
        agent.close()


def test_a_restarted_relay_listens_again_and_the_agent_reconnects(relay):
    made = endpoint(relay)
    path = relay.node_dir / SID / SOCKET_NAME
    agent = connect_agent(path)
    channel = made.accept(soon())
    try:
        ping_pong(channel, agent)
        inode = os.lstat(path).st_ino
        relay.kill()  # a crash: nothing is cleaned up
        assert closed_by_peer(agent)
        with pytest.raises(ChannelLost):
            channel.recv(deadline=soon())
        agent.close()
        with pytest.raises(AgentTimeoutError, match="no relay answers"):  # waited for, as the agent waits
            made.accept(soon(1))
        relay.start()  # on the same port
        assert os.lstat(path).st_ino != inode  # it listens again before it serves controllers
        assert f"sandbox {SID}: listening again" in relay.log()
        agent = connect_agent(path, timeout=0.5)  # at once
        new_channel = made.accept(soon())  # the same endpoint: nothing of it lived in the relay
        try:
            ping_pong(new_channel, agent, 3)
        finally:
            new_channel.close()
    finally:
        channel.close()
        agent.close()


@needs_root
def test_a_restarted_relay_takes_the_sandbox_uid_from_the_directory(relay):
    made = endpoint(relay, uid=NOBODY)
    relay.stop()
    relay.start()
    assert f"sandbox {SID}: listening again (uid {NOBODY})" in relay.log()
    intruder = connect_agent(relay.node_dir / SID / SOCKET_NAME)  # root, not nobody: still refused
    try:
        with pytest.raises(AgentTimeoutError):
            made.accept(soon(1))
    finally:
        intruder.close()


# --- the Swarm backend's sweep of directories whose removal did not reach the relay ----------------

STORE = "st-test"


class FakeSwarmApi:
    """The manager's API as a removal and its sweep use it: three nodes, this store's services, no networks."""

    def __init__(self, sandboxes: dict[str, str]) -> None:
        """``sandboxes``: service id -> its sandbox id; each runs on node n1."""
        self.live = {
            service_id: {
                "ID": service_id,
                "Spec": {
                    "Name": f"orch-{STORE}-{sandbox_id}",
                    "Labels": {MANAGED: "true", STORE_ID: STORE, SANDBOX_ID: sandbox_id},
                },
            }
            for service_id, sandbox_id in sandboxes.items()
        }

    def nodes(self) -> list[dict[str, Any]]:
        return [
            {"ID": node_id, "Spec": {"Role": "worker", "Availability": "active"}, "Status": {"State": state}}
            for node_id, state in (("n1", "ready"), ("n2", "ready"), ("n3", "down"))
        ]

    def services(self, filters: dict[str, list[str]]) -> list[dict[str, Any]]:
        assert f"{STORE_ID}={STORE}" in filters["label"]
        return list(self.live.values())

    def inspect_service(self, service_id: str) -> dict[str, Any]:
        if service_id not in self.live:
            raise docker.errors.NotFound(service_id)
        return self.live[service_id]

    def tasks(self, filters: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"ServiceID": filters["service"], "NodeID": "n1", "Status": {"State": "running"}}]

    def remove_service(self, service_id: str) -> None:
        del self.live[service_id]

    def networks(self, filters: dict[str, Any]) -> list[dict[str, Any]]:
        return []


class FakeEngine:
    """A Swarm manager's engine, as far as ``SwarmBackend`` asks."""

    def __init__(self, api: FakeSwarmApi) -> None:
        self.api = api

    def ping(self) -> bool:
        return True

    def info(self) -> dict[str, Any]:
        return {"Swarm": {"LocalNodeState": "active", "ControlAvailable": True}}

    def close(self) -> None:
        pass


class FakeFleet:
    """The relays by node id, all on 127.0.0.1: n1's is the test relay, n2's port has nothing on it."""

    def __init__(self, relay: RelayProcess, credentials: Credentials) -> None:
        with socket.socket() as placeholder:
            placeholder.bind(("127.0.0.1", 0))
            nothing = placeholder.getsockname()[1]
        self.ports = {"n1": relay.port, "n2": nothing}
        self.tls = client_context(credentials)
        self.asked: list[str] = []

    def client(self, node: Node) -> RelayClient:
        self.asked.append(node.id)
        return RelayClient("127.0.0.1", self.ports[node.id], self.tls, timeout=2)


def age(relay: RelayProcess, *sandbox_ids: str) -> None:
    """Make these directories an hour old (a relay's start renews them all: it listens again in each)."""
    old = time.time() - 3600
    for sandbox_id in sandbox_ids:
        os.utime(relay.node_dir / sandbox_id, (old, old))


def finish_sweep(backend: SwarmBackend) -> None:
    assert backend._sweep is not None
    backend._sweep.result(timeout=30)


def test_a_directory_a_removal_left_is_swept_by_the_next_removal_once_its_relay_answers(
    relay, base, credentials, caplog
):
    caplog.set_level(logging.INFO, logger="orchestrator")
    client = relay.client()
    for sandbox_id in ("sb-live", "sb-gone", "sb-other", "sb-young"):  # sb-young: its service is being made
        client.create(sandbox_id, None, None)
    api = FakeSwarmApi({"svc-live": "sb-live", "svc-gone": "sb-gone", "svc-other": "sb-other"})
    settings = Settings(image="orchestrator-sandbox:test", state_dir=base / "state", runtime_dir=base / "run")
    backend = SwarmBackend(settings, scope=STORE, relay_image=settings.image, client=FakeEngine(api))
    fleet = backend._relays = FakeFleet(relay, credentials)  # type: ignore[assignment]
    try:
        relay.stop()  # its node was drained
        backend.remove("svc-gone")
        finish_sweep(backend)  # no relay answered it: nothing swept, nothing raised
        assert "sb-gone: its directory on node" in caplog.text and "the next removal's sweep" in caplog.text
        relay.start()
        age(relay, "sb-live", "sb-gone")
        backend.remove("svc-other")
        finish_sweep(backend)
    finally:
        backend.close()
    assert sorted(os.listdir(relay.node_dir)) == ["sb-live", "sb-young"]
    assert "sandbox sb-gone: removed its directory on node" in caplog.text
    assert "n3" not in fleet.asked  # a node that is down is not dialled


class CountingSwarmApi(FakeSwarmApi):
    """The fake manager, counting how often the store's services are listed."""

    def __init__(self) -> None:
        super().__init__({})
        self.listings = 0

    def services(self, filters: dict[str, list[str]]) -> list[dict[str, Any]]:
        self.listings += 1
        return super().services(filters)


class StubFleet:
    """Relays that are never dialled: ``RelayEndpoint.create`` is replaced in the test."""

    def client(self, node: Node) -> str:
        return node.id

    def node_dir(self) -> str:
        return "/var/lib/orchestrator-relay"


def test_node_choices_list_the_store_at_most_once_a_second_and_count_the_sandboxes_placed_since(base, monkeypatch):
    api = CountingSwarmApi()
    settings = Settings(image="orchestrator-sandbox:test", state_dir=base / "state", runtime_dir=base / "run")
    backend = SwarmBackend(settings, scope=STORE, relay_image=settings.image, client=FakeEngine(api))
    backend._relays = StubFleet()  # type: ignore[assignment]
    monkeypatch.setattr(RelayEndpoint, "create", lambda relay, sandbox_id, node, **_: node.node_id)
    try:
        placed = [backend.create_endpoint(f"sb-{i:012x}", settings, Placement()) for i in range(6)]
    finally:
        backend.close()
    assert api.listings == 1  # six choices within a second: one listing (it grows with the store)
    assert sorted(placed) == ["n1", "n1", "n1", "n2", "n2", "n2"]  # n3 is down; the placed ones were counted


# --- live usage of a node's sandboxes (``orchestrator ls`` on a Swarm) --------------------------------------------

ID_A, ID_B, ID_C = "a" * 64, "b" * 64, "c" * 64


def fake_cgroups(root: Path) -> None:
    """A node's /sys/fs/cgroup (v1, cgroupfs) knowing containers A (memory and CPU) and B (memory only)."""
    for container_id, memory, cpu in ((ID_A, "20971520", "1500000000"), (ID_B, "1024", None)):
        (root / "memory/docker" / container_id).mkdir(parents=True)
        (root / "memory/docker" / container_id / "memory.usage_in_bytes").write_text(memory)
        if cpu is not None:
            (root / "cpuacct/docker" / container_id).mkdir(parents=True)
            (root / "cpuacct/docker" / container_id / "cpuacct.usage").write_text(cpu)


@pytest.fixture
def usage_relay(base: Path, credentials: Credentials) -> Iterator[RelayProcess]:
    fake_cgroups(base / "cgroup")
    process = RelayProcess(base / "node", credentials, base / "relay.log", ORCH_RELAY_CGROUP=str(base / "cgroup"))
    process.start()
    try:
        yield process
    finally:
        process.stop()


def test_usage_requests_parse_and_bad_ones_are_refused():
    assert parse_request(json.dumps({"op": "usage", "containers": [ID_A]}).encode())["containers"] == [ID_A]
    for containers, says in (
        (ID_A, "a list"),
        ([ID_A] * 49, "at most 48"),
        (["../../etc"], "full container ids"),
        ([ID_A.upper()], "full container ids"),
        ([7], "full container ids"),
    ):
        with pytest.raises(BadRequest, match=says):
            parse_request(json.dumps({"op": "usage", "containers": containers}).encode())


def test_the_relay_reads_its_nodes_cgroups_for_the_containers_asked(usage_relay):
    client = usage_relay.client()
    assert client.usage([ID_A, ID_B, ID_C]) == {ID_A: (20 << 20, 1.5), ID_B: (1024, None)}
    many = [f"{n:064x}" for n in range(60)] + [ID_A]  # over one request's ids: asked in two
    assert client.usage(many) == {ID_A: (20 << 20, 1.5)}
    assert client.usage([]) == {}


@pytest.mark.parametrize(
    "usage",
    [
        b"null",
        b'{"' + ID_C.encode() + b'": [1, 1.0]}',  # a container it was not asked about
        b'{"' + ID_A.encode() + b'": [1]}',
        b'{"' + ID_A.encode() + b'": [-1, 1.0]}',
        b'{"' + ID_A.encode() + b'": [true, 1.0]}',
        b'{"' + ID_A.encode() + b'": [1, "1"]}',
        b'{"' + ID_A.encode() + b'": [1, 1e999]}',
    ],
)
def test_a_malformed_usage_answer_is_relay_unavailable(credentials, usage):
    with (
        fake_relay(credentials, b'{"ok": true, "usage": ' + usage + b"}") as client,
        pytest.raises(RelayUnavailable, match="malformed usage"),
    ):
        client.usage([ID_A])


class UsageSwarmApi(FakeSwarmApi):
    """The fake manager with the running tasks of three sandboxes: on n1 (its relay answers), n2 (nothing answers
    there) and n3 (down)."""

    def tasks(self, filters: dict[str, Any]) -> list[dict[str, Any]]:
        assert filters["desired-state"] == "running"
        placed = {"svc-a": ("n1", ID_A), "svc-b": ("n2", ID_B), "svc-c": ("n3", ID_C)}
        return [
            {
                "ServiceID": service,
                "NodeID": placed[service][0],
                "Status": {"State": "running", "ContainerStatus": {"ContainerID": placed[service][1]}},
            }
            for service in filters["service"]
        ]


def test_the_swarm_backend_asks_each_nodes_relay_and_skips_those_that_do_not_answer(usage_relay, base, credentials):
    settings = Settings(image="orchestrator-sandbox:test", state_dir=base / "state", runtime_dir=base / "run")
    backend = SwarmBackend(settings, scope=STORE, relay_image=settings.image, client=FakeEngine(UsageSwarmApi({})))
    fleet = backend._relays = FakeFleet(usage_relay, credentials)  # type: ignore[assignment]
    try:
        usage = backend.resource_usage(["svc-a", "svc-b", "svc-c"])
        assert backend.resource_usage([]) == {}
    finally:
        backend.close()
    assert usage == {"svc-a": ResourceUsage(memory_bytes=20 << 20, cpu_seconds=1.5)}
    assert sorted(fleet.asked) == ["n1", "n2"]  # n3 is down: not dialled
