"""A peer that plays an agent without knowing the secret, for ``test_host_privacy``.

Run as root: ``python rogue_agent.py RUNTIME_DIR SENTINEL UID``. It takes the sandbox's uid as its
effective uid (so ``SO_PEERCRED`` shows the sandbox's uid, as for a host process running as that
user) but keeps file-system uid 0 so it can reach the sockets under the private runtime dir: the
only thing it lacks is the secret. Until its stdin closes it connects over and over to every
``RUNTIME_DIR/*/channel.sock``, sends a well-formed ``hello`` naming the sandbox of the directory,
answers an ``auth`` with a made-up ``auth_ok``, and records what it receives. At the end it prints
one JSON object: attempts, connections, the frames received (type, body length), whether the
sentinel appeared in any received byte, and its euid while connecting.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import socket
import struct
import sys
import threading
import time
from pathlib import Path


def frame(header: dict[str, object], body: bytes = b"") -> bytes:
    head = json.dumps(header).encode()
    return struct.pack("!4sII", b"ORC1", len(head), len(body)) + head + body


class Rogue:
    def __init__(self, runtime_dir: Path, sentinel: bytes) -> None:
        self.runtime_dir = runtime_dir
        self.sentinel = sentinel
        self.attempts = 0
        self.connections = 0
        self.frames: list[tuple[str, int]] = []
        self.sentinel_seen = False
        self.tail = b""

    def visit(self, path: Path) -> None:
        self.attempts += 1
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.5)
            sock.connect(str(path))
            self.connections += 1
            hello = {
                "type": "hello",
                "protocol": 2,
                "sandbox_id": path.parent.name,
                "generation": 0,
                "python": "3.11.0",
                "dill": "0.3.8",
                "agent_pid": 7,
                "worker_pid": 8,
                "nonce": secrets.token_hex(16),
            }
            sock.sendall(frame(hello))
            buf = bytearray()
            ends = time.monotonic() + 0.5
            while time.monotonic() < ends:
                try:
                    chunk = sock.recv(65536)
                except (TimeoutError, OSError):
                    break
                if not chunk:
                    break
                buf += chunk
                window = self.tail + chunk
                self.sentinel_seen = self.sentinel_seen or self.sentinel in window
                self.tail = window[-len(self.sentinel) :]
                while len(buf) >= 12:
                    _, hlen, blen = struct.unpack("!4sII", buf[:12])
                    if len(buf) < 12 + hlen + blen:
                        break
                    try:
                        kind = str(json.loads(bytes(buf[12 : 12 + hlen])).get("type"))
                    except (ValueError, AttributeError):
                        kind = "<not a JSON object>"
                    self.frames.append((kind, blen))
                    del buf[: 12 + hlen + blen]
                    if kind == "auth":
                        sock.sendall(frame({"type": "auth_ok", "proof": "0" * 64}))


def main() -> None:
    runtime_dir, sentinel, uid = Path(sys.argv[1]), sys.argv[2].encode(), int(sys.argv[3])
    stop = threading.Event()

    def wait_for_eof() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    os.setegid(uid)
    os.seteuid(uid)
    # Back to file-system uid 0 (allowed: it is our real uid), which brings back the file-system capabilities.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.setfsuid(0)
    libc.setfsgid(0)
    euid = os.geteuid()
    rogue = Rogue(runtime_dir, sentinel)
    print(json.dumps({"ready": True}), flush=True)
    while not stop.is_set():
        for path in list(runtime_dir.glob("*/channel.sock")):
            with contextlib.suppress(OSError):
                rogue.visit(path)
        time.sleep(0.005)
    print(
        json.dumps(
            {
                "euid": euid,
                "attempts": rogue.attempts,
                "connections": rogue.connections,
                "frames": rogue.frames,
                "sentinel_seen": rogue.sentinel_seen,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
