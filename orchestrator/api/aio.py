"""The same API as coroutines, for callers that drive many sessions from one asyncio event loop.

Every class of the sync API has an async twin with the same calls, the same arguments and the same
errors: ``AsyncOrchestrator`` (``Orchestrator``), ``AsyncSession`` (``Session``), ``AsyncContext``
(``Context``) and ``AsyncPythonTool`` (``PythonTool``). Every method is a coroutine (``stream`` an
async iterator); properties stay properties (they read what the handle holds, no I/O). Each twin's
``sync`` is the object it wraps. ``tests/unit/api/test_aio.py`` fails when a public call of the sync
API has no twin here, or a twin whose parameters differ.

Every engine and channel operation underneath is blocking (the Docker SDK is), so each call
runs on a thread pool of the ``AsyncOrchestrator`` (``max_threads``, 64 by default) and the
loop only awaits it: the loop never blocks, and a session holds a thread only while one of
its calls runs. Callbacks (``on_output``, ``on_result``) run on the loop's thread. Cancelling an
awaiting ``execute``, ``stream`` or tool call interrupts that cell as its timeout would (interrupt,
then kill after ``Settings.timeouts.interrupt_grace``); the cancellation completes when the
session is usable again, and other sessions' cells go on untouched. Any other call, once begun,
runs to its end on its thread when its await is cancelled.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import os
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ..backends.base import Backend, ContainerState, Placement
from ..config import Settings
from ..evaluation import EvalOptions, EvalReport, Submission
from ..evaluation.evaluator import OnResult
from ..ops.prune import PruneReport
from ..ops.survey import SessionInfo
from ..runtime.hostcalls import HostCalls
from ..runtime.restore import SessionState
from .contexts import Context
from .events import Event, InputRequest
from .manager import Orchestrator
from .results import ExecResult, Generation
from .session import Session
from .tools import DEFAULT_ANSWER_CHARS, PythonTool

T = TypeVar("T")
_INTERRUPT_POLL = 0.005
AsyncOnOutput = Callable[[Event], "str | Awaitable[str | None] | None"]
"""An async ``on_output``: a plain function or a coroutine function, run on the loop; what it returns (or its coroutine
returns) for an ``InputRequest`` answers it, as in the sync API."""


class _Threads:
    """Runs blocking calls on the orchestrator's thread pool and awaits them."""

    def __init__(self, executor: ThreadPoolExecutor) -> None:
        self.executor = executor

    async def run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(function, *args, **kwargs))


class AsyncSession:
    """A ``Session`` whose calls are coroutines; ``sync`` is the session itself (``Session`` documents every call)."""

    def __init__(
        self,
        session: Session,
        executor: ThreadPoolExecutor,
        handle: Callable[[Session], AsyncSession] | None = None,
    ) -> None:
        """``handle`` gives the one async handle of another session (a fork) of the same orchestrator."""
        self.sync = session
        self._threads = _Threads(executor)
        self._handle = handle or (lambda other: AsyncSession(other, executor))
        self._cells = asyncio.Lock()  # calls that run a cell, one at a time: a cancelled one interrupts only its own

    # ----------------------------------------------------------------- properties: what the handle holds

    @property
    def id(self) -> str:
        return self.sync.id

    @property
    def state(self) -> SessionState:
        return self.sync.state

    @property
    def restore_failures(self) -> dict[str, str]:
        return self.sync.restore_failures

    @property
    def sandbox_id(self) -> str | None:
        return self.sync.sandbox_id

    @property
    def container_id(self) -> str | None:
        return self.sync.container_id

    @property
    def generation(self) -> int:
        return self.sync.generation

    @property
    def epoch(self) -> int:
        return self.sync.epoch

    @property
    def variables(self) -> list[str]:
        return self.sync.variables

    @property
    def checkpoint_bytes(self) -> int:
        return self.sync.checkpoint_bytes

    @property
    def agent_info(self) -> dict[str, Any]:
        return self.sync.agent_info

    @property
    def unsaved(self) -> dict[str, str]:
        return self.sync.unsaved

    @property
    def forked_from(self) -> tuple[str, int] | None:
        return self.sync.forked_from

    @property
    def contexts(self) -> list[AsyncContext]:
        """Every context of the session (``Session.contexts``), as async handles."""
        return [AsyncContext(context, self) for context in self.sync.contexts]

    # ----------------------------------------------------------------- calls

    async def execute(
        self,
        code: str,
        timeout: float | None = None,
        *,
        host_calls: HostCalls | None = None,
        on_output: AsyncOnOutput | None = None,
        context: str | None = None,
    ) -> ExecResult:
        """``Session.execute`` as a coroutine. Cancelling the await interrupts the cell.

        ``on_output`` runs on the loop's thread, in order (keep it quick); it may be a coroutine function. For an
        ``InputRequest`` a str it returns answers it, or ``submit_input`` does later.
        """
        relay = None if on_output is None else _Relay(asyncio.get_running_loop(), on_output)
        call = functools.partial(
            self.sync.execute, code, timeout, host_calls=host_calls, on_output=relay, context=context
        )
        return await self._interruptible(call)

    async def _interruptible(self, call: Callable[[], T]) -> T:
        """Run ``call`` (one that runs a cell) on a thread; a cancelled await interrupts its cell and waits until the
        session is free again. A call waiting for its turn here is cancelled without touching the cell that runs (the
        session's ``interrupt`` stops whichever cell runs, so only the call whose cell it may be is handed to it)."""
        async with self._cells:
            running = self._threads.executor.submit(call)
            future = asyncio.wrap_future(running)
            try:
                return await asyncio.shield(future)
            except asyncio.CancelledError:
                await self._interrupt(running, future)
                raise

    async def _interrupt(self, running: concurrent.futures.Future[Any], future: asyncio.Future[Any]) -> None:
        if running.cancel():
            return
        while not future.done() and not self.sync.interrupt():
            await asyncio.sleep(_INTERRUPT_POLL)  # the call has not reached its cell yet
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await future

    async def stream(
        self,
        code: str,
        timeout: float | None = None,
        *,
        host_calls: HostCalls | None = None,
        context: str | None = None,
    ) -> AsyncGenerator[Event | ExecResult, None]:
        """Each ``OutputEvent`` and ``InputRequest`` as it happens, then the ``ExecResult`` (``Session.stream``).

        Answer an ``InputRequest`` with ``submit_input``. Leaving the loop early interrupts the cell.
        """
        events: asyncio.Queue[Event] = asyncio.Queue()
        task = asyncio.ensure_future(
            self.execute(code, timeout, host_calls=host_calls, on_output=events.put_nowait, context=context)
        )
        try:
            while True:
                getter = asyncio.ensure_future(events.get())
                await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield getter.result()
                    continue
                getter.cancel()
                while not events.empty():
                    yield events.get_nowait()
                yield task.result()
                return
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def submit_input(self, request_id: str, text: str) -> None:
        """Answer the running cell's ``input()`` request (``Session.submit_input``; does not block)."""
        self.sync.submit_input(request_id, text)

    async def interrupt(self) -> bool:
        """Stop the running cell (``Session.interrupt``; does not block); False when none runs."""
        return self.sync.interrupt()

    async def as_tool(
        self, *, max_timeout: float | None = None, max_answer_chars: int = DEFAULT_ANSWER_CHARS, undo: bool = False
    ) -> AsyncPythonTool:
        """This session as tools for a model (``Session.as_tool``), answering through coroutines."""
        tool = self.sync.as_tool(max_timeout=max_timeout, max_answer_chars=max_answer_chars, undo=undo)
        return AsyncPythonTool._of(self, tool)

    async def set_scaffold(self, code: str, *, names: Collection[str] = ()) -> None:
        await self._threads.run(self.sync.set_scaffold, code, names=names)

    async def fork(
        self, *, at: int | None = None, session_id: str | None = None, labels: Mapping[str, str] | None = None
    ) -> AsyncSession:
        """A new session with this one's state (``Session.fork``), as an async handle."""
        return self._handle(await self._threads.run(self.sync.fork, at=at, session_id=session_id, labels=labels))

    async def history(self) -> list[Generation]:
        return self.sync.history()

    async def rewind(self, generation: int) -> Generation:
        async with self._cells:
            return await self._threads.run(self.sync.rewind, generation)

    async def set_value(
        self, name: str, payload: str | bytes | dict[str, Any] | list[Any], *, aliases: Collection[str] = ()
    ) -> None:
        await self._threads.run(self.sync.set_value, name, payload, aliases=aliases)

    async def add_context(self, payload: str | bytes | dict[str, Any] | list[Any], index: int | None = None) -> int:
        return await self._threads.run(self.sync.add_context, payload, index)

    async def add_history(self, messages: list[Any], index: int | None = None) -> int:
        return await self._threads.run(self.sync.add_history, messages, index)

    async def get_context_count(self) -> int:
        return self.sync.get_context_count()

    async def get_history_count(self) -> int:
        return self.sync.get_history_count()

    async def reset(self) -> None:
        await self._threads.run(self.sync.reset)

    async def detach(self) -> None:
        await self._threads.run(self.sync.detach)

    async def hibernate(self) -> None:
        await self._threads.run(self.sync.hibernate)

    async def close(self) -> None:
        await self._threads.run(self.sync.close)

    async def context(self, context_id: str) -> AsyncContext:
        """The handle of an existing context (``Session.context``)."""
        return AsyncContext(self.sync.context(context_id), self)

    async def create_context(
        self, cwd: str | None = None, env: Mapping[str, str] | None = None, *, context_id: str | None = None
    ) -> AsyncContext:
        """A new, empty namespace in this session's sandbox (``Session.create_context``)."""
        created = await self._threads.run(self.sync.create_context, cwd, env, context_id=context_id)
        return AsyncContext(created, self)

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, exc_type: object, *exc_info: object) -> None:
        await self._threads.run(self.sync.__exit__, exc_type, *exc_info)

    def __repr__(self) -> str:
        return f"<Async{repr(self.sync)[1:]}"


class AsyncContext:
    """A ``Context`` whose calls are coroutines; ``sync`` is the context, ``session`` the ``AsyncSession`` it is of."""

    def __init__(self, context: Context, session: AsyncSession) -> None:
        self.sync = context
        self._session = session

    @property
    def id(self) -> str:
        return self.sync.id

    @property
    def session(self) -> AsyncSession:
        return self._session

    @property
    def cwd(self) -> str | None:
        return self.sync.cwd

    @property
    def env(self) -> dict[str, str]:
        return self.sync.env

    @property
    def variables(self) -> list[str]:
        return self.sync.variables

    async def execute(
        self,
        code: str,
        timeout: float | None = None,
        *,
        host_calls: HostCalls | None = None,
        on_output: AsyncOnOutput | None = None,
    ) -> ExecResult:
        """``AsyncSession.execute`` in this context."""
        return await self._session.execute(code, timeout, host_calls=host_calls, on_output=on_output, context=self.id)

    async def stream(self, code: str, timeout: float | None = None) -> AsyncIterator[Event | ExecResult]:
        """``AsyncSession.stream`` in this context."""
        async with contextlib.aclosing(self._session.stream(code, timeout, context=self.id)) as events:
            async for item in events:
                yield item

    async def add_context(self, payload: str | bytes | dict[str, Any] | list[Any], index: int | None = None) -> int:
        return await self._session._threads.run(self.sync.add_context, payload, index)

    async def add_history(self, messages: list[Any], index: int | None = None) -> int:
        return await self._session._threads.run(self.sync.add_history, messages, index)

    async def set_value(
        self, name: str, payload: str | bytes | dict[str, Any] | list[Any], *, aliases: Collection[str] = ()
    ) -> None:
        await self._session._threads.run(self.sync.set_value, name, payload, aliases=aliases)

    async def get_context_count(self) -> int:
        return self.sync.get_context_count()

    async def get_history_count(self) -> int:
        return self.sync.get_history_count()

    async def reset(self) -> None:
        await self._session._threads.run(self.sync.reset)

    async def destroy(self) -> None:
        await self._session._threads.run(self.sync.destroy)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AsyncContext) and other.sync == self.sync

    def __hash__(self) -> int:
        return hash(self.sync)

    def __repr__(self) -> str:
        return f"<AsyncContext {self.id} of session {self._session.id}>"


class AsyncPythonTool:
    """A ``PythonTool`` whose calls are coroutines, over an ``AsyncSession``; ``sync`` is the tool it runs.

    The same arguments as ``PythonTool`` (``Session.as_tool`` / ``AsyncSession.as_tool`` fill in where whole outputs
    are kept). Cancelling an awaiting ``handle`` interrupts the cell it runs.
    """

    def __init__(
        self,
        session: AsyncSession,
        *,
        max_timeout: float | None = None,
        max_answer_chars: int = DEFAULT_ANSWER_CHARS,
        output_dir: str | os.PathLike[str] | None = None,
        max_output_files: int = 64,
        undo: bool = False,
    ) -> None:
        self.session = session
        self.sync = PythonTool(
            session.sync,
            max_timeout=max_timeout,
            max_answer_chars=max_answer_chars,
            output_dir=output_dir,
            max_output_files=max_output_files,
            undo=undo,
        )

    @classmethod
    def _of(cls, session: AsyncSession, tool: PythonTool) -> AsyncPythonTool:
        twin = cls.__new__(cls)
        twin.session, twin.sync = session, tool
        return twin

    @property
    def definitions(self) -> list[dict[str, Any]]:
        return self.sync.definitions

    @property
    def undo(self) -> bool:
        return self.sync.undo

    async def handle(self, name: str, arguments: str | Mapping[str, Any] | None) -> str:
        """``PythonTool.handle`` as a coroutine: the text for the model (bad calls and failures are answers)."""
        return await self.session._interruptible(functools.partial(self.sync.handle, name, arguments))

    async def handle_tool_call(self, tool_call: Any) -> dict[str, str]:
        """``PythonTool.handle_tool_call`` as a coroutine: the ``{"role": "tool", ...}`` message."""
        return await self.session._interruptible(functools.partial(self.sync.handle_tool_call, tool_call))


class AsyncOrchestrator:
    """An ``Orchestrator`` whose calls are coroutines; ``sync`` is the orchestrator itself.

    Args:
        settings: as ``Orchestrator`` (default ``Settings.from_env()``).
        backend: as ``Orchestrator``.
        max_threads: calls running at once, over all sessions (each blocking call holds a thread while it runs).

    Constructing it connects to the engine, as ``Orchestrator()`` does (a blocking call of a few milliseconds).
    """

    def __init__(
        self, settings: Settings | None = None, *, backend: Backend | None = None, max_threads: int = 64
    ) -> None:
        self.sync = Orchestrator(settings, backend=backend)
        self._executor = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="orchestrator-aio")
        self._threads = _Threads(self._executor)
        self._handles: weakref.WeakKeyDictionary[Session, AsyncSession] = weakref.WeakKeyDictionary()

    def _handle(self, session: Session) -> AsyncSession:
        """The one async handle of ``session`` (attaching a session held here gives the handle already held)."""
        handle = self._handles.get(session)
        if handle is None:
            handle = self._handles[session] = AsyncSession(session, self._executor, self._handle)
        return handle

    @property
    def settings(self) -> Settings:
        return self.sync.settings

    @property
    def default_image(self) -> str:
        return self.sync.default_image

    async def build_image(self, *, rebuild: bool = False) -> str:
        return await self._threads.run(self.sync.build_image, rebuild=rebuild)

    async def create_session(
        self,
        *,
        session_id: str | None = None,
        image: str | None = None,
        labels: Mapping[str, str] | None = None,
        placement: Placement | None = None,
    ) -> AsyncSession:
        """``Orchestrator.create_session`` (same keywords)."""
        session = await self._threads.run(
            self.sync.create_session, session_id=session_id, image=image, labels=labels, placement=placement
        )
        return self._handle(session)

    async def attach(self, session_id: str, *, force: bool = False) -> AsyncSession:
        """``Orchestrator.attach`` (this orchestrator's own handle when it holds the session already)."""
        return self._handle(await self._threads.run(self.sync.attach, session_id, force=force))

    async def fork(
        self,
        session_id: str,
        count: int = 1,
        *,
        at: int | None = None,
        labels: Mapping[str, str] | None = None,
        session_ids: Sequence[str] | None = None,
        placement: Placement | None = None,
    ) -> list[AsyncSession]:
        """``Orchestrator.fork`` (same arguments), the forks as async handles."""
        forks = await self._threads.run(
            self.sync.fork, session_id, count, at=at, labels=labels, session_ids=session_ids, placement=placement
        )
        return [self._handle(fork) for fork in forks]

    async def history(self, session_id: str) -> list[Generation]:
        return await self._threads.run(self.sync.history, session_id)

    async def rewind(self, session_id: str, generation: int, *, force: bool = False) -> Generation:
        return await self._threads.run(self.sync.rewind, session_id, generation, force=force)

    async def evaluate(
        self,
        submissions: Iterable[Submission | Mapping[str, Any]] | str | os.PathLike[str],
        *,
        out: str | os.PathLike[str] | None = None,
        junit: str | os.PathLike[str] | None = None,
        resume: bool = False,
        on_result: OnResult | None = None,
        options: EvalOptions | None = None,
    ) -> EvalReport:
        """``Orchestrator.evaluate``; ``on_result`` runs on the loop's thread (a coroutine function as a task)."""
        loop = asyncio.get_running_loop()
        relay = None if on_result is None else functools.partial(_call_soon, loop, on_result)
        return await self._threads.run(
            self.sync.evaluate, submissions, out=out, junit=junit, resume=resume, on_result=relay, options=options
        )

    async def list_sessions(self, *, now: float | None = None) -> list[SessionInfo]:
        return await self._threads.run(self.sync.list_sessions, now=now)

    async def describe(self, session_id: str, *, now: float | None = None) -> SessionInfo:
        return await self._threads.run(self.sync.describe, session_id, now=now)

    async def hibernate(self, session_id: str) -> bool:
        return await self._threads.run(self.sync.hibernate, session_id)

    async def resume(self, session_id: str, *, force: bool = False) -> bool:
        return await self._threads.run(self.sync.resume, session_id, force=force)

    async def logs(self, session_id: str, tail: int | None = 200) -> str:
        return await self._threads.run(self.sync.logs, session_id, tail)

    async def prune(
        self,
        *,
        idle_for: float | None = None,
        older_than: float | None = None,
        hibernate_only: bool = False,
        dry_run: bool = False,
        now: float | None = None,
    ) -> PruneReport:
        return await self._threads.run(
            self.sync.prune,
            idle_for=idle_for,
            older_than=older_than,
            hibernate_only=hibernate_only,
            dry_run=dry_run,
            now=now,
        )

    async def remove(self, session_id: str, *, force: bool = False) -> None:
        await self._threads.run(self.sync.remove, session_id, force=force)

    async def containers(self, session_id: str | None = None) -> list[ContainerState]:
        return await self._threads.run(self.sync.containers, session_id)

    async def sessions(self) -> list[str]:
        return await self._threads.run(self.sync.sessions)

    async def close(self) -> None:
        """Close every session this orchestrator holds (``Orchestrator.close``), then its threads."""
        try:
            await self._threads.run(self.sync.close)
        finally:
            self._executor.shutdown(wait=False)

    async def __aenter__(self) -> AsyncOrchestrator:
        return self

    async def __aexit__(self, exc_type: object, *exc_info: object) -> None:
        try:
            await self._threads.run(self.sync.__exit__, exc_type, *exc_info)
        finally:
            self._executor.shutdown(wait=False)


class _Relay:
    """The sync ``on_output`` an async call hands its session: each event goes to the loop's thread, in order; for an
    ``InputRequest`` the call's thread waits (at most the request's ``idle_timeout``) for what the callback returns."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_output: AsyncOnOutput) -> None:
        self._loop = loop
        self._on_output = on_output

    def __call__(self, event: Event) -> str | None:
        if not isinstance(event, InputRequest):
            _call_soon(self._loop, self._on_output, event)
            return None
        answer = asyncio.run_coroutine_threadsafe(self._answer(event), self._loop)
        try:
            return answer.result(event.idle_timeout)
        except concurrent.futures.TimeoutError:
            answer.cancel()
            return None

    async def _answer(self, event: InputRequest) -> str | None:
        answer = self._on_output(event)
        return await answer if inspect.isawaitable(answer) else answer


_PENDING: set[asyncio.Future[Any]] = set()  # callbacks' coroutines running as tasks (held until done)


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[Any], Any], value: Any) -> None:
    """Run ``callback(value)`` on the loop's thread; a coroutine it returns runs as a task."""

    def run() -> None:
        result = callback(value)
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            _PENDING.add(task)
            task.add_done_callback(_PENDING.discard)

    loop.call_soon_threadsafe(run)
