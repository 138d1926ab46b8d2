"""Which sandbox image a DockerREPL runs: our agent built on the caller's base image, which must have python3.

rlms' ``DockerREPL(image=...)`` takes an image with Python and installs what it needs into
each container at start. Here ``image`` is the *base* the sandbox image is built on, once
and offline (cached by digest), as rlms users pass it; the default is the configured base,
``Settings.base_image`` (``ORCH_BASE_IMAGE``). A base without a usable ``python3`` fails the
build, and that failure is told as such. A sandbox image given there (one ``orchestrator image
build`` made, known by its label ``images.SANDBOX_LABEL``) is run as it is.
"""

from __future__ import annotations

import re

from ..api.manager import Orchestrator
from ..config import Settings
from ..errors import ConfigError, ImageBuildFailed, ImageMissing
from ..ops import images

# What a build step says when the base has no python3 (or no shell to look for it with).
_NO_PYTHON = re.compile(
    r"python3: (?:command )?not found|python3.*no such file|non-zero code: 127|exec: \"/bin/sh\"|/bin/sh.*no such file",
    re.IGNORECASE,
)


def resolve_settings(settings: Settings | None, image: str | None) -> Settings:
    """``settings`` (default ``Settings.from_env()``) with ``image``, when given, as the base image."""
    settings = settings if settings is not None else Settings.from_env()
    if image is not None:
        if not isinstance(image, str) or not image.strip():
            raise ConfigError(f"image must be the name of a base image with python3, got {image!r}")
        settings = settings.replace(base_image=image.strip(), image=None)
    return settings


def ensure_image(orch: Orchestrator) -> str:
    """The tag of the sandbox image for ``orch.settings``, built on its base if it does not exist yet; a base that is
    a sandbox image already is used as it is.

    Raises:
        ImageMissing: the base image is not on this engine (nothing is pulled).
        ConfigError: the base image has no usable ``python3``.
        ImageBuildFailed: the build failed for another reason (``log_tail``: the end of its log).
    """
    settings = orch.settings
    if settings.image:
        return settings.image
    base = settings.base_image
    if images.is_sandbox_image(orch.backend, base):
        return base
    if not orch.backend.image_exists(orch.default_image) and not orch.backend.image_exists(base):
        raise ImageMissing(
            f"base image {base!r} is not on this Docker engine and is never pulled automatically; "
            f"`docker pull {base}` it, or build a Debian base offline with images/build-base-offline"
        )
    try:
        return orch.build_image()
    except ImageBuildFailed as exc:
        if _NO_PYTHON.search(str(exc)):
            raise ConfigError(
                f"image {base!r} has no usable python3 on its PATH, and the sandbox runs Python code: "
                "pass an image with Python 3.9 or newer (e.g. python:3.12-slim, or one with your packages)"
            ) from exc
        raise
