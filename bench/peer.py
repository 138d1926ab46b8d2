"""The peer's sandbox image, built offline: a base with python3 plus what rlms' DockerREPL needs.

rlms' ``DockerREPL`` runs ``docker exec <container> python /workspace/_exec.py`` per cell,
imports ``dill`` and ``requests`` there, and runs ``pip install -q dill requests`` in every new
container. With no registry and no PyPI, the image gets pure-Python copies of the host's
installed ``dill``, ``requests`` and ``requests``' dependencies (urllib3, idna,
charset_normalizer, certifi) in its build context, a ``python`` on PATH (a link to python3
where the base has none) and a ``pip`` first on PATH that prints nothing and exits 0. The
build runs with no network (``network_mode="none"``) and never pulls; its tag is a digest of
the base image's id and the context, so an existing image is reused.

    python bench/peer.py [--base IMAGE] [--rebuild]     # prints the tag
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import io
import os
import sys
import tarfile
from pathlib import Path

import docker
import docker.errors

REPOSITORY = "orchestrator-bench-peer"
PACKAGES = ("dill", "requests", "urllib3", "idna", "charset_normalizer", "certifi")
"""Import names copied into the image: rlms' DockerREPL imports dill and requests; the rest are requests' own."""
DOCKERFILE = Path(__file__).resolve().parent / "peer.Dockerfile"
PIP_SHIM = b"#!/bin/sh\n# bench/peer.py: the peer's pip install must not reach a network; it does nothing.\nexit 0\n"
COMPILED = (".so", ".pyd")
LABEL = "orchestrator.bench.peer"


class PeerImageError(RuntimeError):
    """The peer image could not be built (a package needs compiled code, no base image, a failed build)."""


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise PeerImageError(f"{name} is not installed on the host as a package; `pip install {name}` first")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def _package_files(name: str) -> dict[str, bytes]:
    """The pure-Python files of one installed package (sources and data), by path inside the context.

    Compiled modules are left out; each must have a pure-Python twin (``md.py`` beside
    ``md.cpython-311-x86_64-linux-gnu.so``, as charset_normalizer ships them), or the copy would
    not import on another Python.
    """
    root = _package_dir(name)
    files: dict[str, bytes] = {}
    missing: list[str] = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
            continue
        if path.suffix in COMPILED:
            if not path.with_name(path.name.split(".", 1)[0] + ".py").is_file():
                missing.append(str(path.relative_to(root)))
            continue
        files[f"site/{name}/{path.relative_to(root).as_posix()}"] = path.read_bytes()
    if missing:
        raise PeerImageError(f"{name} has compiled modules without a pure-Python fallback: {', '.join(missing)}")
    return files


def context_files() -> dict[str, bytes]:
    """Every file of the build context, by path inside it."""
    files = {"Dockerfile": DOCKERFILE.read_bytes(), "bin/pip": PIP_SHIM}
    for name in PACKAGES:
        files.update(_package_files(name))
    return files


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755 if name.startswith("bin/") else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def image_tag(base_id: str, files: dict[str, bytes]) -> str:
    """The tag for a build of ``files`` on the base image with id ``base_id``."""
    digest = hashlib.sha256(base_id.encode())
    for name, data in sorted(files.items()):
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return f"{REPOSITORY}:{digest.hexdigest()[:16]}"


def ensure_peer_image(client: docker.DockerClient, base_image: str, *, rebuild: bool = False) -> str:
    """The tag of the peer image on ``base_image``, built when it does not exist yet (or ``rebuild``).

    Raises:
        PeerImageError: the base image is not on this engine (it is never pulled), a package
            cannot be copied as pure Python, or the build failed (the message has the log's end).
    """
    try:
        base_id = client.images.get(base_image).id
    except docker.errors.ImageNotFound:
        raise PeerImageError(
            f"base image {base_image!r} is not on this Docker engine and is never pulled; "
            "set ORCH_BASE_IMAGE to a local base (scripts/ensure-image makes one)"
        ) from None
    files = context_files()
    tag = image_tag(base_id, files)
    if not rebuild:
        try:
            client.images.get(tag)
            return tag
        except docker.errors.ImageNotFound:
            pass
    try:
        client.images.build(
            fileobj=io.BytesIO(_tar(files)),
            custom_context=True,
            tag=tag,
            buildargs={"BASE_IMAGE": base_image},
            labels={LABEL: "true", f"{LABEL}.base-image": base_image},
            rm=True,
            forcerm=True,
            pull=False,
            network_mode="none",
        )
    except docker.errors.BuildError as exc:
        tail = "".join(str(chunk.get("stream", chunk.get("error", ""))) for chunk in list(exc.build_log)[-15:])
        raise PeerImageError(f"building the peer image {tag} on {base_image} failed: {exc.msg}\n{tail}") from exc
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=os.environ.get("ORCH_BASE_IMAGE", "python:3.12-slim"), help="base image")
    parser.add_argument("--rebuild", action="store_true", help="build even when the tag exists")
    args = parser.parse_args(argv)
    client = docker.from_env()
    try:
        print(ensure_peer_image(client, args.base, rebuild=args.rebuild))
    except PeerImageError as exc:
        print(f"peer: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
