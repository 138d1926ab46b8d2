"""A sandbox's carrier comes from what its backend can do, unless the settings force one (ORCH_CARRIER); an agent that
does not offer one hop on it is too old for this controller."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from fakes import FakeAgent, FakeBackend, fake_settings

from orchestrator import Orchestrator, ProtocolError
from orchestrator.agent import protocol
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


def test_an_agent_that_does_not_offer_the_relayed_carrier_is_refused_as_too_old_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(FakeAgent, "capabilities", (protocol.BLOB_FILES,))
    too_old = r"offers blob_files, not relayed.*too old for this controller; rebuild the image"
    with (
        Orchestrator(fake_settings(tmp_path, ORCH_CARRIER="relayed"), backend=FakeBackend()) as orch,
        pytest.raises(ProtocolError, match=too_old),
    ):
        orch.create_session().execute("1")
