"""Fixtures: a FakeCompute server per test, wired to the provider through its seams.

MGPU_CLOUD_GCP_ENDPOINT points every google-cloud-compute client at the fake (anonymous
credentials); MGPU_CLOUD_GCP_RETRY_BASE_S / MGPU_CLOUD_GCP_POLL_S / MGPU_CLOUD_GCP_HOSTKEY_POLL_S
= 0 remove retry and poll waits;
MGPU_CLOUD_HOME keeps inventories and keys in tmp_path; MGPU_CLOUD_CALLER_IP stands in for the
caller's public address.

Every test also runs through gcp_rules.py (the autouse `gcp_rules` fixture): Compute's
documented rules the fake does not enforce, on every request the fake captured and on the
state after every `create`; a violation fails the test.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import gcp_rules  # noqa: E402
from fake_compute import FakeCompute  # noqa: E402
from fake_iam import FakeIam  # noqa: E402

from provision.model.inventory import InventoryStore  # noqa: E402
from provision.model.spec import ClusterSpec, build_cluster_spec, deep_merge  # noqa: E402

PROJECT = "test-proj"
CALLER_IP = "198.51.100.7"


@pytest.fixture
def fake() -> Iterator[FakeCompute]:
    server = FakeCompute()
    server.start()
    yield server
    server.stop()


class RulesLayer:
    def __init__(self, fake: FakeCompute) -> None:
        self.fake = fake
        self.state_violations: list[str] = []
        self.creates_checked = 0

    def after_create(self) -> None:
        self.creates_checked += 1
        self.state_violations += gcp_rules.check_state(self.fake.instances, self.fake.policies)

    def violations(self) -> list[str]:
        # a VM read back as 404 does not exist (an insert whose operation failed made none):
        # the rules count it out of its placement policy, as they do a deleted one
        requests = [("GONE" if r.method == "GET" and r.status == 404 else r.method, r.path,
                     r.body) for r in self.fake.requests]
        return gcp_rules.check_requests(requests) + self.state_violations


@pytest.fixture(autouse=True)
def gcp_rules_layer(fake: FakeCompute, monkeypatch: pytest.MonkeyPatch) -> Iterator[RulesLayer]:
    """Every GCP test: Compute's rules on each request and on the state `create` (and
    `replace`) leaves."""
    from provision.cluster.providers.gcp.provider import GcpProvider

    layer = RulesLayer(fake)
    create = GcpProvider.create

    def checked_create(self: Any, *args: Any, **kwargs: Any) -> None:
        create(self, *args, **kwargs)
        layer.after_create()

    monkeypatch.setattr(GcpProvider, "create", checked_create)
    replace = GcpProvider.replace

    def checked_replace(self: Any, *args: Any, **kwargs: Any) -> Any:
        new = replace(self, *args, **kwargs)
        layer.after_create()  # the policy holds exactly vmCount VMs again, all in its region
        return new

    monkeypatch.setattr(GcpProvider, "replace", checked_replace)
    yield layer
    found = layer.violations()
    if found:
        pytest.fail("Compute Engine rules violated:\n  " + "\n  ".join(found))


@pytest.fixture(autouse=True)
def gcp_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fake: FakeCompute) -> None:
    monkeypatch.setenv("MGPU_CLOUD_GCP_ENDPOINT", fake.url)
    monkeypatch.setenv("MGPU_CLOUD_GCP_RETRY_BASE_S", "0")
    monkeypatch.setenv("MGPU_CLOUD_GCP_POLL_S", "0")
    monkeypatch.setenv("MGPU_CLOUD_GCP_HOSTKEY_POLL_S", "0")
    monkeypatch.setenv("MGPU_CLOUD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MGPU_CLOUD_CALLER_IP", CALLER_IP)
    for var in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "GOOGLE_APPLICATION_CREDENTIALS"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def iam(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeIam]:
    """The IAM fake (service accounts, roles, bindings) the controller identity talks to."""
    fake = FakeIam()
    fake.start()
    monkeypatch.setenv("MGPU_CLOUD_GCP_IAM_ENDPOINT", fake.url)
    yield fake
    fake.stop()


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


def writes(fake: FakeCompute) -> list[str]:
    """Every mutating request sent (operation waits excluded)."""
    return [f"{r.method} {r.path}" for r in fake.requests
            if r.method in ("POST", "DELETE") and not r.path.endswith("/wait")]
