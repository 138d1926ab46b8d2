"""The async twins against a real engine: every kind of call of AsyncOrchestrator, AsyncSession, AsyncContext and
AsyncPythonTool, with input() answered by a coroutine, a cancelled tool call, hibernation and attach."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from orchestrator import (
    AsyncContext,
    AsyncOrchestrator,
    AsyncSession,
    ExecResult,
    HostCalls,
    InputRequest,
    OutputEvent,
    SessionStatus,
    Settings,
)

pytestmark = pytest.mark.docker


def test_a_session_its_contexts_and_its_values_through_coroutines(
    settings_for: Callable[..., Settings], image: str
) -> None:
    async def scenario() -> None:
        async with AsyncOrchestrator(settings_for()) as orch:
            session = await orch.create_session()
            assert isinstance(session, AsyncSession)
            await session.set_value("greeting", "hello", aliases=["g"])
            assert await session.add_context({"doc": "text"}) == 0
            assert await session.add_history([{"role": "user", "content": "hi"}]) == 0
            assert (await session.get_context_count(), await session.get_history_count()) == (1, 1)
            await session.set_scaffold(
                "def before_cell(ns):\n    ns['shout'] = lambda s: host_call('shout', {'s': s})['s']\n", names=["shout"]
            )
            calls = HostCalls({"shout": lambda payload: {"s": payload["s"].upper()}})
            result = await session.execute("shout(greeting) + ' ' + context['doc']", host_calls=calls)
            assert result.return_value == "'HELLO text'"
            assert {"greeting", "g", "context", "context_0", "history", "history_0"} <= set(session.variables)

            ctx = await session.create_context(env={"WHO": "ctx"})
            assert isinstance(ctx, AsyncContext) and ctx in session.contexts
            assert (await ctx.execute("import os\nwho = os.environ['WHO']\nwho")).return_value == "'ctx'"
            assert (await session.context(ctx.id)).variables == ["os", "who"]
            await ctx.destroy()

            await session.reset()
            assert session.variables == []
            generation = session.generation
            await session.hibernate()
            assert session.container_id is None
            assert (await session.execute("z = 1 + 1\nz")).return_value == "2" and session.generation > generation
            assert session.variables == ["z"] and session.container_id is not None
            await session.close()
            assert await orch.sessions() == []

    asyncio.run(scenario())


def test_input_is_answered_by_a_coroutine_on_the_loop(settings_for: Callable[..., Settings], image: str) -> None:
    async def scenario() -> None:
        async with AsyncOrchestrator(settings_for()) as orch, await orch.create_session() as session:
            printed: list[str] = []

            async def on_output(event: Any) -> str | None:
                if isinstance(event, OutputEvent):
                    printed.append(event.text)
                    return None
                await asyncio.sleep(0.01)  # e.g. asking someone
                return "ada"

            result = await session.execute("name = input('name? ')\nprint('hi', name)", on_output=on_output)
            assert result.ok and result.stdout == "name? hi ada\n" == "".join(printed)

            items: list[Any] = []
            async for item in session.stream("print('q'); a = input('a? '); print(a * 2)"):
                items.append(item)
                if isinstance(item, InputRequest):
                    await session.submit_input(item.request_id, "xy")
            assert isinstance(items[-1], ExecResult) and items[-1].stdout == "q\na? xyxy\n"

    asyncio.run(scenario())


def test_the_tool_and_the_orchestrator_calls(settings_for: Callable[..., Settings], image: str) -> None:
    async def scenario() -> None:
        async with AsyncOrchestrator(settings_for()) as orch:
            session = await orch.create_session()
            tool = await session.as_tool(max_answer_chars=3_000)
            answer = await tool.handle("execute_code", {"code": "print('y' * 100_000)"})
            assert len(answer) <= 3_000 and "left out" in answer and "all of it is in the file" in answer

            waiting = asyncio.ensure_future(tool.handle("execute_code", {"code": "import time\ntime.sleep(60)"}))
            await asyncio.sleep(0.7)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert (await tool.handle("execute_code", {"code": "'alive'"})).endswith("return value: 'alive'\n")

            assert [info.id for info in await orch.list_sessions()] == [session.id]
            assert (await orch.describe(session.id)).status is SessionStatus.RUNNING
            assert session.container_id in [c.id for c in await orch.containers(session.id)]
            assert await orch.hibernate(session.id) is True
            assert (await orch.describe(session.id)).status is SessionStatus.HIBERNATED
            await session.detach()  # let go of it, for resume and attach (which would make a held handle stale)
            await orch.resume(session.id)
            assert (await orch.describe(session.id)).status is SessionStatus.RUNNING
            again = await orch.attach(session.id)
            assert (await again.execute("'back'")).return_value == "'back'"
            assert isinstance(await orch.logs(session.id), str)
            report = await orch.prune(idle_for=3600, dry_run=True)
            assert report.dry_run and report.failed == []
            await again.detach()
            await orch.remove(session.id)
            assert await orch.sessions() == []

    asyncio.run(scenario())


def test_evaluate_and_build_image_through_coroutines(settings_for: Callable[..., Settings], image: str) -> None:
    async def scenario() -> None:
        async with AsyncOrchestrator(settings_for()) as orch:
            assert await orch.build_image() == orch.default_image == image
            loop = asyncio.get_running_loop()
            seen: list[tuple[str, bool]] = []

            async def on_result(result: Any) -> None:
                seen.append((result.id, asyncio.get_running_loop() is loop))

            items = [{"id": "good", "code": "print('A')", "expected_stdout": "A\n"}, {"id": "bad", "code": "1/0"}]
            report = await orch.evaluate(items, on_result=on_result)
            await asyncio.sleep(0)  # the last callback's task
            assert [r.id for r in report.results] == ["good", "bad"] and report.exit_code == 1
            assert sorted(seen) == [("bad", True), ("good", True)]

    asyncio.run(scenario())


def test_cancelling_a_call_that_waits_for_its_turn_leaves_the_running_cell_alone(
    settings_for: Callable[..., Settings], image: str
) -> None:
    async def scenario() -> None:
        async with AsyncOrchestrator(settings_for()) as orch, await orch.create_session() as session:
            running = asyncio.ensure_future(session.execute("import time\ntime.sleep(1.5)\n'done'"))
            await asyncio.sleep(0.5)
            waiting = asyncio.ensure_future(session.execute("'never'"))
            await asyncio.sleep(0.2)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert (await running).return_value == "'done'"  # not interrupted on behalf of the cancelled call

    asyncio.run(scenario())
