"""The sandbox's default confinement, checked from inside: user, network, filesystem, privileges, limits."""

from __future__ import annotations

import pytest

from orchestrator import Orchestrator, Session, Settings

pytestmark = pytest.mark.docker


def value(session: Session, code: str) -> str:
    result = session.execute(code)
    assert result.error is None, str(result.error)
    assert result.return_value is not None
    return result.return_value


def test_runs_as_an_unprivileged_user(shared_session: Session, settings: Settings) -> None:
    uid, gid = (int(part) for part in settings.user.split(":"))
    assert value(shared_session, "import os\nos.getuid(), os.geteuid(), os.getgid()") == f"({uid}, {uid}, {gid})"
    assert uid != 0


def test_no_network(shared_session: Session) -> None:
    code = (
        "import socket\n"
        "def attempt(host, port):\n"
        "    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
        "    s.settimeout(3)\n"
        "    try:\n"
        "        s.connect((host, port))\n"
        "        return 'connected'\n"
        "    except OSError as exc:\n"
        "        return type(exc).__name__\n"
        "    finally:\n"
        "        s.close()\n"
        "attempt('1.1.1.1', 53), attempt('8.8.8.8', 443)"
    )
    assert "connected" not in value(shared_session, code)
    interfaces = value(shared_session, "import socket\nsorted(name for _, name in socket.if_nameindex())")
    assert interfaces == "['lo']"
    code = "try:\n    socket.getaddrinfo('example.com', 80)\n    r = 'resolved'\nexcept OSError:\n    r = 'failed'\nr"
    dns = value(shared_session, code)
    assert dns == "'failed'"


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
    assert value(shared_session, "import os\nos.getcwd()") == "'/tmp'"
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
        "def attempt(f, *a):\n"
        "    try:\n"
        "        f(*a)\n"
        "        return 'allowed'\n"
        "    except OSError as exc:\n"
        "        return type(exc).__name__\n"
        "(attempt(os.setuid, 0), attempt(os.chroot, '/tmp'), attempt(os.chown, '/tmp/owned', 0, 0),\n"
        " attempt(socket.socket, socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))"
    )
    assert value(shared_session, code) == "('PermissionError', 'PermissionError', 'PermissionError', 'PermissionError')"


def test_channel_mount_is_read_only(shared_session: Session) -> None:
    code = (
        "import os\n"
        "try:\n"
        "    open('/run/orchestrator/planted', 'w')\n"
        "    r = 'planted'\n"
        "except OSError as exc:\n"
        "    r = type(exc).__name__\n"
        "r, sorted(os.listdir('/run/orchestrator'))"
    )
    assert value(shared_session, code) == "('OSError', ['channel.sock'])"


def test_engine_side_limits(orch: Orchestrator, shared_session: Session, settings: Settings) -> None:
    container = orch.backend.client.containers.get(shared_session.container_id)
    host = container.attrs["HostConfig"]
    assert host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges:true"]
    assert host["Privileged"] is False
    assert host["PidsLimit"] == settings.pids_limit
    assert host["NanoCpus"] == settings.nano_cpus
    assert host["Memory"] == host["MemorySwap"] == 1 << 30
    assert container.attrs["Config"]["User"] == settings.user
