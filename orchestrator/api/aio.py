"""The same API as coroutines, for callers that drive many sessions from one asyncio event loop.

Every class of the sync API has an async twin with the same calls, the same arguments and the same
errors: ``AsyncOrchestrator`` (``Orchestrator``), ``AsyncSession`` (``Session``), ``AsyncContext``
(``Context``) and ``AsyncPythonTool`` (``PythonTool``). Every method is a coroutine (``stream`` an
async iterator); properties stay properties (they read what the handle holds, no I/O). Each twin's
``sync`` is the object it wraps. A call that only waits for its sync call is made from it by
``_twin`` (its parameters and docstring are the sync call's); the others (a cell that cancelling
interrupts, a handle to wrap) are written here. A ``context=`` may be an ``AsyncContext`` too.
``tests/unit/api/test_aio.py`` fails when a public call of the sync API has no twin here, or a twin
whose parameters differ.

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
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Concatenate, ParamSpec, TypeVar

from ..backends.base import Backend, Placement
from ..config import Settings
from ..evaluation import EvalOptions, EvalReport, Submission
from ..evaluation.evaluator import OnResult
from ..runtime.hostcalls import HostCalls
from ..runtime.restore import SessionState
from .events import Event, InputRequest
from .files import Files
from .manager import Orchestrator
from .results import ExecResult, Generation
from .session import Context, Session
from .tools import DEFAULT_ANSWER_CHARS, PythonTool

P = ParamSpec("P")
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


def _twin(
    call: Callable[Concatenate[Any, P], T], *, blocking: bool = True
) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, T]]:
    """The coroutine twin of the sync ``call``: the call of the twin's ``sync``, run on the orchestrator's threads
    (``blocking``) or at once (it only reads what the handle holds); its parameters and docstring are ``call``'s."""
    name = call.__name__

    async def method(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> T:
        kwargs.update(_sync_context(kwargs))
        bound = getattr(self.sync, name)
        result: T = await self._threads.run(bound, *args, **kwargs) if blocking else bound(*args, **kwargs)
        return result

    functools.update_wrapper(method, call)
    method.__module__ = __name__
    method.__doc__ = f"``{call.__qualname__}`` as a coroutine.\n\n{inspect.getdoc(call) or ''}".rstrip()
    return method


def _sync_context(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A ``context=`` keyword given as an ``AsyncContext``, as the ``Context`` it wraps (else nothing)."""
    context = kwargs.get("context")
    return {"context": context.sync} if isinstance(context, AsyncContext) else {}


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
    def files(self) -> AsyncFiles:
        return AsyncFiles(self.sync.files, self._threads)

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
        context: AsyncContext | Context | str | None = None,
    ) -> ExecResult:
        """``Session.execute`` as a coroutine. Cancelling the await interrupts the cell.

        ``on_output`` runs on the loop's thread, in order (keep it quick); it may be a coroutine function. For an
        ``InputRequest`` a str it returns answers it, or ``submit_input`` does later.
        """
        relay = None if on_output is None else _Relay(asyncio.get_running_loop(), on_output)
        context = context.sync if isinstance(context, AsyncContext) else context
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
        context: AsyncContext | Context | str | None = None,
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

    submit_input = _twin(Session.submit_input, blocking=False)
    interrupt = _twin(Session.interrupt, blocking=False)

    async def as_tool(
        self, *, max_timeout: float | None = None, max_answer_chars: int = DEFAULT_ANSWER_CHARS, undo: bool = False
    ) -> AsyncPythonTool:
        """This session as tools for a model (``Session.as_tool``), answering through coroutines."""
        tool = self.sync.as_tool(max_timeout=max_timeout, max_answer_chars=max_answer_chars, undo=undo)
        return AsyncPythonTool._of(self, tool)

    async def fork(
        self, *, at: int | None = None, session_id: str | None = None, labels: Mapping[str, str] | None = None
    ) -> AsyncSession:
        """A new session with this one's state (``Session.fork``), as an async handle."""
        return self._handle(await self._threads.run(self.sync.fork, at=at, session_id=session_id, labels=labels))

    async def rewind(self, generation: int) -> Generation:
        """``Session.rewind`` as a coroutine, after the cell that runs (if any)."""
        async with self._cells:
            return await self._threads.run(self.sync.rewind, generation)

    history = _twin(Session.history, blocking=False)
    get_context_count = _twin(Session.get_context_count, blocking=False)
    get_history_count = _twin(Session.get_history_count, blocking=False)
    set_scaffold = _twin(Session.set_scaffold)
    set_value = _twin(Session.set_value)
    add_context = _twin(Session.add_context)
    add_history = _twin(Session.add_history)
    reset = _twin(Session.reset)
    detach = _twin(Session.detach)
    hibernate = _twin(Session.hibernate)
    close = _twin(Session.close)

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


class AsyncFiles:
    """A session's ``Files`` whose calls are coroutines (each runs on the orchestrator's threads: they read or write
    files); ``sync`` is the ``Files`` it wraps."""

    def __init__(self, files: Files, threads: _Threads) -> None:
        self.sync = files
        self._threads = threads

    read = _twin(Files.read)
    list = _twin(Files.list)
    exists = _twin(Files.exists)
    download = _twin(Files.download)
    write = _twin(Files.write)
    remove = _twin(Files.remove)
    upload = _twin(Files.upload)


class AsyncContext:
    """A ``Context`` whose calls are coroutines; ``sync`` is the context, ``session`` the ``AsyncSession`` it is of."""

    def __init__(self, context: Context, session: AsyncSession) -> None:
        self.sync = context
        self._session = session
        self._threads = session._threads

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

    @property
    def files(self) -> AsyncFiles:
        return AsyncFiles(self.sync.files, self._threads)

    async def execute(
        self,
        code: str,
        timeout: float | None = None,
        *,
        host_calls: HostCalls | None = None,
        on_output: AsyncOnOutput | None = None,
    ) -> ExecResult:
        """``AsyncSession.execute`` in this context."""
        return await self._session.execute(code, timeout, host_calls=host_calls, on_output=on_output, context=self)

    async def stream(
        self, code: str, timeout: float | None = None, *, host_calls: HostCalls | None = None
    ) -> AsyncIterator[Event | ExecResult]:
        """``AsyncSession.stream`` in this context."""
        events = self._session.stream(code, timeout, host_calls=host_calls, context=self)
        async with contextlib.aclosing(events):
            async for item in events:
                yield item

    add_context = _twin(Context.add_context)
    add_history = _twin(Context.add_history)
    set_value = _twin(Context.set_value)
    get_context_count = _twin(Context.get_context_count, blocking=False)
    get_history_count = _twin(Context.get_history_count, blocking=False)
    reset = _twin(Context.reset)
    destroy = _twin(Context.destroy)

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

    @property
    def metrics_address(self) -> str | None:
        return self.sync.metrics_address

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

    build_image = _twin(Orchestrator.build_image)
    history = _twin(Orchestrator.history)
    rewind = _twin(Orchestrator.rewind)
    list_sessions = _twin(Orchestrator.list_sessions)
    describe = _twin(Orchestrator.describe)
    hibernate = _twin(Orchestrator.hibernate)
    resume = _twin(Orchestrator.resume)
    logs = _twin(Orchestrator.logs)
    prune = _twin(Orchestrator.prune)
    remove = _twin(Orchestrator.remove)
    containers = _twin(Orchestrator.containers)
    sessions = _twin(Orchestrator.sessions)

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
