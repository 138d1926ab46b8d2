"""The name this project is installed by, and the one-line answer when an optional extra is missing.

The import package and the command are ``orchestrator``, but the distribution on PyPI is not: ``orchestrator``
there is an unrelated project, so every install line names ``DISTRIBUTION`` (issue 38).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from .errors import ConfigError

DISTRIBUTION = "orchestrator-sessions"
"""What ``pip install`` and ``importlib.metadata`` know this project by."""
VERSION = "0.1.0"
"""Its version (``orchestrator.__version__``), here so that the layers can name it without importing the package."""


def install_line(extra: str) -> str:
    """The command that installs ``extra`` of this project: ``pip install 'orchestrator-sessions[mcp]'``."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


@contextmanager
def needs(extra: str, what: str) -> Iterator[None]:
    """Turn an import that fails for want of ``extra`` into one line: ``<what>: pip install '...[extra]'``.

    Any module that is not part of this package counts as the extra's (its SDK, or what the SDK needs: a user
    without the extra misses whichever is imported first, ``anyio`` before ``mcp``); a missing module of our own
    is a bug and is raised as it is.

    Raises:
        ConfigError: the import failed for want of the extra (a usage problem: exit status 2 in the CLI).
    """
    try:
        yield
    except ImportError as exc:
        if exc.name is None or exc.name.partition(".")[0] == __name__.partition(".")[0]:
            raise
        raise ConfigError(f"{what}: {install_line(extra)}") from exc
