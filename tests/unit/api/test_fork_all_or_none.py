"""``Orchestrator.fork`` on the fake engine stores all its forks or none: a taken id among them leaves nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import FakeBackend, fake_settings

from orchestrator import ConfigError, Orchestrator


def test_a_taken_id_after_others_leaves_no_fork_behind(tmp_path: Path) -> None:
    backend = FakeBackend()
    with Orchestrator(fake_settings(tmp_path), backend=backend) as orch:
        source = orch.create_session()
        source.execute("x = 'one'")
        orch.create_session(session_id="taken-id")
        before, containers = set(orch.sessions()), len(backend.running())
        with pytest.raises(ConfigError, match="'taken-id' already exists"):
            orch.fork(source.id, 3, session_ids=["fork-one", "fork-two", "taken-id"])
        assert set(orch.sessions()) == before
        assert sorted(p.name for p in orch.store.session_dirs()) == sorted(before)
        assert len(backend.running()) == containers
        (fork,) = orch.fork(source.id, session_ids=["fork-one"])  # the ids are free again
        assert fork.execute("x").ok
