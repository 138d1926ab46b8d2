"""A sandbox's carrier comes from what its backend can do, unless the settings force one (ORCH_CARRIER)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.backends.base import Capabilities
from orchestrator.config import Settings
from orchestrator.runtime.sandbox import carrier_of


@pytest.mark.parametrize(
    ("passes_descriptors", "forced", "expected"),
    [(True, None, "descriptors"), (False, None, "relayed"), (True, "relayed", "relayed")],
)
def test_the_carrier_of_a_backend(passes_descriptors: bool, forced: str | None, expected: str) -> None:
    backend = SimpleNamespace(capabilities=Capabilities(passes_descriptors=passes_descriptors, delivers_signals=True))
    assert carrier_of(backend, Settings(carrier=forced)) == expected  # type: ignore[arg-type]
