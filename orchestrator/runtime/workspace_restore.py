"""The stored workspace written into a restored sandbox: the record's ``files`` map as ``files_put`` batches.

A restore empties the worker's ``/workspace`` (``restore_begin``); after the values, and before
``restore_end`` lets a cell run, the controller sends every entry of the generation
(docs/design/workspace.md, "Restore"). Entries go in path order, so an entry's directory is in its
batch or an earlier one; a batch holds at most ``MAX_FILES_PUT_ENTRIES`` entries and
``MAX_FILES_PUT_BYTES`` of file bytes, except a file bigger than that, which goes alone (its body is
the file, bounded by the frame as every saved file is). Each file's bytes are the stored blob's,
checked against its digest and size before they are sent: a damaged one is left out and named, as
a value whose blob is damaged is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager

from ..agent import blob_format
from ..agent.request_table import MAX_FILES_PUT_BYTES, MAX_FILES_PUT_ENTRIES, FileEntry
from ..errors import CheckpointError
from ..state.files import FILE, UNSAVED_PREFIX, Entry

OpenBlob = Callable[[str], AbstractContextManager[memoryview]]
PutBatch = Callable[[list[FileEntry], Sequence[memoryview]], None]
"""Sends one ``files_put``: its entries and its body, the files' contents in their order."""
DAMAGED = "its stored blob does not match its digest: the checkpoint file is damaged"


def batches(files: Mapping[str, Entry], sizes: Mapping[str, int]) -> Iterator[list[FileEntry]]:
    """The ``files_put`` entries of ``files`` (``[path, kind, mode, mtime_ns, ref, size]``) in path order, cut into
    batches within the bounds; ``sizes`` gives each file blob's size (the record's ``blob_sizes``)."""
    batch: list[FileEntry] = []
    batch_bytes = 0
    for path in sorted(files):  # a parent is a prefix of its entries' paths: it sorts before them
        kind, mode, mtime_ns, ref = files[path]
        size = sizes[ref] if kind == FILE else 0
        if batch and (len(batch) == MAX_FILES_PUT_ENTRIES or batch_bytes + size > MAX_FILES_PUT_BYTES):
            yield batch
            batch, batch_bytes = [], 0
        batch.append([path, kind, mode, mtime_ns, ref, size])
        batch_bytes += size
    if batch:
        yield batch


def put_workspace(
    files: Mapping[str, Entry], sizes: Mapping[str, int], open_blob: OpenBlob, put: PutBatch
) -> dict[str, str]:
    """Send ``files`` in batches through ``put``; return the files left out (``/workspace/<path>`` -> why): a blob
    missing, of another size than the record says, or whose bytes do not match its digest."""
    failed: dict[str, str] = {}
    for batch in batches(files, sizes):
        with contextlib.ExitStack() as blobs:
            entries: list[FileEntry] = []
            body: list[memoryview] = []
            for entry in batch:
                path, kind, _, _, ref, size = entry
                if kind == FILE:
                    problem = _checked(blobs, open_blob, ref, size, body)
                    if problem is not None:
                        failed[UNSAVED_PREFIX + path] = problem
                        continue
                entries.append(entry)
            if entries:
                put(entries, body)
    return failed


def _checked(
    blobs: contextlib.ExitStack, open_blob: OpenBlob, digest: str, size: int, body: list[memoryview]
) -> str | None:
    """Map the blob for the batch and add it to ``body`` when it is intact; else why not."""
    try:
        blob = blobs.enter_context(open_blob(digest))
    except CheckpointError as exc:
        return f"its stored blob is missing: {exc}"
    if len(blob) != size or blob_format.blob_digest(blob) != digest:
        return DAMAGED
    body.append(blob)
    return None
