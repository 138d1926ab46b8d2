"""Host-side record of sessions: metadata and checkpoints, written atomically, never unpickled.

Layout under ``Settings.state_dir``::

    sessions/<session_id>/meta.json      SessionRecord as JSON (the checkpoint manifest included)
    sessions/<session_id>/blobs/<digest> one dill blob per distinct variable value, opaque bytes

A checkpoint commits in two steps: new blobs are written (temp file + rename), then
``meta.json`` is replaced atomically; blobs no longer referenced are deleted afterwards.
A crash at any point leaves the previous manifest, and every blob it names, intact.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import CheckpointError, ConfigError, SessionNotFound

_SESSION_ID = re.compile(r"^[a-z0-9][a-z0-9-]{2,62}$")
_DIGEST = re.compile(r"^[0-9a-f]{32}$")


def validate_session_id(session_id: str) -> str:
    """Session ids become paths and container names, so they are restricted.

    Raises:
        ConfigError: the id is not 3-63 characters of lowercase letters, digits and dashes.
    """
    if not isinstance(session_id, str) or not _SESSION_ID.match(session_id):
        raise ConfigError(f"invalid session id {session_id!r}: use 3-63 lowercase letters, digits and dashes")
    return session_id


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
    container_id: str | None = None
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def checkpoint_bytes(self) -> int:
        return sum(self.blob_sizes.values())


def _write_atomically(path: Path, chunks: Sequence[bytes | bytearray | memoryview], fsync: bool) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as fh:
            for chunk in chunks:
                fh.write(chunk)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class SessionStore:
    """Session records and checkpoint blobs on the local filesystem."""

    def __init__(self, root: Path, *, fsync: bool = False) -> None:
        self.root = Path(root) / "sessions"
        self.fsync = fsync

    def _dir(self, session_id: str) -> Path:
        return self.root / validate_session_id(session_id)

    def create(self, record: SessionRecord) -> None:
        """Write a new session's record.

        Raises:
            CheckpointError: the state directory is not writable.
        """
        try:
            (self._dir(record.session_id) / "blobs").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(f"cannot create session state in {self.root}: {exc}") from exc
        self.save(record)

    def save(self, record: SessionRecord) -> None:
        """Replace the record atomically."""
        data = json.dumps(asdict(record), indent=1, sort_keys=True).encode()
        try:
            _write_atomically(self._dir(record.session_id) / "meta.json", [data], self.fsync)
        except OSError as exc:
            raise CheckpointError(f"cannot write the record of session {record.session_id}: {exc}") from exc

    def load(self, session_id: str) -> SessionRecord:
        """Read a session's record.

        Raises:
            SessionNotFound: no record for this id.
        """
        path = self._dir(session_id) / "meta.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise SessionNotFound(f"no session {session_id!r} in {self.root}") from None
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"the record of session {session_id} is unreadable: {exc}") from exc
        return SessionRecord(**data)

    def exists(self, session_id: str) -> bool:
        return (self._dir(session_id) / "meta.json").exists()

    def ids(self) -> Iterator[str]:
        """Ids of every stored session."""
        if self.root.is_dir():
            for entry in sorted(self.root.iterdir()):
                if (entry / "meta.json").exists():
                    yield entry.name

    def commit(
        self,
        record: SessionRecord,
        *,
        generation: int,
        blobs: Mapping[str, bytes | bytearray | memoryview],
        changed: Mapping[str, str],
        deleted: Sequence[str],
    ) -> None:
        """Store a checkpoint delta: write its blobs, then switch the manifest in one rename.

        ``record`` is updated in place only once the new manifest is on disk.

        Raises:
            CheckpointError: a blob or the manifest could not be written; the previous
                checkpoint is still intact.
        """
        for name, blob_digest in changed.items():
            if not _DIGEST.match(blob_digest):
                raise CheckpointError(f"variable {name!r} names an invalid blob digest")
            if blob_digest not in blobs and blob_digest not in record.blob_sizes:
                raise CheckpointError(f"variable {name!r} refers to blob {blob_digest} that was not sent")
        blob_dir = self._dir(record.session_id) / "blobs"
        try:
            for blob_digest, data in blobs.items():
                if not _DIGEST.match(blob_digest):
                    raise CheckpointError(f"invalid blob digest {blob_digest!r}")
                target = blob_dir / blob_digest
                if not target.exists():
                    _write_atomically(target, [data], self.fsync)
        except OSError as exc:
            raise CheckpointError(f"cannot store checkpoint blobs of session {record.session_id}: {exc}") from exc
        variables = {k: v for k, v in record.variables.items() if k not in deleted}
        variables.update(changed)
        sizes = {**record.blob_sizes, **{d: len(b) for d, b in blobs.items()}}
        live = set(variables.values())
        new = SessionRecord(
            **{
                **asdict(record),
                "generation": generation,
                "variables": variables,
                "blob_sizes": {d: s for d, s in sizes.items() if d in live},
                "last_used_at": time.time(),
            }
        )
        self.save(new)
        for blob_digest in set(record.blob_sizes) - live:
            with contextlib.suppress(OSError):
                (blob_dir / blob_digest).unlink()
        record.__dict__.update(new.__dict__)

    def read_blobs(self, record: SessionRecord) -> list[tuple[str, bytes]]:
        """The blobs of the current checkpoint, as opaque bytes, to send back to an agent.

        Raises:
            CheckpointError: a blob named by the manifest is missing or unreadable.
        """
        blob_dir = self._dir(record.session_id) / "blobs"
        try:
            return [(d, (blob_dir / d).read_bytes()) for d in sorted(set(record.variables.values()))]
        except OSError as exc:
            raise CheckpointError(f"checkpoint of session {record.session_id} is damaged: {exc}") from exc

    def delete(self, session_id: str) -> None:
        """Remove a session's record and checkpoints (missing is fine)."""
        shutil.rmtree(self._dir(session_id), ignore_errors=True)
