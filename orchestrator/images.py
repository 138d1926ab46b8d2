"""Building the sandbox image from the installed package: agent sources and dill on a chosen base.

The build context is made in memory from files inside the installed ``orchestrator``
package (the Dockerfile, the agent, and the host's pure-Python dill), so it works from a
pip install with no repository and with no PyPI access inside the build. The tag is a
digest of everything that goes in, so an existing image is reused and a changed agent
gets a new image.
"""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import tarfile
from pathlib import Path

import dill

from . import __version__
from .agent import protocol
from .backend import LABEL_PREFIX, Backend

logger = logging.getLogger(__name__)

IMAGE_REPOSITORY = "orchestrator-sandbox"
_PACKAGE_DIR = Path(__file__).resolve().parent
_DOCKERFILE = _PACKAGE_DIR / "sandbox.Dockerfile"


def _context_files() -> dict[str, bytes]:
    """Every file of the build context, by path inside the context."""
    files = {"Dockerfile": _DOCKERFILE.read_bytes()}
    for source in sorted((_PACKAGE_DIR / "agent").glob("*.py")):
        files[f"orchestrator_agent/{source.name}"] = source.read_bytes()
    dill_dir = Path(dill.__file__).resolve().parent
    for source in sorted(dill_dir.rglob("*.py")):
        files[f"vendor/dill/{source.relative_to(dill_dir).as_posix()}"] = source.read_bytes()
    return files


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@functools.lru_cache(maxsize=8)
def image_tag(base_image: str) -> str:
    """The tag of the sandbox image for ``base_image`` and the installed agent sources."""
    digest = hashlib.sha256(base_image.encode())
    for name, data in sorted(_context_files().items()):
        digest.update(name.encode() + b"\0" + data)
    return f"{IMAGE_REPOSITORY}:{digest.hexdigest()[:16]}"


def build_image(backend: Backend, base_image: str, *, rebuild: bool = False) -> str:
    """Ensure the sandbox image for ``base_image`` exists; return its tag.

    Raises:
        EngineError: the build failed (for example the base has no ``python3``).
        EngineUnavailable: no engine answers.
    """
    tag = image_tag(base_image)
    if not rebuild and backend.image_exists(tag):
        logger.info("sandbox image %s exists; reusing it", tag)
        return tag
    logger.info("building sandbox image %s on %s", tag, base_image)
    backend.build_image(
        _tar(_context_files()),
        tag,
        buildargs={"BASE_IMAGE": base_image},
        labels={
            LABEL_PREFIX + "image-version": __version__,
            LABEL_PREFIX + "protocol": str(protocol.PROTOCOL_VERSION),
            LABEL_PREFIX + "base-image": base_image,
        },
    )
    return tag
