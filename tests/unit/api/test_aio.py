"""The async API is the same API: every public call of the sync classes has a coroutine twin with the same
parameters (checked by introspection, so a call added to the sync API without its twin fails here), and the twins
work, on the fake engine."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeBackend, fake_settings

import orchestrator.aio
from orchestrator import (
    AsyncContext,
    AsyncOrchestrator,
    AsyncPythonTool,
    AsyncSession,
    Context,
    ContextNotFound,
    InputRequest,
    Orchestrator,
    OutputEvent,
    PythonTool,
    Session,
)
from orchestrator.api.aio import AsyncFiles
from orchestrator.api.files import Files
from orchestrator.api.session import SessionState

TWINS = [
    (Orchestrator, AsyncOrchestrator),
    (Session, AsyncSession),
    (Context, AsyncContext),
    (PythonTool, AsyncPythonTool),
    (Files, AsyncFiles),
]
AS_ASYNC = {"__enter__": "__aenter__", "__exit__": "__aexit__"}
ASYNC_ONLY = {"settings"}  # an instance attribute of Orchestrator, a property of its twin


def _public(cls: type) -> list[str]:
    return sorted(name for name in dir(cls) if not name.startswith("_") or name in AS_ASYNC)


def _parameters(function: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    """Name, kind and default of each parameter but ``self``."""
    return [(p.name, p.kind, p.default) for p in list(inspect.signature(function).parameters.values())[1:]]


@pytest.mark.parametrize(("sync", "twin"), TWINS, ids=[twin.__name__ for _, twin in TWINS])
def test_every_public_call_has_an_async_twin_with_the_same_parameters(sync: type, twin: type) -> None:
    for name in _public(sync):
        member = inspect.getattr_static(sync, name)
        twin_name = AS_ASYNC.get(name, name)
        twin_member = inspect.getattr_static(twin, twin_name, None)
        where = f"{sync.__name__}.{name} has no twin {twin.__name__}.{twin_name}"
        assert twin_member is not None, f"{where}: add it to orchestrator/api/aio.py"
        if isinstance(member, property):
            assert isinstance(twin_member, property), f"{where} that is a property"
            continue
        assert callable(member), name
        assert inspect.iscoroutinefunction(twin_member) or inspect.isasyncgenfunction(twin_member), (
            f"{where} that is a coroutine (or an async iterator)"
        )
        assert _parameters(twin_member) == _parameters(member), f"{twin.__name__}.{twin_name}'s parameters differ"


@pytest.mark.parametrize(("sync", "twin"), TWINS, ids=[twin.__name__ for _, twin in TWINS])
def test_a_twin_has_no_call_its_sync_class_lacks(sync: type, twin: type) -> None:
    extra = set(_public(twin)) - {AS_ASYNC.get(name, name) for name in _public(sync)} - ASYNC_ONLY
    assert extra <= {"__aenter__", "__aexit__"}, f"{twin.__name__} has calls {sync.__name__} lacks: {sorted(extra)}"


def test_the_twins_are_exported_from_orchestrator_and_orchestrator_aio() -> None:
    for _, twin in TWINS:
        assert getattr(orchestrator.aio, twin.__name__) is twin and twin.__name__ in orchestrator.aio.__all__


def test_the_calls_of_a_session_its_contexts_and_its_tool(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AsyncOrchestrator(fake_settings(tmp_path), backend=FakeBackend()) as orch:
            assert orch.settings is orch.sync.settings and orch.default_image == "fake:latest"
            async with await orch.create_session(session_id="async-one") as session:
                assert session.state is SessionState.READY and session.id == "async-one"
                result = await session.execute("x = 'one'")
                assert result.ok and session.variables == ["x"] and session.generation == result.generation
                await session.set_value("y", "two", aliases=["why"])
                assert await session.add_context("text") == 0 and await session.get_context_count() == 1
                assert await session.add_history([{"role": "user"}]) == 0 and await session.get_history_count() == 1
                await session.set_scaffold("", names=[])

                created = await session.create_context(context_id="other")
                assert isinstance(created, AsyncContext) and created.session is session
                assert [c.id for c in session.contexts] == ["default", "other"]
                again = await session.context("other")
                assert again == created and hash(again) == hash(created)
                assert (await created.execute("z = 'three'")).ok and await created.add_context("c") == 0
                assert await session.add_history([], context=created) == 0 and await created.get_history_count() == 1
                assert await session.get_context_count(context="other") == 1 == created.sync.get_context_count()
                with pytest.raises(orchestrator.ConfigError, match="of another session"):
                    await session.set_value("w", "four", context=Context(orch.sync, "other"))  # type: ignore[arg-type]
                assert created.cwd == "/workspace/contexts/other" and created.env == {} and created.variables == []
                items = [item async for item in created.stream("v = 'five'")]
                assert items[-1].ok  # type: ignore[union-attr]
                await session.reset(context=created)
                await created.destroy()
                with pytest.raises(ContextNotFound):
                    await session.context("other")

                tool = await session.as_tool(max_answer_chars=5_000)
                assert isinstance(tool, AsyncPythonTool) and tool.sync.max_answer_chars == 5_000
                assert [d["function"]["name"] for d in tool.definitions] == ["execute_code", "reset_repl"]
                assert tool.sync.output_dir == session.sync._ledger.store.outputs_dir(session.id)
                answer = await tool.handle("execute_code", {"code": "t = 'tool'"})
                assert answer.startswith("status: success\n")
                call = {"id": "c1", "function": {"name": "reset_repl", "arguments": "{}"}}
                assert (await tool.handle_tool_call(call))["tool_call_id"] == "c1"
                await session.reset()
                assert await session.interrupt() is False
                assert session.sandbox_id and session.container_id and session.epoch == 1
                assert session.checkpoint_bytes >= 0 and session.restore_failures == {}
                assert set(session.agent_info) == {"protocol", "python", "dill"}
                assert repr(session).startswith("<AsyncSession async-one ")
            assert session.state is SessionState.CLOSED

    asyncio.run(scenario())


def test_the_calls_of_an_orchestrator(tmp_path: Path) -> None:
    async def scenario() -> None:
        backend = FakeBackend()
        async with AsyncOrchestrator(fake_settings(tmp_path), backend=backend) as orch:
            session = await orch.create_session(session_id="async-two")
            await session.execute("x = 'kept'")
            assert await orch.sessions() == ["async-two"]
            assert [info.id for info in await orch.list_sessions()] == ["async-two"]
            assert (await orch.describe("async-two")).id == "async-two"
            assert [c.id for c in await orch.containers("async-two")] == [session.container_id]
            assert isinstance(await orch.logs("async-two"), str)
            assert await orch.hibernate("async-two") is True and session.container_id is None
            await orch.resume("async-two")
            attached = await orch.attach("async-two")
            assert attached.variables == ["x"] and (await attached.execute("y = 'more'")).ok
            await attached.detach()
            assert (await orch.prune(idle_for=3600, dry_run=True)).actions == []
            await orch.remove("async-two")
            assert await orch.sessions() == []

    asyncio.run(scenario())


def test_output_events_and_input_requests_reach_an_async_callback_on_the_loop(tmp_path: Path) -> None:
    """The fake agent prints nothing, so the relay is driven directly, as the session's thread would."""

    async def scenario() -> None:
        from orchestrator.api.aio import _Relay

        loop = asyncio.get_running_loop()
        seen: list[Any] = []

        async def on_output(event: Any) -> str | None:
            seen.append((event, asyncio.get_running_loop() is loop))
            return "yes" if isinstance(event, InputRequest) else None

        relay = _Relay(loop, on_output)
        answers = await loop.run_in_executor(
            None, lambda: [relay(OutputEvent("stdout", "hi\n")), relay(InputRequest("in-1", "go? ", 5.0))]
        )
        await asyncio.sleep(0)
        assert answers == [None, "yes"]
        assert [(type(event).__name__, on_loop) for event, on_loop in seen] == [
            ("OutputEvent", True),
            ("InputRequest", True),
        ]

    asyncio.run(scenario())
