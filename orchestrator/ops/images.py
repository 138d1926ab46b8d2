"""Build contexts made from the installed packages: the sandbox image's, and the janitor image's.

The sandbox image's context is made in memory from files inside the installed ``orchestrator``
package (the Dockerfile, the agent, and the host's pure-Python dill), so it works from a
pip install with no repository and with no PyPI access inside the build. The tag is a
digest of everything that goes in, so an existing image is reused and a changed agent
gets a new image.

The janitor image (``compose/janitor``) gets the whole package and its runtime dependencies
the same way, copied from the host's installed distributions, because neither PyPI nor pip
is there to install them inside a build.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import io
import logging
import re
import shutil
import tarfile
from pathlib import Path

from ..agent import protocol
from ..backends.base import LABEL_PREFIX, Backend
from ..config import Settings
from ..errors import ConfigError, ImageBuildFailed, ImageMissing, NotASandboxImage
from ..extras import DISTRIBUTION, VERSION

logger = logging.getLogger(__name__)

IMAGE_REPOSITORY = "orchestrator-sandbox"
SANDBOX_LABEL = LABEL_PREFIX + "protocol"
"""The mark of a sandbox image: the protocol version its agent speaks. Every image ``build_image`` made carries it
(and so does an image built FROM one); a base image does not."""
_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_DOCKERFILE = Path(__file__).resolve().with_name("sandbox.Dockerfile")


JANITOR_SITE = "site"
"""The directory of the janitor's build context that holds the copied packages (its Dockerfile COPYs it)."""
_SITE_MARK = ".orchestrator-janitor-site"
"""A file in every site directory we write: only such a directory is ever replaced."""
_COMPILED = (".so", ".pyd", ".pyc", ".pyo")
"""Built for the host's interpreter and platform, not the image's: left out (pure-Python fallbacks remain)."""
_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _context_files() -> dict[str, bytes]:
    """Every file of the build context, by path inside the context."""
    files = {"Dockerfile": _DOCKERFILE.read_bytes()}
    for source in sorted((_PACKAGE_DIR / "agent").glob("*.py")):
        files[f"orchestrator_agent/{source.name}"] = source.read_bytes()
    for name, data in _distribution_files("dill").items():
        if name.endswith(".py"):
            files[f"vendor/{name}"] = data
    return files


def _top_level_names(dist: importlib.metadata.Distribution) -> list[str]:
    """The names a distribution's packages and modules are imported by."""
    listed = dist.read_text("top_level.txt")
    if listed is not None:
        return sorted({line.strip() for line in listed.splitlines() if line.strip()})
    names = set()
    for entry in dist.files or ():
        first = entry.parts[0]
        if first in ("..", "__pycache__") or first.endswith((".dist-info", ".egg-info", ".pth", ".data")):
            continue
        names.add(first[:-3] if first.endswith(".py") and len(entry.parts) == 1 else first)
    return sorted(n for n in names if n.isidentifier() and not n.startswith("__editable__"))


def _distribution_files(distribution: str) -> dict[str, bytes]:
    """The importable files of an installed distribution, by path relative to where they are imported from.

    Found by import name rather than by the distribution's file list, so an editable install (whose
    list names only a path hook) gives its real sources too. Bytecode and compiled extensions are left
    out: they were built for the host, and the images run another interpreter build.

    Raises:
        ConfigError: the distribution is not installed.
    """
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ConfigError(f"the Python distribution {distribution!r} is not installed; it goes into an image") from exc
    files: dict[str, bytes] = {}
    for name in _top_level_names(dist):
        spec = importlib.util.find_spec(name)
        if spec is None:
            continue
        if spec.submodule_search_locations is not None:  # a package (a namespace package may have several dirs)
            trees = [Path(location).resolve() for location in spec.submodule_search_locations]
            sources = [(tree.parent, p) for tree in trees for p in sorted(tree.rglob("*")) if p.is_file()]
        elif spec.origin is not None and spec.has_location:
            module = Path(spec.origin).resolve()
            sources = [(module.parent, module)]
        else:
            continue
        for root, source in sources:
            if "__pycache__" not in source.parts and not source.name.endswith(_COMPILED):
                files[source.relative_to(root).as_posix()] = source.read_bytes()
    return files


def _runtime_distributions(root: str = DISTRIBUTION) -> list[str]:
    """``root`` and every distribution it needs at run time (no extras), as installed on this host.

    A requirement under an environment marker that is not installed here (``pywin32; sys_platform ==
    'win32'``) is taken to be for another platform or Python and left out; a plain one must be installed.

    Raises:
        ConfigError: ``root``, or a distribution it needs, is not installed.
    """
    try:
        importlib.metadata.distribution(root)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(
            f"the distribution {root!r} is not installed here (in a checkout: pip install -e .)"
        ) from None
    wanted, queue = {root}, [root]
    while queue:
        for requirement in importlib.metadata.requires(queue.pop()) or ():
            spec, _, marker = requirement.partition(";")
            if "extra" in marker:
                continue
            match = _REQUIREMENT_NAME.match(spec)
            if match is None:
                continue
            name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
            if name in wanted:
                continue
            try:
                importlib.metadata.distribution(name)
            except importlib.metadata.PackageNotFoundError:
                if marker.strip():
                    continue
                raise ConfigError(f"{name}, which {root} needs, is not installed") from None
            wanted.add(name)
            queue.append(name)
    return sorted(wanted)


def write_janitor_context(directory: Path) -> Path:
    """Write the packages of the janitor image into ``directory/site``; return that directory.

    ``directory`` is the build context of ``compose/janitor`` (its Dockerfile is committed there):
    ``site`` gets the ``orchestrator`` package and its runtime dependencies copied from this host,
    without compiled extensions (charset-normalizer falls back to its pure-Python modules). An
    existing ``site`` is replaced, but only one this function wrote.

    Raises:
        ConfigError: a dependency is not installed, or ``directory/site`` is something else.
    """
    site = Path(directory) / JANITOR_SITE
    if site.exists() and not (site / _SITE_MARK).is_file():
        raise ConfigError(f"{site} exists and was not written by write_janitor_context; remove it or choose another")
    files: dict[str, bytes] = {}
    for distribution in _runtime_distributions():
        files.update(_distribution_files(distribution))
    fresh = site.with_name(f".{JANITOR_SITE}.new")
    shutil.rmtree(fresh, ignore_errors=True)
    for name, data in files.items():
        target = fresh / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    (fresh / _SITE_MARK).write_text(
        "Written by orchestrator.ops.images.write_janitor_context; replaced on every run.\n"
    )
    shutil.rmtree(site, ignore_errors=True)
    fresh.rename(site)
    logger.info("janitor build context: %d files in %s", len(files), site)
    return site


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


def sandbox_image(settings: Settings) -> str:
    """The image sessions use unless told otherwise: ``settings.image``, or the sandbox image of its base image."""
    return settings.image or image_tag(settings.base_image)


def build_image(backend: Backend, base_image: str, *, rebuild: bool = False) -> str:
    """Ensure the sandbox image for ``base_image`` exists; return its tag.

    Raises:
        ImageBuildFailed: the build failed (for example the base has no ``python3``).
        ImageMissing: the base is not on the engine, and the engine could not pull it.
        EngineUnavailable: no engine answers.
    """
    tag = image_tag(base_image)
    if not rebuild and backend.image_exists(tag):
        logger.info("sandbox image %s exists; reusing it", tag)
        return tag
    logger.info("building sandbox image %s on %s", tag, base_image)
    try:
        backend.build_image(
            _tar(_context_files()),
            tag,
            buildargs={"BASE_IMAGE": base_image},
            labels={
                LABEL_PREFIX + "image-version": VERSION,
                SANDBOX_LABEL: str(protocol.PROTOCOL_VERSION),
                LABEL_PREFIX + "base-image": base_image,
            },
        )
    except ImageBuildFailed as exc:
        if backend.image_exists(base_image):
            raise
        raise ImageMissing(
            f"base image {base_image!r} is not on this Docker engine and could not be pulled ({exc.headline}); "
            f"`docker pull` or build it first (`docker images` lists those there)"
        ) from exc
    return tag


def is_sandbox_image(backend: Backend, image: str) -> bool | None:
    """Whether ``image`` is a sandbox image (it carries ``SANDBOX_LABEL``); None when it does not exist."""
    labels = backend.image_labels(image)
    return None if labels is None else SANDBOX_LABEL in labels


def check_sandbox_image(backend: Backend, image: str, *, base_image: str | None = None) -> None:
    """Refuse, before any container starts, an image that cannot serve as a sandbox image.

    Args:
        base_image: the base ``image`` would be built on, when it is the default sandbox image (named in the hint).

    Raises:
        ImageMissing: ``image`` does not exist; how to build it.
        NotASandboxImage: ``image`` is a base image (no agent); how to build a sandbox image on it.
    """
    found = is_sandbox_image(backend, image)
    if found is None:
        build = (
            f"`orchestrator image build --base {base_image}`"
            if base_image
            else ("`orchestrator image build --base BASE` (BASE: an image with python3) and pass the tag it prints")
        )
        raise ImageMissing(f"sandbox image {image!r} does not exist; build it with {build}")
    if not found:
        raise NotASandboxImage(
            f"{image!r} is not a sandbox image (no orchestrator agent in it; sandbox images carry the label "
            f"{SANDBOX_LABEL}): to run sessions on this base image, build a sandbox image on it with "
            f"`orchestrator image build --base {image}` and pass the tag it prints (Python: "
            f"Settings(base_image={image!r}) and Orchestrator.build_image())",
            image=image,
        )
