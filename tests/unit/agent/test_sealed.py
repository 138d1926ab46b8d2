"""The sealed copy a worker is handed instead of a stored blob's file (agent/sealed.py): the same bytes, another
inode with no path and no link, and nobody can change it through any descriptor, its owner's included."""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

import pytest

from orchestrator.agent.sealed import sealed_copy

DATA = os.urandom(3 << 20) + b"end"


def _copy_of(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.lseek(fd, 5, os.SEEK_SET)
        copy = sealed_copy(fd)
        assert os.lseek(fd, 0, os.SEEK_CUR) == 5  # the caller's offset is left alone
        return copy
    finally:
        os.close(fd)


def test_the_copy_is_the_whole_file_mapped_read_only(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    path.write_bytes(DATA)
    fd = _copy_of(path)
    try:
        found = os.fstat(fd)
        assert found.st_size == len(DATA) and found.st_nlink == 0 and found.st_mode & 0o777 == 0o400
        assert found.st_ino != path.stat().st_ino
        assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:")
        with mmap.mmap(fd, len(DATA), flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) as mapped:
            assert mapped[:] == DATA
    finally:
        os.close(fd)


def test_nobody_can_change_the_copy(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    path.write_bytes(DATA)
    fd = _copy_of(path)
    try:
        with pytest.raises(OSError) as info:
            os.write(fd, b"x")
        assert info.value.errno == errno.EBADF
        os.fchmod(fd, 0o600)  # its owner (we) may reopen it for writing: the seals still hold
        writable = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
        try:
            for attempt in (
                lambda: os.write(writable, b"x"),
                lambda: os.ftruncate(writable, 1),
                lambda: os.ftruncate(writable, len(DATA) + 1),
                lambda: mmap.mmap(writable, len(DATA), flags=mmap.MAP_SHARED),
            ):
                with pytest.raises(OSError) as info:
                    attempt()
                assert info.value.errno in (errno.EPERM, errno.EACCES), attempt
        finally:
            os.close(writable)
        assert os.pread(fd, len(DATA) + 1, 0) == DATA
    finally:
        os.close(fd)


def test_an_empty_file_gives_an_empty_copy(tmp_path: Path) -> None:
    path = tmp_path / "empty"
    path.write_bytes(b"")
    fd = _copy_of(path)
    try:
        assert os.fstat(fd).st_size == 0
    finally:
        os.close(fd)
