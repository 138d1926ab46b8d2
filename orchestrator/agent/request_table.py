"""Each request defined once for both sides, and ``REQUESTS``: the row that says how the agent serves it.

A request's fields are a TypedDict; the controller sends it with its builder; the agent checks
it with its reader, which checks each field it uses (a field of the wrong type is an error
reply, or counts as absent where docs/protocol.md says so). Replies are checked on the host
(orchestrator/wire/replies.py): every byte from a sandbox is hostile.

A new request is a row of ``REQUESTS`` here, its handler in ``worker.py`` and its entry in
docs/protocol.md: the worker, the ladder and the controller read the row instead
of branching on the request's type.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, TypedDict, Union, cast

from .blob_format import HOST_BLOB_KINDS, HOST_BLOB_OVERHEAD, is_host_blob, value_file_name
from .checkpoint_names import CONTEXT_SEPARATOR, is_internal
from .framing import Header
from .protocol import ERROR, STATUS_ERROR, STATUS_PROTOCOL_ERROR, BadRequest

# --- Request types -----------------------------------------------------------------------------------------
# Requests the controller sends; each carries an ``id`` that its reply echoes.
EXEC = "exec"
SET_VALUE = "set_value"
RESET = "reset"
RESTORE_BEGIN = "restore_begin"
LOAD = "load"
DEFER = "defer"
RESTORE_END = "restore_end"
PING = "ping"
INSTALL = "install"  # the session's scaffold: code run in its own module of every worker (docs/protocol.md)
CONTEXT_CREATE = "context_create"
CONTEXT_DESTROY = "context_destroy"
FILES_PUT = "files_put"  # a batch of the stored workspace, written into a restored sandbox's (docs/design/workspace.md)
FILE_WRITE = "file_write"  # files.write: one file written, then a checkpoint
FILE_REMOVE = "file_remove"  # files.remove: one path removed, then a checkpoint
# The replies that answer them (a request of another type is answered ``protocol.ERROR``).
EXEC_REPLY = "exec_reply"
STATE_REPLY = "state_reply"
LOAD_REPLY = "load_reply"
RESTORE_REPLY = "restore_reply"
PONG = "pong"
INSTALL_REPLY = "install_reply"

# In the shapes below a key the agent can do without is optional (a TypedDict of ``total=False``), even where
# the controller always sends it. Time limits (``timeout``, ``checkpoint_timeout``) are seconds the request's ladder
# enforces; absent, or not a positive finite number, it uses its own default.


class _Envelope(TypedDict, total=False):
    id: str  # set by the controller's connection when it sends the request; the reply echoes it


class _Request(_Envelope):
    type: str


class InContext(_Request, total=False):
    context: str  # the context the request runs in (a CONTEXT_ID); absent: the default context


class _ExecFields(InContext):
    code: str


class ExecOptions(TypedDict, total=False):
    """The fields an exec may do without: each absent one has its default, which the builder leaves out."""

    checkpoint_timeout: float
    checkpoint: bool  # false: no checkpoint (an empty delta)
    stream: bool  # true: every byte of output travels as ``output`` frames
    input: bool  # true: the cell's input() asks the controller (a host call of INPUT_CALL)
    send_limit: int  # output bytes per stream that may travel as ``output`` frames (> 0; else none)
    output_cap: int  # bytes of stdout and stderr together past which the cell's writes raise (>= 0)
    stdin: str  # the text sys.stdin and Python's own input() read; then ``input`` is ignored


class ExecRequest(_ExecFields, ExecOptions, total=False):
    """Run a cell, then checkpoint (docs/protocol.md, "Requests and replies" and "Output, input() and interrupts")."""

    timeout: float


_EXEC_DEFAULTS = (
    ("checkpoint_timeout", None),
    ("checkpoint", True),
    ("stream", False),
    ("input", False),
    ("send_limit", None),
    ("output_cap", None),
    ("stdin", None),
)
"""Each option of an exec in the order the builder writes it, with the default it is left out at."""


def exec_request(code: str, timeout: float, options: Optional[ExecOptions] = None) -> ExecRequest:
    """The exec of ``code``, with the ``options`` that are not at their defaults."""
    request = ExecRequest(type=EXEC, code=code, timeout=timeout)
    given = cast(Dict[str, Any], options or {})
    for name, default in _EXEC_DEFAULTS:
        value = given.get(name)
        if value is not None and value != default:
            cast(Dict[str, Any], request)[name] = value
    return request


_EXEC_OPTIONS: Dict[str, Callable[[Any], bool]] = {
    "send_limit": lambda value: type(value) is int and value > 0,
    "output_cap": lambda value: type(value) is int and value >= 0,
    "stdin": lambda value: isinstance(value, str),
    "stream": lambda value: value is True,
    "input": lambda value: value is True,
    "checkpoint": lambda value: value is False,
}


def read_exec(header: Header) -> ExecRequest:
    """The exec request; an option of the wrong type (or its default value) is dropped: it counts as absent.

    Raises:
        BadRequest: no code.
    """
    if not isinstance(header.get("code"), str):
        raise BadRequest("no code")
    kept = {key: value for key, value in header.items() if key not in _EXEC_OPTIONS or _EXEC_OPTIONS[key](value)}
    return cast(ExecRequest, kept)


class _SetValueFields(InContext):
    name: str
    kind: str  # how the body is the value: "str" (UTF-8, surrogatepass), "bytes", "json"


class SetValueRequest(_SetValueFields, total=False):
    """Bind a value the controller sends as the body to ``name`` and ``aliases`` (docs/protocol.md)."""

    aliases: List[str]
    checkpoint_timeout: float
    blob: str  # kind str or bytes: the id of the host-made blob the controller stored (HOST_BLOB_ID) ...
    blob_size: int  # ... and its size: the body's length plus HOST_BLOB_OVERHEAD
    file: str  # with blob, local sandboxes only: the blob is this file of the channel directory, the body empty


def set_value_request(name: str, kind: str, aliases: List[str], checkpoint_timeout: float) -> SetValueRequest:
    return SetValueRequest(type=SET_VALUE, name=name, kind=kind, aliases=aliases, checkpoint_timeout=checkpoint_timeout)


def read_set_value(header: Header, body_size: int) -> SetValueRequest:
    """The set_value request whose body is ``body_size`` bytes, with ``aliases`` a list (absent: empty).

    Raises:
        BadRequest: a name or alias that is not a non-empty str or internal (``is_internal``); a ``blob`` without
            the kind, id and size of a host-made blob (the worker decodes the body by ``kind``); a
            ``file`` that is not that blob's file name, or comes with a body.
    """
    kind = header.get("kind")
    aliases = header.get("aliases") or []
    names = [header.get("name"), *(aliases if isinstance(aliases, list) else [None])]
    if not all(isinstance(name, str) and name and not is_internal(name) for name in names):
        raise BadRequest("bad variable name")
    blob_id, blob_size, file = header.get("blob"), header.get("blob_size"), header.get("file")
    if file is not None and not (isinstance(blob_id, str) and file == value_file_name(blob_id) and body_size == 0):
        raise BadRequest("a value file must be named after its host-made blob, with an empty body")
    if blob_id is not None and not (
        kind in HOST_BLOB_KINDS
        and is_host_blob(blob_id)
        and type(blob_size) is int
        and blob_size >= HOST_BLOB_OVERHEAD
        and (file is not None or blob_size == body_size + HOST_BLOB_OVERHEAD)
    ):
        raise BadRequest("a host-made blob needs kind str or bytes, its id and its size")
    return cast(SetValueRequest, dict(header, aliases=aliases))


class ResetRequest(InContext, total=False):
    """Clear the context's namespace, then checkpoint."""

    checkpoint_timeout: float


def reset_request(checkpoint_timeout: float) -> ResetRequest:
    return ResetRequest(type=RESET, checkpoint_timeout=checkpoint_timeout)


class RestoreBeginRequest(_Request, total=False):
    """Clear every namespace and drop every context but the default one: a restore starts."""

    generation: int  # the generation being restored (the agent does not use it)
    prepare: bool  # true: an empty restore that readies a pooled sandbox (the worker imports dill now)


def restore_begin_request(generation: int, prepare: bool = False) -> RestoreBeginRequest:
    request = RestoreBeginRequest(type=RESTORE_BEGIN, generation=generation)
    if prepare:
        request["prepare"] = True
    return request


class _LoadFields(InContext):
    name: str  # the bare name (its context in ``context``)
    digest: str  # the blob's content digest, or a host-made blob's id


class LoadRequest(_LoadFields, total=False):
    """Unpickle the body (one blob) into ``name`` (docs/protocol.md, "Restore")."""

    timeout: float
    verified: bool  # true: the controller checks the digest itself, the worker does not


def load_request(name: str, digest: str, timeout: float, context: Optional[str] = None) -> LoadRequest:
    request = LoadRequest(type=LOAD, name=name, digest=digest, timeout=timeout)
    if context is not None:
        request["context"] = context
    return request


def read_load(header: Header) -> LoadRequest:
    """The load request.

    Raises:
        BadRequest: the name is not a non-empty str or internal (``is_internal``), or the digest is not a str.
    """
    name = header.get("name")
    if not isinstance(name, str) or not name or is_internal(name) or not isinstance(header.get("digest"), str):
        raise BadRequest("the load request needs a name and a digest")
    return cast(LoadRequest, header)


class _DeferFields(_LoadFields):
    size: int  # the blob's size in bytes (the checkpoint and its quota count it)


class DeferRequest(_DeferFields, total=False):
    """Bind ``name`` to a stored blob that is loaded on first use, not now (docs/protocol.md, "Deferred values")."""


def defer_request(name: str, digest: str, size: int, context: Optional[str] = None) -> DeferRequest:
    request = DeferRequest(type=DEFER, name=name, digest=digest, size=size)
    if context is not None:
        request["context"] = context
    return request


def read_defer(header: Header) -> DeferRequest:
    """The defer request.

    Raises:
        BadRequest: the name is not a non-empty str or internal (``is_internal``), the digest is not a str, or the size
            is not an int >= 0.
    """
    read_load(header)
    size = header.get("size")
    if type(size) is not int or size < 0:
        raise BadRequest("the defer request needs a size")
    return cast(DeferRequest, header)


class RestoreEndRequest(_Request):
    """The restore is complete: the checkpoint generation the worker holds now."""

    generation: int


def restore_end_request(generation: int) -> RestoreEndRequest:
    return RestoreEndRequest(type=RESTORE_END, generation=generation)


def read_restore_end(header: Header) -> RestoreEndRequest:
    """The restore_end request.

    Raises:
        BadRequest: the generation is not an int >= 0.
    """
    generation = header.get("generation")
    if type(generation) is not int or generation < 0:
        raise BadRequest("restore_end needs a generation")
    return cast(RestoreEndRequest, header)


# --- The workspace (docs/design/workspace.md) ----------------------------------------------------------------
MAX_FILES_PUT_ENTRIES = 4096  # entries of one files_put (the controller sends a workspace in batches)
MAX_FILES_PUT_BYTES = 64 << 20  # file bytes of one files_put (its body)
FileEntry = List[Any]  # [path, kind, mode, mtime_ns, ref, size]: a checkpoint delta's ``files.changed`` entry


class _FilesPutFields(_Request):
    entries: List[FileEntry]


class FilesPutRequest(_FilesPutFields, total=False):
    """Write a batch of the stored workspace into the fresh one a restore began with (``restore_begin`` emptied it).

    ``entries`` as a checkpoint delta lists them; the body is the contents of the entries of kind ``f``, in their
    order, each ``size`` bytes. The reply is ``restore_reply``; the workspace is the stored one at ``restore_end``.
    """

    timeout: float


def files_put_request(entries: List[FileEntry], timeout: float) -> FilesPutRequest:
    return FilesPutRequest(type=FILES_PUT, entries=entries, timeout=timeout)


def read_files_put(header: Header, body_size: int) -> FilesPutRequest:
    """The files_put request: its entries' shape only (the worker's workspace checks each path and field).

    Raises:
        BadRequest: ``entries`` is not a list of at most MAX_FILES_PUT_ENTRIES six-item lists whose files' sizes add
            up to the body's length (at most MAX_FILES_PUT_BYTES, unless the batch is one entry: a bigger file goes
            alone, bounded by the frame as every saved file is).
    """
    entries = header.get("entries")
    if not isinstance(entries, list) or len(entries) > MAX_FILES_PUT_ENTRIES:
        raise BadRequest("files_put needs a list of at most %d entries" % MAX_FILES_PUT_ENTRIES)
    total = 0
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 6 and type(entry[5]) is int and entry[5] >= 0):
            raise BadRequest("a files_put entry is [path, kind, mode, mtime_ns, ref, size]")
        total += entry[5] if entry[1] == "f" else 0
    if total != body_size or (body_size > MAX_FILES_PUT_BYTES and len(entries) > 1):
        raise BadRequest("the files_put body must hold its files' bytes, at most %d" % MAX_FILES_PUT_BYTES)
    return cast(FilesPutRequest, header)


class _FileWriteFields(InContext):
    path: str  # relative to /workspace, or absolute under it (the context's own directory is not implied)
    mode: int  # the permission bits of the file (0..0o777)


class FileWriteRequest(_FileWriteFields, total=False):
    """Write the body as the file ``path`` (its parent directories made), then checkpoint (``files.write``)."""

    checkpoint_timeout: float


def file_write_request(path: str, mode: int, checkpoint_timeout: float) -> FileWriteRequest:
    return FileWriteRequest(type=FILE_WRITE, path=path, mode=mode, checkpoint_timeout=checkpoint_timeout)


def read_file_write(header: Header) -> FileWriteRequest:
    """The file_write request.

    Raises:
        BadRequest: the path is not a non-empty str, or the mode not an int in 0..0o777.
    """
    mode = header.get("mode")
    if not isinstance(header.get("path"), str) or not header["path"] or type(mode) is not int or not 0 <= mode <= 0o777:
        raise BadRequest("file_write needs a path and a mode")
    return cast(FileWriteRequest, header)


class _FileRemoveFields(InContext):
    path: str
    recursive: bool  # a directory and everything in it; false: a file, a link or an empty directory


class FileRemoveRequest(_FileRemoveFields, total=False):
    """Remove ``path`` from the workspace, then checkpoint (``files.remove``)."""

    checkpoint_timeout: float


def file_remove_request(path: str, recursive: bool, checkpoint_timeout: float) -> FileRemoveRequest:
    return FileRemoveRequest(type=FILE_REMOVE, path=path, recursive=recursive, checkpoint_timeout=checkpoint_timeout)


def read_file_remove(header: Header) -> FileRemoveRequest:
    """The file_remove request.

    Raises:
        BadRequest: the path is not a non-empty str, or ``recursive`` not a bool.
    """
    if not isinstance(header.get("path"), str) or not header["path"] or type(header.get("recursive")) is not bool:
        raise BadRequest("file_remove needs a path and recursive")
    return cast(FileRemoveRequest, header)


class _InstallFields(_Request):
    code: str
    names: List[str]  # session names the scaffold makes: never checkpointed


class InstallRequest(_InstallFields, total=False):
    """Run the session's scaffold in a module of its own (docs/protocol.md, "The scaffold")."""

    timeout: float


def install_request(code: str, names: List[str], timeout: float) -> InstallRequest:
    return InstallRequest(type=INSTALL, code=code, names=names, timeout=timeout)


def read_install(header: Header) -> InstallRequest:
    """The install request.

    Raises:
        BadRequest: the code is not a str, or the names not a list of str.
    """
    code, names = header.get("code"), header.get("names")
    if not isinstance(code, str) or not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise BadRequest("install needs code (a str) and names (a list of str)")
    return cast(InstallRequest, header)


class _ContextCreateFields(_Request):
    context: str
    cwd: str  # absolute; the worker creates it
    env: Dict[str, str]  # on top of the worker's own environment


class ContextCreateRequest(_ContextCreateFields, total=False):
    """Make an empty context (an existing one of that id is destroyed first)."""

    checkpoint_timeout: float


def context_create_request(
    context: str, cwd: str, env: Dict[str, str], checkpoint_timeout: Optional[float] = None
) -> ContextCreateRequest:
    request = ContextCreateRequest(type=CONTEXT_CREATE, context=context, cwd=cwd, env=env)
    if checkpoint_timeout is not None:
        request["checkpoint_timeout"] = checkpoint_timeout
    return request


class _ContextDestroyFields(_Request):
    context: str


class ContextDestroyRequest(_ContextDestroyFields, total=False):
    """Delete a context and its names."""

    checkpoint_timeout: float


def context_destroy_request(context: str, checkpoint_timeout: float) -> ContextDestroyRequest:
    return ContextDestroyRequest(type=CONTEXT_DESTROY, context=context, checkpoint_timeout=checkpoint_timeout)


def read_context(header: Header) -> Union[ContextCreateRequest, ContextDestroyRequest]:
    """A context_create or context_destroy request.

    Raises:
        BadRequest: no context id (a non-empty str without the separator); for context_create, a ``cwd``
            that is not absolute or an ``env`` that is not an object of strings.
    """
    context_id, cwd, env = header.get("context"), header.get("cwd"), header.get("env")
    if not isinstance(context_id, str) or not context_id or CONTEXT_SEPARATOR in context_id:
        raise BadRequest("the request needs a context id")
    if header["type"] == CONTEXT_DESTROY:
        return cast(ContextDestroyRequest, header)
    if not (
        isinstance(cwd, str)
        and cwd.startswith("/")
        and isinstance(env, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise BadRequest("context_create needs an absolute cwd and env (an object of strings)")
    return cast(ContextCreateRequest, header)


class PingRequest(_Request):
    """Is the agent there? It answers ``pong {generation}`` itself, without the worker."""


# What the controller sends through ``AgentConnection.request``: each answered by its row's ``reply``.
Request = Union[
    ExecRequest,
    SetValueRequest,
    ResetRequest,
    RestoreBeginRequest,
    LoadRequest,
    DeferRequest,
    RestoreEndRequest,
    InstallRequest,
    ContextCreateRequest,
    ContextDestroyRequest,
    FilesPutRequest,
    FileWriteRequest,
    FileRemoveRequest,
    PingRequest,
]


# --- The table ---------------------------------------------------------------------------------------------
# Ladder phases (agent/ladder.py): the clock a request starts on, and the signal that interrupts it (docs/protocol.md).
CELL_PHASE = "cell"  # user code, SIGINT; ``timeout``
LOAD_PHASE = "load"  # unpickling, SIGINT; ``timeout``
CHECKPOINT_PHASE = "checkpoint"  # a namespace cleared or changed, then a checkpoint, SIGUSR2; ``checkpoint_timeout``
CONTROL_PHASE = "request"  # no user code, only a namespace to clear (whose __del__ may hang); ``timeout``, short


def _never(header: Header) -> bool:
    return False


def _always(header: Header) -> bool:
    return True


def _prepares(header: Header) -> bool:
    """A restore that says ``prepare`` is an empty one that readies a warm pool's sandbox (``Sandbox.warm_up``)
    while nobody waits, for the fork or restore that takes it: dill is imported now. A new session's own empty
    restore does not import it: a session of plain data never needs dill."""
    return header.get("prepare") is True


def _unchecked(header: Header, body_size: int) -> Header:
    return header


def _header_only(read: Callable[[Header], Any]) -> Callable[[Header, int], Any]:
    return lambda header, body_size: read(header)


class Row(NamedTuple):
    """How the agent serves one request type: what every branch on the type would otherwise decide."""

    reply: str  # the reply type that answers it
    phase: str  # the ladder phase it starts in (``*_PHASE``)
    read: Callable[[Header, int], Any]  # (header, body size) -> the request; raises BadRequest
    handler: Optional[str]  # the worker's method that serves the request; None: the supervisor answers it (ping)
    refusal: str = STATUS_ERROR  # the status of the reply to a request ``read`` refuses
    in_context: bool = True  # the worker enters the request's ``context`` first (False: the handler chooses)
    imports_dill: Callable[[Header], bool] = _never  # the worker imports dill before it (the request unpickles)
    fresh_worker_ok: bool = False  # an empty worker is what it asks for: a worker lost or killed meanwhile is success


REQUESTS: Dict[str, Row] = {
    EXEC: Row(EXEC_REPLY, CELL_PHASE, _header_only(read_exec), "execute", refusal=STATUS_PROTOCOL_ERROR),
    SET_VALUE: Row(STATE_REPLY, CHECKPOINT_PHASE, read_set_value, "set_value"),
    RESET: Row(STATE_REPLY, CHECKPOINT_PHASE, _unchecked, "reset"),
    RESTORE_BEGIN: Row(
        RESTORE_REPLY,
        CONTROL_PHASE,
        _unchecked,
        "restore_begin",
        in_context=False,
        imports_dill=_prepares,
        fresh_worker_ok=True,
    ),
    LOAD: Row(LOAD_REPLY, LOAD_PHASE, _header_only(read_load), "load", imports_dill=_always),
    DEFER: Row(LOAD_REPLY, CONTROL_PHASE, _header_only(read_defer), "defer"),
    RESTORE_END: Row(RESTORE_REPLY, CONTROL_PHASE, _header_only(read_restore_end), "restore_end"),
    INSTALL: Row(INSTALL_REPLY, CONTROL_PHASE, _header_only(read_install), "install"),
    CONTEXT_CREATE: Row(STATE_REPLY, CHECKPOINT_PHASE, _header_only(read_context), "context_create", in_context=False),
    CONTEXT_DESTROY: Row(
        STATE_REPLY, CHECKPOINT_PHASE, _header_only(read_context), "context_destroy", in_context=False
    ),
    FILES_PUT: Row(RESTORE_REPLY, LOAD_PHASE, read_files_put, "files_put", in_context=False),
    FILE_WRITE: Row(STATE_REPLY, CHECKPOINT_PHASE, _header_only(read_file_write), "file_write"),
    FILE_REMOVE: Row(STATE_REPLY, CHECKPOINT_PHASE, _header_only(read_file_remove), "file_remove"),
    PING: Row(PONG, CONTROL_PHASE, _unchecked, None),
}
"""Every request type, a row each (docs/protocol.md, "Requests and replies"); any other type is answered ``ERROR``."""


def reply_type(kind: str) -> str:
    """The reply type that answers a request of type ``kind``: ``ERROR`` for a type not in ``REQUESTS``."""
    row = REQUESTS.get(kind)
    return ERROR if row is None else row.reply
