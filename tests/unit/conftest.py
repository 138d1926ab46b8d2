"""Fixtures shared by unit tests of several layers: the agent as a host subprocess, and a store with a ledger."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest
from agent_process import Agent

from orchestrator.state.ledger import CheckpointLedger, new_owner_token
from orchestrator.state.store import SessionRecord, SessionStore

QUOTA = 1000
"""The ledger fixture's checkpoint quota, in bytes."""


@pytest.fixture
def make_agent():
    made: list[Agent] = []
    directory = Path(tempfile.mkdtemp(prefix="orch-ut-", dir="/tmp"))

    def make(**env: str) -> Agent:
        sub = directory / str(len(made))
        sub.mkdir()
        agent = Agent(sub, **env)
        made.append(agent)
        return agent

    yield make
    for agent in made:
        agent.close()
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def agent(make_agent):
    return make_agent()


@pytest.fixture
def store(tmp_path):
    return SessionStore(tmp_path, lock_timeout=0.5)


@pytest.fixture
def ledger(store):
    record = SessionRecord(
        session_id="s-test", image="img", created_at=time.time(), last_used_at=0.0, owner=new_owner_token(), epoch=1
    )
    store.create(record)
    return CheckpointLedger(store, record, QUOTA, keep=0)


@pytest.fixture(autouse=True)
def _own_config_home(tmp_path_factory, monkeypatch):
    """No unit test reads or writes the user's defaults file (``config.defaults_path``, under XDG_CONFIG_HOME)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config-home")))
