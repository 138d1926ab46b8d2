"""The janitor image's packages are found through our distribution's name (``orchestrator-sessions``)."""

from __future__ import annotations

import pytest

from orchestrator.errors import ConfigError
from orchestrator.extras import DISTRIBUTION
from orchestrator.ops import images


def test_a_distribution_that_is_not_installed_is_one_line_with_what_to_do() -> None:
    with pytest.raises(ConfigError, match=r"'no-such-dist-here' is not installed here \(in a checkout: pip install"):
        images._runtime_distributions("no-such-dist-here")


def test_the_default_root_is_our_distribution() -> None:
    assert images._runtime_distributions.__defaults__ == (DISTRIBUTION,)
