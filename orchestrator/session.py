"""A persistent Python session in one sandbox container: calls, checkpoints, and recovery.

A call is a transaction on the session state. Its reply carries the checkpoint delta the
call caused, which is stored before the call returns. When the worker, the agent or the
whole container dies, the session starts what is missing again, restores the last stored
checkpoint, and tells the caller precisely what happened through a typed exception; the
next call just works.
"""

from __future__ import annotations

import enum
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from .agent import protocol
from .backend import LABEL_PREFIX, ContainerState, DockerBackend
from .config import Settings
from .errors import (
    AgentTimeoutError,
    ChannelLost,
    ConfigError,
    ExecutionTimeout,
    ProtocolError,
    SandboxCrashed,
    SandboxOutOfMemory,
    SessionAttachedElsewhere,
    SessionClosed,
    SessionNotFound,
    TransportError,
)
from .results import ExecResult, expect, expect_str_map
from .store import SessionRecord, SessionStore
from .transport import Channel, ChannelListener

logger = logging.getLogger(__name__)

T = TypeVar("T")
_DEATH_SETTLE_SECONDS = 3.0
_DIGEST = re.compile(r"^[0-9a-f]{32}$")
_LAST_USED_RESOLUTION = 30.0


class SessionState(enum.Enum):
    READY = "ready"
    DETACHED = "detached"
    CLOSED = "closed"


def _new_request_id() -> str:
    return uuid.uuid4().hex


def _encode_payload(payload: Any) -> tuple[str, bytes]:
    """How a context or history travels: (kind, raw bytes), never pickled on the host."""
    if isinstance(payload, str):
        return "str", payload.encode("utf-8", errors="surrogatepass")
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return "bytes", bytes(payload)
    if isinstance(payload, (dict, list)):
        try:
            return "json", json.dumps(payload).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"a dict or list payload must be JSON-serializable: {exc}") from exc
    raise ConfigError(f"payload must be str, bytes, dict or list, not {type(payload).__name__}")


class Session:
    """The handle on one persistent sandbox session; obtain it from ``Orchestrator``.

    One call runs at a time; concurrent callers wait their turn. Use as a context manager
    to ``close()`` the session (container and stored state) on exit.
    """

    def __init__(
        self,
        record: SessionRecord,
        *,
        store: SessionStore,
        backend: DockerBackend,
        settings: Settings,
        on_close: Callable[[Session], None] | None = None,
    ) -> None:
        self._record = record
        self._store = store
        self._backend = backend
        self._settings = settings
        self._on_close = on_close
        self._lock = threading.RLock()
        self._listener: ChannelListener | None = None
        self._channel: Channel | None = None
        self.state = SessionState.READY
        self.restore_failures: dict[str, str] = {}
        """Variables the last restore could not load, with the reason."""
        self.agent_info: dict[str, Any] = {}
        """The agent's handshake: protocol, Python and dill versions."""

    # ----------------------------------------------------------------- public surface

    @property
    def id(self) -> str:
        return self._record.session_id

    @property
    def container_id(self) -> str | None:
        return self._record.container_id

    @property
    def generation(self) -> int:
        """Checkpoint generation of the stored state (advances with every call that changed it)."""
        return self._record.generation

    @property
    def variables(self) -> list[str]:
        """Names held by the last checkpoint."""
        return sorted(self._record.variables)

    @property
    def checkpoint_bytes(self) -> int:
        """Size of the stored checkpoint in bytes."""
        return self._record.checkpoint_bytes

    def execute(self, code: str, timeout: float | None = None) -> ExecResult:
        """Run ``code`` in the session's namespace and checkpoint the result.

        Args:
            code: Python source; a trailing expression's repr becomes ``return_value``.
            timeout: seconds the cell may run (default ``Settings.exec_timeout``).

        Returns:
            ExecResult; an exception raised by the code is in ``.error``, not raised.

        Raises:
            ExecutionTimeout: the cell ran past ``timeout`` (``.restored`` says whether the
                worker was killed and the last checkpoint restored).
            SandboxCrashed: the interpreter or container died; the session was restored.
            SandboxOutOfMemory: the memory limit was hit; the session was restored.
            ProtocolError: the agent misbehaved; the session was restored.
            SessionClosed: the session was closed.
        """
        if not isinstance(code, str):
            raise ConfigError(f"code must be a str, not {type(code).__name__}")
        try:
            # The frame would fail (or silently change the code) on lone surrogates; ASCII is O(1) to rule out.
            code.isascii() or code.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(f"code must be valid Unicode text: {exc}") from None
        limit = self._settings.exec_timeout if timeout is None else float(timeout)
        if not limit > 0:
            raise ConfigError(f"timeout must be a positive number of seconds, got {timeout!r}")
        with self._lock:
            request = {"type": protocol.EXEC, "id": _new_request_id(), "code": code, "timeout": limit}
            reply, body = self._call(request, b"", limit + self._settings.interrupt_grace + self._settings.reply_margin)
            return self._accept(reply, body, lambda r, b: self._finish_exec(r, b, limit))

    def add_context(self, payload: str | bytes | dict[str, Any] | list[Any], index: int | None = None) -> int:
        """Load a context into the namespace as ``context_<index>`` (``context`` aliases ``context_0``).

        The payload travels once, as raw bytes. Returns the index used.
        """
        return self._add_versioned("context", payload, index)

    def add_history(self, messages: list[Any], index: int | None = None) -> int:
        """Store a message history as ``history_<index>`` (``history`` aliases ``history_0``)."""
        if not isinstance(messages, list):
            raise ConfigError(f"messages must be a list, not {type(messages).__name__}")
        return self._add_versioned("history", messages, index)

    def get_context_count(self) -> int:
        return self._record.context_count

    def get_history_count(self) -> int:
        return self._record.history_count

    def reset(self) -> None:
        """Clear every variable (the container keeps running); the empty state is checkpointed."""
        with self._lock:
            reply, body = self._call(
                {"type": protocol.RESET, "id": _new_request_id()}, b"", self._settings.start_timeout
            )
            self._accept(reply, body, self._commit)
            self._record.context_count = self._record.history_count = 0
            self._store.save(self._record)

    def detach(self) -> None:
        """Let go of the session but keep its container and checkpoint, for ``Orchestrator.attach``."""
        with self._lock:
            if self.state is SessionState.READY:
                self._drop_channel()
                self.state = SessionState.DETACHED

    def close(self) -> None:
        """Remove the container and the stored state. Closing twice is fine."""
        with self._lock:
            if self.state is SessionState.CLOSED:
                return
            self._drop_channel()
            self.state = SessionState.CLOSED
            try:
                for container in self._backend.find(self.id):
                    self._backend.remove(container.id)
            finally:
                self._store.delete(self.id)
                if self._on_close is not None:
                    self._on_close(self)
            logger.info("closed session %s", self.id)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Session {self.id} {self.state.value} generation={self.generation}>"

    # ----------------------------------------------------------------- starting and restoring

    def start(self) -> None:
        """Start a new container for this session and restore its checkpoint into it."""
        self._drop_channel()
        self._listener = ChannelListener(
            self._settings.runtime_dir / self.id, self._settings.max_header_bytes, self._settings.max_body_bytes
        )
        self._record.container_id = self._backend.run_sandbox(
            session_id=self.id,
            image=self._record.image,
            channel_dir=self._listener.path.parent,
            labels={
                LABEL_PREFIX + "created-at": str(int(self._record.created_at)),
                LABEL_PREFIX + "last-used": str(int(time.time())),
                LABEL_PREFIX + "protocol": str(protocol.PROTOCOL_VERSION),
                **self._record.labels,
            },
            environment={
                "ORCH_SESSION_ID": self.id,
                "ORCH_OUTPUT_LIMIT": str(self._settings.max_output_bytes),
                "ORCH_INTERRUPT_GRACE": str(self._settings.interrupt_grace),
                "ORCH_FRAME_TIMEOUT": str(self._settings.frame_timeout),
                "ORCH_MAX_BODY": str(self._settings.max_body_bytes),
            },
            settings=self._settings,
        )
        self._store.save(self._record)
        self._connect(self._settings.start_timeout)
        self._restore()

    def reattach(self, container: ContainerState) -> None:
        """Take over the channel of a running container; restore only if its state is not ours."""
        self._drop_channel()
        self._listener = ChannelListener(
            self._settings.runtime_dir / self.id, self._settings.max_header_bytes, self._settings.max_body_bytes
        )
        self._backend.kill(container.id, signal="SIGUSR1")  # the agent drops any old connection and reconnects
        hello = self._connect(self._settings.start_timeout)
        self._record.container_id = container.id
        if hello["generation"] != self._record.generation:
            self._restore()

    def _connect(self, timeout: float) -> dict[str, Any]:
        assert self._listener is not None
        channel = self._listener.accept(timeout)
        try:
            hello, _ = channel.recv(timeout)
            if hello.get("type") != protocol.HELLO:
                raise ProtocolError(f"expected a hello from the agent, got {hello.get('type')!r}")
            version = expect(hello, "protocol", int)
            if version != protocol.PROTOCOL_VERSION:
                raise ProtocolError(
                    f"agent speaks protocol {version}, this controller {protocol.PROTOCOL_VERSION}: "
                    "rebuild the image with `orchestrator image build`"
                )
            if expect(hello, "session_id", str) != self.id:
                raise ProtocolError(f"an agent of session {hello['session_id']!r} connected to session {self.id!r}")
            expect(hello, "generation", int)
        except BaseException:
            channel.close()
            raise
        self._channel = channel
        self.agent_info = {k: hello.get(k) for k in ("protocol", "python", "dill")}
        logger.info("agent of session %s connected: %s", self.id, self.agent_info)
        return hello

    def _restore(self) -> None:
        """Load the stored checkpoint into the (fresh) worker."""
        blobs = self._store.read_blobs(self._record)
        header = {
            "type": protocol.RESTORE,
            "id": _new_request_id(),
            "generation": self._record.generation,
            "vars": self._record.variables,
            "blobs": [{"digest": d, "size": len(b)} for d, b in blobs],
        }
        reply, _ = self._roundtrip(header, [b for _, b in blobs], self._settings.start_timeout + 60.0)
        if reply.get("type") != protocol.RESTORE_REPLY:
            raise ProtocolError(f"restore answered with {reply.get('type')!r}: {str(reply.get('reason', ''))[:500]}")
        self.restore_failures = expect_str_map(reply, "failed")
        if self.restore_failures:
            logger.warning("session %s: could not restore %s", self.id, ", ".join(sorted(self.restore_failures)))

    def _drop_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    # ----------------------------------------------------------------- calls

    def _roundtrip(
        self, header: dict[str, Any], body: protocol.Body | list[bytes], deadline: float
    ) -> tuple[dict[str, Any], bytearray]:
        """Send one request and wait for the reply with its id; no recovery here."""
        assert self._channel is not None
        try:
            self._channel.send(header, body)
        except ChannelLost:
            self._hear_between_calls()  # a takeover's goodbye may be waiting behind the broken pipe
            raise
        ends = time.monotonic() + deadline
        while True:
            reply, reply_body = self._channel.recv(max(0.0, ends - time.monotonic()))
            if reply.get("type") == protocol.GOODBYE:
                self._drop_channel()
                self.state = SessionState.DETACHED
                raise SessionAttachedElsewhere(f"session {self.id} was attached by another controller")
            if reply.get("id") == header["id"]:
                return reply, reply_body
            raise ProtocolError(f"reply for request {str(reply.get('id'))[:64]!r} while waiting for {header['id']!r}")

    def _ensure_live(self) -> None:
        """Before a call: notice a container that died or was removed since the last call, and recover."""
        if self.state is SessionState.CLOSED:
            raise SessionClosed(f"session {self.id} is closed")
        if self.state is SessionState.DETACHED:
            raise SessionAttachedElsewhere(f"session {self.id} is detached; attach it again with Orchestrator.attach")
        if self._channel is not None and self._channel.has_pending():
            self._hear_between_calls()
        if self._channel is None:
            self._check_owner()
            self.start()

    def _hear_between_calls(self) -> None:
        """The agent spoke unasked: a goodbye means another controller took over; anything else, it hung up."""
        assert self._channel is not None
        try:
            message, _ = self._channel.recv(1.0)
        except TransportError:
            message = {}
        if message.get("type") == protocol.GOODBYE:
            self._drop_channel()
            self.state = SessionState.DETACHED
            raise SessionAttachedElsewhere(f"session {self.id} was attached by another controller")
        logger.info("session %s: the sandbox went away between calls; restarting it", self.id)
        self._channel.close()
        self._channel = None

    def _check_owner(self) -> None:
        """Before starting a container: another controller may have attached and started its own.

        Its container id is in the stored record; starting ours would remove theirs by name.
        """
        try:
            stored = self._store.load(self.id)
        except SessionNotFound:
            self._drop_channel()
            self.state = SessionState.CLOSED
            raise SessionClosed(f"session {self.id} was closed by another controller") from None
        if stored.container_id != self._record.container_id:
            self._drop_channel()
            self.state = SessionState.DETACHED
            raise SessionAttachedElsewhere(f"session {self.id} was attached by another controller")

    def _call(self, header: dict[str, Any], body: bytes, deadline: float) -> tuple[dict[str, Any], bytearray]:
        """A round trip with recovery: whatever kills the sandbox, the session is restored before we raise."""
        reply, reply_body = self._call_once(header, body, deadline)
        if reply.get("status") == protocol.STATUS_CRASHED and reply.get("ran") is False:
            # The worker had died between calls and the request never ran: restore and send it again.
            self._restore()
            reply, reply_body = self._call_once({**header, "id": _new_request_id()}, body, deadline)
        return reply, reply_body

    def _call_once(self, header: dict[str, Any], body: bytes, deadline: float) -> tuple[dict[str, Any], bytearray]:
        self._ensure_live()
        try:
            return self._roundtrip(header, body, deadline)
        except ChannelLost as exc:
            state = self._settled_state()
            cause = self._death_cause(state, exc)
            self._check_owner()
            self.start()
            error_type = SandboxOutOfMemory if state is not None and state.oom_killed else SandboxCrashed
            raise error_type(self._restored_message(cause), restored=True, generation=self.generation) from None
        except AgentTimeoutError:
            self._recycle()
            raise ExecutionTimeout(
                self._restored_message(f"the sandbox did not answer within {deadline:.1f} s and was recycled"),
                restored=True,
                generation=self.generation,
            ) from None
        except ProtocolError as exc:
            self._recycle()
            raise ProtocolError(self._restored_message(str(exc))) from None

    def _recycle(self) -> None:
        if self._record.container_id:
            self._backend.remove(self._record.container_id)
        self.start()

    def _settled_state(self) -> ContainerState | None:
        """The container's state once it has finished dying (a closed channel precedes the engine's view).

        A container someone is removing counts as still dying: starting its successor under the
        same name meanwhile would fail with "removal already in progress".
        """
        ends = time.monotonic() + _DEATH_SETTLE_SECONDS
        while True:
            state = self._backend.inspect(self._record.container_id) if self._record.container_id else None
            settled = state is None or (not state.running and state.status != "removing")
            if settled or time.monotonic() > ends:
                return state
            time.sleep(0.05)

    def _death_cause(self, state: ContainerState | None, exc: Exception) -> str:
        if state is None:
            return "the sandbox container was removed during the call"
        if state.running:
            return f"the agent closed the channel while its container kept running ({exc})"
        return f"the sandbox died during the call: {state.describe()}"

    def _restored_message(self, cause: str) -> str:
        return f"{cause}; session {self.id} was restored to checkpoint generation {self.generation}"

    def _accept(self, reply: dict[str, Any], body: bytearray, handle: Callable[[dict[str, Any], bytearray], T]) -> T:
        """Hand a reply to ``handle`` once its status says the worker lived.

        A reply that fails validation means the agent is out of step with us (user code can
        forge frames on the worker's socket), so the sandbox is recycled and restored before
        the ProtocolError is raised.
        """
        self._raise_if_worker_lost(reply)
        try:
            if reply.get("status") not in (protocol.STATUS_OK, protocol.STATUS_ERROR, protocol.STATUS_TIMEOUT):
                raise ProtocolError(f"unknown reply status {str(reply.get('status'))[:64]!r}")
            return handle(reply, body)
        except ProtocolError as exc:
            self._recycle()
            raise ProtocolError(self._restored_message(f"invalid reply from the agent: {exc}")) from None

    def _raise_if_worker_lost(self, reply: dict[str, Any]) -> None:
        """The agent replaced a worker that died or misbehaved: restore into the new one and say why."""
        status = reply.get("status")
        if status in (protocol.STATUS_CRASHED, protocol.STATUS_PROTOCOL_ERROR):
            self._restore()
            error = SandboxOutOfMemory if reply.get("oom") is True else SandboxCrashed
            if status == protocol.STATUS_PROTOCOL_ERROR:
                raise ProtocolError(self._restored_message(str(reply.get("reason", ""))[:2000]))
            raise error(
                self._restored_message(str(reply.get("reason", "the worker died"))[:2000]),
                restored=True,
                generation=self.generation,
            )

    def _finish_exec(self, reply: dict[str, Any], body: bytearray, limit: float) -> ExecResult:
        if reply.get("type") != protocol.EXEC_REPLY:
            raise ProtocolError(f"exec answered with {str(reply.get('type'))[:64]!r}")
        if reply["status"] == protocol.STATUS_TIMEOUT:
            if reply.get("worker_restarted") is not False:
                self._restore()
                raise ExecutionTimeout(
                    self._restored_message(f"the cell ran past its {limit:g} s timeout and ignored the interrupt"),
                    restored=True,
                    generation=self.generation,
                )
            unsaved = self._commit(reply, body)
            raise ExecutionTimeout(
                f"the cell ran past its {limit:g} s timeout and was interrupted; session {self.id} keeps "
                f"what the cell did before the interrupt (generation {self.generation}"
                + (f"; not saved: {', '.join(sorted(unsaved))}" if unsaved else "")
                + ")",
                restored=False,
                generation=self.generation,
                stdout=expect(reply, "stdout", str),
                stderr=expect(reply, "stderr", str),
            )
        unsaved = self._commit(reply, body)
        return ExecResult.from_reply(reply, unsaved, self.generation)

    def _commit(self, reply: dict[str, Any], body: bytearray) -> dict[str, str]:
        """Validate a reply's checkpoint delta and store it; return the names that could not be saved."""
        delta = expect(reply, "checkpoint", dict)
        generation = expect(delta, "generation", int)
        index = expect(delta, "blobs", list)
        changed = expect_str_map(delta, "vars")
        deleted = expect(delta, "deleted", list)
        unsaved = expect_str_map(delta, "unsaved")
        if not all(isinstance(name, str) for name in deleted):
            raise ProtocolError("checkpoint 'deleted' must list names")
        sizes = []
        for entry in index:
            if not isinstance(entry, dict):
                raise ProtocolError("checkpoint blob entries must be objects")
            sizes.append(expect(entry, "size", int))
            if not _DIGEST.match(expect(entry, "digest", str)):
                raise ProtocolError("checkpoint blob digests must be 32 hex digits")
        known = {entry["digest"] for entry in index} | set(self._record.blob_sizes)
        if not set(changed.values()) <= known:
            raise ProtocolError("checkpoint names a blob that was neither sent nor stored")
        try:
            parts = protocol.split_body(body, sizes)
        except protocol.ProtocolViolation as exc:
            raise ProtocolError(str(exc)) from None
        expected = self._record.generation + (1 if changed or deleted else 0)
        if generation != expected:
            raise ProtocolError(f"checkpoint generation {generation} out of step (expected {expected})")
        if changed or deleted:
            self._store.commit(
                self._record,
                generation=generation,
                blobs={entry["digest"]: part for entry, part in zip(index, parts, strict=False)},
                changed=changed,
                deleted=deleted,
            )
        elif time.time() - self._record.last_used_at > _LAST_USED_RESOLUTION:
            self._record.last_used_at = time.time()
            self._store.save(self._record)
        return unsaved

    def _add_versioned(self, prefix: str, payload: Any, index: int | None) -> int:
        kind, raw = _encode_payload(payload)
        counter = f"{prefix}_count"
        with self._lock:
            count = getattr(self._record, counter)
            if index is None:
                index = count
            if not isinstance(index, int) or isinstance(index, bool) or index < 0:
                raise ConfigError(f"index must be a non-negative int, got {index!r}")
            name = f"{prefix}_{index}"
            header = {
                "type": protocol.SET_VALUE,
                "id": _new_request_id(),
                "name": name,
                "kind": kind,
                "aliases": [prefix] if index == 0 else [],
            }
            reply, body = self._call(header, raw, self._settings.start_timeout + 60.0)
            self._accept(reply, body, self._commit)
            setattr(self._record, counter, max(count, index + 1))
            self._store.save(self._record)
            return index
