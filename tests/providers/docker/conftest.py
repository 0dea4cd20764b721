"""Fixtures of the docker provider's unit tests: `engine`, a scripted engine (fake_engine.py)
wired to the provider through its client seams, the node image taken as there."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fake_engine import FakeClient, FakeEngine  # noqa: E402


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    eng = FakeEngine()
    client = FakeClient(eng)
    monkeypatch.setattr("provision.cluster.providers.docker.provider.docker_client", lambda: client)
    monkeypatch.setattr("provision.cluster.providers.docker.controller.docker_client",
                        lambda: client)
    monkeypatch.setattr("provision.cluster.providers.docker.images.ensure_node_image",
                        lambda opts, log, client=None: "mgpu-cloud/node:test")
    return eng

