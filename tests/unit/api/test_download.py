"""The checked writer (orchestrator.api.download): a stored workspace written under a destination, never outside it."""

from __future__ import annotations

import os
import resource
import stat

import pytest

from orchestrator.api.download import download_file, download_tree
from orchestrator.api.file_tree import FileTree
from orchestrator.errors import CheckpointError

MTIME = 1_733_600_000_123_456_789
TB = 1 << 40


class Stored:
    """A workspace as a record holds it (``files``, ``blob_sizes``) and its blobs, as files the opener opens."""

    def __init__(self, tmp_path):
        self.blobs = tmp_path / "blobs"
        self.blobs.mkdir()
        self.files: dict[str, tuple] = {}
        self.sizes: dict[str, int] = {}
        self.opened: list[str] = []

    def file(self, path, data, *, mode=0o644, size=None, blob=None):
        ref = f"{len(self.sizes):032x}"
        (self.blobs / ref).write_bytes(data if blob is None else blob)
        self.files[path] = ("f", mode, MTIME, ref)
        self.sizes[ref] = len(data) if size is None else size

    def dir(self, path, *, mode=0o755):
        self.files[path] = ("d", mode, MTIME, "")

    def link(self, path, target):
        self.files[path] = ("l", 0o777, MTIME, target)

    @property
    def tree(self):
        return FileTree(self.files, self.sizes)

    def open_blob(self, entry):
        self.opened.append(entry.path)
        return os.open(self.blobs / entry.ref, os.O_RDONLY)

    def download(self, destination, root=""):
        return download_tree(self.tree, root, destination, self.open_blob)


def _listing(top):
    """Every path under ``top`` (bytes, relative) with its kind letter, as the disk holds them."""
    found = {}
    for directory, dirs, files in os.walk(os.fsencode(top)):
        for name in dirs + files:
            full = os.path.join(directory, name)
            mode = os.lstat(full).st_mode
            kind = "l" if stat.S_ISLNK(mode) else "d" if stat.S_ISDIR(mode) else "f" if stat.S_ISREG(mode) else "?"
            found[os.path.relpath(full, os.fsencode(top))] = kind
    return found


def test_a_tree_is_written_whole_with_its_modes_times_and_inside_links(tmp_path):
    stored = Stored(tmp_path)
    stored.dir("data")
    stored.file("data/a.bin", bytes(range(256)) * 5000, mode=0o4755)  # setuid is never written
    stored.file("data/empty", b"", mode=0o600)
    stored.dir("data/ro", mode=0o500)  # its mode comes after its entries, which it would refuse
    stored.file("data/ro/inner.txt", b"inner")
    stored.link("latest", "data/a.bin")
    stored.link("data/up", "../data")
    destination = tmp_path / "out"

    report = stored.download(destination)

    assert (report.files, report.directories, report.links, report.skipped) == (3, 2, 2, {})
    assert report.bytes == 256 * 5000 + 5
    assert (destination / "data/a.bin").read_bytes() == bytes(range(256)) * 5000
    assert (destination / "data/empty").read_bytes() == b""
    assert stat.S_IMODE(os.stat(destination / "data/a.bin").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(destination / "data/empty").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(destination / "data/ro").st_mode) == 0o500
    assert os.stat(destination / "data/ro").st_mtime_ns == MTIME
    assert os.stat(destination / "data/a.bin").st_mtime_ns == MTIME
    assert os.readlink(destination / "latest") == "data/a.bin"
    assert os.readlink(destination / "data/up") == "../data"
    assert sorted(os.listdir(destination / "data")) == ["a.bin", "empty", "ro", "up"]  # no temporary file left
    os.chmod(destination / "data/ro", 0o700)


@pytest.mark.parametrize(
    "target",
    [
        "/etc/shadow",
        "../../x",
        "..",
        "data/../../x",
        "sub/b/../x",  # sub/b leads to the root, so its '..' is above it: the kernel's walk, not normpath's
        "missing",  # a name the download does not hold may be anything once on the disk
        "loop",
        "",
    ],
)
def test_a_link_is_made_only_when_it_leads_to_an_entry_inside(tmp_path, target):
    stored = Stored(tmp_path)
    stored.dir("data")
    stored.dir("sub")
    stored.link("sub/b", "..")
    stored.link("loop", "loop")
    stored.file("x", b"x")
    stored.link("evil", target)

    report = stored.download(tmp_path / "out")

    assert "evil" in report.skipped
    assert not os.path.lexists(tmp_path / "out/evil")
    assert os.readlink(tmp_path / "out/sub/b") == ".."


def test_a_subtree_keeps_only_the_links_that_stay_in_it(tmp_path):
    stored = Stored(tmp_path)
    stored.file("config", b"c")
    stored.dir("data")
    stored.link("data/config", "../config")  # inside the workspace, outside the download of data
    stored.link("data/self", "../data/a")  # leaves the download on the way: on the host '..' is outside it
    stored.file("data/a", b"a")
    stored.link("data/here", "a")

    report = stored.download(tmp_path / "out", root="data")

    assert set(report.skipped) == {"data/config", "data/self"}
    assert "the download" in report.skipped["data/config"]
    assert _listing(tmp_path / "out") == {b"a": "f", b"here": "l"}


def test_a_link_planted_at_a_directory_name_is_neither_followed_nor_replaced(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    destination = tmp_path / "out"
    destination.mkdir()
    (destination / "data").symlink_to(outside)
    stored = Stored(tmp_path)
    stored.dir("data")
    stored.file("data/a", b"a")

    with pytest.raises(NotADirectoryError, match="never followed"):
        stored.download(destination)

    assert os.listdir(outside) == []
    assert os.path.islink(destination / "data")


def test_a_link_planted_at_a_file_name_is_replaced_not_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    destination = tmp_path / "out"
    destination.mkdir()
    (destination / "a.txt").symlink_to(victim)
    stored = Stored(tmp_path)
    stored.file("a.txt", b"new")

    stored.download(destination)

    assert victim.read_bytes() == b"precious"
    assert not os.path.islink(destination / "a.txt")
    assert (destination / "a.txt").read_bytes() == b"new"


def test_a_directory_where_a_file_goes_is_an_error_and_kept(tmp_path):
    destination = tmp_path / "out"
    (destination / "a.txt").mkdir(parents=True)
    (destination / "a.txt/keep").write_bytes(b"k")
    stored = Stored(tmp_path)
    stored.file("a.txt", b"new")

    with pytest.raises(IsADirectoryError):
        stored.download(destination)

    assert (destination / "a.txt/keep").read_bytes() == b"k"
    assert os.listdir(destination) == ["a.txt"]


def test_a_destination_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "out").write_bytes(b"f")
    with pytest.raises(NotADirectoryError):
        Stored(tmp_path).download(tmp_path / "out")


@pytest.mark.parametrize(
    ("blob", "size", "says"),
    [
        (b"short", 10, "holds 5 bytes, not the 10"),
        (b"longer than said", 4, "holds more than the 4"),
        (b"x" * 10, TB, f"holds 10 bytes, not the {TB}"),  # a 1 TB claim: counted, never trusted
    ],
)
def test_a_blob_of_another_length_than_recorded_is_an_error_and_leaves_nothing(tmp_path, blob, size, says):
    stored = Stored(tmp_path)
    stored.dir("d")
    stored.file("d/f", b"", size=size, blob=blob)
    destination = tmp_path / "out"

    with pytest.raises(CheckpointError, match=says):
        stored.download(destination)

    assert _listing(destination) == {b"d": "d"}  # no partial file, no temporary one
    with pytest.raises(CheckpointError):
        download_file(stored.tree.entry("d/f"), tmp_path / "single", stored.open_blob)
    assert not (tmp_path / "single").exists()


def test_names_that_are_not_utf8_are_written_as_their_bytes(tmp_path):
    stored = Stored(tmp_path)
    name = os.fsdecode(b"caf\xe9\n\x1b[2J")
    stored.dir(name)
    stored.file(f"{name}/f", b"1")
    stored.link("l", name)

    report = stored.download(tmp_path / "out")

    assert report.skipped == {}
    assert _listing(tmp_path / "out") == {b"caf\xe9\n\x1b[2J": "d", b"caf\xe9\n\x1b[2J/f": "f", b"l": "l"}
    assert os.readlink(os.fsencode(tmp_path / "out/l")) == b"caf\xe9\n\x1b[2J"


def test_what_is_no_file_directory_or_link_is_never_made(tmp_path):
    stored = Stored(tmp_path)
    stored.files["fifo"] = ("p", 0o644, MTIME, "")
    stored.files["dev"] = ("c", 0o666, MTIME, "")
    stored.file("f", b"x")
    stored.files["f/under"] = ("d", 0o755, MTIME, "")  # a directory under a file
    stored.files["orphan/x"] = ("d", 0o755, MTIME, "")  # under a directory the map lacks
    stored.files["bad\x00name"] = ("d", 0o755, MTIME, "")

    report = stored.download(tmp_path / "out")

    assert set(report.skipped) == {"fifo", "dev", "f/under", "orphan/x", "bad\x00name"}
    assert _listing(tmp_path / "out") == {b"f": "f"}


def test_a_single_file_replaces_the_one_there_and_keeps_nothing_else(tmp_path):
    stored = Stored(tmp_path)
    stored.file("a", b"new", mode=0o2640)
    target = tmp_path / "a.out"
    target.write_bytes(b"old")

    report = download_file(stored.tree.entry("a"), target, stored.open_blob)

    assert (report.files, report.bytes) == (1, 3)
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o640
    assert sorted(os.listdir(tmp_path)) == ["a.out", "blobs"]


def test_a_tree_deeper_than_the_descriptors_a_process_may_hold_is_written_whole(tmp_path):
    stored = Stored(tmp_path)
    depth = 300
    for level in range(1, depth + 1):
        stored.dir("/".join(["d"] * level), mode=0o750)
        stored.file("/".join(["d"] * level + ["f"]), str(level).encode())  # written after the deeper levels
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 80, hard))
    try:
        report = stored.download(tmp_path / "out")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    assert (report.directories, report.files) == (depth, depth)
    deepest = tmp_path.joinpath("out", *["d"] * depth)
    assert (deepest / "f").read_bytes() == b"300"
    for level in (1, 150, depth):
        directory = tmp_path.joinpath("out", *["d"] * level)
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o750 and os.stat(directory).st_mtime_ns == MTIME
