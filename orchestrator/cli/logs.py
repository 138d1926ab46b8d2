"""``orchestrator logs``: a session's container log, or the whole outputs the host kept of its calls; ``-f`` follows.

The container log is what the sandbox wrote outside a cell's captured ``print``: whatever a cell
(or a program it started) wrote to the process's own file descriptors, and the agent's messages
(one per connection of every command: noise to a user, so shown with ``--agent`` only).
``--output`` shows instead the files where the host keeps the whole stdout or stderr of a call
that printed more than ``ORCH_MAX_OUTPUT_BYTES`` (the call's result holds only a preview of it);
calls that printed less leave no file.

``-f`` polls every ``POLL_SECONDS``: new lines of the log as they come, across the containers of
the session's life (a restart, a resume: the new container's log follows a note); while the session
is hibernated it waits; it ends when the session is removed, or at Ctrl-C (exit status 0).
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from ..errors import ConfigError, SessionNotFound
from .commands import Context
from .output import Exit, UsageError

POLL_SECONDS = 0.5
AGENT_PREFIXES = ("orchestrator agent: ", "orchestrator worker: ")
"""How the agent's own lines on the container's stderr begin (``agent/log.py``, ``agent/worker.py``)."""


def run(ctx: Context, args: argparse.Namespace) -> int:
    """The ``logs`` command."""
    if args.output:
        if ctx.out.json_mode:
            raise UsageError("logs --output prints the files as text; it has no --json")
        return show_outputs(ctx, args.session_id, args.follow)
    return show_log(ctx, args.session_id, args.tail, args.follow, agent=args.agent)


def show_log(ctx: Context, session_id: str, tail: int | None, follow: bool, *, agent: bool = False) -> int:
    """The container log's last ``tail`` lines; with ``follow``, then every new line until the session is removed.

    ``agent``: the agent's own lines too; else they are left out before the last ``tail`` lines are taken.
    """
    shown = _as_is if agent else _without_agent
    if not follow:
        try:
            text = shown(ctx.orch.logs(session_id, tail=tail if agent else None))
        except ConfigError as exc:  # no container now
            raise ConfigError(
                f"{exc}; `orchestrator resume {session_id}` starts one, "
                f"`orchestrator logs -f {session_id}` waits for it"
            ) from None
        text = _last_lines(text, tail)
        if ctx.out.json_mode:
            ctx.out.json({"id": session_id, "tail": tail, "log": text})
        else:
            ctx.out.sandbox_log(text if not text or text.endswith("\n") else text + "\n")
        return Exit.OK
    if ctx.out.json_mode:
        raise UsageError("logs -f prints lines as they come; it has no --json")
    seen = ""  # the complete lines of the current container's log, all shown
    first, waiting = True, False
    with _until_interrupted():
        while True:
            try:
                text = ctx.orch.logs(session_id, tail=None)
            except SessionNotFound:
                ctx.out.note(f"orchestrator: session {session_id} was removed; nothing more to follow")
                return Exit.OK
            except ConfigError:  # no container now: hibernated, or between two containers
                if not waiting:
                    ctx.out.note(f"orchestrator: session {session_id} has no container now; waiting for one")
                waiting = True
                time.sleep(POLL_SECONDS)
                continue
            text = text[: text.rfind("\n") + 1]  # whole lines only: the rest comes with the next poll
            if first:
                new = _last_lines(shown(text), tail)
            elif waiting or not text.startswith(seen):  # another container: its log starts anew
                ctx.out.note(f"orchestrator: session {session_id} runs in a new container; its log follows")
                new = shown(text)
            else:
                new = shown(text[len(seen) :])
            first = waiting = False
            seen = text
            if new:
                ctx.out.sandbox_log(new)
            time.sleep(POLL_SECONDS)
    return Exit.OK


def show_outputs(ctx: Context, session_id: str, follow: bool) -> int:
    """The kept whole outputs of the session's calls, oldest first, each after a note naming its file."""
    ctx.orch.describe(session_id)  # SessionNotFound for an unknown id
    directory = ctx.orch.store.outputs_dir(session_id)
    shown: dict[str, tuple[int, codecs.IncrementalDecoder]] = {}
    current: str | None = None
    with _until_interrupted():
        while True:
            for path in _output_files(directory):
                offset, decoder = shown.get(path.name) or (0, codecs.getincrementaldecoder("utf-8")("replace"))
                data = _read_from(path, offset)
                if not data and path.name in shown:
                    continue
                if current != path.name:
                    ctx.out.note(f"orchestrator: {path}")
                    current = path.name
                shown[path.name] = (offset + len(data), decoder)
                ctx.out.sandbox_log(decoder.decode(data))
            if not follow:
                break
            if not ctx.orch.store.exists(session_id):
                ctx.out.note(f"orchestrator: session {session_id} was removed; nothing more to follow")
                break
            time.sleep(POLL_SECONDS)
    if not shown and not follow:
        ctx.out.note(
            f"orchestrator: no call of {session_id} printed more than ORCH_MAX_OUTPUT_BYTES lately, so the host kept "
            "no output file (the log is `orchestrator logs ID`)"
        )
    return Exit.OK


@contextlib.contextmanager
def _until_interrupted() -> Iterator[None]:
    """Ctrl-C ends following: the usual way to stop it, not a failure."""
    with contextlib.suppress(KeyboardInterrupt):
        yield


def _without_agent(text: str) -> str:
    """``text`` without the agent's own lines (whole lines: ``text`` ends with a line break or is cut at one)."""
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith(AGENT_PREFIXES))


def _as_is(text: str) -> str:
    return text


def _last_lines(text: str, tail: int | None) -> str:
    if tail is None:
        return text
    lines = text.splitlines(keepends=True)
    return "".join(lines[-tail:])


def _output_files(directory: Path) -> list[Path]:
    try:
        entries = [e for e in os.scandir(directory) if e.is_file(follow_symlinks=False)]
    except FileNotFoundError:
        return []
    entries.sort(key=lambda e: (e.stat(follow_symlinks=False).st_mtime_ns, e.name))
    return [Path(e.path) for e in entries]


def _read_from(path: Path, offset: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # removed meanwhile (only the newest files are kept)
        return b""
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
