"""Images as a new user meets them (issue 38, "Images anywhere"), on the real engine.

A build on the user's own base runs its steps with no network (an engine without a default bridge builds it); a
build that fails shows the end of its log as lines, escaped; a base image passed as the sandbox image is refused
before any container starts, naming ``--base``; a container that exits while starting is reported at once with its
exit code and last log lines, not at the start timeout. Every image is built here from the images on the engine
(no registry is reachable).
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import docker
import docker.errors
import pytest
from support import cli_env, closing_orch

from orchestrator import AgentStartFailed, NotASandboxImage, Orchestrator, Settings
from orchestrator.backends.base import STORE_ID
from orchestrator.ops.images import SANDBOX_LABEL, image_tag
from orchestrator.rlm.image import ensure_image

pytestmark = pytest.mark.docker

_START_SECONDS = 120.0
"""The start timeout of the tests that expect an early failure: they must end well before it."""


@pytest.fixture
def store(settings_for: Callable[..., Settings], image: str) -> Settings:
    return settings_for()


@pytest.fixture
def client() -> Iterator[docker.DockerClient]:
    engine = docker.from_env()
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture
def local_image(client: docker.DockerClient, run_id: str) -> Iterator[Callable[[str, str], str]]:
    """Factory: build a small image from a Dockerfile (FROM an image on the engine, no network), removed after the
    test together with the sandbox image built on it."""
    made: list[str] = []

    def build(name: str, dockerfile: str) -> str:
        tag = f"orchestrator-test-{name}:{run_id}"
        made.append(tag)
        client.images.build(
            fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, forcerm=True, pull=False, network_mode="none"
        )
        return tag

    yield build
    for tag in made:
        for each in (image_tag(tag), tag):
            with contextlib.suppress(docker.errors.DockerException):
                client.images.remove(each, force=True)


def cli(store: Settings, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *argv],
        capture_output=True,
        text=True,
        env=cli_env(store, **env),
        timeout=300,
    )


def test_a_build_on_my_base_runs_with_no_network(
    store: Settings, local_image: Callable[[str, str], str], run_id: str
) -> None:
    """`image build --base <my base>`: the sandbox layer's steps see no network interface but loopback (so an engine
    started with --bridge=none builds it too), and sessions run on what it built."""
    base = local_image(
        "marked",
        f"FROM {store.base_image}\n"
        "RUN echo 'my team base' > /etc/team-marker\n"
        # Runs inside the sandbox image's build, right after its FROM: fails it when that step has a network.
        f'ONBUILD RUN echo {run_id}; test "$(ls /sys/class/net)" = lo || {{ echo "a build step has network: '
        '$(ls /sys/class/net)"; exit 1; }\n',  # (run_id: never taken from the cache)
    )
    built = cli(store, "image", "build", "--base", base)
    assert built.returncode == 0, built.stderr
    tag = built.stdout.strip()
    assert tag == image_tag(base)
    ran = cli(store, "run", "--rm", "--image", tag, "print(open('/etc/team-marker').read().strip())")
    assert (ran.returncode, ran.stdout) == (0, "my team base\n"), ran.stderr


def test_a_failed_build_shows_its_last_lines_as_lines(
    store: Settings, local_image: Callable[[str, str], str], run_id: str
) -> None:
    """A base without python3: one error line, then the build log's last lines each on a line of its own (the
    engine's error once, not twice), with what the base printed made harmless for a terminal."""
    base = local_image(
        "nopython",
        f"FROM {store.base_image}\n"
        "RUN rm -f /usr/bin/python3* /usr/local/bin/python3*\n"
        f"ONBUILD RUN printf 'base {run_id} says \\033]52;c;aGk=\\007 hello\\n'\n",  # run_id: not from the cache
    )
    failed = cli(store, "image", "build", "--base", base)
    assert failed.returncode == 6, failed.stderr
    lines = failed.stderr.splitlines()
    assert lines[0].startswith(f"orchestrator: ImageBuildFailed: building image {image_tag(base)} on {base} failed: ")
    assert lines[0].endswith("failed: the step's command returned a non-zero code: 127")
    assert failed.stderr.count("returned a non-zero code") == 1
    quoted = lines[1:]
    assert 3 <= len(quoted) <= 20 and all(line.startswith("  | ") for line in quoted), lines
    assert quoted[-1] == "  | /bin/sh: 1: python3: not found"
    assert f"  | base {run_id} says \\x1b]52;c;aGk=\\x07 hello" in quoted
    assert "\x1b" not in failed.stderr and "\x07" not in failed.stderr
    as_json = cli(store, "--json", "image", "build", "--base", base)
    error = json.loads(as_json.stdout)["error"]
    assert error["type"] == "ImageBuildFailed" and error["exit_code"] == 6
    assert error["log_tail"][-1] == "/bin/sh: 1: python3: not found"  # (its steps came from the cache this time)


def test_a_base_that_is_not_there_is_named(store: Settings, run_id: str) -> None:
    """A mistyped --base (and no registry to pull it from): ImageMissing naming it, not a build log."""
    base = f"orchestrator-test-absent:{run_id}"
    failed = cli(store, "image", "build", "--base", base)
    assert failed.returncode == 6, failed.stderr
    (line,) = failed.stderr.splitlines()
    assert line.startswith(f"orchestrator: ImageMissing: base image {base!r} is not on this Docker engine")


def _created_containers(client: docker.DockerClient, store: Settings, since: float) -> list[dict[str, object]]:
    """The engine's "create" events since ``since`` for containers of ``store``'s controller."""
    with closing_orch(Orchestrator(store)) as orch:
        store_id = orch.store.store_id
    events = client.events(
        since=int(since) - 1,
        until=int(time.time()) + 1,
        decode=True,
        filters={"type": "container", "event": "create", "label": f"{STORE_ID}={store_id}"},
    )
    return list(events)


def test_a_base_image_as_the_sandbox_image_is_refused_at_once(
    store: Settings, make_orch: Callable[[Settings], Orchestrator], client: docker.DockerClient
) -> None:
    """`create --image <a base image>`: a usage error naming `--base`, and the engine never created a container."""
    since = time.time()
    created = cli(store, "create", "--image", store.base_image, ORCH_START_TIMEOUT=str(_START_SECONDS))
    assert created.returncode == 2, created.stderr
    (line,) = created.stderr.splitlines()
    assert line.startswith(f"orchestrator: NotASandboxImage: {store.base_image!r} is not a sandbox image")
    assert f"orchestrator image build --base {store.base_image}" in line
    orch = make_orch(store)
    with pytest.raises(NotASandboxImage) as info:
        orch.create_session(image=store.base_image)
    assert info.value.image == store.base_image
    assert orch.sessions() == [] and orch.containers() == []
    assert _created_containers(client, store, since) == []


def test_an_agent_that_exits_at_start_is_reported_at_once(
    store: Settings, make_orch: Callable[[Settings], Orchestrator], client: docker.DockerClient
) -> None:
    """An agent command that fails at once (exit 3): AgentStartFailed with the engine's exit code and the last log
    line (escaped), well before the start timeout; nothing left behind."""
    failing = "import sys; print('agent: no config \\x1b[2J here', file=sys.stderr); sys.exit(3)"
    settings = store.replace(
        agent_command=("python3", "-c", failing), timeouts=store.timeouts.replace(start=_START_SECONDS)
    )
    orch = make_orch(settings)
    since, started = time.time(), time.monotonic()
    with pytest.raises(AgentStartFailed) as info:
        orch.create_session()
    assert time.monotonic() - started < _START_SECONDS / 2, "reported at the start timeout, not when it exited"
    exc = info.value
    assert exc.exit_code == 3
    assert exc.log_tail[-1] == "agent: no config \\x1b[2J here"
    assert "exit code 3" in exc.headline and "\x1b" not in str(exc)
    assert orch.sessions() == [] and orch.containers() == []
    died = client.events(
        since=int(since) - 1,
        until=int(time.time()) + 1,
        decode=True,
        filters={"type": "container", "event": "die", "label": f"{STORE_ID}={orch.store.store_id}"},
    )
    assert [event["Actor"]["Attributes"]["exitCode"] for event in died] == ["3"]


def test_the_cli_shows_an_agent_that_exits_at_start(store: Settings) -> None:
    """The same through `orchestrator create`: exit status 7, the error line, then the container's last log line."""
    command = "python3 -c \"import sys; print('agent: cannot start', file=sys.stderr); sys.exit(3)\""
    created = cli(store, "create", ORCH_AGENT_COMMAND=command, ORCH_START_TIMEOUT=str(_START_SECONDS))
    assert created.returncode == 7, created.stderr
    lines = created.stderr.splitlines()
    assert lines[0].startswith("orchestrator: AgentStartFailed: the container of sandbox ")
    assert "(exit code 3)" in lines[0]
    assert lines[1:] == ["  | agent: cannot start"]


def test_the_rlm_path_takes_a_base_or_a_sandbox_image(store: Settings, image: str) -> None:
    """`DockerREPL(image=...)` keeps rlms' meaning (a base, built on); a sandbox image given there is run as it is."""
    with closing_orch(Orchestrator(store.replace(base_image=image))) as orch:
        assert ensure_image(orch) == image
    with closing_orch(Orchestrator(store)) as orch:
        assert ensure_image(orch) == image_tag(store.base_image) == image
        assert SANDBOX_LABEL in (orch.backend.image_labels(image) or {})
