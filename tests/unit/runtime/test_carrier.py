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


@pytest.mark.parametrize(("offered", "forced"), [((), {}), ((protocol.ONE_HOP,), {"ORCH_CARRIER": "relayed"})])
def test_an_agent_that_does_not_offer_one_hop_on_the_carrier_is_refused_as_too_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offered: tuple[str, ...], forced: dict[str, str]
) -> None:
    monkeypatch.setattr(FakeAgent, "capabilities", offered)
    too_old = r"offers .*, not one_hop.*too old for this controller; rebuild the image"
    with (
        Orchestrator(fake_settings(tmp_path, **forced), backend=FakeBackend()) as orch,
        pytest.raises(ProtocolError, match=too_old),
    ):
        orch.create_session().execute("1")
