"""The sandbox's default confinement, checked from inside: user, network, filesystem, privileges, limits."""

from __future__ import annotations

import pytest
from support import ATTEMPT_SOURCE, PORT, listener_on_a_bridge

from orchestrator import Orchestrator, Session, Settings
from orchestrator.backends.base import SUPERVISOR_CAPABILITIES, WORKER_UID

pytestmark = pytest.mark.docker


def value(session: Session, code: str) -> str:
    result = session.execute(code)
    assert result.error is None, str(result.error)
    assert result.return_value is not None
    return result.return_value


def test_runs_as_an_unprivileged_user(shared_session: Session, orch: Orchestrator, settings: Settings) -> None:
    """The cell runs as the sandbox's own uid (its label), gid the same, no supplementary group; the supervisor as
    root with a few capabilities (tests/integration/test_supervisor_out_of_reach.py)."""
    assert shared_session.container_id
    state = orch.backend.inspect(shared_session.container_id)
    assert state is not None
    uid = int(state.labels[WORKER_UID])
    assert uid != 0 and settings.confinement.worker_uids[0] <= uid <= settings.confinement.worker_uids[1]
    code = "import os\nos.getuid(), os.geteuid(), os.getgid(), os.getgroups()"
    assert value(shared_session, code) == f"({uid}, {uid}, {uid}, [])"


ATTEMPT = (
    "import socket\n"
    "def attempt(host, port):\n"
    "    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
    "    s.settimeout(3)\n"
    "    try:\n"
    "        s.connect((host, port))\n"
    "        return 'connected: ' + s.recv(16).decode()\n"
    "    except OSError as exc:\n"
    "        return type(exc).__name__ + ': ' + str(exc)\n"
    "    finally:\n"
    "        s.close()\n"
)


def test_no_network_interfaces_or_routes(shared_session: Session) -> None:
    """Only the loopback interface, and no usable default route (IPv4 or IPv6), inside the sandbox.

    The kernel keeps a *reject* route ``unreachable default dev lo`` (flag RTF_REJECT, 0x0200) in the
    IPv6 table of a namespace without interfaces; it sends nothing anywhere, so it does not count.
    """
    interfaces = value(shared_session, "import socket\nsorted(name for _, name in socket.if_nameindex())")
    assert interfaces == "['lo']"
    code = (
        "def rows(path):\n"
        "    try:\n"
        "        with open(path) as fh:\n"
        "            return [line.split() for line in fh.read().splitlines() if line.strip()]\n"
        "    except FileNotFoundError:\n"
        "        return []\n"
        "REJECT = 0x0200\n"
        "v4 = [r for r in rows('/proc/net/route')[1:] if r[1] == '00000000' and not int(r[3], 16) & REJECT]\n"
        "v6 = [r for r in rows('/proc/net/ipv6_route')\n"
        "      if r[0] == '0' * 32 and r[1] == '00' and not int(r[8], 16) & REJECT]\n"
        "v4_devices = sorted({r[0] for r in rows('/proc/net/route')[1:]})\n"
        "v4, v6, v4_devices"
    )
    assert value(shared_session, code) == "([], [], [])"


def test_no_egress_to_a_host_on_the_local_bridge(
    shared_session: Session, orch: Orchestrator, image: str, run_id: str
) -> None:
    """A listener the test starts on a bridge network of its own: a container there reaches it, the sandbox cannot.

    Nothing here dials a public address or resolves a name: the only peer is the test's own container.
    """
    with listener_on_a_bridge(orch.backend.client, image, run_id) as peer:
        outcome = value(shared_session, ATTEMPT + f"attempt({peer['ip']!r}, {PORT})")
    assert "connected" not in outcome, outcome
    assert "unreachable" in outcome.lower() or "Error" in outcome, outcome


def test_root_filesystem_is_read_only(shared_session: Session) -> None:
    code = (
        "import errno\n"
        "def try_write(path):\n"
        "    try:\n"
        "        with open(path, 'w') as fh:\n"
        "            fh.write('x')\n"
        "        return 'written'\n"
        "    except OSError as exc:\n"
        "        return errno.errorcode[exc.errno]\n"
        "try_write('/etc/x'), try_write('/x'), try_write('/opt/orchestrator/x'), try_write('/var/tmp/x')"
    )
    assert value(shared_session, code) == "('EROFS', 'EROFS', 'EROFS', 'EROFS')"
    mounts = value(shared_session, "[l.split()[3].split(',')[0] for l in open('/proc/mounts') if l.split()[1] == '/']")
    assert mounts == "['ro']"


def test_tmp_is_writable_and_size_capped(shared_session: Session) -> None:
    code = "open('/tmp/probe.txt', 'w').write('data')\nopen('/tmp/probe.txt').read()"
    assert value(shared_session, code) == "'data'"
    assert value(shared_session, "import os\nos.getcwd()") == "'/workspace'"  # test_workspace_mount.py
    sizes = value(shared_session, "st = os.statvfs('/tmp')\nst.f_blocks * st.f_frsize <= 256 * 2**20")
    assert sizes == "True"


def test_no_capabilities_and_no_new_privileges(shared_session: Session) -> None:
    code = "dict(l.split(':\\t') for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)"
    shared_session.execute("status = " + code)
    assert value(shared_session, "status['CapEff'].strip()") == "'0000000000000000'"
    assert value(shared_session, "status['CapPrm'].strip()") == "'0000000000000000'"
    assert value(shared_session, "status['CapBnd'].strip()") == "'0000000000000000'"
    assert value(shared_session, "status['NoNewPrivs'].strip()") == "'1'"


def test_privileged_operations_fail(shared_session: Session) -> None:
    code = (
        "import os, socket\n"
        "open('/tmp/owned', 'w').close()\n"
        + ATTEMPT_SOURCE
        + "(attempt(os.setuid, 0), attempt(os.chroot, '/tmp'), attempt(os.chown, '/tmp/owned', 0, 0),\n"
        " attempt(socket.socket, socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))"
    )
    assert value(shared_session, code) == "('PermissionError', 'PermissionError', 'PermissionError', 'PermissionError')"


def test_channel_mount_is_read_only(orch: Orchestrator, shared_session: Session) -> None:
    """Mounted read-only, and closed to the cell: only the supervisor (root, or the controller's group) opens it."""
    code = (
        "import os\n"
        + ATTEMPT_SOURCE
        + "attempt(lambda: open('/run/orchestrator/planted', 'w')), attempt(os.listdir, '/run/orchestrator')"
    )
    assert value(shared_session, code) == "('PermissionError', 'PermissionError')"
    mounts = orch.backend.client.containers.get(shared_session.container_id).attrs["Mounts"]
    binds = sorted((m["Destination"], m["RW"]) for m in mounts if m["Type"] == "bind")
    assert binds in ([("/run/orchestrator", False)], [("/run/orchestrator", False), ("/workspace", True)])


def test_engine_side_limits(orch: Orchestrator, shared_session: Session, settings: Settings) -> None:
    container = orch.backend.client.containers.get(shared_session.container_id)
    host = container.attrs["HostConfig"]
    assert host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    assert sorted(host["CapAdd"]) == sorted(SUPERVISOR_CAPABILITIES)  # the supervisor's; the worker has none
    assert host["SecurityOpt"] == ["no-new-privileges:true"]
    assert host["Privileged"] is False
    assert host["PidsLimit"] == settings.limits.pids
    assert host["NanoCpus"] == settings.limits.nano_cpus
    assert host["Memory"] == host["MemorySwap"] == 1 << 30
    assert container.attrs["Config"]["User"] == settings.confinement.user
