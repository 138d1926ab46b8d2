"""Runs the fenced blocks of one document in order, in a place of its own (see tests/docs/README.md).

A document gets a temporary directory: its working directory, its ``ORCH_STATE_DIR`` and its
``ORCH_RUNTIME_DIR``, so no example touches a user's store; and an offline fake LM
(``ScriptedOpenAIServer``) named by ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``, which the real
``openai`` client (and rlms through it) reads when an example gives no ``base_url``. Python
blocks share one namespace, as a reader running them one after the other in one interpreter
would; shell blocks and console transcripts run with ``bash`` in the same directory and
environment. At the end, every session left in the document's store is removed.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from doc_fences import Fence, read_transcript

from orchestrator import Orchestrator, Settings
from orchestrator.rlm.testing import ScriptedOpenAIServer

_USES_RLMS = re.compile(r"^\s*(import|from)\s+(rlm|orchestrator\.rlm)\b", re.MULTILINE)

SHELL_TIMEOUT = 120.0
"""Seconds one shell block or transcript command may take."""

FAKE_ROOT_REPLY = '```repl\nanswer["content"] = "an offline answer"\nanswer["ready"] = True\n```'
"""What the fake LM answers an RLM's root model (a conversation with a system prompt): one cell that answers."""


def fake_model(messages: list[dict[str, Any]], model: str) -> str:
    """The offline LM every document sees: an RLM's root model gets an answering cell, anything else an echo."""
    if messages and messages[0].get("role") == "system" and "repl" in str(messages[0].get("content", "")):
        return FAKE_ROOT_REPLY
    prompt = str(messages[-1].get("content", "")) if messages else ""
    return f"offline reply to: {prompt[:60]}"


class DocumentRun:
    """One document's blocks, run in order in one namespace, directory and store."""

    def __init__(self, document: Path) -> None:
        self.document = document
        self.directory = Path(tempfile.mkdtemp(prefix="orch-docs-"))
        self.lm = ScriptedOpenAIServer(fake_model)
        self.environment = {
            # The image the user's set-up resolves to, read before XDG_CONFIG_HOME hides their recorded default.
            "ORCH_BASE_IMAGE": Settings.from_env().base_image,
            "XDG_CONFIG_HOME": str(self.directory / "config"),  # `image build --make-default` records it there
            "ORCH_STATE_DIR": str(self.directory / "state"),
            "ORCH_RUNTIME_DIR": str(self.directory / "run"),
            "OPENAI_BASE_URL": self.lm.base_url,
            "OPENAI_API_KEY": "offline-fake-lm",
        }
        self.namespace: dict[str, Any] = {"__name__": "__docs__"}
        self.failed: str | None = None
        """Where an earlier block failed: the later blocks of the document are then skipped."""
        self.uses_rlms = False

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        """The document's environment and working directory, put back as they were afterwards."""
        saved_environment = {name: os.environ.get(name) for name in self.environment}
        saved_directory = Path.cwd()
        os.environ.update(self.environment)
        os.chdir(self.directory)
        try:
            yield
        finally:
            os.chdir(saved_directory)
            for name, value in saved_environment.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    def run(self, fence: Fence) -> None:
        """Run (or check) one block; raises AssertionError (or what the block raised) when it fails."""
        with self.inside():
            if fence.language in ("python", "py"):
                self._python(fence)
            elif fence.language in ("sh", "bash"):
                self._shell(fence)
            elif fence.language == "console":
                self._console(fence)
            elif fence.language == "json":
                json.loads(fence.source)

    def _python(self, fence: Fence) -> None:
        # Padded to the block's line, and named by the document, so a traceback points into the Markdown file.
        code = compile("\n" * (fence.line - 1) + fence.source, str(fence.path), "exec")
        self.uses_rlms = self.uses_rlms or _USES_RLMS.search(fence.source) is not None
        with self._rlms_leftovers_ignored():
            exec(code, self.namespace)

    @contextlib.contextmanager
    def _rlms_leftovers_ignored(self) -> Iterator[None]:
        """Once a document uses rlms: ResourceWarning off while its blocks run and are collected. rlms leaves
        sockets unclosed (``LMHandler.stop`` never closes its server socket; its openai clients' pools), which
        would fail whichever test runs when they are freed. Other documents keep the warning as an error."""
        if not self.uses_rlms:
            yield
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            try:
                yield
            finally:
                gc.collect()

    def _shell(self, fence: Fence) -> None:
        done = self._bash(fence.source)
        assert done.returncode == 0, f"{fence.where}: the block exited {done.returncode}\n{_shown(done)}"

    def _console(self, fence: Fence) -> None:
        steps = read_transcript(fence.source)
        assert steps, f"{fence.where}: a console block without a '$ ' command"
        unchecked: subprocess.CompletedProcess[str] | None = None
        for step in steps:
            if step.command.strip() == "echo $?":
                assert unchecked is not None, f"{fence.where}: 'echo $?' without a command before it"
                shown = step.output[0].strip() if step.output else ""
                assert str(unchecked.returncode) == shown, (
                    f"{fence.where}: '$ {unchecked.args[-1]}' exited {unchecked.returncode}, the transcript shows "
                    f"{shown}\n{_shown(unchecked)}"
                )
                unchecked = None
                continue
            _succeeded(fence, unchecked)
            unchecked = self._bash(step.command, stdin=step.typed_input)
            for kind in step.errors_shown:
                assert f"{kind}:" in unchecked.stderr + unchecked.stdout, (
                    f"{fence.where}: the transcript shows '$ {step.command}' report {kind}, it did not\n"
                    f"{_shown(unchecked)}"
                )
        _succeeded(fence, unchecked)

    def _bash(self, script: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=self.directory,
            env=os.environ.copy(),
            input=stdin if stdin is not None else "",
            capture_output=True,
            text=True,
            timeout=SHELL_TIMEOUT,
            check=False,
        )

    def close(self) -> None:
        """Close what the blocks left open, remove every session of the document's store, stop the fake LM."""
        try:
            with self.inside():
                for value in list(self.namespace.values()):
                    if isinstance(value, Orchestrator):
                        value.close()
                if not (self.directory / "state").exists():
                    return  # no example made a store (or none ran: no engine), so there is nothing to sweep
                with Orchestrator(Settings.from_env()) as sweeper:
                    for info in sweeper.list_sessions():
                        sweeper.remove(info.id)
                    sweeper.prune()  # containers no record names, channel directories
                    left = [container.name for container in sweeper.containers()]
                assert not left, f"{self.document.name}: containers left after removing every session: {left}"
        finally:
            if self.uses_rlms:  # a document's register() must not outlive it
                from orchestrator.rlm import unregister  # here: it imports rlms, which only such documents need

                unregister()
            with self._rlms_leftovers_ignored():
                self.namespace.clear()
            self.lm.close()
            shutil.rmtree(self.directory, ignore_errors=True)


def _succeeded(fence: Fence, done: subprocess.CompletedProcess[str] | None) -> None:
    """A transcript's command whose status the transcript does not show must succeed."""
    if done is not None and done.returncode != 0:
        raise AssertionError(
            f"{fence.where}: '$ {done.args[-1]}' exited {done.returncode} (a command meant to fail is followed by "
            f"'$ echo $?' and its status)\n{_shown(done)}"
        )


def _shown(done: subprocess.CompletedProcess[str]) -> str:
    return f"--- stdout\n{done.stdout}--- stderr\n{done.stderr}"
