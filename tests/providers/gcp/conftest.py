"""Fixtures: a FakeCompute server per test, wired to the provider through its seams.

MGPU_CLOUD_GCP_ENDPOINT points every google-cloud-compute client at the fake (anonymous
credentials); MGPU_CLOUD_GCP_RETRY_BASE_S / MGPU_CLOUD_GCP_POLL_S = 0 remove retry and poll waits;
MGPU_CLOUD_HOME keeps inventories and keys in tmp_path; MGPU_CLOUD_CALLER_IP stands in for the
caller's public address.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fake_compute import FakeCompute  # noqa: E402

from provision.inventory import Inventory, InventoryStore  # noqa: E402
from provision.spec import ClusterSpec, build_cluster_spec, deep_merge  # noqa: E402

PROJECT = "test-proj"
CALLER_IP = "198.51.100.7"


@pytest.fixture
def fake() -> Iterator[FakeCompute]:
    server = FakeCompute()
    server.start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def gcp_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fake: FakeCompute) -> None:
    monkeypatch.setenv("MGPU_CLOUD_GCP_ENDPOINT", fake.url)
    monkeypatch.setenv("MGPU_CLOUD_GCP_RETRY_BASE_S", "0")
    monkeypatch.setenv("MGPU_CLOUD_GCP_POLL_S", "0")
    monkeypatch.setenv("MGPU_CLOUD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MGPU_CLOUD_CALLER_IP", CALLER_IP)
    for var in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "GOOGLE_APPLICATION_CREDENTIALS"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def store(tmp_path: Path) -> InventoryStore:
    return InventoryStore(tmp_path / "home")


@pytest.fixture
def make_spec() -> Callable[..., ClusterSpec]:
    def make(**overrides: Any) -> ClusterSpec:
        base = {"provider": "gcp", "name": "c1", "nodes": 2, "ssh_cidr": "203.0.113.0/24",
                "gcp": {"project": PROJECT, "zone": "us-central1-a"}}
        return build_cluster_spec({}, deep_merge(base, overrides))

    return make


@pytest.fixture
def up(store: InventoryStore) -> Callable[[ClusterSpec], Inventory]:
    """pipeline.up without bootstrap, auto-confirmed (rollback on failure included)."""
    from provision import pipeline

    def run(spec: ClusterSpec) -> Inventory:
        inv = pipeline.up(spec, confirm=lambda plan: True, store=store, bootstrap=False,
                          log=lambda msg: None)
        assert inv is not None
        return inv

    return run


def writes(fake: FakeCompute) -> list[str]:
    """Every mutating request sent (operation waits excluded)."""
    return [f"{r.method} {r.path}" for r in fake.requests
            if r.method in ("POST", "DELETE") and not r.path.endswith("/wait")]
