"""Host-side record of sessions: metadata and checkpoint blobs, changed only under a per-session lock.

Layout under ``Settings.state_dir`` (created 0700)::

    store-id                             random id of this store; scopes container names and labels
    sessions/<session_id>/meta.json      SessionRecord as JSON (the checkpoint manifest included)
    sessions/<session_id>/lock           flock(2) target of the session's transactions
    sessions/<session_id>/activity       held by calls, touched when they run (``activity``): busy and idle time
    sessions/<session_id>/lease          who holds the session and when they last renewed (``lease``)
    sessions/<session_id>/lease.lock     flock(2) target of the lease's writes
    sessions/<session_id>/blobs/<blob id> one pickle blob per distinct variable value, opaque bytes; a fork's
                                         blobs are hard links of its source's (``fork``), so they count once

A blob id is either the content digest of the blob (32 lowercase hex: blobs the agent made) or,
for a str or bytes value the controller made itself (``set_value``, ``add_context``), a fresh
random ``h`` + 32 lowercase hex (``new_host_blob_id``; docs/protocol.md, "Host-made blobs"):
hashing a 100 MB context would cost more than everything else its call does. Both live side
by side in ``blobs/``; a host-made blob is written to a temp file first (``stage_blob``) and
gets its name only inside the commit that names it (``place_blob``).

Every change of a record goes through ``transaction()``: an exclusive ``flock`` held around
read, check (owner and epoch, done by the caller) and write, so two controllers, in one process
or two, never interleave their changes. Files are replaced by temp file + rename; with
``fsync`` the files and their directories are flushed as well, so a commit also survives power
loss. A record read back from disk is validated field by field: a crafted manifest cannot
point outside the store. A session's owner skips that (kept history and all) while the file
holds exactly the bytes its own last ``save`` wrote (``Written``); any other change is read
and validated again.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import fcntl
import hashlib
import itertools
import json
import mmap
import os
import re
import secrets
import shutil
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..agent.checkpoint_names import CONTEXT_ID, CONTEXT_SEPARATOR, checkpoint_key_problem
from ..checks import is_count, is_number
from ..errors import CheckpointError, ConfigError, ProtocolError, SessionNotFound
from ..files import TEMP_PREFIX, fsync_dir, replace_file, write_temp
from ..wire.replies import BLOB_ID
from . import files as files_map
from .activity import ACTIVITY_FILE, lock_within
from .history import Snapshot, compact_json, distinct_bytes, named_blobs, stored
from .lease import Lease, LeaseFile
from .private import STORE_ID_FILE, ensure_state_dir

_SESSION_ID = re.compile(r"^[a-z0-9][a-z0-9-]{2,62}$")
_SANDBOX_ID = re.compile(r"^sb-[0-9a-f]{12}$")  # what new_sandbox_id makes
_STORE_ID = re.compile(r"^[0-9a-f]{12}$")
_CONTAINER_ID = re.compile(r"^[0-9a-z]{12,64}$")  # a container id (hex) or a Swarm service id (base 36)
_REMOVED_PREFIX = ".removed-"
QUARANTINE_DIR = "quarantine"
"""Under the state dir (beside ``sessions/``): session directories whose record could not be read, kept aside."""
QUARANTINE_NOTE = "QUARANTINED"


def validate_session_id(session_id: str) -> str:
    """Session ids become paths and labels, so they are restricted.

    Raises:
        ConfigError: the id is not 3-63 characters of lowercase letters, digits and dashes.
    """
    if not isinstance(session_id, str) or not _SESSION_ID.match(session_id):
        raise ConfigError(f"invalid session id {session_id!r}: use 3-63 lowercase letters, digits and dashes")
    return session_id


def wrong_size(blob_id: str, sent: int, stored: int) -> ProtocolError:
    """The error for a checkpoint that sends a blob the host stores with another size (a lying sandbox)."""
    return ProtocolError(
        f"checkpoint sends blob {blob_id} with {sent} bytes; the host stores it with {stored} bytes "
        "(a content digest names one content, of one size)"
    )


def new_host_blob_id() -> str:
    """A fresh id for a host-made blob: ``h`` and 32 random lowercase hex, never a content digest."""
    return "h" + secrets.token_hex(16)


def new_sandbox_id() -> str:
    """A fresh sandbox id: names the container, its runtime directory and its agent."""
    return f"sb-{secrets.token_hex(6)}"


def is_sandbox_id(name: str) -> bool:
    """Whether ``name`` is one ``new_sandbox_id`` makes (a runtime directory of ours is named so)."""
    return bool(_SANDBOX_ID.match(name))


@dataclass
class SessionRecord:
    """Everything the host knows about a session, enough to rebuild it from nothing."""

    session_id: str
    image: str
    created_at: float
    last_used_at: float
    generation: int = 0
    variables: dict[str, str] = field(default_factory=dict)
    """Checkpoint manifest: variable name -> blob digest."""
    blob_sizes: dict[str, int] = field(default_factory=dict)
    context_count: int = 0
    history_count: int = 0
    owner: str = ""
    """Token of the handle that owns the session; only it may change the record."""
    epoch: int = 0
    """Advances with every attach; a handle whose epoch is behind is stale."""
    sandbox_id: str | None = None
    container_id: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    hibernated_at: float | None = None
    """Set when the session gave up its container on purpose; cleared when a sandbox serves it again."""
    contexts: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Contexts besides the default one: id -> {cwd, env, context_count, history_count} (``contexts.py``);
    their variables are in ``variables`` as ``<id>/<name>``."""
    placement: dict[str, Any] = field(default_factory=dict)
    """Where its sandboxes may run (``backend.Placement`` as JSON: constraints, reserve_cpus, reserve_memory);
    empty for anywhere."""
    committed_at: float = 0.0
    """When the current generation was committed."""
    changed: list[str] = field(default_factory=list)
    """Names set or deleted to reach the current generation."""
    unsaved: dict[str, str] = field(default_factory=dict)
    """Names the worker holds that the checkpoint does not (``<id>/<name>`` in contexts), with why."""
    rewound_from: int | None = None
    """The generation the current one copies, when ``rewind`` made it."""
    history: list[Snapshot] = field(default_factory=list)
    """Earlier generations kept for ``rewind`` and ``fork(at=...)``, oldest first (``history.retain``)."""
    forked_from: dict[str, Any] = field(default_factory=dict)
    """``{"session_id", "generation"}`` of the session this one was forked from; empty otherwise."""
    scaffold: dict[str, Any] = field(default_factory=dict)
    """``{"code", "names"}`` of the scaffold installed in every new worker (``Session.set_scaffold``); empty: none."""
    files: dict[str, files_map.Entry] = field(default_factory=dict)
    """The workspace: path -> (kind, mode, mtime_ns, ref) (``state/files.py``); its files' blobs are in
    ``blob_sizes`` with the values'."""
    files_changed: list[str] = field(default_factory=list)
    """Paths set or deleted to reach the current generation (``files.changed_paths``: bounded)."""

    @property
    def checkpoint_bytes(self) -> int:
        return sum(self.blob_sizes.values())

    @property
    def history_bytes(self) -> int:
        """Bytes of every blob the current generation and the kept ones name, each counted once."""
        return distinct_bytes([self.blob_sizes, *(s.blob_sizes for s in self.history)])

    def named_blobs(self) -> set[str]:
        """Every blob the current manifest or a kept generation names: none of them may leave the disk."""
        return named_blobs([self.blob_sizes, *(s.blob_sizes for s in self.history)])

    def snapshot(self) -> Snapshot:
        """The current generation as a ``Snapshot`` (copies: later changes of the record do not reach it)."""
        return Snapshot(
            generation=self.generation,
            at=self.committed_at or self.created_at,
            variables=dict(self.variables),
            blob_sizes=dict(self.blob_sizes),
            contexts=copy.deepcopy(self.contexts),
            context_count=self.context_count,
            history_count=self.history_count,
            changed=list(self.changed),
            unsaved=dict(self.unsaved),
            rewound_from=self.rewound_from,
            files=dict(self.files),
            files_changed=list(self.files_changed),
        )

    def generation_at(self, generation: int) -> Snapshot | None:
        """The kept generation ``generation`` (the current one included), or None."""
        if generation == self.generation:
            return self.snapshot()
        return next((s for s in self.history if s.generation == generation), None)

    def apply(self, snapshot: Snapshot) -> None:
        """Make ``snapshot``'s state the current one (manifest, workspace, contexts, counters, unsaved; not the
        generation)."""
        self.variables, self.blob_sizes = dict(snapshot.variables), dict(snapshot.blob_sizes)
        self.files = dict(snapshot.files)
        self.contexts = copy.deepcopy(snapshot.contexts)
        self.context_count, self.history_count = snapshot.context_count, snapshot.history_count
        self.unsaved = dict(snapshot.unsaved)

    def copy(self) -> SessionRecord:
        """A copy that can be changed in place without reaching this record (the kept snapshots, frozen, are shared)."""
        return replace(
            self,
            variables=dict(self.variables),
            blob_sizes=dict(self.blob_sizes),
            labels=dict(self.labels),
            contexts=copy.deepcopy(self.contexts),
            placement=copy.deepcopy(self.placement),
            changed=list(self.changed),
            unsaved=dict(self.unsaved),
            history=list(self.history),
            forked_from=dict(self.forked_from),
            scaffold=copy.deepcopy(self.scaffold),
            files=dict(self.files),
            files_changed=list(self.files_changed),
        )

    def to_json(self) -> bytes:
        """The record as compact JSON with sorted keys: a commit writes it, so its cost is on every changing call's
        path. The C encoder does the fields; each kept snapshot is encoded once (``Snapshot.encoded``) and put in its
        place between the fields before ``history`` and those after it, as one ``json.dumps`` of it all would."""
        before = compact_json({name: getattr(self, name) for name in _BEFORE_HISTORY})
        after = compact_json({name: getattr(self, name) for name in _AFTER_HISTORY})
        history = ",".join(snapshot.encoded for snapshot in self.history)
        return stored(f'{before[:-1]},"history":[{history}],{after[1:]}')

    @classmethod
    def from_json(cls, data: Any, session_id: str) -> SessionRecord:
        """Parse and validate a stored record; anything off is a CheckpointError naming the field."""
        if not isinstance(data, dict) or set(data) - {f.name for f in fields(cls)}:
            raise ValueError("not a session record")
        history = data.get("history", [])
        if not isinstance(history, list) or not all(isinstance(entry, dict) for entry in history):
            raise ValueError("invalid field(s): history")
        workspace = _loaded_files(data, "files", {})
        try:
            snapshots = [
                Snapshot(**{**entry, "files": _loaded_files(entry, "history", workspace)}) for entry in history
            ]
        except TypeError:
            raise ValueError("invalid field(s): history") from None
        record = cls(**{**data, "history": snapshots, "files": workspace})
        manifest = _manifest_checks(record.variables, record.blob_sizes, record.contexts, record.files, {})
        known = record.blob_sizes if manifest["blob_sizes"] else {}  # kept generations repeat most of its blobs
        checks = {
            "session_id": record.session_id == session_id,
            "image": isinstance(record.image, str),
            "created_at": isinstance(record.created_at, (int, float)),
            "last_used_at": isinstance(record.last_used_at, (int, float)),
            "hibernated_at": record.hibernated_at is None or isinstance(record.hibernated_at, (int, float)),
            "generation": is_count(record.generation),
            "context_count": is_count(record.context_count),
            "history_count": is_count(record.history_count),
            "epoch": is_count(record.epoch),
            "owner": isinstance(record.owner, str),
            "sandbox_id": record.sandbox_id is None or is_sandbox_id(str(record.sandbox_id)),
            "container_id": record.container_id is None or bool(_CONTAINER_ID.match(str(record.container_id))),
            "labels": _str_map(record.labels),
            "placement": _placement(record.placement),
            **manifest,
            "files_changed": files_map.changed_list_ok(record.files_changed),
            "committed_at": is_number(record.committed_at),
            "changed": isinstance(record.changed, list) and all(isinstance(name, str) for name in record.changed),
            "unsaved": _str_map(record.unsaved),
            "rewound_from": record.rewound_from is None or is_count(record.rewound_from),
            "history": all(_snapshot_ok(s, known) for s in record.history)
            and all(a.generation < b.generation for a, b in itertools.pairwise(record.history))
            and all(s.generation < record.generation for s in record.history),
            "forked_from": record.forked_from == {}
            or (
                isinstance(record.forked_from, dict)
                and set(record.forked_from) == {"session_id", "generation"}
                and isinstance(record.forked_from["session_id"], str)
                and bool(_SESSION_ID.match(record.forked_from["session_id"]))
                and is_count(record.forked_from["generation"])
            ),
            "scaffold": record.scaffold == {}
            or (
                isinstance(record.scaffold, dict)
                and set(record.scaffold) == {"code", "names"}
                and isinstance(record.scaffold["code"], str)
                and isinstance(record.scaffold["names"], list)
                and all(isinstance(name, str) and name.isidentifier() for name in record.scaffold["names"])
            ),
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid field(s): {', '.join(bad)}")
        return record


_BEFORE_HISTORY = tuple(sorted(f.name for f in fields(SessionRecord) if f.name < "history"))
_AFTER_HISTORY = tuple(sorted(f.name for f in fields(SessionRecord) if f.name > "history"))


@dataclass(frozen=True)
class Written:
    """A record as ``SessionStore.save`` wrote it: the digest of its bytes and a copy of it.

    The owner of a session keeps it between its transactions: while the record's file holds those very bytes
    (compared in full, by digest, not by file times), ``load`` hands back a copy instead of parsing and validating
    the record again, history and all. Any other writer's change, through the lock or not, changes the bytes.
    """

    digest: bytes
    record: SessionRecord


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=32).digest()


def _loaded_files(data: dict[str, Any], name: str, known: dict[str, files_map.Entry]) -> dict[str, files_map.Entry]:
    """The ``files`` map of a stored record or kept generation, checked whole (``files.loaded``; ``known``: the
    current generation's, whose entries a kept one shares)."""
    try:
        return files_map.loaded(data.get("files", {}), known)
    except ValueError as exc:
        raise ValueError(f"invalid field(s): {name} ({exc})") from None


def _manifest_checks(
    variables: Any, blob_sizes: Any, contexts: Any, files: dict[str, files_map.Entry], known: dict[str, int]
) -> dict[str, bool]:
    """Whether each part of a manifest can be read back: valid names and blob ids, sizes for every blob (the values'
    and the workspace files'), contexts that exist; ``files`` is checked already (``_loaded_files``), and so is
    a blob with the size ``known`` (the current generation's ``blob_sizes``) gives it."""
    variables_ok = _str_map(variables) and all(
        checkpoint_key_problem(k) is None and BLOB_ID.match(v) for k, v in variables.items()
    )
    return {
        "variables": variables_ok,
        "blob_sizes": isinstance(blob_sizes, dict)
        and all(
            (type(v) is int and known.get(k) == v) or (isinstance(k, str) and BLOB_ID.match(k) and is_count(v))
            for k, v in blob_sizes.items()
        )
        and variables_ok
        and set(variables.values()) | files_map.digests(files) <= set(blob_sizes),
        "contexts": isinstance(contexts, dict)
        and all(isinstance(k, str) and CONTEXT_ID.match(k) and _context_spec(v) for k, v in contexts.items())
        and variables_ok
        and all(key.partition(CONTEXT_SEPARATOR)[0] in contexts for key in variables if CONTEXT_SEPARATOR in key),
    }


def _snapshot_ok(snapshot: Snapshot, known: dict[str, int]) -> bool:
    manifest = _manifest_checks(snapshot.variables, snapshot.blob_sizes, snapshot.contexts, snapshot.files, known)
    return (
        is_count(snapshot.generation)
        and is_number(snapshot.at)
        and all(manifest.values())
        and files_map.changed_list_ok(snapshot.files_changed)
        and is_count(snapshot.context_count)
        and is_count(snapshot.history_count)
        and isinstance(snapshot.changed, list)
        and all(isinstance(name, str) for name in snapshot.changed)
        and _str_map(snapshot.unsaved)
        and (snapshot.rewound_from is None or is_count(snapshot.rewound_from))
    )


def _placement(value: Any) -> bool:
    if not isinstance(value, dict) or set(value) - {"constraints", "reserve_cpus", "reserve_memory"}:
        return False
    constraints = value.get("constraints", [])
    cpus = value.get("reserve_cpus")
    memory = value.get("reserve_memory")
    return (
        isinstance(constraints, list)
        and all(isinstance(c, str) for c in constraints)
        and (cpus is None or is_number(cpus))
        and (memory is None or isinstance(memory, str))
    )


def _str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _context_spec(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and set(value) == {"cwd", "env", "context_count", "history_count"}
        and isinstance(value["cwd"], str)
        and value["cwd"].startswith("/")
        and _str_map(value["env"])
        and is_count(value["context_count"])
        and is_count(value["history_count"])
    )


class SessionStore:
    """Session records and checkpoint blobs on the local filesystem."""

    def __init__(self, root: Path, *, fsync: bool = False, lock_timeout: float = 30.0) -> None:
        """Open (creating, 0700) the store under ``root``, which must be private (``private.ensure_state_dir``).

        Raises:
            ConfigError: ``root`` is not a private directory of this user, or cannot be created.
            CheckpointError: ``sessions/`` cannot be created or the store id is unreadable.
        """
        self.base = Path(root)
        self.root = self.base / "sessions"
        self._root = str(self.root)
        self.fsync = fsync
        self.lock_timeout = lock_timeout
        ensure_state_dir(self.base)
        try:
            self.root.mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(f"cannot create the state directory {self.root}: {exc}") from exc
        self.store_id = self._store_id()

    def _store_id(self) -> str:
        path = self.base / STORE_ID_FILE
        with contextlib.suppress(FileExistsError):
            _write_new(path, secrets.token_hex(6).encode())
        try:
            value = path.read_text().strip()
        except OSError as exc:
            raise CheckpointError(f"cannot read the store id {path}: {exc}") from exc
        if not _STORE_ID.match(value):
            raise CheckpointError(f"{path} does not hold a store id; remove it to make a new one")
        return value

    def _dir(self, session_id: str) -> Path:
        return self.root / validate_session_id(session_id)

    def blob_path(self, session_id: str, blob_id: str) -> Path:
        if not isinstance(blob_id, str) or not BLOB_ID.match(blob_id):
            raise CheckpointError(f"invalid blob id {blob_id!r}")
        return self._dir(session_id) / "blobs" / blob_id

    def create(self, record: SessionRecord, lease: Lease | None = None) -> None:
        """Write a new session's record (and its creator's ``lease``, first: the record makes it visible); the id
        must be free.

        Raises:
            ConfigError: a session with that id exists.
            CheckpointError: the state directory is not writable.
        """
        directory = self._new_dir(record.session_id, "use Orchestrator.attach to reuse it")
        (directory / "blobs").mkdir(mode=0o700)
        if lease is not None:
            LeaseFile(directory).write(lease)
        self.save(record)
        self._flush_root()

    def fork(self, source_id: str, child: SessionRecord, lease: Lease) -> None:
        """Store ``child``, a new session whose manifests name blobs of ``source_id``: each blob is hard-linked, not
        copied (call inside the source's ``transaction``, where none of them can leave its disk).

        Like ``create``, the record is written last: until then the child's directory is an orphan that prune
        removes after a grace period, and a failure here removes it at once. Deleting either session later
        removes only its own links.

        Raises:
            ConfigError: a session with the child's id exists.
            CheckpointError: a blob of the source is missing (its checkpoint is damaged) or the links cannot be made.
        """
        directory = self._new_dir(child.session_id, "fork into a new id")
        try:
            (directory / "blobs").mkdir(mode=0o700)
            for blob_id in sorted(child.named_blobs()):
                _link_or_copy(self.blob_path(source_id, blob_id), directory / "blobs" / blob_id, fsync=self.fsync)
            if self.fsync:
                fsync_dir(directory / "blobs")
            LeaseFile(directory).write(lease)
            self.save(child)
            self._flush_root()
        except FileNotFoundError as exc:
            shutil.rmtree(directory, ignore_errors=True)
            raise CheckpointError(
                f"cannot fork session {source_id}: its checkpoint is damaged ({exc.filename} is missing)"
            ) from None
        except BaseException as exc:
            shutil.rmtree(directory, ignore_errors=True)
            if isinstance(exc, OSError):
                raise CheckpointError(f"cannot fork session {source_id} into {child.session_id}: {exc}") from exc
            raise

    def _new_dir(self, session_id: str, instead: str) -> Path:
        """Make a new session's directory; an id that is taken is refused, saying what to do ``instead``."""
        directory = self._dir(session_id)
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            raise ConfigError(f"session {session_id!r} already exists; {instead}") from None
        except OSError as exc:
            raise CheckpointError(f"cannot create session state in {self.root}: {exc}") from exc
        return directory

    def shared_bytes(self, record: SessionRecord) -> int:
        """Bytes of the record's blobs that other sessions' directories hold too (hard links of a fork)."""
        return self.shared_bytes_of(record.session_id, record.named_blobs())

    def shared_bytes_of(self, session_id: str, blob_ids: Iterable[str]) -> int:
        """Bytes of these blobs of the session that other sessions' directories hold too (hard links of a fork)."""
        shared = 0
        blobs = os.path.join(self.session_path(session_id), "blobs")
        for blob_id in blob_ids:
            if not isinstance(blob_id, str) or not BLOB_ID.match(blob_id):
                raise CheckpointError(f"invalid blob id {blob_id!r}")
            with contextlib.suppress(OSError):
                info = os.stat(os.path.join(blobs, blob_id), follow_symlinks=False)
                if info.st_nlink > 1:
                    shared += info.st_size
        return shared

    def _flush_root(self) -> None:
        """With ``fsync``, make a new session directory's entry in ``sessions/`` durable too."""
        if self.fsync:
            try:
                fsync_dir(self.root)
            except OSError as exc:
                raise CheckpointError(f"cannot flush {self.root}: {exc}") from exc

    def save(self, record: SessionRecord) -> Written:
        """Replace the record atomically (call it inside ``transaction``); returns it as written (for ``load``).

        Raises:
            CheckpointError: the record cannot be written.
        """
        directory = self._dir(record.session_id)
        data = record.to_json()
        try:
            replace_file(directory / "meta.json", data, fsync=self.fsync, mode=0o600)
            if self.fsync:
                fsync_dir(directory)
        except OSError as exc:
            raise CheckpointError(f"cannot write the record of session {record.session_id}: {exc}") from exc
        return Written(_digest(data), record.copy())

    def load(self, session_id: str, *, written: Written | None = None) -> SessionRecord:
        """Read and validate a session's record; when its file still holds the bytes of ``written`` (what this
        process's ``save`` returned), a copy of ``written``'s record instead, neither parsed nor validated again.

        Raises:
            SessionNotFound: no record for this id.
            CheckpointError: the record is unreadable or invalid.
        """
        data, _ = self._read_file(session_id)
        if written is not None and _digest(data) == written.digest:
            return written.record.copy()
        return self._parse(session_id, data)

    def read(self, session_id: str) -> tuple[SessionRecord, os.stat_result]:
        """``load``, and the ``fstat`` of the very file it read (which ``state.index`` keys its cache by).

        Raises:
            SessionNotFound: no record for this id.
            CheckpointError: the record is unreadable or invalid.
        """
        data, info = self._read_file(session_id)
        return self._parse(session_id, data), info

    def _read_file(self, session_id: str) -> tuple[bytes, os.stat_result]:
        try:
            with open(self.meta_path(session_id), "rb") as file:
                return file.read(), os.fstat(file.fileno())
        except FileNotFoundError:
            raise SessionNotFound(f"no session {session_id!r} in {self.root}") from None
        except OSError as exc:
            raise CheckpointError(f"the record of session {session_id} is unreadable: {exc}") from exc

    def _parse(self, session_id: str, data: bytes) -> SessionRecord:
        try:
            parsed = json.loads(data)
        except ValueError as exc:
            raise CheckpointError(f"the record of session {session_id} is unreadable: {exc}") from exc
        try:
            return SessionRecord.from_json(parsed, session_id)
        except (TypeError, ValueError) as exc:
            path = self.meta_path(session_id)
            raise CheckpointError(f"the record of session {session_id} ({path}) is invalid: {exc}") from None

    def session_path(self, session_id: str) -> str:
        """The session's directory as a string (the listing path: cheaper than ``Path`` joins, 10,000 times over)."""
        return os.path.join(self._root, validate_session_id(session_id))

    def meta_path(self, session_id: str) -> str:
        """The session's record file (``meta.json``)."""
        return os.path.join(self._root, validate_session_id(session_id), "meta.json")

    def exists(self, session_id: str) -> bool:
        return os.path.exists(self.meta_path(session_id))

    def ids(self) -> Iterator[str]:
        """Ids of every stored session."""
        for name in self.names():
            if os.path.exists(os.path.join(self._root, name, "meta.json")):
                yield name

    def names(self) -> list[str]:
        """Sorted names of every entry under ``sessions/`` named like a session (a record in it or not)."""
        return sorted(name for name in os.listdir(self._root) if _SESSION_ID.match(name))

    def recorded_containers(self) -> dict[str, str]:
        """Container id -> session id of every readable record that names a container (a snapshot)."""
        owners = {}
        for session_id in self.ids():
            with contextlib.suppress(SessionNotFound, CheckpointError):
                container_id = self.load(session_id).container_id
                if container_id:
                    owners[container_id] = session_id
        return owners

    @contextlib.contextmanager
    def transaction(self, session_id: str, *, written: Written | None = None) -> Iterator[SessionRecord]:
        """Hold the session's lock and yield its current record (``load``, with ``written``); ``save`` what changed
        before leaving.

        Raises:
            SessionNotFound: the session does not exist (or was deleted while we waited).
            SessionBusy: another process held the lock for ``lock_timeout`` seconds.
            CheckpointError: the record is unreadable.
        """
        with self.locked(session_id):
            yield self.load(session_id, written=written)  # SessionNotFound if it was deleted while we waited

    @contextlib.contextmanager
    def locked(self, session_id: str) -> Iterator[None]:
        """Hold the session's lock without reading its record (which may be unreadable: prune removes such).

        Raises:
            SessionNotFound: the session's directory does not exist.
            SessionBusy: another process held the lock for ``lock_timeout`` seconds.
        """
        directory = self._dir(session_id)
        try:
            fd = os.open(directory / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            raise SessionNotFound(f"no session {session_id!r} in {self.root}") from None
        except OSError as exc:
            raise CheckpointError(f"cannot open the lock of session {session_id}: {exc}") from exc
        try:
            lock_within(
                fd,
                fcntl.LOCK_EX,
                self.lock_timeout,
                f"session {session_id} stayed locked by another process for {self.lock_timeout:g} s",
            )
            yield
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def store_lock(self, name: str) -> Iterator[None]:
        """An exclusive lock over the whole store (``<state_dir>/<name>.lock``), for decisions about many sessions.

        Raises:
            SessionBusy: another process held it for ``lock_timeout`` seconds.
        """
        fd = os.open(self.base / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            lock_within(
                fd,
                fcntl.LOCK_EX,
                self.lock_timeout,
                f"the store's {name} lock stayed taken for {self.lock_timeout:g} s",
            )
            yield
        finally:
            os.close(fd)

    def outputs_dir(self, session_id: str) -> Path:
        """Where whole outputs of the session's calls are kept (``outputs/``); removed with the session."""
        return self._dir(session_id) / "outputs"

    def lease(self, session_id: str) -> LeaseFile:
        """The session's lease (``lease``): who holds it, renewed while they live."""
        return LeaseFile(self._dir(session_id))

    def activity_path(self, session_id: str) -> Path:
        """The session's activity file (``activity``): busy while a call runs, its mtime the last use."""
        return self._dir(session_id) / ACTIVITY_FILE

    def session_dirs(self, skip: Collection[str] = ()) -> Iterator[Path]:
        """Every directory under ``sessions/`` named like a session, with or without a record (orphans too), but those
        named in ``skip``."""
        with os.scandir(self._root) as entries:
            found = sorted(
                e.name
                for e in entries
                if e.name not in skip and _SESSION_ID.match(e.name) and e.is_dir(follow_symlinks=False)
            )
        for name in found:
            yield self.root / name

    def stray_files(self, session_id: str, keep: Iterable[str]) -> dict[Path, int]:
        """Blobs not in ``keep`` and unfinished temp files of a session, with their sizes (call inside
        ``transaction``, where no commit is half done)."""
        directory = self._dir(session_id)
        wanted = set(keep)
        temps = [entry for entry in _files(directory) if entry.name.startswith(TEMP_PREFIX)]
        unnamed = [entry for entry in _files(directory / "blobs") if entry.name not in wanted]
        return {Path(entry.path): entry.stat(follow_symlinks=False).st_size for entry in temps + unnamed}

    def missing_blobs(self, record: SessionRecord) -> set[str]:
        """Digests the record's manifest names that are not on disk (a damaged checkpoint)."""
        try:
            present = set(os.listdir(os.path.join(self.session_path(record.session_id), "blobs")))
        except OSError:
            present = set()
        return (set(record.variables.values()) | files_map.digests(record.files)) - present

    def write_blobs(self, session_id: str, blobs: dict[str, bytes | bytearray | memoryview]) -> None:
        """Write blobs that are not stored yet (content-addressed: an existing file of the same size is kept).

        Raises:
            ProtocolError: a blob's file exists with another size (its digest cannot name both); nothing was written.
            CheckpointError: a blob cannot be written.
        """
        try:
            missing = {}
            for blob_digest, data in blobs.items():
                target = self.blob_path(session_id, blob_digest)
                try:
                    size = os.stat(target, follow_symlinks=False).st_size
                except FileNotFoundError:
                    missing[target] = data
                    continue
                if size != memoryview(data).nbytes:
                    raise wrong_size(blob_digest, memoryview(data).nbytes, size)
            for target, data in missing.items():
                replace_file(target, data, fsync=self.fsync, mode=0o600)
            if blobs and self.fsync:
                fsync_dir(self._dir(session_id) / "blobs")
        except OSError as exc:
            raise CheckpointError(f"cannot store checkpoint blobs of session {session_id}: {exc}") from exc

    @contextlib.contextmanager
    def mapped_blob(self, session_id: str, blob_digest: str) -> Iterator[memoryview]:
        """One blob of the checkpoint, mapped read-only for the ``with`` block, to send back to an agent.

        Mapped, not read: the bytes go from the page cache to the socket, so restoring a 100 MB value
        costs the host no 100 MB copy. Blobs are never changed in place (written whole and renamed,
        removed by unlink), so the mapping stays valid while it is used.

        Raises:
            CheckpointError: the blob is missing or unreadable.
        """
        try:
            fd = os.open(self.blob_path(session_id, blob_digest), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise CheckpointError(f"checkpoint of session {session_id} is damaged: {exc}") from exc
        try:
            try:
                size = os.fstat(fd).st_size
                mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else None
            except OSError as exc:
                raise CheckpointError(f"checkpoint of session {session_id} is damaged: {exc}") from exc
        finally:
            os.close(fd)  # the mapping keeps its own reference
        if mapped is None:
            yield memoryview(b"")
            return
        with mapped, memoryview(mapped) as view:
            yield view

    def stage_blob(self, session_id: str, parts: Sequence[bytes | bytearray | memoryview]) -> Path:
        """Write a host-made blob to a new temp file in ``blobs/`` (flushed with ``fsync``), outside any lock.

        The file is unnamed: ``place_blob`` names it inside the commit, and until then prune's rule
        (files in ``blobs/`` that no manifest names) covers it, so a controller that dies leaves
        nothing that prune would not remove.

        Raises:
            CheckpointError: it cannot be written (no temp file is left).
        """
        try:
            return write_temp(self._dir(session_id) / "blobs", *parts, fsync=self.fsync, mode=0o600)
        except OSError as exc:
            raise CheckpointError(f"cannot store a checkpoint blob of session {session_id}: {exc}") from exc

    def place_blob(
        self, session_id: str, staged: Path | None, blob_id: str, parts: Sequence[bytes | bytearray | memoryview]
    ) -> None:
        """Give a staged blob its name (call inside ``transaction``, before saving the manifest that names it).

        When the temp file is missing (writing it failed, or a prune removed it as unnamed
        meanwhile) the blob is written from ``parts`` here instead.

        Raises:
            CheckpointError: the blob cannot be written.
        """
        target = self.blob_path(session_id, blob_id)
        try:
            try:
                if staged is None:
                    raise FileNotFoundError(blob_id)
                os.replace(staged, target)
            except FileNotFoundError:
                replace_file(target, *parts, fsync=self.fsync, mode=0o600)
            if self.fsync:
                fsync_dir(target.parent)
        except OSError as exc:
            if staged is not None:
                with contextlib.suppress(OSError):
                    os.unlink(staged)
            raise CheckpointError(f"cannot store checkpoint blobs of session {session_id}: {exc}") from exc

    def delete_blobs(self, session_id: str, digests: Iterable[str]) -> None:
        """Delete blobs no manifest references any more (call inside ``transaction``, after ``save``)."""
        for blob_digest in digests:
            with contextlib.suppress(OSError):
                self.blob_path(session_id, blob_digest).unlink()

    def delete(self, session_id: str) -> None:
        """Remove a session's record and checkpoints (call inside ``transaction``; missing is fine).

        The directory is first renamed out of the way in one step: a process opening the session's
        lock or activity file meanwhile then gets ``SessionNotFound`` instead of creating the file
        again inside a half-removed directory (which would outlive the removal).
        """
        doomed = self.root / f"{_REMOVED_PREFIX}{session_id}-{secrets.token_hex(4)}"
        try:
            os.rename(self._dir(session_id), doomed)
        except FileNotFoundError:
            return
        shutil.rmtree(doomed, ignore_errors=True)

    def quarantine(self, session_id: str, reason: str) -> Path:
        """Move a session's directory aside, whole, under ``<state_dir>/quarantine/`` (call inside ``locked``).

        For a record that cannot be read: prune keeps it for a person to look at instead of deleting it,
        and leaves its containers alone. ``reason`` is written beside it (``QUARANTINED``). Returns the new path.

        Raises:
            SessionNotFound: the session's directory does not exist.
            CheckpointError: the quarantine directory cannot be made or the move failed.
        """
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target = self.base / QUARANTINE_DIR / f"{validate_session_id(session_id)}.{stamp}.{secrets.token_hex(3)}"
        try:
            target.parent.mkdir(mode=0o700, exist_ok=True)
            os.rename(self._dir(session_id), target)
        except FileNotFoundError:
            raise SessionNotFound(f"no session {session_id!r} in {self.root}") from None
        except OSError as exc:
            raise CheckpointError(f"cannot move session {session_id} to {target.parent}: {exc}") from exc
        with contextlib.suppress(OSError):
            (target / QUARANTINE_NOTE).write_text(reason + "\n")
        return target

    def quarantined(self) -> set[str]:
        """Ids of the sessions whose directory was quarantined (prune leaves their containers alone)."""
        try:
            entries = list(os.scandir(self.base / QUARANTINE_DIR))
        except FileNotFoundError:
            return set()
        return {entry.name.partition(".")[0] for entry in entries if entry.is_dir(follow_symlinks=False)}

    def unfinished_removals(self) -> Iterator[Path]:
        """Directories a ``delete`` renamed away but did not finish removing (its process died meanwhile)."""
        with os.scandir(self._root) as entries:
            found = sorted(
                e.name for e in entries if e.name.startswith(_REMOVED_PREFIX) and e.is_dir(follow_symlinks=False)
            )
        for name in found:
            yield self.root / name


def _link_or_copy(source: Path, target: Path, *, fsync: bool) -> None:
    """Give ``target`` the bytes of ``source``: a hard link, or a copy where the filesystem allows no more links.

    Raises:
        FileNotFoundError: ``source`` is missing.
    """
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError as exc:
        if exc.errno != errno.EMLINK:
            raise
        data = source.read_bytes()
        replace_file(target, data, fsync=fsync, mode=0o600)


def _files(folder: Path) -> list[os.DirEntry[str]]:
    """The regular files directly in ``folder`` (none when it does not exist)."""
    try:
        return [entry for entry in os.scandir(folder) if entry.is_file(follow_symlinks=False)]
    except FileNotFoundError:
        return []


def _write_new(path: Path, data: bytes) -> None:
    """Create ``path`` with ``data`` in one step (a hard link of a complete temp file); FileExistsError if it exists."""
    temporary = write_temp(path.parent, data, mode=0o600)
    try:
        os.link(temporary, path)
    finally:
        os.unlink(temporary)
