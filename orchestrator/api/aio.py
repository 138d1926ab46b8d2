"""The same API as coroutines, for callers that drive many sessions from one asyncio event loop.

Every engine and channel operation underneath is blocking (the Docker SDK is), so each call
runs on a thread pool of the ``AsyncOrchestrator`` (``max_threads``, 64 by default) and the
loop only awaits it: the loop never blocks, and a session holds a thread only while one of
its calls runs. Cancelling an awaiting ``execute`` interrupts that cell as its timeout would
(interrupt, then kill after ``Settings.timeouts.interrupt_grace``); the cancellation completes when
the session is usable again, and other sessions' cells go on untouched.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ..config import Settings
from ..runtime.hostcalls import HostCalls
from .events import Event
from .manager import Orchestrator
from .results import ExecResult
from .session import Session

T = TypeVar("T")
_INTERRUPT_POLL = 0.005


class AsyncSession:
    """A ``Session`` whose calls are coroutines; ``sync`` is the session itself."""

    def __init__(self, session: Session, executor: ThreadPoolExecutor) -> None:
        self.sync = session
        self._executor = executor

    @property
    def id(self) -> str:
        return self.sync.id

    async def _run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(function, *args, **kwargs))

    async def execute(
        self,
        code: str,
        timeout: float | None = None,
        *,
        host_calls: HostCalls | None = None,
        on_output: Callable[[Event], Any] | None = None,
    ) -> ExecResult:
        """``Session.execute`` as a coroutine; ``on_output`` runs on the loop's thread, in order (keep it quick).

        Answer an ``InputRequest`` with ``submit_input``. Cancelling the await interrupts the cell.
        """
        loop = asyncio.get_running_loop()
        relay = None if on_output is None else functools.partial(_call_on_loop, loop, on_output)
        call = functools.partial(self.sync.execute, code, timeout, host_calls=host_calls, on_output=relay)
        running = self._executor.submit(call)
        future = asyncio.wrap_future(running, loop=loop)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            await self._interrupt(running, future)
            raise

    async def _interrupt(
        self, running: concurrent.futures.Future[ExecResult], future: asyncio.Future[ExecResult]
    ) -> None:
        """Stop the cell of ``running`` (not begun yet: it never begins) and wait until the session is free again."""
        if running.cancel():
            return
        while not future.done() and not self.sync.interrupt():
            await asyncio.sleep(_INTERRUPT_POLL)  # the call has not reached its cell yet
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await future

    async def stream(self, code: str, timeout: float | None = None) -> AsyncIterator[Event | ExecResult]:
        """Each ``OutputEvent`` and ``InputRequest`` as it happens, then the ``ExecResult`` (``Session.stream``)."""
        events: asyncio.Queue[Event] = asyncio.Queue()
        task = asyncio.ensure_future(self.execute(code, timeout, on_output=events.put_nowait))
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

    def submit_input(self, request_id: str, text: str) -> None:
        """Answer an ``InputRequest`` (does not block)."""
        self.sync.submit_input(request_id, text)

    def interrupt(self) -> bool:
        """Stop the running cell (does not block); False when none runs."""
        return self.sync.interrupt()

    async def add_context(self, payload: Any, index: int | None = None) -> int:
        return await self._run(self.sync.add_context, payload, index)

    async def add_history(self, messages: list[Any], index: int | None = None) -> int:
        return await self._run(self.sync.add_history, messages, index)

    async def set_value(self, name: str, value: Any) -> None:
        await self._run(self.sync.set_value, name, value)

    async def reset(self) -> None:
        await self._run(self.sync.reset)

    async def hibernate(self) -> None:
        await self._run(self.sync.hibernate)

    async def detach(self) -> None:
        await self._run(self.sync.detach)

    async def close(self) -> None:
        await self._run(self.sync.close)

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class AsyncOrchestrator:
    """An ``Orchestrator`` whose session calls are coroutines; ``sync`` is the orchestrator itself."""

    def __init__(self, settings: Settings | None = None, *, max_threads: int = 64, **kwargs: Any) -> None:
        self.sync = Orchestrator(settings, **kwargs)
        self._executor = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="orchestrator-aio")

    async def _run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(function, *args, **kwargs))

    async def create_session(self, **kwargs: Any) -> AsyncSession:
        """``Orchestrator.create_session`` (same keywords)."""
        return AsyncSession(await self._run(self.sync.create_session, **kwargs), self._executor)

    async def attach(self, session_id: str) -> AsyncSession:
        return AsyncSession(await self._run(self.sync.attach, session_id), self._executor)

    async def close(self) -> None:
        """Close every session this orchestrator holds, then its threads."""
        await self._run(self.sync.close)
        self._executor.shutdown(wait=False)

    async def __aenter__(self) -> AsyncOrchestrator:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def _call_on_loop(loop: asyncio.AbstractEventLoop, on_output: Callable[[Event], Any], event: Event) -> None:
    """Hand an event to the loop's thread (so its return value cannot answer an input request: submit_input does)."""
    loop.call_soon_threadsafe(on_output, event)
