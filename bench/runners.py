"""The systems under test, behind one ``Runner`` protocol: ours (``OrchestratorRunner``) and the peer (``PeerRunner``).

A metric is one function run once per system, so everything a metric needs from a system is a
method of ``Runner``; each runner also finds and removes its own containers at the end.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import importlib.metadata
import os
import shutil
import tempfile
import threading
import time
import traceback
from collections.abc import Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import docker
import docker.errors

import orchestrator
from orchestrator import Orchestrator, Session, Settings
from orchestrator.backends.base import STORE_ID
from orchestrator.state.controllers import ROLE

OURS = "ours"
PEER = "peer"
SYSTEMS = (OURS, PEER)
POOL_SETTLE = 1.5
"""Seconds waited after a warm pool's containers all run: each one's agent connects and warms up after that."""


class Runner(Protocol):
    """What a metric needs from a system under test; ``handle`` is whatever ``create`` returns."""

    name: str
    """``ours`` or ``peer``."""

    def create(self) -> Any:
        """A new session, ready for calls."""
        ...

    def execute(self, handle: Any, code: str) -> None:
        """Run a cell; raise RuntimeError if it raised."""
        ...

    def evaluate(self, handle: Any, expression: str) -> str:
        """The repr of ``expression``, computed in the session."""
        ...

    def add_context(self, handle: Any, payload: str, index: int) -> None: ...

    def kill(self, handle: Any) -> None:
        """Kill the session's container from outside (``docker kill``) and return once it is dead."""
        ...

    def recover(self, handle: Any) -> Any:
        """After ``kill``: what a user does to go on with the same state; the handle to use from now on."""
        ...

    def close(self, handle: Any) -> None: ...

    def memory(self, handle: Any) -> int | None:
        """The container's memory as ``docker stats`` shows it, in bytes; None when it cannot be read."""
        ...

    def rlm_environment(self, lm_handler_address: tuple[str, int]) -> Any:
        """An rlms environment (``execute_code``, ``cleanup``) with LM calls to ``lm_handler_address``."""
        ...

    def describe(self) -> dict[str, Any]:
        """Facts about the setup (image, engine) for the report."""
        ...

    def for_restarts(self) -> contextlib.AbstractContextManager[Any]:
        """This runner set up as its users would for crash recovery (ours: with a warm pool; the peer: as it is)."""
        ...

    def for_forks(self, count: int) -> contextlib.AbstractContextManager[Any]:
        """This runner set up as its users would to branch into ``count`` (ours: a warm pool of ``count``)."""
        ...

    def settle(self, open_handles: Collection[Any]) -> None:
        """Return once a new sample may start (ours: its warm pool, if any, is full again beside ``open_handles``)."""
        ...

    def fork(self, handle: Any, count: int) -> list[Any]:
        """``count`` new sessions with ``handle``'s state, ready for calls (the peer: its state file copied into new
        environments)."""
        ...

    def state_paths(self, handle: Any) -> list[Path]:
        """The host directories that hold the session's state (ours: its store directory; the peer: its workspace)."""
        ...

    def mark(self, handle: Any) -> Any:
        """Keep the session's current state so that ``rewind`` can bring it back (ours: its generation, kept by
        itself; the peer: a copy of its state file, which replaces the one kept before)."""
        ...

    def rewind(self, handle: Any, mark: Any) -> None:
        """Bring the session back to the state ``mark`` kept."""
        ...

    def leftovers(self) -> list[str]:
        """Ids of this runner's containers that still exist."""
        ...

    def shutdown(self) -> None:
        """Close whatever is still open and remove any container left; called once, in a finally."""
        ...


@contextlib.contextmanager
def session(runner: Runner) -> Iterator[Any]:
    """A new session of ``runner``, closed on the way out."""
    handle = runner.create()
    try:
        yield handle
    finally:
        runner.close(handle)


def shut_down(runners: list[Runner]) -> list[str]:
    """Shut each runner down in turn (a failure is printed and named); the containers any of them left."""
    leftovers: list[str] = []
    for runner in runners:
        try:
            runner.shutdown()
            leftovers += runner.leftovers()
        except Exception:
            traceback.print_exc()
            leftovers.append(f"({runner.name}: the clean-up failed)")
    return leftovers


def container_memory(client: docker.DockerClient, container_id: str) -> int | None:
    """What ``docker stats`` shows: usage minus inactive file cache; read from the cgroup when the engine runs here."""
    for root, usage_file, inactive_key in (
        (f"/sys/fs/cgroup/memory/docker/{container_id}", "memory.usage_in_bytes", "total_inactive_file"),
        (f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope", "memory.current", "inactive_file"),
        (f"/sys/fs/cgroup/docker/{container_id}", "memory.current", "inactive_file"),
    ):
        base = Path(root)
        with contextlib.suppress(OSError, ValueError):
            usage = int((base / usage_file).read_text())
            stat = dict(line.split() for line in (base / "memory.stat").read_text().splitlines())
            inactive = int(stat.get(inactive_key, 0))
            return usage - inactive if 0 < inactive < usage else usage
    try:
        stats = client.containers.get(container_id).stats(stream=False)
    except docker.errors.DockerException:
        return None
    mem = stats.get("memory_stats") or {}
    usage = int(mem.get("usage", 0))
    detail = mem.get("stats") or {}
    inactive = int(detail.get("total_inactive_file", detail.get("inactive_file", 0)))
    return usage - inactive if 0 < inactive < usage else usage or None


def _state_file(handle: Any) -> Path:
    """The peer's whole state: the dill file in its workspace, loaded and saved by every cell."""
    return Path(handle.temp_dir) / "state.dill"


def _wait_dead(client: docker.DockerClient, container_id: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if client.containers.get(container_id).status != "running":
                return
        except docker.errors.NotFound:
            return
        time.sleep(0.02)
    raise RuntimeError(f"container {container_id[:12]} still runs {timeout:.0f} s after SIGKILL")


class OrchestratorRunner:
    """Our sessions, in a temporary state and runtime directory, on a freshly built or reused sandbox image."""

    name = OURS

    def __init__(self, settings: Settings | None = None) -> None:
        self._tmp = Path(tempfile.mkdtemp(prefix="orch-", dir="/tmp"))  # short: Unix socket paths max ~107 bytes
        base = settings or Settings.from_env()
        self.settings = base.replace(state_dir=self._tmp / "state", runtime_dir=self._tmp / "run")
        self.client = docker.from_env()
        self.orch = Orchestrator(self.settings)
        self._stores = [self.orch.store.store_id]
        self._lock = threading.Lock()
        try:
            self.image = self.orch.build_image()
        except BaseException:
            self.shutdown()
            raise

    def describe(self) -> dict[str, Any]:
        return {
            "system": f"orchestrator {orchestrator.__version__}",
            "image": self.image,
            "base_image": self.settings.base_image,
            "mem_limit": self.settings.limits.memory,
            "nano_cpus": self.settings.limits.nano_cpus,
        }

    def create(self) -> Session:
        return self.orch.create_session()

    def execute(self, handle: Session, code: str) -> None:
        result = handle.execute(code)
        if result.error is not None:
            raise RuntimeError(f"benchmark cell {code[:60]!r} failed: {result.error}")

    def evaluate(self, handle: Session, expression: str) -> str:
        result = handle.execute(expression)
        if result.error is not None or result.return_value is None:
            raise RuntimeError(f"{expression!r} gave no value: {result.error}")
        return str(result.return_value)

    def add_context(self, handle: Session, payload: str, index: int) -> None:
        handle.add_context(payload, index)

    def kill(self, handle: Session) -> None:
        container_id = handle.container_id
        if container_id is None:
            raise RuntimeError(f"session {handle.id} has no container to kill")
        self.client.containers.get(container_id).kill()
        _wait_dead(self.client, container_id)

    def recover(self, handle: Session) -> Session:
        return handle  # the next call restarts the sandbox and restores the checkpoint by itself

    def close(self, handle: Session) -> None:
        handle.close()

    def memory(self, handle: Session) -> int | None:
        return None if handle.container_id is None else container_memory(self.client, handle.container_id)

    def rlm_environment(self, lm_handler_address: tuple[str, int]) -> Any:
        from orchestrator.rlm.environment import DockerREPL

        return DockerREPL(lm_handler_address=lm_handler_address, persistent=True, settings=self.settings)

    @contextlib.contextmanager
    def pooled(self, pool_size: int) -> Iterator[Orchestrator]:
        """An Orchestrator with a warm pool of ``pool_size`` sandboxes, in a state directory of its own."""
        root = Path(tempfile.mkdtemp(prefix="pool-", dir=self._tmp))
        capacity = self.settings.capacity.replace(pool_size=pool_size)
        settings = self.settings.replace(capacity=capacity, state_dir=root / "state", runtime_dir=root / "run")
        orch = Orchestrator(settings)
        with self._lock:
            self._stores.append(orch.store.store_id)
        try:
            yield orch
        finally:
            orch.close()

    @contextlib.contextmanager
    def on_pool(self, pool_size: int) -> Iterator[OrchestratorRunner]:
        """This runner with its sessions on a warm pool of ``pool_size`` (``pooled``)."""
        with self.pooled(pool_size=pool_size) as orch:
            view = copy.copy(self)
            view.orch = orch
            yield view

    def for_restarts(self) -> contextlib.AbstractContextManager[OrchestratorRunner]:
        """This runner with its sessions on a warm pool of 2: a killed sandbox is replaced by a started one."""
        return self.on_pool(2)

    def for_forks(self, count: int) -> contextlib.AbstractContextManager[OrchestratorRunner]:
        """This runner with its sessions on a warm pool of ``count``: each fork takes a started sandbox."""
        return self.on_pool(count)

    def settle(self, open_handles: Collection[Session], timeout: float = 120.0) -> None:
        """Return once the warm pool (if any) holds its full size of started sandboxes beside those of
        ``open_handles``, and ``POOL_SETTLE`` seconds more (a pooled sandbox's agent connects and warms up after its
        container runs).

        Raises:
            RuntimeError: the pool did not fill within ``timeout`` seconds.
        """
        size = self.orch.settings.capacity.pool_size
        if size == 0:
            return
        labels = {STORE_ID: self.orch.store.store_id, ROLE: "pool"}
        taken = {h.container_id for h in open_handles}
        deadline = time.monotonic() + timeout
        while True:
            running = self.client.containers.list(filters={"label": [f"{k}={v}" for k, v in labels.items()]})
            spare = [c for c in running if c.id not in taken]
            if len(spare) >= size:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the warm pool holds {len(spare)} of {size} sandboxes after {timeout:.0f} s")
            time.sleep(0.1)
        time.sleep(POOL_SETTLE)

    def fork(self, handle: Session, count: int) -> list[Session]:
        return self.orch.fork(handle.id, count)

    def state_paths(self, handle: Session) -> list[Path]:
        return [self.orch.store.root / handle.id]

    def mark(self, handle: Session) -> int:
        return handle.generation

    def rewind(self, handle: Session, mark: int) -> None:
        handle.rewind(mark)

    def leftovers(self) -> list[str]:
        found = []
        for store in self._stores:
            found += [c.id for c in self.client.containers.list(all=True, filters={"label": f"{STORE_ID}={store}"})]
        return found

    def shutdown(self) -> None:
        """Close every session, remove any container of ours that is left, then the temporary directory."""
        try:
            self.orch.close()
        finally:
            try:
                for container_id in self.leftovers():
                    with contextlib.suppress(docker.errors.NotFound):
                        self.client.containers.get(container_id).remove(force=True)
            finally:
                shutil.rmtree(self._tmp, ignore_errors=True)


class PeerRunner:
    """rlms' own DockerREPL (``docker exec python`` per cell, the whole state loaded and saved each time).

    Its workspaces (host directories bind-mounted at ``/workspace``) live in a temporary directory
    (``RLM_DOCKER_WORKSPACE_DIR``), removed at the end; its containers are found by that mount.
    """

    name = PEER

    def __init__(self, base_image: str) -> None:
        from peer import ensure_peer_image  # a sibling module
        from rlm.environments.docker_repl import DockerREPL  # the peer, as its users import it

        self._repl = DockerREPL
        self.client = docker.from_env()
        self.workspace = Path(tempfile.mkdtemp(prefix="rlm-peer-ws-", dir="/tmp"))
        self._env_before = os.environ.get("RLM_DOCKER_WORKSPACE_DIR")
        os.environ["RLM_DOCKER_WORKSPACE_DIR"] = str(self.workspace)
        self._open: list[Any] = []
        self._lock = threading.Lock()
        try:
            self.image = ensure_peer_image(self.client, base_image)
        except BaseException:
            self.shutdown()
            raise

    def describe(self) -> dict[str, Any]:
        return {"system": f"rlms {importlib.metadata.version('rlms')} DockerREPL", "image": self.image}

    def _track(self, env: Any) -> Any:
        with self._lock:
            self._open.append(env)
        return env

    def create(self) -> Any:
        return self._track(self._repl(image=self.image, persistent=True))

    def execute(self, handle: Any, code: str) -> None:
        self._run(handle, code)

    def _run(self, handle: Any, code: str) -> Any:
        result = handle.execute_code(code)
        if result.stderr:
            raise RuntimeError(f"the peer's cell {code[:60]!r} failed: {result.stderr[-500:]}")
        return result

    def evaluate(self, handle: Any, expression: str) -> str:
        # Its execute_code returns the cell's output, not a value: print the repr, as a REPL would show it.
        ast.parse(expression, mode="eval")
        lines = self._run(handle, f"print(repr({expression}))").stdout.strip().splitlines()
        if not lines:
            raise RuntimeError(f"the peer printed nothing for {expression!r}")
        return str(lines[-1])

    def add_context(self, handle: Any, payload: str, index: int) -> None:
        handle.add_context(payload, index)

    def kill(self, handle: Any) -> None:
        container_id = handle.container_id
        self.client.containers.get(container_id).kill()
        _wait_dead(self.client, container_id)  # started with --rm: it is removed too

    def recover(self, handle: Any) -> Any:
        """The peer has no restore: a new DockerREPL whose workspace gets the dead one's ``state.dill``."""
        return self._copy(_state_file(handle))

    def _copy(self, state: Path) -> Any:
        """A new DockerREPL whose workspace gets a copy of ``state`` (its next cell loads it)."""
        fresh = self.create()
        try:
            shutil.copyfile(state, _state_file(fresh))
        except BaseException:
            self.close(fresh)
            raise
        return fresh

    def fork(self, handle: Any, count: int) -> list[Any]:
        """The peer has no fork: ``count`` new DockerREPLs, made at once (a thread each), each given a copy of
        ``handle``'s ``state.dill``; all closed if one fails."""
        state = _state_file(handle)
        with ThreadPoolExecutor(count) as pool:
            futures = [pool.submit(self._copy, state) for _ in range(count)]
        made, errors = [], []
        for future in futures:
            try:
                made.append(future.result())
            except Exception as exc:
                errors.append(exc)
        if errors:
            for env in made:
                with contextlib.suppress(Exception):
                    self.close(env)
            raise errors[0]
        return made

    def for_forks(self, count: int) -> contextlib.AbstractContextManager[PeerRunner]:
        """As it is: the peer has no pool."""
        return contextlib.nullcontext(self)

    def settle(self, open_handles: Collection[Any]) -> None:
        """Nothing to wait for: the peer keeps nothing started ahead."""

    def state_paths(self, handle: Any) -> list[Path]:
        return [Path(handle.temp_dir)]

    def mark(self, handle: Any) -> Path:
        """What its user does to be able to go back: copy ``state.dill`` aside (one kept copy per session, beside
        its workspace)."""
        kept = Path(handle.temp_dir).with_name(Path(handle.temp_dir).name + ".kept.dill")
        shutil.copyfile(_state_file(handle), kept)
        return kept

    def rewind(self, handle: Any, mark: Path) -> None:
        """Copy the kept state file back over ``state.dill`` (the kept one stays, as a generation of ours does); the
        next cell loads it, as every cell of the peer loads the whole state."""
        shutil.copyfile(mark, _state_file(handle))

    def close(self, handle: Any) -> None:
        handle.cleanup()
        with self._lock, contextlib.suppress(ValueError):
            self._open.remove(handle)

    def memory(self, handle: Any) -> int | None:
        return None if handle.container_id is None else container_memory(self.client, handle.container_id)

    def rlm_environment(self, lm_handler_address: tuple[str, int]) -> Any:
        return self._track(self._repl(image=self.image, lm_handler_address=lm_handler_address, persistent=True))

    def for_restarts(self) -> contextlib.AbstractContextManager[PeerRunner]:
        """As it is: the peer has no pool (its recovery is `recover`)."""
        return contextlib.nullcontext(self)

    def leftovers(self) -> list[str]:
        """Containers whose bind mount lies in this runner's workspace (the RLM conversation's included)."""
        found = []
        prefix = str(self.workspace) + "/"
        for container in self.client.containers.list(all=True, filters={"ancestor": self.image}):
            with contextlib.suppress(docker.errors.NotFound):
                mounts = container.attrs.get("Mounts") or []
                if any(str(m.get("Source", "")).startswith(prefix) for m in mounts):
                    found.append(container.id)
        return found

    def shutdown(self) -> None:
        """Clean up every environment still open, remove any container left, the workspace, and restore the env var."""
        try:
            with self._lock:
                left, self._open = self._open, []
            for env in left:
                with contextlib.suppress(Exception):
                    env.cleanup()
            if hasattr(self, "image"):
                for container_id in self.leftovers():
                    with contextlib.suppress(docker.errors.NotFound):
                        self.client.containers.get(container_id).remove(force=True)
        finally:
            if self._env_before is None:
                os.environ.pop("RLM_DOCKER_WORKSPACE_DIR", None)
            else:
                os.environ["RLM_DOCKER_WORKSPACE_DIR"] = self._env_before
            shutil.rmtree(self.workspace, ignore_errors=True)
