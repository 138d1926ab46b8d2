"""Engine errors are translated at the boundary into the orchestrator's own, with what to do."""

from __future__ import annotations

import gc
import warnings

import docker.errors
import pytest

from orchestrator import EngineError, EngineUnavailable, ImageMissing
from orchestrator.backends.docker import DockerBackend, engine_errors


def test_unreachable_engine_says_how_to_start_one(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such.sock")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # docker-py leaks the failed connection
        with pytest.raises(EngineUnavailable, match="setup-engine"):
            DockerBackend()
        gc.collect()


def test_missing_image_says_how_to_build_it():
    with pytest.raises(ImageMissing, match="orchestrator image build"), engine_errors("starting"):
        raise docker.errors.ImageNotFound("no such image")


def test_api_errors_become_engine_errors():
    with pytest.raises(EngineError, match="refused"), engine_errors("starting"):
        raise docker.errors.APIError("conflict")
