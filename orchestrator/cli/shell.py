"""``orchestrator shell``: an interactive Python prompt whose every complete input runs in a session.

Input is read like the Python REPL reads it (``codeop``): a compound statement continues at a
``...`` prompt until a blank line ends it. On a terminal there is line editing and a history
file (readline); from a pipe, the same blocks are read without prompts. Ctrl-C drops the input
being typed (or abandons a running call: the session is attached again, which stops the cell);
Ctrl-D detaches and leaves the session running, so its state is there for the next shell.
"""

from __future__ import annotations

import argparse
import codeop
import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

from ..api.session import Session
from ..errors import OrchestratorError, SandboxError, SessionAttachedElsewhere, SessionClosed, SessionNotFound
from .commands import Context
from .output import Exit, error_line
from .render import write_exec_result

PS1 = ">>> "
PS2 = "... "
HISTORY_FILE = "shell-history"
"""Under the state dir: the lines typed at ``orchestrator shell`` (0600)."""
HISTORY_LENGTH = 5000


def is_complete(source: str) -> bool | None:
    """True when ``source`` is a complete input, None when it needs more lines, False when it can never compile."""
    try:
        code = codeop.compile_command(source, "<shell>", "single")
    except (SyntaxError, OverflowError, ValueError):
        return False
    return None if code is None else True


class InputBuffer:
    """Collects lines until they make one complete input, the way the Python REPL decides it.

    A line that starts a new statement after an indented block (no blank line between) ends the
    block, which is sent, and starts the next input: pasted code needs no blank lines. With
    ``blank_ends_block=False`` (input from a pipe) a blank line does not end a block either, so
    a script with blank lines inside its functions reads whole.
    """

    def __init__(self, send: Callable[[str], None], *, blank_ends_block: bool = True) -> None:
        self.send = send
        self.blank_ends_block = blank_ends_block
        self.lines: list[str] = []

    @property
    def more(self) -> bool:
        """True while an input is incomplete (show the continuation prompt)."""
        return bool(self.lines)

    def push(self, line: str) -> None:
        """Add a line (without its newline); send the input once it is complete (or cannot compile)."""
        if not line.strip():
            if not self.lines:
                return
            self.lines.append(line)
            if self.blank_ends_block and is_complete("\n".join(self.lines)) is not None:
                self.flush()  # like the REPL: a blank line ends a block (not an open bracket)
            return
        self.lines.append(line)
        state = is_complete("\n".join(self.lines))
        if state is None:
            return
        if state is False and len(self.lines) > 1 and line.strip() and not line[:1].isspace():
            head = "\n".join(self.lines[:-1])
            if is_complete(head + "\n") is True:
                self.lines = []
                self.send(head)
                self.push(line)
                return
        self.flush()

    def flush(self) -> None:
        """Send what is buffered, complete or not (at end of input); the sandbox reports a syntax error."""
        source, self.lines = "\n".join(self.lines), []
        if source.strip():
            self.send(source)

    def reset(self) -> None:
        self.lines = []


class Shell:
    """One shell on one session: reads inputs, runs each, shows what it wrote, returned or raised."""

    def __init__(
        self,
        ctx: Context,
        session_id: str,
        *,
        timeout: float | None,
        stdin: TextIO | None = None,
        force: bool = False,
        wait: float = 0.0,
    ) -> None:
        self.ctx = ctx
        self.force = force
        self.wait = wait
        self.out = ctx.out
        self.session_id = session_id
        self.timeout = timeout
        self.stdin = stdin or sys.stdin
        self.interactive = self.stdin.isatty()
        self.session: Session | None = None
        self.buffer = InputBuffer(self.run, blank_ends_block=self.interactive)

    def main(self) -> int:
        """Attach, read and run until end of input, detach. Returns the exit status."""
        self.session = self.ctx.attach(self.session_id, force=self.force, wait=self.wait)
        try:
            with self._history():
                if self.interactive:
                    self.out.note(
                        f"orchestrator shell: session {self.session_id} (generation {self.session.generation}, "
                        f"{len(self.session.variables)} variables). Ctrl-D detaches; the session keeps running."
                    )
                self.loop(self.read)
        except BaseException:
            self.ctx.abandon(self.session)
            raise
        self.ctx.detach(self.session)
        if self.interactive:
            self.out.note(f"orchestrator shell: detached from {self.session_id}")
        return Exit.OK

    def read(self, prompt: str) -> str:
        """One line: with the prompt and line editing on a terminal, plain from a pipe. EOFError at the end."""
        if self.interactive:
            return input(prompt)
        line = self.stdin.readline()
        if not line:
            raise EOFError
        return line.rstrip("\r\n")

    def loop(self, read: Callable[[str], str]) -> None:
        """Read lines into the buffer until end of input; Ctrl-C drops the input being typed."""
        while True:
            try:
                line = read(PS2 if self.buffer.more else PS1)
            except EOFError:
                if self.interactive:
                    self.out.write("\n")
                self.buffer.flush()
                return
            except KeyboardInterrupt:
                self.out.write("\n")
                self.out.note("orchestrator shell: KeyboardInterrupt")
                self.buffer.reset()
                continue
            self.buffer.push(line)

    def run(self, source: str) -> None:
        """Run one complete input and show its output; infrastructure errors are shown and the shell goes on.

        Raises:
            SessionAttachedElsewhere, SessionNotFound, SessionClosed: the session is no longer ours to use.
        """
        session = self.session
        assert session is not None
        try:
            result = session.execute(source, timeout=self.timeout)
        except KeyboardInterrupt:
            self.out.write("\n")
            self.ctx.abandon(session)
            # Taking it over stops the abandoned cell (its lease went with the abandoned handle).
            self.session = self.ctx.attach(self.session_id, force=self.force)
            self.out.note(
                f"orchestrator shell: KeyboardInterrupt: the call was abandoned; session {self.session_id} is at "
                f"generation {self.session.generation} (the last call that completed)"
            )
            return
        except (SessionAttachedElsewhere, SessionNotFound, SessionClosed):
            raise
        except OrchestratorError as exc:
            if isinstance(exc, SandboxError):
                self.out.program_output(getattr(exc, "stdout", ""))
                self.out.program_output(getattr(exc, "stderr", ""), self.out.stderr)
            self.out.note(error_line(exc))
            return
        write_exec_result(self.out, result)

    @contextlib.contextmanager
    def _history(self) -> Iterator[None]:
        """Line editing and a history file (only on a terminal)."""
        if not self.interactive:
            yield
            return
        try:
            import readline
        except ImportError:  # a Python built without readline: plain input()
            yield
            return
        path = Path(self.ctx.orch.settings.state_dir) / HISTORY_FILE
        readline.clear_history()
        with contextlib.suppress(OSError):
            readline.read_history_file(path)
        readline.set_history_length(HISTORY_LENGTH)
        # Tab indents (there is nothing local to complete: the names live in the sandbox).
        readline.parse_and_bind("bind ^I ed-insert" if "libedit" in (readline.__doc__ or "") else "tab: tab-insert")
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                path.touch(mode=0o600)
                os.chmod(path, 0o600)
                readline.write_history_file(path)


def shell(ctx: Context, args: argparse.Namespace) -> int:
    """The ``shell`` command."""
    return Shell(ctx, args.session_id, timeout=args.timeout, force=args.force, wait=args.wait).main()
