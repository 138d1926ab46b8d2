"""orchestrator.rlm.DockerREPL against a real engine: the rlms REPL surface, persistence, sub-calls, failures.

LM calls go to rlms' own ``LMHandler`` on loopback with fake clients (``rlm_support``), so no
packet leaves this machine. Each test gets its own state directory (``settings_for``); every
environment made here is cleaned up after its test, and the conftest sweep removes the rest.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import docker
import pytest
from rlm_support import EchoLM, completion, lm_handlers, stop
from support import cli_env, closing_orch, kill_and_wait

from orchestrator import ConfigError, GenerationNotFound, Orchestrator, SessionClosed, Settings
from orchestrator.rlm import DockerREPL, DockerREPLResult

pytestmark = pytest.mark.docker

TEST_LABEL = "orchestrator.test.run"


@pytest.fixture
def repl_settings(settings_for: Callable[..., Settings], image: str) -> Settings:
    """Private state for this test's environments (the image is built once per run)."""
    return settings_for()


@pytest.fixture
def make_repl(repl_settings: Settings, run_id: str) -> Iterator[Callable[..., DockerREPL]]:
    """Factory of DockerREPLs on this test's settings; all are cleaned up after the test."""
    made: list[DockerREPL] = []

    def make(**kwargs: Any) -> DockerREPL:
        kwargs.setdefault("settings", repl_settings)
        kwargs.setdefault("labels", {TEST_LABEL: run_id})
        made.append(DockerREPL(**kwargs))
        return made[-1]

    try:
        yield make
    finally:
        for repl in made:
            repl.cleanup()


@pytest.fixture
def handlers() -> Iterator[Callable[..., Any]]:
    with lm_handlers() as start:
        yield start


def out(result: DockerREPLResult) -> str:
    assert not result.stderr, result.stderr
    return result.stdout.strip()


# ----------------------------------------------------------------- persistence protocol


def test_contexts_and_histories_are_versioned_and_aliased(make_repl) -> None:
    repl = make_repl()
    assert repl.add_context("First") == 0
    assert repl.add_context({"k": "v", "n": [1, 2]}) == 1
    assert repl.add_context("Third", 5) == 5
    assert repl.get_context_count() == 6
    assert repl.add_history([{"role": "user", "content": "h0"}]) == 0
    assert repl.add_history([{"role": "assistant", "content": "h1"}]) == 1
    assert repl.get_history_count() == 2
    result = repl.execute_code(
        "print(context, context_1['n'][1], context_5, context is context_0)\n"
        "print(history[0]['content'], history_1[0]['content'], history is history_0)"
    )
    assert out(result).splitlines() == ["First 2 Third True", "h0 h1 True"]


def test_history_is_a_deep_copy_and_completion_context_is_overwritten(make_repl) -> None:
    repl = make_repl()
    messages = [{"role": "user", "content": "orig", "meta": {"n": 1}}]
    repl.add_history(messages)
    messages[0]["content"] = "mutated"
    messages[0]["meta"]["n"] = 2
    repl.set_completion_context("one")
    repl.set_completion_context({"two": 2})
    result = repl.execute_code("print(history_0[0]['content'], history_0[0]['meta']['n'], completion_context)")
    assert out(result) == "orig 1 {'two': 2}"


def test_compaction_history_is_a_host_owned_list(make_repl) -> None:
    repl = make_repl(compaction=True)
    assert out(repl.execute_code("print(type(history).__name__, len(history))")) == "list 0"
    repl.add_history([{"role": "user", "content": "old turn"}])
    repl.append_compaction_entry([{"role": "user", "content": "turn1"}])
    repl.execute_code("history = 'clobbered'")
    assert out(repl.execute_code("print(len(history), history[0][0]['content'], history_0[0]['content'])")) == (
        "1 turn1 old turn"
    )
    repl.execute_code("history.append('edited in place')")
    repl.append_compaction_entry({"type": "summary", "content": "keep"})
    assert out(repl.execute_code("print(len(history), history[-1]['content'])")) == "2 keep"


def test_without_compaction_append_is_a_no_op(make_repl) -> None:
    repl = make_repl()
    repl.append_compaction_entry({"type": "summary", "content": "x"})
    assert "history" not in repl.execute_code("x = 1").locals


# ----------------------------------------------------------------- the REPL surface


def test_reserved_names_are_restored_after_a_cell_overwrites_them(make_repl, handlers) -> None:
    repl = make_repl(lm_handler_address=handlers().address, context_payload="ORIGINAL")
    repl.add_history([{"role": "user", "content": "first"}])
    repl.execute_code(
        "llm_query = llm_query_batched = rlm_query = rlm_query_batched = SHOW_VARS = 1\n"
        "context = 'clobbered'\nhistory = 'clobbered'\nanswer = 'not a dict'"
    )
    result = repl.execute_code(
        "print(llm_query('hi'), rlm_query_batched(['a']), callable(SHOW_VARS))\n"
        "print(context, history[0]['content'], answer)"
    )
    assert out(result).splitlines() == [
        "echo:hi ['echo:a'] True",
        "ORIGINAL first {'content': '', 'ready': False}",
    ]


def test_show_vars_lists_user_variables_only(make_repl) -> None:
    repl = make_repl(custom_tools={"square": "def square(x):\n    return x * x", "CFG": {"a": 1}})
    assert out(repl.execute_code("print(SHOW_VARS())")) == "Available variables: {'CFG': 'dict'}"
    assert "x': 'int'" in out(repl.execute_code("x = 3\n_hidden = 4\nprint(SHOW_VARS())"))


def test_answer_surfaces_the_final_answer_and_resets_each_turn(make_repl, handlers) -> None:
    repl = make_repl(lm_handler_address=handlers().address)
    assert repl.execute_code("answer['content'] = 'partial'").final_answer is None
    assert repl.execute_code("answer['content'] = 1234; answer['ready'] = True").final_answer == "1234"
    repl.update_handler_address(handlers().address)
    result = repl.execute_code("print(answer)")
    assert out(result) == "{'content': '', 'ready': False}"
    assert result.final_answer is None
    assert repl.execute_code("answer = {'content': 'X', 'ready': True}").final_answer == "X"


def test_custom_tools_code_data_and_host_callables(make_repl, caplog: pytest.LogCaptureFixture) -> None:
    tools = {
        "square": "def square(x):\n    return x * x",
        "double": "lambda x: 2 * x",
        "Box": "class Box:\n    def __init__(self, v):\n        self.v = v",
        "CFG": {"tool": {"mode": "t", "vals": [1, 2, 3]}, "description": "settings"},
        "LIMIT": 7,
        "GREETING": "hello",
        "NOTE": "line one\nline two",
        "hostfn": {"tool": lambda x: x, "description": "a host function"},
    }
    with caplog.at_level(logging.WARNING, logger="orchestrator.rlm"):
        repl = make_repl(custom_tools=tools)
    assert any("hostfn" in record.getMessage() for record in caplog.records)
    result = repl.execute_code("print(square(CFG['vals'][2]), double(4), Box(5).v, LIMIT, GREETING)\nprint(repr(NOTE))")
    assert out(result).splitlines() == ["9 8 5 7 hello", "'line one\\nline two'"]
    repl.execute_code("square = None")
    assert out(repl.execute_code("print(square(2))")) == "4"
    failed = repl.execute_code("hostfn(1)")
    assert "RuntimeError" in failed.stderr
    assert "is a Python callable of the host process" in failed.stderr
    assert "pass its source code as a string" in failed.stderr


def test_custom_tools_that_cannot_go_into_the_sandbox_are_refused(make_repl) -> None:
    with pytest.raises(ValueError, match="reserved"):
        make_repl(custom_tools={"llm_query": "def llm_query(): pass"})
    with pytest.raises(ValueError, match="JSON"):
        make_repl(custom_tools={"S": {1, 2}})
    with pytest.raises(ValueError, match="does not compile"):
        make_repl(custom_tools={"f": "def f(:\n    pass"})


def test_locals_are_bounded_reprs_and_a_50_mb_context_costs_once(make_repl) -> None:
    repl = make_repl()
    big = "x" * 50_000_000
    started = time.monotonic()
    repl.add_context(big)
    loaded = time.monotonic() - started
    result = repl.execute_code("n = len(context)\nnested = {'k': [list(range(1000))] * 50}\nprint(n)")
    assert out(result) == "50000000"
    assert len(result.locals["context"]) < 500 and result.locals["context"].startswith("'xxxx")
    assert len(result.locals["nested"]) < 500
    started = time.monotonic()
    for _ in range(3):
        repl.execute_code("y = 1")
    per_cell = (time.monotonic() - started) / 3
    assert per_cell < 0.5, f"a cell next to a 50 MB context took {per_cell:.2f} s (loading it took {loaded:.1f} s)"


def test_an_unsaveable_value_is_named_and_kept_in_memory(make_repl) -> None:
    repl = make_repl()
    result = repl.execute_code("gen = (i for i in range(3))\nkeep = 42")
    assert "gen" in result.unsaved and "keep" not in result.unsaved
    assert out(repl.execute_code("print(next(gen), keep)")) == "0 42"


def test_a_raising_cell_has_its_traceback_in_stderr(make_repl) -> None:
    repl = make_repl()
    result = repl.execute_code("before = 1\nprint('before')\nraise ValueError('kaboom')")
    assert result.stdout == "before\n"
    assert "Traceback" in result.stderr and "ValueError: kaboom" in result.stderr
    assert result.final_answer is None
    assert out(repl.execute_code("print(before)")) == "1"


# ----------------------------------------------------------------- LM calls


def test_llm_query_from_threads_runs_concurrently(make_repl, handlers) -> None:
    repl = make_repl(lm_handler_address=handlers(EchoLM(delay=0.3)).address)
    code = (
        "import threading\nres = {}\n"
        "def w(i):\n    res[i] = llm_query(f'q{i}')\n"
        "ts = [threading.Thread(target=w, args=(i,)) for i in range(5)]\n"
        "[t.start() for t in ts]\n[t.join() for t in ts]\n"
        "print(sorted(res), all(v.startswith('echo:q') for v in res.values()))"
    )
    started = time.monotonic()
    result = repl.execute_code(code)
    took = time.monotonic() - started
    assert out(result) == "[0, 1, 2, 3, 4] True"
    assert len(result.rlm_calls) == 5
    assert took < 1.2, f"5 llm_query calls of 0.3 s from threads took {took:.2f} s: serialized?"


def test_batched_sub_calls_keep_prompt_order_and_the_cap_holds_across_the_environment(make_repl) -> None:
    lock = threading.Lock()
    active, peak = [0], [0]

    def subcall(prompt: str, model: str | None = None):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep({"p0": 0.3, "p1": 0.2, "p2": 0.1}.get(prompt, 0.05))
        with lock:
            active[0] -= 1
        if prompt == "bad":
            raise ValueError("nope")
        return completion(f"c:{prompt}", prompt)

    repl = make_repl(subcall_fn=subcall, max_concurrent_subcalls=2)
    result = repl.execute_code("print(rlm_query_batched(['p0', 'p1', 'bad', 'p2']))")
    assert "['c:p0', 'c:p1', 'Error: RLM query failed - nope', 'c:p2']" in result.stdout, result.stderr
    assert [c.response for c in result.rlm_calls] == ["c:p0", "c:p1", "c:p2"]
    code = (
        "import threading\nout = {}\n"
        "def batch(tag):\n    out[tag] = rlm_query_batched([f'{tag}{i}' for i in range(4)])\n"
        "ts = [threading.Thread(target=batch, args=(t,)) for t in 'ab']\n"
        "[t.start() for t in ts]\n[t.join() for t in ts]\nprint(sum(len(v) for v in out.values()))"
    )
    peak[0] = 0
    result = repl.execute_code(code)
    assert out(result) == "8"
    assert peak[0] <= 2, f"max_concurrent_subcalls=2 but {peak[0]} subcall_fn calls ran at once"
    assert len(result.rlm_calls) == 8


def test_calls_are_tracked_per_cell_in_call_order(make_repl, handlers) -> None:
    repl = make_repl(lm_handler_address=handlers().address, subcall_fn=lambda p, m=None: completion(f"c:{p}", p))
    result = repl.execute_code("llm_query('first')\nrlm_query_batched(['b', 'c'])\nllm_query_batched(['d'])")
    assert [c.response for c in result.rlm_calls] == ["echo:first", "c:b", "c:c", "echo:d"]
    assert repl.execute_code("x = 5").rlm_calls == []


def test_a_sub_call_that_ends_after_its_cell_is_not_counted_for_a_later_cell(make_repl) -> None:
    release, finished = threading.Event(), threading.Event()

    def subcall(prompt: str, model: str | None = None):
        if prompt == "slow":
            release.wait(20)
            finished.set()
        return completion(f"c:{prompt}", prompt)

    repl = make_repl(subcall_fn=subcall, cell_timeout=2.0)
    try:
        # The cell ends (here: by its timeout) while its sub-call is still running on the host.
        timed_out = repl.execute_code("rlm_query('slow')")
        assert "TimeoutError" in timed_out.stderr and timed_out.rlm_calls == []
        # It finishes while the next cell runs: that cell reports only its own call.
        threading.Timer(0.3, release.set).start()
        result = repl.execute_code("import time\ntime.sleep(1.0)\nprint(rlm_query('fast'))")
        assert finished.is_set()
        assert out(result) == "c:fast"
        assert [c.response for c in result.rlm_calls] == ["c:fast"]
    finally:
        release.set()


def test_a_thread_calling_llm_query_between_cells_gets_an_error_string(make_repl, handlers) -> None:
    repl = make_repl(lm_handler_address=handlers().address)
    repl.execute_code(
        "import threading, time\nlate = []\n"
        "def later():\n    time.sleep(0.5)\n    late.append(llm_query('between cells'))\n"
        "threading.Thread(target=later, daemon=True).start()"
    )
    time.sleep(1.5)
    result = repl.execute_code("print(late)")
    assert result.stdout.startswith("['Error: "), result.stdout
    assert result.rlm_calls == []


def test_without_a_handler_or_with_a_dead_one_llm_query_returns_an_error_string(make_repl, handlers) -> None:
    repl = make_repl()
    result = repl.execute_code("print(llm_query('hi'))\nprint(llm_query_batched(['a', 'b']))\nprint(rlm_query('x'))")
    assert out(result).splitlines() == [
        "Error: No LM handler configured",
        "['Error: No LM handler configured', 'Error: No LM handler configured']",
        "Error: No LM handler configured",
    ]
    assert result.rlm_calls == []
    dead = handlers()
    stop(dead)
    repl.update_handler_address(dead.address)
    started = time.monotonic()
    result = repl.execute_code("print(llm_query('hi'))")
    assert result.stdout.startswith("Error:") and time.monotonic() - started < 10
    assert result.rlm_calls == []


def test_a_malformed_or_raising_subcall_is_an_error_string(make_repl) -> None:
    repl = make_repl(subcall_fn=lambda p, m=None: 12345 if p == "odd" else completion(f"c:{p}"))
    result = repl.execute_code("print(rlm_query('odd'))")
    assert out(result).startswith("Error: RLM query failed") and result.rlm_calls == []


def test_a_subcall_fn_that_calls_back_into_its_environment_is_refused(make_repl) -> None:
    holder: dict[str, DockerREPL] = {}

    def subcall(prompt: str, model: str | None = None):
        holder["repl"].execute_code("x = 1")
        return completion("unreachable")

    holder["repl"] = make_repl(subcall_fn=subcall)
    result = holder["repl"].execute_code("print(rlm_query('x'))")
    assert "Error: RLM query failed - execute_code was called from this DockerREPL's own subcall_fn" in result.stdout


# ----------------------------------------------------------------- failures and lifecycle


def test_a_timed_out_cell_keeps_the_session(make_repl) -> None:
    repl = make_repl(cell_timeout=1.0)
    repl.execute_code("y = 5")
    started = time.monotonic()
    result = repl.execute_code("y = 6\nimport time\ntime.sleep(60)")
    assert time.monotonic() - started < 15
    assert "TimeoutError" in result.stderr and "interrupted" in result.stderr
    assert out(repl.execute_code("print(y)")) == "6"


def test_a_crash_in_a_cell_restores_the_last_state(make_repl) -> None:
    repl = make_repl()
    repl.execute_code("kept = 'yes'")
    result = repl.execute_code("lost = 1\nimport os\nos._exit(3)")
    assert "SandboxCrashed" in result.stderr
    assert out(repl.execute_code("print(kept, 'lost' in globals())")) == "yes False"


def test_a_killed_container_comes_back_between_turns_and_reaches_the_new_handler(
    make_repl, handlers, orch: Orchestrator
) -> None:
    first = handlers(EchoLM("A"))
    repl = make_repl(
        lm_handler_address=first.address,
        context_payload="doc one",
        custom_tools={"square": "def square(x):\n    return x * x"},
    )
    repl.add_history([{"role": "user", "content": "turn one"}])
    repl.execute_code("x = 42\nclass Point:\n    def __init__(self, v):\n        self.v = v\np = Point(7)")
    old = repl.container_id
    kill_and_wait(orch, old)
    stop(first)
    second = handlers(EchoLM("B"))
    repl.update_handler_address(second.address)
    result = repl.execute_code("print(context, history[0]['content'], x, p.v, square(3), llm_query('hi'))")
    assert out(result) == "doc one turn one 42 7 9 B:hi"
    assert repl.container_id != old
    assert repl.get_context_count() == 1 and repl.get_history_count() == 1


def test_a_container_killed_during_a_cell_gives_a_result_and_the_session_restores(
    make_repl, orch: Orchestrator
) -> None:
    repl = make_repl()
    repl.execute_code("kept = 1")
    container = repl.container_id
    threading.Timer(0.5, kill_and_wait, (orch, container)).start()
    result = repl.execute_code("import time\ntime.sleep(30)")
    assert "SandboxCrashed" in result.stderr or "MemoryError" in result.stderr, result.stderr
    assert out(repl.execute_code("print(kept)")) == "1"


def test_a_sub_call_in_flight_when_the_container_dies_fails_cleanly(make_repl, orch: Orchestrator) -> None:
    release, finished = threading.Event(), threading.Event()

    def subcall(prompt: str, model: str | None = None):
        if prompt == "slow":
            release.wait(20)
            finished.set()
        return completion(f"c:{prompt}", prompt)

    repl = make_repl(subcall_fn=subcall)
    try:
        repl.execute_code("kept = 1")
        threading.Timer(0.5, kill_and_wait, (orch, repl.container_id)).start()
        started = time.monotonic()
        crashed = repl.execute_code("print(rlm_query('slow'))")
        assert time.monotonic() - started < 15
        assert "SandboxCrashed" in crashed.stderr and crashed.rlm_calls == []
        release.set()
        assert finished.wait(10)
        result = repl.execute_code("print(kept, rlm_query('fast'))")
        assert out(result) == "1 c:fast"
        assert [c.response for c in result.rlm_calls] == ["c:fast"]
    finally:
        release.set()


# ----------------------------------------------------------------- branches: fork and rewind


def test_a_fork_branches_the_conversation_and_reaches_the_same_handler(make_repl, handlers) -> None:
    first = handlers(EchoLM("A"))
    repl = make_repl(
        lm_handler_address=first.address,
        context_payload="doc one",
        custom_tools={"square": "def square(x):\n    return x * x", "CFG": {"k": 1}},
    )
    repl.add_history([{"role": "user", "content": "turn one"}])
    repl.execute_code("x = 1\nclass Point:\n    def __init__(self, v):\n        self.v = v\np = Point(7)")
    repl.execute_code("CFG['k'] = 2")
    with repl.fork() as branch:
        assert isinstance(branch, DockerREPL) and branch.session_id != repl.session_id
        assert branch.container_id != repl.container_id and branch.cell_timeout == repl.cell_timeout
        assert branch.get_context_count() == 1 and branch.get_history_count() == 1
        assert branch.session.forked_from == (repl.session_id, repl.generation)

        mine = branch.execute_code(
            "x += 10\nanswer['content'] = f'branch {x} {llm_query(\"hi\")}'\nanswer['ready'] = 1"
        )
        theirs = repl.execute_code("x += 100\nanswer['content'] = f'trunk {x}'\nanswer['ready'] = True")
        assert (mine.final_answer, theirs.final_answer) == ("branch 11 A:hi", "trunk 101")
        assert [c.response for c in mine.rlm_calls] == ["A:hi"] and theirs.rlm_calls == []
        shown = "print(x, p.v, square(3), CFG['k'], context, history[0]['content'], llm_query('q'))"
        assert out(branch.execute_code(shown)) == "11 7 9 2 doc one turn one A:q"

        second = handlers(EchoLM("B"))
        branch.update_handler_address(second.address)  # its own: the trunk still reaches the first handler
        assert out(branch.execute_code("print(llm_query('q'), answer['ready'])")) == "B:q False"
        assert out(repl.execute_code("print(llm_query('q'), answer['ready'])")) == "A:q True"

        repl.cleanup()  # the trunk goes; the branch keeps every value it shared with it
        assert out(branch.execute_code("print(x, p.v, context)")) == "11 7 doc one"


def test_a_fork_defers_a_big_context_yet_shows_and_aliases_it(make_repl) -> None:
    repl = make_repl(context_payload="d" * 3_000_000)  # past the 1 MiB at which a restore defers a value
    repl.execute_code("small = 1")
    with repl.fork() as branch:
        shown = branch.execute_code("small += 1").locals
        assert shown["small"] == "2"
        assert shown["context"].startswith("<stored value of") and shown["context_0"] == shown["context"]
        # A cell that rebinds the alias gets it back from context_0 (loaded for that), as in an eager session.
        branch.execute_code("context = 'mine'")
        assert out(branch.execute_code("print(len(context), context is context_0)")) == "3000000 True"
        assert "context_0" in out(branch.execute_code("print(SHOW_VARS())"))


def test_a_sub_call_forks_its_environment_while_the_cell_runs(make_repl) -> None:
    """Tree search from inside a cell: rlm_query's subcall_fn runs each candidate on a fork of the running REPL."""
    repl: DockerREPL

    def explore(prompt: str, model: str | None = None):
        with repl.fork() as branch:
            result = branch.execute_code(f"base = base * {prompt}\nprint(base)")
        return completion(out(result), prompt)

    repl = make_repl(subcall_fn=explore)
    repl.execute_code("base = 3")
    result = repl.execute_code("base = 1000\nprint(rlm_query_batched(['2', '5']))")
    assert out(result) == "['6', '15']"  # forks of the last completed cell: base = 3, not 1000
    assert out(repl.execute_code("print(base)")) == "1000"


def test_rewind_and_fork_at_an_earlier_generation(make_repl) -> None:
    repl = make_repl(compaction=True)
    repl.append_compaction_entry({"type": "summary", "content": "one"})
    repl.execute_code("state = 'good'")
    good = repl.generation
    repl.append_compaction_entry({"type": "summary", "content": "two"})
    repl.add_context("late context")
    repl.execute_code("del state\nbroken = True")
    assert [g.generation for g in repl.generations()][-1] == repl.generation and good in {
        g.generation for g in repl.generations()
    }

    with repl.fork(at=good) as earlier:
        assert out(earlier.execute_code("print(state, len(history))")) == "good 1"
        assert earlier.get_context_count() == 0

    rewound = repl.rewind(good)
    assert rewound.rewound_from == good and rewound.current and repl.generation == rewound.generation
    assert out(repl.execute_code("print(state, 'broken' in globals(), len(history))")) == "good False 1"
    assert repl.get_context_count() == 0
    repl.append_compaction_entry({"type": "summary", "content": "three"})  # the host's list was read back
    assert out(repl.execute_code("print([h['content'] for h in history])")) == "['one', 'three']"
    with pytest.raises(GenerationNotFound, match="keeps no generation 9999"):
        repl.rewind(9999)
    with pytest.raises(GenerationNotFound):
        repl.fork(at=9999)


def test_a_fork_that_cannot_be_made_leaves_nothing_behind(make_repl, repl_settings: Settings) -> None:
    repl = make_repl()
    repl.execute_code("x = 1")
    for bad in ("Not An Id!", repl.session_id):
        with pytest.raises(ConfigError):
            repl.fork(session_id=bad)
    assert _stored(repl_settings) == [repl.session_id]
    assert out(repl.execute_code("print(x)")) == "1"
    repl.cleanup()
    with pytest.raises(SessionClosed):
        repl.fork()


def test_two_environments_are_isolated(make_repl) -> None:
    one = make_repl(subcall_fn=lambda p, m=None: completion("A"))
    two = make_repl(subcall_fn=lambda p, m=None: completion("B"))
    one.execute_code("shared = 'one'")
    two.execute_code("shared = 'two'")
    assert out(one.execute_code("print(shared)")) == "one"
    assert [c.response for c in two.execute_code("rlm_query('x')").rlm_calls] == ["B"]
    assert one.container_id != two.container_id


def test_cleanup_removes_the_container_and_later_use_is_a_clear_error(
    repl_settings: Settings, orch: Orchestrator
) -> None:
    with DockerREPL(settings=repl_settings) as repl:
        repl.execute_code("x = 1")
        container = repl.container_id
    assert orch.backend.inspect(container) is None
    assert not list((repl_settings.state_dir / "sessions").glob("*"))
    repl.cleanup()  # again: nothing happens
    with pytest.raises(SessionClosed, match="cleaned up"):
        repl.execute_code("x")
    with pytest.raises(SessionClosed):
        repl.add_context("late")


def test_a_detached_session_is_resumed_by_id(make_repl, run_id: str) -> None:
    session_id = f"rlm-resume-{run_id}"
    first = make_repl(session_id=session_id, context_payload="kept context")
    first.add_history([{"role": "user", "content": "h"}])
    first.execute_code("x = 5")
    first.detach()
    with pytest.raises(SessionClosed):
        first.execute_code("x")
    second = make_repl(session_id=session_id)
    assert second.session_id == session_id
    assert second.get_context_count() == 1 and second.get_history_count() == 1
    assert out(second.execute_code("print(x, context, history[0]['content'])")) == "5 kept context h"


def test_a_base_image_without_python_is_refused_clearly(repl_settings: Settings) -> None:
    import io

    import docker

    tag = f"orchestrator-test-nopython:{os.getpid()}"
    client = docker.from_env()
    try:
        dockerfile = f"FROM {repl_settings.base_image}\nRUN rm -f /usr/bin/python3*\n".encode()
        client.images.build(fileobj=io.BytesIO(dockerfile), tag=tag, rm=True, forcerm=True, pull=False)
        with pytest.raises(ConfigError, match="no usable python3"):
            DockerREPL(image=tag, settings=repl_settings)
    finally:
        with contextlib.suppress(docker.errors.DockerException):
            client.images.remove(tag, force=True)
        client.close()


def test_the_scaffold_runs_on_the_oldest_supported_python(make_repl, handlers) -> None:
    base = os.environ.get("ORCH_OLDEST_BASE_IMAGE")
    if not base:
        if os.environ.get("ORCH_REQUIRE_DOCKER") == "1":
            pytest.fail("ORCH_OLDEST_BASE_IMAGE is not set; run the tests through scripts/test")
        pytest.skip("ORCH_OLDEST_BASE_IMAGE is not set (scripts/ensure-image sets it)")
    repl = make_repl(
        image=base,
        lm_handler_address=handlers().address,
        custom_tools={"double": "lambda x: 2 * x", "CFG": [1, 2]},
    )
    assert repl.session.agent_info["python"].startswith("3.9")
    result = repl.execute_code(
        "import sys\nprint(sys.version_info[:2], llm_query('hi'), double(CFG[1]), SHOW_VARS())\n"
        "answer['content'] = 'ok'; answer['ready'] = True"
    )
    assert out(result).startswith("(3, 9) echo:hi 4 Available variables:")
    assert result.final_answer == "ok" and result.locals["CFG"] == "[1, 2]"


# ----------------------------------------------------------------- left without cleanup()


def _labelled(label: str, value: str) -> list[str]:
    """Containers (running or not) that carry ``label=value``."""
    client = docker.from_env()
    try:
        return [c.id for c in client.containers.list(all=True, filters={"label": f"{label}={value}"}, sparse=True)]
    finally:
        client.close()


def _stored(settings: Settings) -> list[str]:
    with closing_orch(Orchestrator(settings)) as orch:
        return list(orch.store.ids())


def test_an_environment_collected_without_cleanup_removes_its_container(repl_settings: Settings) -> None:
    mark = secrets.token_hex(6)
    repl = DockerREPL(settings=repl_settings, labels={TEST_LABEL: mark})
    assert repl.execute_code("x = 1").stderr == ""
    assert len(_labelled(TEST_LABEL, mark)) == 1
    del repl
    gc.collect()
    assert _labelled(TEST_LABEL, mark) == [], "a collected DockerREPL left its container"
    assert _stored(repl_settings) == [], "and its stored state"


LEFT_AT_EXIT = """
import os
import sys
from orchestrator.rlm import DockerREPL, register

register()
from rlm.environments.docker_repl import DockerREPL as Registered  # what rlms makes after register()

label, mark = sys.argv[1], sys.argv[2]
kept = [DockerREPL(labels={label: mark}), Registered(labels={label: mark})]
assert Registered is DockerREPL
for repl in kept:
    repl.execute_code("x = 1")
child = os.fork()
if child == 0:
    sys.exit(0)  # the child's exit runs the finalizers it inherited: they must leave the parent's sandboxes alone
os.waitpid(child, 0)
for repl in kept:
    assert repl.execute_code("print(x)").stdout.strip() == "1"
print(" ".join(repl.container_id for repl in kept), flush=True)
"""


def test_an_environment_left_at_exit_removes_its_container(repl_settings: Settings) -> None:
    """A real process makes two environments (one through rlms after register()), forks a child that exits, and
    exits without close."""
    mark = secrets.token_hex(6)
    done = subprocess.run(
        [sys.executable, "-c", LEFT_AT_EXIT, TEST_LABEL, mark],
        capture_output=True,
        text=True,
        env=cli_env(repl_settings),
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) == 2, done.stdout
    assert _labelled(TEST_LABEL, mark) == [], "the process exited and left its containers"
    assert _stored(repl_settings) == [], "and their stored state"
