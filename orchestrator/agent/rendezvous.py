"""A sandbox's rendezvous on one machine: ``<base>/<sandbox_id>/`` with its secret and a listening socket.

The controller (``orchestrator/wire/endpoint.py``, on its own host) and the node relay (``node_relay.py``,
on a Swarm node) both make these directories, take them over and delete them, with the same
checks (docs/protocol.md, "The sandbox directory and the secret"): nothing here follows a
symbolic link, every directory is checked with ``lstat`` before it is used, files are opened
relative to a directory descriptor with ``O_NOFOLLOW``, and the sandbox's files belong to its
uid when we are root. Failures raise ``RendezvousError`` with a sentence that says what to do;
``setting`` in the signatures names the knob that chose ``base`` (for that advice).

Standard library only, Python 3.9+: the relay runs this inside the sandbox image.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import shutil
import socket
import stat
import sys
from pathlib import Path
from typing import Callable, List, NamedTuple, Optional, Set, Tuple

from . import handshake

logger = logging.getLogger(__name__)

SOCKET_NAME = "channel.sock"
SECRET_NAME = "secret"
MAX_SOCKET_PATH = 107
"""Longest Unix socket path in bytes (``sun_path`` is 108 bytes with its NUL on Linux)."""
SANDBOX_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""What a sandbox id may be: a plain file name."""

_BACKLOG = 8
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class RendezvousError(Exception):
    """A sandbox directory, its secret or its socket cannot be made, used or trusted; the message says why.

    Attributes:
        kind: one word for a program: ``invalid`` (not a plain sandbox id), ``exists`` (a new
            sandbox's directory is there already), ``missing`` (a live sandbox's directory is
            gone) or ``unusable`` (anything else).
    """

    def __init__(self, message: str, kind: str = "unusable") -> None:
        super().__init__(message)
        self.kind = kind


class Rendezvous(NamedTuple):
    """A sandbox directory with our listening socket in it.

    Attributes:
        directory: ``<base>/<sandbox_id>``.
        listener: non-blocking, listening, bound at ``directory/SOCKET_NAME``; the caller owns it.
        socket_file: (st_dev, st_ino) of the socket file, to tell whether another owner replaced it.
        secret: the key (``handshake.SECRET_BYTES`` bytes), what ``handshake.auth_proof`` takes.
    """

    directory: Path
    listener: socket.socket
    socket_file: Tuple[int, int]
    secret: bytes


def check_sandbox_id(sandbox_id: object) -> str:
    """Return ``sandbox_id`` if it is a plain name, else raise ``RendezvousError``."""
    if not isinstance(sandbox_id, str) or not SANDBOX_ID.fullmatch(sandbox_id):
        raise RendezvousError(
            "sandbox id %r is not a plain name (letters, digits, '_', '.', '-'; at most 64; "
            "not starting with a dot)" % (sandbox_id,),
            "invalid",
        )
    return sandbox_id


def ensure_private_dir(path: Path, setting: str) -> Path:
    """Create ``path`` (and missing parents) with mode 0700, or check that the existing one is private.

    Raises:
        RendezvousError: it is a symbolic link, not a directory, not owned by this process's
            effective uid, has any group or other permission bit, or cannot be created.
    """
    path = Path(path)
    missing = []
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            break
        missing.append(candidate)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            continue  # created meanwhile; checked below if it is ours to use
        except OSError as exc:
            raise RendezvousError(
                "cannot create the directory %s: %s; %s" % (directory, exc, _advice(setting))
            ) from exc
        if directory == path:
            _set_mode(path, 0o700)  # the umask may have taken bits off
    check_private(path, setting)
    return path


def check_private(path: Path, setting: str) -> None:
    """Check that ``path`` is a real directory of ours, closed to group and others.

    Raises:
        RendezvousError: it is not.
    """
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise RendezvousError("cannot inspect the directory %s: %s; %s" % (path, exc, _advice(setting))) from exc
    if stat.S_ISLNK(st.st_mode):
        raise RendezvousError("%s is a symbolic link, not a private directory: remove it %s" % (path, _advice(setting)))
    if not stat.S_ISDIR(st.st_mode):
        raise RendezvousError("%s is not a directory: remove it %s" % (path, _advice(setting)))
    if st.st_uid != os.geteuid():
        raise RendezvousError(
            "%s belongs to uid %d, not to this process (uid %d); another user may have created it to watch our "
            "sockets: do not use it, %s" % (path, st.st_uid, os.geteuid(), _advice(setting))
        )
    if st.st_mode & 0o077:
        raise RendezvousError(
            "%s has mode %04o, open to other users; run `chmod 700 %s` %s"
            % (path, stat.S_IMODE(st.st_mode), path, _advice(setting))
        )


def check_socket_path(path: Path, setting: str) -> None:
    """Refuse a socket path longer than a Unix socket address can hold."""
    size = len(os.fsencode(path))
    if size > MAX_SOCKET_PATH:
        raise RendezvousError(
            "the socket path %s is %d bytes, over the %d bytes a Unix socket path may have; use a shorter %s, "
            "such as /tmp/orchestrator-%d" % (path, size, MAX_SOCKET_PATH, setting, os.geteuid())
        )


def create(
    base: Path, sandbox_id: str, sandbox_uid: Optional[int], sandbox_gid: Optional[int], setting: str
) -> Rendezvous:
    """Make ``<base>/<sandbox_id>/`` (``base`` is created 0700 if missing) with a fresh secret and a listening socket.

    When we are root and know the sandbox's uid, the directory (0700), the secret (0400) and the
    socket (0600) belong to that uid; otherwise they stay ours and our group's (0710, 0440, 0660)
    under the private ``base``, and the sandbox's supervisor gets our group (``supervisor_groups``).

    Raises:
        RendezvousError: ``sandbox_id`` is not a plain name, ``base`` is not private, the sandbox
            directory already exists (or is a symbolic link), or the socket path is too long.
    """
    check_sandbox_id(sandbox_id)
    directory = ensure_private_dir(base, setting) / sandbox_id
    check_socket_path(directory / SOCKET_NAME, setting)
    give_to = _give_to(sandbox_uid, sandbox_gid)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        if os.path.islink(directory):
            raise RendezvousError("%s is a symbolic link; refusing to follow it (remove it)" % directory) from None
        raise RendezvousError(
            "%s already exists (a leftover of a dead controller?); a new sandbox needs a fresh directory: remove it, "
            "or take the live sandbox over instead" % directory,
            "exists",
        ) from None
    except OSError as exc:
        raise RendezvousError("cannot create the sandbox directory %s: %s" % (directory, exc)) from exc
    try:
        dir_fd = os.open(directory, _DIR_FLAGS)
        try:
            os.fchmod(dir_fd, 0o700)  # closed until everything in it is in place
            key = secrets.token_bytes(handshake.SECRET_BYTES)
            _write_secret(dir_fd, handshake.format_secret(key), give_to)
            listener, socket_file = _listen(directory / SOCKET_NAME, give_to)
            try:
                if give_to is not None:
                    os.fchown(dir_fd, *give_to)
                else:
                    os.fchown(dir_fd, -1, os.getegid())  # not the group of a setgid ``base``
                    os.fchmod(dir_fd, 0o710)
            except BaseException:
                listener.close()
                raise
        finally:
            os.close(dir_fd)
    except BaseException:
        remove_tree(directory)
        raise
    return Rendezvous(directory, listener, socket_file, key)


def take_over(
    base: Path, sandbox_id: str, sandbox_uid: Optional[int], sandbox_gid: Optional[int], setting: str
) -> Rendezvous:
    """Read a live sandbox's secret and put a new listening socket in place of ``channel.sock``.

    The new socket is bound under a temporary name in the same directory and renamed over
    ``channel.sock``, so the path flips atomically to a new inode (which is how the agent
    notices a takeover); whoever listened on the old file keeps a socket nobody can dial.

    Raises:
        RendezvousError: the directory is missing (the message says the sandbox "is gone"), is a
            symbolic link, belongs to someone other than root, us or the sandbox's uid, is
            writable by others, or its secret is missing or malformed; or the socket path is too long.
    """
    check_sandbox_id(sandbox_id)
    directory = ensure_private_dir(base, setting) / sandbox_id
    check_socket_path(directory / SOCKET_NAME, setting)
    owners = {0, os.geteuid()} | ({sandbox_uid} if sandbox_uid is not None else set())
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        raise RendezvousError(
            "no sandbox directory %s: the sandbox %s is gone" % (directory, sandbox_id), "missing"
        ) from None
    _check_entry(directory, st, stat.S_ISDIR, "a directory", owners)
    try:
        dir_fd = os.open(directory, _DIR_FLAGS)
    except OSError as exc:
        raise RendezvousError("cannot open the sandbox directory %s: %s" % (directory, exc)) from exc
    try:
        opened = os.fstat(dir_fd)
        if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
            raise RendezvousError("%s was replaced while it was being opened; try again" % directory)
        key = _read_secret(dir_fd, directory / SECRET_NAME, owners)
    finally:
        os.close(dir_fd)
    temporary = directory / (".%s.sock" % secrets.token_hex(3))  # as long as SOCKET_NAME
    listener, socket_file = _listen(temporary, _give_to(sandbox_uid, sandbox_gid))
    try:
        os.rename(temporary, directory / SOCKET_NAME)
    except BaseException:
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return Rendezvous(directory, listener, socket_file, key)


def socket_file(directory: Path) -> Optional[Tuple[int, int]]:
    """(st_dev, st_ino) of ``directory/SOCKET_NAME`` now, or None when it cannot be seen."""
    try:
        st = os.lstat(directory / SOCKET_NAME)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def discard(base: Path, sandbox_id: str, setting: str) -> None:
    """Delete ``<base>/<sandbox_id>`` once its sandbox is gone; nothing happens if it does not exist.

    Raises:
        RendezvousError: ``sandbox_id`` is not a plain name, or ``base`` exists but is not private.
    """
    check_sandbox_id(sandbox_id)
    base = Path(base)
    if not os.path.lexists(base):
        return
    check_private(base, setting)
    remove_tree(base / sandbox_id)


def remove_tree(directory: Path) -> None:
    """Delete a sandbox directory; a link or other non-directory in its place is left alone (and logged).

    Failures to delete are logged, not raised: this is clean-up.
    """
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        logger.warning("%s is not a directory (a symbolic link?); left alone", directory)
        return

    def failed(function: object, path: str, exc: BaseException) -> None:
        if not isinstance(exc, FileNotFoundError):
            logger.warning("could not delete %s: %s", path, exc)

    if sys.version_info >= (3, 12):
        shutil.rmtree(directory, onexc=failed)
    else:
        shutil.rmtree(directory, onerror=lambda function, path, info: failed(function, path, info[1]))


def _advice(setting: str) -> str:
    return "or point %s at a directory of your own" % setting


def _check_entry(path: Path, st: os.stat_result, is_kind: Callable[[int], bool], kind: str, owners: Set[int]) -> None:
    """Refuse a sandbox directory or secret that is a link, of the wrong kind, foreign or writable by others."""
    if stat.S_ISLNK(st.st_mode):
        raise RendezvousError("%s is a symbolic link; refusing to follow it (remove it if it is not yours)" % path)
    if not is_kind(st.st_mode):
        raise RendezvousError("%s is not %s" % (path, kind))
    if st.st_uid not in owners:
        raise RendezvousError(
            "%s belongs to uid %d, which is neither root, us nor the sandbox's user" % (path, st.st_uid)
        )
    if st.st_mode & 0o022:
        raise RendezvousError("%s has mode %04o: others may write to it" % (path, stat.S_IMODE(st.st_mode)))


def supervisor_groups() -> List[int]:
    """The supplementary groups a sandbox's supervisor needs for what ``create`` made: our group when we are not
    root (the files stay ours and our group's), else none (they belong to the sandbox's uid)."""
    return [] if os.geteuid() == 0 else [os.getegid()]


def _give_to(sandbox_uid: Optional[int], sandbox_gid: Optional[int]) -> Optional[Tuple[int, int]]:
    """The (uid, gid) to hand the sandbox's files to; None when we cannot (not root) or do not know whom to."""
    if sandbox_uid is None or os.geteuid() != 0:
        return None
    return sandbox_uid, -1 if sandbox_gid is None else sandbox_gid


def _set_mode(path: Path, mode: int) -> None:
    fd = os.open(path, _DIR_FLAGS)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _write_secret(dir_fd: int, text: bytes, give_to: Optional[Tuple[int, int]]) -> None:
    mode = 0o400 if give_to is not None else 0o440
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(SECRET_NAME, flags, mode, dir_fd=dir_fd)
    try:
        view = memoryview(text)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)  # the umask may have taken bits off
        os.fchown(fd, *(give_to if give_to is not None else (-1, os.getegid())))
    finally:
        os.close(fd)


def _read_secret(dir_fd: int, path: Path, owners: Set[int]) -> bytes:
    try:
        # O_NONBLOCK: a FIFO planted in place of the secret must not hang the open.
        fd = os.open(SECRET_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as exc:
        raise RendezvousError("cannot open the sandbox secret %s: %s" % (path, exc)) from exc
    try:
        _check_entry(path, os.fstat(fd), stat.S_ISREG, "a regular file", owners)
        text = os.read(fd, 2 * handshake.SECRET_BYTES + 2)
    finally:
        os.close(fd)
    try:
        return handshake.parse_secret(text)
    except ValueError as exc:
        raise RendezvousError("the sandbox secret %s is malformed: %s" % (path, exc)) from None


def _listen(path: Path, give_to: Optional[Tuple[int, int]]) -> Tuple[socket.socket, Tuple[int, int]]:
    """A non-blocking socket bound at ``path`` (which must not exist) and listening, with the sandbox's access.

    Returns:
        The socket and the (st_dev, st_ino) of its file, which a rename keeps.
    """
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(os.fspath(path))
    except OSError as exc:
        listener.close()
        raise RendezvousError("cannot listen at %s: %s" % (path, exc)) from exc
    try:
        st = os.lstat(path)
        if give_to is not None:
            os.chown(path, *give_to, follow_symlinks=False)
            os.chmod(path, 0o600)
        else:  # the agent runs as another uid, with our group: connecting needs write permission
            os.chown(path, -1, os.getegid(), follow_symlinks=False)
            os.chmod(path, 0o660)
        listener.listen(_BACKLOG)
        listener.setblocking(False)
    except BaseException:
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    return listener, (st.st_dev, st.st_ino)
