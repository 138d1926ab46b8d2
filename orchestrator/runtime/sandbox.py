"""One sandbox: a running container, its agent and the channel to it, under its own id, apart from any session.

A sandbox is started (new container, private channel directory, authenticated agent), taken
over from another controller (new socket, SIGUSR1, handshake), asked to restore a checkpoint
value by value, asked how it died, and removed. It knows nothing of session records or
owners, so a pool can hold sandboxes that serve no session yet and a session can exist with
no sandbox (hibernated) or move to another one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from concurrent.futures import Future
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, cast

from .. import background
from ..agent import blob_format, checkpoint_names, protocol, request_table
from ..agent.sealed import sealed_copy_of
from ..backends.base import SANDBOX_ID, WORKER_UID, Backend, ContainerState, Phase, Placement, SandboxSpec
from ..config import Settings
from ..errors import (
    AgentStartFailed,
    AgentStartTimeout,
    AgentTimeoutError,
    EngineError,
    OrchestratorError,
    ProtocolError,
)
from ..safe_text import last_lines
from ..state.files import Entry
from ..state.store import new_sandbox_id
from ..wire.call import Call, LiveEvents
from ..wire.connection import AgentConnection, Body, Header
from ..wire.endpoint import Endpoint
from ..wire.replies import parse_load_reply, parse_restore_reply, parse_state_reply, worker_failure
from . import workspace_restore
from .deferred import DeferredBlobs, deferrable
from .hostcalls import CallDesk
from .identity import choose_worker_uid

logger = logging.getLogger(__name__)

_DEATH_SETTLE_SECONDS = 3.0
_START_WATCH_SECONDS = 0.2
"""How often a starting sandbox's container is inspected while its agent is awaited (most agents connect within
0.3-1 s: one to five inspects)."""
_START_LOG_LINES = 20
_CONTROL_SECONDS = 10.0
_CHECK_BESIDE_BYTES = 1 << 20
_RESTORE_LOADS_PER_VALUE = 4
_RESTORE_LOADS_SLACK = 64
"""A restore sends at most 4 loads per stored value plus 64: an honest one needs a few passes (an instance
retried after its class) and a start-over per value that kills the worker; an agent that fails every load
on purpose would otherwise hold the controller for about N * N / 2 loads."""


@dataclasses.dataclass(frozen=True)
class ValueFile:
    """A ``set_value`` body whose host-made blob is in the store already: a local sandbox maps that file instead.

    Where descriptors pass to the worker, ``Sandbox.request`` sends the request with ``file`` and an empty body and
    attaches a read-only descriptor of a sealed copy of the staged blob (docs/protocol.md, "One hop"). Where that
    cannot be (the relayed carrier, staging failed, no copy) ``raw`` goes as the body.
    """

    written: Callable[[], Path | None]
    """Waits for the staged blob's temp file and gives it (``StagedBlob.written``; None: staging failed); called
    only for a sandbox that can take the file, so elsewhere the write still runs beside the send."""
    blob_id: str
    raw: Body
    """The value's bytes (the blob without its frame): the body when no file can be used."""


class Sandbox:
    """A running container with an authenticated connection to its agent."""

    deferred: DeferredBlobs | None = None
    """Answers the agent's requests for deferred values' blobs (``serve_deferred``); None: none are served."""

    def __init__(
        self,
        backend: Backend,
        settings: Settings,
        container_id: str,
        endpoint: Endpoint,
        connection: AgentConnection,
    ) -> None:
        self._backend = backend
        self._settings = settings
        self.sandbox_id = endpoint.sandbox_id
        self.container_id = container_id
        self._endpoint = endpoint
        self.connection = connection

    @property
    def generation(self) -> int:
        """The checkpoint generation the agent's memory held when it connected."""
        return self.connection.hello["generation"]

    @classmethod
    def start(
        cls,
        backend: Backend,
        settings: Settings,
        *,
        image: str,
        scope: str,
        labels: Mapping[str, str],
        network_of: str | None = None,
        placement: Placement | None = None,
    ) -> Sandbox:
        """Start a new container and wait for its agent.

        Args:
            scope: the store id; it goes into the container's name so stores never collide.
            labels: extra container labels (store, session, ...).
            network_of: a container whose (loopback-only) network namespace this one joins.
            placement: where it may run (a multi-node backend; ``Settings.swarm.constraints`` come on top).

        Raises:
            ImageMissing, EngineError: the engine could not start it.
            AgentStartFailed: the container exited before its agent connected; reported as soon as the engine says so.
            AgentStartTimeout: the container started but its agent never connected.
        """
        sandbox_id = new_sandbox_id()
        placement = placement or Placement()
        own_labels = {**labels, SANDBOX_ID: sandbox_id}
        worker_uid = choose_worker_uid(backend, settings) if settings.confinement.separate_worker else None
        endpoint = backend.create_endpoint(sandbox_id, settings, placement)
        environment = agent_environment(endpoint, settings)
        if worker_uid is not None:
            own_labels[WORKER_UID] = environment["ORCH_WORKER_UID"] = str(worker_uid)
        spec = SandboxSpec(
            name=f"orch-{scope}-{sandbox_id}",
            image=image,
            labels=own_labels,
            environment=environment,
            mounts=endpoint.mounts(),
            command=settings.agent_command,
            network_of=network_of,
            placement=dataclasses.replace(placement, constraints=(*placement.constraints, *endpoint.constraints())),
            groups=tuple(endpoint.groups()),
        )
        try:
            container_id = backend.run_sandbox(spec, settings)
        except BaseException:
            endpoint.remove()
            raise
        deadline = time.monotonic() + settings.timeouts.start
        try:
            connection = _wait_for_agent(
                backend,
                container_id,
                lambda: AgentConnection.open(
                    endpoint,
                    sandbox_id=sandbox_id,
                    deadline=deadline,
                    carrier=carrier_of(backend, settings),
                    interrupt_grace=settings.timeouts.interrupt_grace,
                    frame_seconds=settings.timeouts.frame,
                ),
            )
        except BaseException as exc:
            state = exc.state if isinstance(exc, _Ended) else _quietly(lambda: backend.inspect(container_id))
            failed = None
            if isinstance(exc, (_Ended, AgentTimeoutError)) and (state is None or state.ended):
                failed = _start_failed(backend, sandbox_id, container_id, state)  # its log, before it is removed
            _quietly(lambda: backend.remove(container_id))
            endpoint.remove()
            if failed is not None:
                raise failed from None
            if isinstance(exc, AgentTimeoutError):
                how = state.describe() if state is not None else "the container is gone"
                raise AgentStartTimeout(
                    f"the agent of sandbox {sandbox_id} did not connect within {settings.timeouts.start:g} s ({how}); "
                    "check that the image runs `python3 -m orchestrator_agent.supervisor` (see `docker logs`)"
                ) from None
            raise
        return cls(backend, settings, container_id, endpoint, connection)

    @classmethod
    def take_over(
        cls,
        backend: Backend,
        settings: Settings,
        *,
        sandbox_id: str,
        container_id: str,
        claim: Callable[[], AbstractContextManager[object]],
    ) -> Sandbox:
        """Move a live sandbox's agent to this controller: new socket file, SIGUSR1, handshake.

        The agent stops whatever it was doing for the previous controller (docs/protocol.md).

        Args:
            claim: held while the socket file is replaced and the agent signalled; the session's
                ownership check (store lock and epoch), so a controller that no longer owns the
                session can never pull the agent away from the one that does.

        Raises:
            SessionAttachedElsewhere: (from ``claim``) the caller no longer owns the session.
            OrchestratorError: the sandbox cannot be taken over (its directory, container or agent is gone).
        """
        with claim():
            endpoint = backend.open_endpoint(sandbox_id, container_id, settings)
            try:
                if backend.capabilities.delivers_signals:  # else opening the endpoint cut the agent's connection
                    backend.kill(container_id, signal="SIGUSR1")
            except BaseException:
                endpoint.close()
                raise
        try:
            wait = settings.timeouts.start + settings.timeouts.interrupt_grace + settings.timeouts.frame
            connection = AgentConnection.open(
                endpoint,
                sandbox_id=sandbox_id,
                deadline=time.monotonic() + wait,
                carrier=carrier_of(backend, settings),
                interrupt_grace=settings.timeouts.interrupt_grace,
                frame_seconds=settings.timeouts.frame,
            )
        except BaseException:
            endpoint.close()
            raise
        return cls(backend, settings, container_id, endpoint, connection)

    def request(
        self,
        header: request_table.Request,
        body: Body | ValueFile = b"",
        *,
        seconds: float,
        checkpoint_seconds: float | None = None,
        desk: CallDesk | None = None,
        live: LiveEvents | None = None,
    ) -> tuple[Header, bytearray]:
        """One request to the agent within ``seconds`` (and ``checkpoint_seconds`` once the cell ended).

        Host calls the cell makes meanwhile go to ``desk``; its output and ``input()`` requests to ``live``; the
        agent's requests for deferred values' blobs to ``deferred``. A ``ValueFile`` body goes as a file where it can.
        """
        value_fd = None
        if isinstance(body, ValueFile):
            if self.connection.passes_descriptors:
                value_fd = self._open_value_file(body)
            if value_fd is None:
                body = body.raw
            else:
                name = blob_format.value_file_name(body.blob_id)
                header, body = cast(request_table.SetValueRequest, {**header, "file": name}), b""
        try:
            call = Call(time.monotonic() + seconds, checkpoint_seconds, desk, live, self.deferred, value_fd)
            return self.connection.request(header, body, call)
        finally:
            if value_fd is not None:
                os.close(value_fd)

    def _open_value_file(self, value: ValueFile) -> int | None:
        """A read-only descriptor of a sealed copy of the staged blob (``_open_private_file``), which the
        controller attaches to the ``set_value`` on the worker's data channel itself (docs/design/one-hop.md, "Value
        files"); None when nothing is staged or no copy can be made."""
        path = value.written()
        return None if path is None else _open_private_file(path)

    def serve_deferred(
        self,
        named: Callable[[str], str | None],
        open_blob: Callable[[str], AbstractContextManager[memoryview]],
        blob_path: Callable[[str], Path] | None = None,
    ) -> None:
        """Answer the agent's requests for deferred values' blobs (runtime/deferred.py): ``named`` gives the blob
        the session's current record names for a checkpoint key. With ``blob_path`` (where a blob is
        stored), to an agent that offers it, a blob goes to the worker as a read-only descriptor of a sealed copy of
        its file (``_open_private_file``)."""
        open_file = None
        if blob_path is not None and self.connection.passes_descriptors and _offers_blob_files(self.connection):
            open_file = lambda digest: _open_private_file(blob_path(digest))  # noqa: E731
        self.deferred = DeferredBlobs(self.sandbox_id, named, open_blob, open_file)

    def restore(
        self,
        manifest: Mapping[str, str],
        generation: int,
        open_blob: Callable[[str], AbstractContextManager[memoryview]],
        contexts: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        defer_at: int | None = None,
        files: Mapping[str, Entry] | None = None,
        file_sizes: Mapping[str, int] | None = None,
    ) -> dict[str, str]:
        """Load a checkpoint into the agent value by value; return the names that could not be loaded, with why.

        With ``defer_at`` (bytes), a value whose blob is at least that big is deferred (``defer``): the agent
        loads it when a cell first uses it (runtime/deferred.py; ``serve_deferred`` first). If a value fails
        while others are deferred (an instance whose class is deferred), the restore starts over loading all.

        A value that raises is tried again after the others (an instance may need its class
        first). A value that hangs or kills the worker leaves an empty worker behind, so the
        restore starts over without it. Every value is under ``Settings.timeouts.restore_value``.
        ``contexts`` (id -> ``{cwd, env}``) are created first; ``<id>/<name>`` keys load into theirs.
        The whole restore sends at most ``_RESTORE_LOADS_PER_VALUE`` loads per value (plus a slack); the
        values still not loaded when that runs out are named as failed, so the work stays linear.
        ``files`` (the record's workspace; ``file_sizes`` its blobs' sizes) are written after the values and before
        the restore ends (runtime/workspace_restore.py): a file whose blob is damaged is named as failed.
        """
        if self.deferred is None:
            defer_at = None  # nobody would answer the agent's requests for them
        deferred = deferrable(manifest, open_blob, defer_at)
        self._deferring(deferred)
        failed = self._restore_all(manifest, generation, open_blob, contexts or {}, deferred)
        if failed and deferred:
            logger.info("sandbox %s: a value failed with others deferred; restoring all at once", self.sandbox_id)
            self._deferring({})
            failed = self._restore_all(manifest, generation, open_blob, contexts or {}, {})
        failed.update(workspace_restore.put_workspace(files or {}, file_sizes or {}, open_blob, self._put_files))
        self._control(request_table.restore_end_request(generation))
        return failed

    def _put_files(self, entries: list[request_table.FileEntry], body: Sequence[memoryview]) -> None:
        """One ``files_put`` batch, under ``Settings.timeouts.restore_value``."""
        limit = self._settings.timeouts.restore_value
        seconds = limit + self._settings.timeouts.interrupt_grace + self._settings.timeouts.reply_margin
        header = request_table.files_put_request(entries, limit)
        parse_restore_reply(self.request(header, body, seconds=seconds)[0])

    def _deferring(self, deferred: Mapping[str, int]) -> None:
        """The restore defers these keys: only their blobs are served (runtime/deferred.py)."""
        if self.deferred is not None:
            self.deferred.restored(deferred)

    def _restore_all(
        self,
        manifest: Mapping[str, str],
        generation: int,
        open_blob: Callable[[str], AbstractContextManager[memoryview]],
        contexts: Mapping[str, Mapping[str, Any]],
        deferred: Mapping[str, int],
    ) -> dict[str, str]:
        failed: dict[str, str] = {}
        budget = _LoadBudget(_RESTORE_LOADS_PER_VALUE * len(manifest) + _RESTORE_LOADS_SLACK)
        while not self._restore_pass(manifest, generation, open_blob, failed, contexts, budget, deferred):
            pass
        return failed

    def _restore_pass(
        self,
        manifest: Mapping[str, str],
        generation: int,
        open_blob: Callable[[str], AbstractContextManager[memoryview]],
        failed: dict[str, str],
        contexts: Mapping[str, Mapping[str, Any]],
        budget: _LoadBudget,
        deferred: Mapping[str, int],
    ) -> bool:
        """One attempt from an empty namespace; False when a value took the worker down (start over)."""
        self._control(request_table.restore_begin_request(generation))
        for context_id, spec in sorted(contexts.items()):
            self._create_context(context_id, spec)
        for name, size in sorted(deferred.items()):
            if not self._defer(name, manifest[name], size):
                if not budget.take():
                    raise ProtocolError(f"sandbox {self.sandbox_id}: the worker keeps dying while a restore defers")
                return False  # the worker died meanwhile: start over
        pending = [name for name in sorted(manifest) if name not in failed and name not in deferred]
        errors: dict[str, str] = {}
        limit = self._settings.timeouts.restore_value
        seconds = limit + self._settings.timeouts.interrupt_grace + self._settings.timeouts.reply_margin
        while pending:
            retry: list[str] = []
            for index, name in enumerate(pending):
                if not budget.take():
                    given_up = f"not restored: the restore gave up after {budget.total} loads (values kept failing)"
                    failed.update({left: errors.get(left, given_up) for left in (*retry, *pending[index:])})
                    logger.error("sandbox %s: restore gave up after %d loads", self.sandbox_id, budget.total)
                    return True
                context_id, separator, local = name.partition(checkpoint_names.CONTEXT_SEPARATOR)
                if separator:
                    header = request_table.load_request(local, manifest[name], limit, context_id)
                else:
                    header = request_table.load_request(name, manifest[name], limit)
                with open_blob(manifest[name]) as blob:
                    checked = _check_digest(header, blob)
                    try:
                        reply = parse_load_reply(self.request(header, blob, seconds=seconds)[0])
                    finally:
                        intact = checked is None or checked.result()  # the mapping must outlive the check
                    if not intact:
                        failed[name] = "its stored blob does not match its digest: the checkpoint file is damaged"
                        logger.error("sandbox %s: the blob of %r does not match its digest", self.sandbox_id, name)
                        return False  # it was loaded already: start over without it
                if reply["status"] == protocol.STATUS_OK:
                    errors.pop(name, None)
                elif reply["status"] == protocol.STATUS_ERROR:
                    errors[name] = reply["reason"]
                    retry.append(name)
                else:
                    failed[name] = reply["reason"] or f"restoring it ended with {reply['status']}"
                    logger.info("sandbox %s: value %r took the worker down while restoring", self.sandbox_id, name)
                    return False
            if len(retry) == len(pending):
                failed.update(errors)
                break
            pending = retry
        return True

    def _defer(self, key: str, digest: str, size: int) -> bool:
        """Announce a value the agent loads on first use (its context exists already); False: the worker died."""
        context_id, separator, local = key.partition(checkpoint_names.CONTEXT_SEPARATOR)
        if separator:
            header = request_table.defer_request(local, digest, size, context_id)
        else:
            header = request_table.defer_request(key, digest, size)
        seconds = _CONTROL_SECONDS + self._settings.timeouts.interrupt_grace
        reply = parse_load_reply(self.request(header, seconds=seconds)[0])
        if reply["status"] in (protocol.STATUS_CRASHED, protocol.STATUS_TIMEOUT):
            return False
        if reply["status"] != protocol.STATUS_OK:
            raise ProtocolError(f"the agent refused to defer {key!r}: {reply['reason']!r:.200}")
        return True

    def warm_up(self) -> None:
        """Have the agent load what checkpoints and restores need (dill) now, while nobody waits: an empty restore
        that says so (a new session's own empty restore does not import dill: plain data never needs it)."""
        self._control(request_table.restore_begin_request(0, prepare=True))
        self._control(request_table.restore_end_request(0))

    def _create_context(self, context_id: str, spec: Mapping[str, Any]) -> None:
        """Make an empty context in the (restoring) worker, as ``Session.create_context`` did."""
        header = request_table.context_create_request(context_id, spec["cwd"], spec["env"])
        reply, _ = self.request(header, seconds=_CONTROL_SECONDS + self._settings.timeouts.interrupt_grace)
        failure = worker_failure(reply)
        if failure is not None:
            raise ProtocolError(f"creating context {context_id} while restoring failed: {failure['reason']}")
        if reply.get("status") != protocol.STATUS_OK:
            raise ProtocolError(f"creating context {context_id} while restoring failed: {reply.get('reason')!r:.200}")
        parse_state_reply(reply)

    def _control(self, header: request_table.RestoreBeginRequest | request_table.RestoreEndRequest) -> None:
        parse_restore_reply(self.request(header, seconds=_CONTROL_SECONDS + self._settings.timeouts.interrupt_grace)[0])

    def settled_state(self) -> ContainerState | None:
        """The container's state once it has finished dying (a closed channel precedes the engine's view)."""
        ends = time.monotonic() + _DEATH_SETTLE_SECONDS
        while True:
            state = self._backend.inspect(self.container_id)
            settled = state is None or (not state.running and state.phase is not Phase.REMOVING)
            if settled or time.monotonic() > ends:
                return state
            time.sleep(0.05)

    def release(self) -> None:
        """Let go of the agent but leave the container running (another controller may take it over)."""
        self.connection.close()
        self._endpoint.close()

    def remove(self) -> None:
        """Remove the container and the channel directory."""
        self.connection.close()
        try:
            self._backend.remove(self.container_id)
        finally:
            self._endpoint.remove()


class _Ended(Exception):
    """The container of a sandbox being started ended (or is gone: ``state`` None) before its agent connected."""

    def __init__(self, state: ContainerState | None) -> None:
        super().__init__()
        self.state = state


def _wait_for_agent(
    backend: Backend, container_id: str, open_connection: Callable[[], AgentConnection]
) -> AgentConnection:
    """``open_connection()`` (the wait for the agent, up to the start timeout), watching the container meanwhile: one
    that ends first (a base image run as a sandbox, an agent that fails at once) ends the wait at once.

    The wait runs on a thread of its own, so it is never cut inside a handshake; once we stop waiting (the container
    ended, an interrupt) the caller removes the endpoint, which ends that thread's accept, and a connection it
    still made is closed.

    Raises:
        _Ended: the container ended, or is gone, before the agent connected.
    """
    opened: Future[AgentConnection] = Future()

    def wait() -> None:
        try:
            opened.set_result(open_connection())
        except BaseException as exc:  # the future carries it to the starting thread
            opened.set_exception(exc)

    threading.Thread(target=wait, name="orchestrator-agent-start", daemon=True).start()
    try:
        while not futures.wait([opened], timeout=_START_WATCH_SECONDS).done:
            try:
                state = backend.inspect(container_id)
            except EngineError as exc:  # the engine hiccuped: the wait goes on to its deadline
                logger.debug("sandbox container %s not inspected while starting: %s", container_id[:12], exc)
                continue
            if state is None or state.ended:
                raise _Ended(state)
        return opened.result()
    except BaseException:
        opened.add_done_callback(_close_late_connection)
        raise


def _close_late_connection(opened: Future[AgentConnection]) -> None:
    if not opened.cancelled() and opened.exception() is None:
        opened.result().close()


def _start_failed(
    backend: Backend, sandbox_id: str, container_id: str, state: ContainerState | None
) -> AgentStartFailed:
    """The error for a sandbox whose container ended before its agent connected: its exit code and its last log lines
    (made safe for a terminal: the image may print anything)."""
    if state is None:
        return AgentStartFailed(
            f"the container of sandbox {sandbox_id} was removed before its agent connected", exit_code=None
        )
    log = _quietly(lambda: backend.logs(container_id, tail=_START_LOG_LINES)) or ""
    return AgentStartFailed(
        f"the container of sandbox {sandbox_id} exited before its agent connected ({state.describe()}): is its image "
        "a sandbox image (a base image needs `orchestrator image build --base IMAGE` first), and does its agent "
        "command run?" + (" Its last log lines:" if log.strip() else " It logged nothing."),
        exit_code=state.exit_code,
        log_tail=last_lines(log, _START_LOG_LINES),
    )


def agent_environment(endpoint: Endpoint, settings: Settings) -> dict[str, str]:
    """What the agent in a new sandbox reads at start: where its channel is, and the limits it enforces."""
    return {
        **endpoint.environment(),
        "ORCH_SANDBOX_ID": endpoint.sandbox_id,
        "ORCH_OUTPUT_LIMIT": str(settings.limits.max_output_bytes),
        "ORCH_INTERRUPT_GRACE": str(settings.timeouts.interrupt_grace),
        "ORCH_FRAME_TIMEOUT": str(settings.timeouts.frame),
        "ORCH_CHECKPOINT_QUOTA": str(settings.limits.checkpoint_quota_bytes),
        "ORCH_WORKSPACE_BYTES": str(settings.limits.workspace_bytes),
        "ORCH_WORKSPACE_FILES": str(settings.limits.workspace_files),
    }


def _check_digest(header: request_table.LoadRequest, blob: memoryview) -> Future[bool] | None:
    """Check a stored blob against its content digest on a host thread while it is sent, and tell the agent so.

    The sandbox has one CPU and a big value's restore is bound by it; the digest (~1.2 ms per MB)
    costs the host a core it has free meanwhile. A host-made blob has no content digest (the agent
    checks its frame). Small blobs are checked at once.
    """
    digest = header["digest"]
    if blob_format.is_host_blob(digest):
        return None
    header["verified"] = True
    if len(blob) < _CHECK_BESIDE_BYTES:
        done: Future[bool] = Future()
        done.set_result(blob_format.blob_digest(blob) == digest)
        return done
    return background.beside().submit(lambda: blob_format.blob_digest(blob) == digest)


def _quietly(call: Callable[[], Any]) -> Any:
    """Best effort while already failing: the first error is the one to report."""
    with contextlib.suppress(OrchestratorError):
        return call()
    return None


class _LoadBudget:
    """How many more loads a restore may send (see ``_RESTORE_LOADS_PER_VALUE``)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._left = total

    def take(self) -> bool:
        """Spend one load; False when none is left."""
        if self._left <= 0:
            return False
        self._left -= 1
        return True


def _open_private_file(path: Path) -> int | None:
    """A read-only descriptor of a sealed in-memory copy of one of the host's stored files, to hand to the worker (a
    value file, a deferred value's blob); None when the file is not a regular one or no copy can be made (its bytes
    then go as the body).

    Never the stored file's own descriptor: a cell that kept one (in a process that outlives its worker) would keep
    a blob the host deleted allocated on its disk, and read the host's path and the blob's link count through it
    (docs/protocol.md, "One hop"). The copy is host memory, freed when the sandbox's last descriptor and mapping
    of it go; nobody can change it, whatever uid the worker runs as (agent/sealed.py).
    """
    try:
        return sealed_copy_of(str(path))
    except OSError as exc:
        logger.debug("no sealed copy of %s (its bytes go as the body): %s", path, exc)
        return None


def carrier_of(backend: Backend, settings: Settings) -> str:
    """How a sandbox's data channel reaches this controller: ``Settings.carrier`` if forced, else as the backend
    can (descriptors where they pass to the sandbox, relayed on the supervisor's connection where they cannot)."""
    if settings.carrier is not None:
        return settings.carrier
    return "descriptors" if backend.capabilities.passes_descriptors else "relayed"


def _offers_blob_files(connection: AgentConnection) -> bool:
    """Whether the agent's worker takes a deferred value's blob as a file (its hello's ``BLOB_FILES``)."""
    return protocol.BLOB_FILES in connection.hello.get("capabilities", ())
