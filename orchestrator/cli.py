"""The ``orchestrator`` command: build images, run the demo, list and remove sessions."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence

from .backend import SESSION_ID
from .config import Settings
from .errors import OrchestratorError, SandboxError
from .manager import Orchestrator


def _image_build(orch: Orchestrator, args: argparse.Namespace) -> int:
    tag = orch.build_image(rebuild=args.rebuild)
    print(tag)
    return 0


def _list(orch: Orchestrator, args: argparse.Namespace) -> int:
    containers = {c.labels.get(SESSION_ID): c for c in orch.containers()}
    print(f"{'SESSION':<16} {'CONTAINER':<12} {'GEN':>5} {'CHECKPOINT':>12} {'IDLE':>8}")
    for session_id in orch.sessions():
        record = orch.store.load(session_id)
        container = containers.get(session_id)
        status = container.status if container else "none"
        idle = time.time() - record.last_used_at
        print(f"{session_id:<16} {status:<12} {record.generation:>5} {record.checkpoint_bytes:>12} {idle:>7.0f}s")
    return 0


def _rm(orch: Orchestrator, args: argparse.Namespace) -> int:
    for session_id in args.session_ids:
        _remove(orch, session_id)
    return 0


def _remove(orch: Orchestrator, session_id: str) -> None:
    orch.remove(session_id)
    print(f"removed {session_id}")


def _demo(orch: Orchestrator, args: argparse.Namespace) -> int:
    """Create a session, set state, kill its container from outside, and show the state come back."""
    image = orch.build_image()
    print(f"sandbox image: {image}")
    started = time.monotonic()
    with orch.create_session() as session:
        print(f"session {session.id} ready in {time.monotonic() - started:.2f} s")
        session.execute(
            "import math\ndocs = {'intro': 'hello world'}\ndef area(r):\n    return math.pi * r * r\nx = 41"
        )
        print(">>> x + 1  ->", session.execute("x + 1").return_value)
        print(f"checkpoint generation {session.generation}, variables {session.variables}")
        old = session.container_id or ""
        print(f"killing container {old[:12]} with the Docker API ...")
        orch.backend.kill(old)
        started = time.monotonic()
        value = session.execute("area(2), docs['intro'], x").return_value
        print(f">>> area(2), docs['intro'], x  ->  {value}  (restored in {time.monotonic() - started:.2f} s)")
        print(f"new container {(session.container_id or '')[:12]}")
        try:
            session.execute("import os; os._exit(1)")
        except SandboxError as exc:
            print(f"os._exit(1) -> {type(exc).__name__}: {exc}")
        print(">>> x  ->", session.execute("x").return_value)
    print("session closed; container and checkpoint removed")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchestrator", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log lifecycle events to stderr")
    commands = parser.add_subparsers(dest="command", required=True)
    image = commands.add_parser("image", help="sandbox image commands").add_subparsers(
        dest="image_command", required=True
    )
    build = image.add_parser("build", help="build (or reuse) the sandbox image on ORCH_BASE_IMAGE; prints its tag")
    build.add_argument("--base", help="base image with python3 (default: ORCH_BASE_IMAGE or python:3.12-slim)")
    build.add_argument("--rebuild", action="store_true", help="build even if the image exists")
    build.set_defaults(func=_image_build)
    commands.add_parser("demo", help="show a session surviving a killed container").set_defaults(func=_demo)
    commands.add_parser("list", help="list stored sessions and their containers").set_defaults(func=_list)
    rm = commands.add_parser("rm", help="remove sessions: containers and stored state")
    rm.add_argument("session_ids", nargs="+")
    rm.set_defaults(func=_rm)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = Settings.from_env()
        if getattr(args, "base", None):
            settings = settings.replace(base_image=args.base)
        with Orchestrator(settings) as orch:
            return int(args.func(orch, args))
    except OrchestratorError as exc:
        print(f"orchestrator: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
