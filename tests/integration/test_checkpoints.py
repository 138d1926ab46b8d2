"""Checkpoints: what cannot be saved is named, big values are stored once, contexts survive restarts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator import ConfigError, Session, Settings

pytestmark = pytest.mark.docker


def blob_sizes(settings: Settings, session: Session) -> dict[str, int]:
    blob_dir = settings.state_dir / "sessions" / session.id / "blobs"
    return {p.name: p.stat().st_size for p in blob_dir.iterdir() if not p.name.startswith(".")}


def test_unsaveable_values_are_named_and_the_rest_survive(
    session: Session, kill_container: Callable[[Session], None]
) -> None:
    code = (
        "import json, socket, threading\n"
        "number = 7\n"
        "text = 'hello'\n"
        "square = lambda v: v * v\n"
        "gen = (i for i in range(3))\n"
        "lock = threading.Lock()\n"
        "mod = json\n"
        "sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
    )
    result = session.execute(code)
    assert result.ok, result.error
    assert {"gen", "sock"} <= set(result.unsaved)
    assert not {"number", "text", "square", "mod", "json", "lock"} & set(result.unsaved)
    assert all(isinstance(reason, str) and reason for reason in result.unsaved.values())
    assert set(result.unsaved).isdisjoint(session.variables)
    assert {"number", "text", "square", "mod", "json", "lock"} <= set(session.variables)
    # The unsaved values still live in the running sandbox, and keep being reported.
    assert session.execute("next(gen)").return_value == "0"
    again = session.execute("number += 1")
    assert {"gen", "sock"} <= set(again.unsaved)

    kill_container(session)
    result = session.execute("square(number), mod.dumps({'a': text}), 'gen' in globals(), 'sock' in globals()")
    assert result.return_value == '(64, \'{"a": "hello"}\', False, False)'
    assert session.restore_failures == {}
    # dill saves a lock (as a new, unlocked one).
    assert session.execute("lock.locked(), lock.acquire(), lock.locked()").return_value == "(False, True, True)"


def test_a_variable_that_becomes_saveable_again(session: Session, kill_container: Callable[[Session], None]) -> None:
    assert "gen" in session.execute("gen = (i for i in range(3))").unsaved
    result = session.execute("gen = [0, 1, 2]")
    assert "gen" not in result.unsaved
    assert "gen" in session.variables
    kill_container(session)
    assert session.execute("gen").return_value == "[0, 1, 2]"


def test_a_saved_variable_replaced_by_an_unsaveable_one_is_dropped(
    session: Session, kill_container: Callable[[Session], None]
) -> None:
    session.execute("thing = 'saveable'")
    assert "thing" in session.variables
    assert "thing" in session.execute("thing = (i for i in range(3))").unsaved
    assert "thing" not in session.variables
    kill_container(session)
    # The stale saved value must not come back in place of the generator.
    assert session.execute("'thing' in globals()").return_value == "False"


def test_big_value_is_stored_once(session: Session, settings: Settings, kill_container) -> None:
    size = 50_000_000
    assert session.execute(f"big = 'x' * {size}").ok
    after_big = session.checkpoint_bytes
    assert after_big >= size
    blobs = blob_sizes(settings, session)
    big_blobs = {d: n for d, n in blobs.items() if n >= size}
    assert len(big_blobs) == 1
    assert sum(blobs.values()) == after_big
    big_file = settings.state_dir / "sessions" / session.id / "blobs" / next(iter(big_blobs))
    mtime = big_file.stat().st_mtime_ns

    for i in range(3):
        result = session.execute(f"y = {i}")
        assert result.ok and result.generation == session.generation
    assert session.checkpoint_bytes - after_big < 1000
    blobs = blob_sizes(settings, session)
    assert {d: n for d, n in blobs.items() if n >= size} == big_blobs
    assert big_file.stat().st_mtime_ns == mtime  # never written again

    # An alias of the same object costs nothing either.
    session.execute("alias = big")
    assert session.checkpoint_bytes - after_big < 1000
    assert len([n for n in blob_sizes(settings, session).values() if n >= size]) == 1

    # After a restart the restored value is not stored again by the next call.
    kill_container(session)
    assert session.execute("len(big), big is alias or big == alias").return_value == f"({size}, True)"
    session.execute("y = 'after restart'")
    assert session.checkpoint_bytes - after_big < 1000
    assert big_file.stat().st_mtime_ns == mtime

    # Dropping the value takes it out of the checkpoint; its blob stays while a kept generation names it (rewind).
    session.execute("del big, alias")
    assert session.checkpoint_bytes < 1000
    assert big_file.stat().st_mtime_ns == mtime


def test_mutated_value_is_checkpointed_again(session: Session, kill_container) -> None:
    session.execute("items = [1]")
    generation = session.generation
    session.execute("items.append(2)")
    assert session.generation == generation + 1
    kill_container(session)
    assert session.execute("items").return_value == "[1, 2]"


def test_contexts_of_each_kind(session: Session, kill_container) -> None:
    assert session.get_context_count() == 0
    assert session.add_context("plain text") == 0
    assert session.add_context(b"\x00\xffraw") == 1
    assert session.add_context({"k": [1, 2], "s": "ü"}) == 2
    assert session.add_context([1, "two", None]) == 3
    assert session.get_context_count() == 4
    result = session.execute(
        "context_0, context_1, context_2, context_3, context is context_0, type(context_2).__name__"
    )
    assert result.return_value == (
        "('plain text', b'\\x00\\xffraw', {'k': [1, 2], 's': 'ü'}, [1, 'two', None], True, 'dict')"
    )
    # An explicit index replaces that context; index 0 moves the alias along.
    assert session.add_context("replaced", index=0) == 0
    assert session.get_context_count() == 4
    assert session.execute("context, context_0").return_value == "('replaced', 'replaced')"
    assert session.add_context("sparse", index=9) == 9
    assert session.get_context_count() == 10

    kill_container(session)
    result = session.execute("context == context_0 == 'replaced', context_1, context_3, context_9")
    assert result.return_value == "(True, b'\\x00\\xffraw', [1, 'two', None], 'sparse')"
    assert session.get_context_count() == 10


def test_context_with_lone_surrogates_roundtrips(session: Session) -> None:
    session.add_context("a\ud800b")
    assert session.execute("context == 'a' + chr(0xD800) + 'b'").return_value == "True"


def test_big_context_survives_a_container_kill(session: Session, settings: Settings, kill_container) -> None:
    payload = bytes(range(256)) * (10_000_000 // 256)
    assert session.add_context(payload) == 0
    text = "é" * 5_000_000
    assert session.add_context(text) == 1
    assert session.checkpoint_bytes >= len(payload) + len(text)
    before = session.checkpoint_bytes
    session.execute("n = 1")
    assert session.checkpoint_bytes - before < 1000
    kill_container(session)
    check = "len(context), context[:3], context[-1], len(context_1), context_1[0], context is context_0"
    result = session.execute(check)
    # One immutable object under two names comes back as one object (the agent loads its blob once).
    assert result.return_value == f"({len(payload)}, b'\\x00\\x01\\x02', 255, 5000000, 'é', True)"
    session.execute("n = 2")
    assert session.checkpoint_bytes - before < 1000


def test_history(session: Session, kill_container) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert session.add_history(messages) == 0
    assert session.get_history_count() == 1
    kill_container(session)
    assert session.execute("history == history_0, history[1]['content']").return_value == "(True, 'hello')"


@pytest.mark.parametrize("payload", [42, 1.5, None, {"k": object()}, ("tuple",)])
def test_bad_context_payloads(session: Session, payload: object) -> None:
    with pytest.raises(ConfigError):
        session.add_context(payload)  # type: ignore[arg-type]
    assert session.get_context_count() == 0


@pytest.mark.parametrize("index", [-1, "1", True, 1.0])
def test_bad_context_index(session: Session, index: object) -> None:
    with pytest.raises(ConfigError, match="index"):
        session.add_context("x", index=index)  # type: ignore[arg-type]
    assert session.get_context_count() == 0


def test_checkpoint_files_are_opaque_blobs(session: Session, settings: Settings) -> None:
    session.execute("value = {'a': 1}")
    meta = settings.state_dir / "sessions" / session.id / "meta.json"
    assert meta.is_file()
    blob_dir: Path = meta.parent / "blobs"
    assert set(session.variables) == {"value"}
    assert len(list(blob_dir.iterdir())) == 1
