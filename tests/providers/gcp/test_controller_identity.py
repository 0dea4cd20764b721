"""The GCP controller's identity (issue 18): service account, custom role and conditional
bindings are created (recorded as they exist), rolled back, deleted by `down` and found by
`gc` against an IAM fake over HTTP; every grant sent obeys iam_rules (each rule can fail)."""

from __future__ import annotations

from pathlib import Path

import gcp_iam_rules as iam_rules
import pytest
from fake_iam import FakeIam

from provision.cluster.providers.gcp.controller import (
    IamApi,
    IamError,
    bindings,
    create_identity,
)
from provision.cluster.providers.gcp.provider import GcpProvider
from provision.model.errors import TeardownError
from provision.model.inventory import Inventory, InventoryStore
from provision.model.spec import build_cluster_spec
from remote.store import parse_url

PROJECT, ZONE = "test-proj", "us-central1-a"
STORE = parse_url("gs://ckpt/runs")


def _inv(tmp_path: Path, name: str) -> tuple[Inventory, InventoryStore]:
    store = InventoryStore(tmp_path / "home")
    spec = build_cluster_spec({}, {"name": name, "provider": "gcp", "ssh_cidr": "203.0.113.7/32",
                                   "gcp": {"project": PROJECT, "zone": ZONE}})
    inv = Inventory(name=name, provider="gcp", spec=spec, key_path=str(tmp_path / "k"))
    store.create(inv)
    return inv, store


def _create(inv: Inventory, store: InventoryStore) -> str:
    return create_identity(IamApi(), PROJECT, ZONE, inv.name, STORE,
                           lambda r: store.record(inv, r))


def test_grants_name_only_the_cluster_and_each_rule_can_fail(iam: FakeIam, tmp_path: Path) -> None:
    inv, store = _inv(tmp_path, "c1")
    email = _create(inv, store)
    member = f"serviceAccount:{email}"
    [sent] = iam.set_policies()
    assert sent["version"] == 3
    assert iam_rules.check_grants("c1", member, sent, iam.roles, "runs/c1") == []
    role = next(r.id for r in inv.resources if r.kind == "iam-custom-role").rsplit("/", 1)[1]
    assert role.startswith("mgpu_ctl_c1_") and len(role) <= 64
    for bad, words in [
        ({"role": "roles/editor", "members": [member]}, "project-wide role"),
        ({"role": f"projects/{PROJECT}/roles/{role}", "members": [member]}, "without a condition"),
        (bindings(PROJECT, ZONE, "other", member, f"projects/{PROJECT}/roles/{role}", STORE)[0],
         "does not name c1"),
        (bindings(PROJECT, ZONE, "c1", member, "x", parse_url("gs://ckpt/elsewhere"))[1],
         "store's folder"),
    ]:
        found = iam_rules.check_grants("c1", member, {"bindings": [bad]}, iam.roles, "runs/c1")
        assert any(words in v for v in found), (words, found)
    wide = {f"projects/{PROJECT}/roles/{role}": {"includedPermissions": ["compute.*"]}}
    found = iam_rules.check_grants("c1", member, sent, wide, "runs/c1")
    assert any("beyond replacing a node" in v for v in found)


def test_recorded_then_deleted_by_down(iam: FakeIam, tmp_path: Path) -> None:
    inv, store = _inv(tmp_path, "c1")
    _create(inv, store)
    assert sorted(r.kind for r in inv.resources) == [
        "iam-binding", "iam-binding", "iam-custom-role", "service-account"]
    GcpProvider().destroy(inv, store)
    assert inv.resources == [] and iam.accounts == {}
    assert all(r.get("deleted") for r in iam.roles.values())
    assert [b["role"] for b in iam.policy["bindings"]] == ["roles/owner"]  # others' untouched
    # the same name again at once (a new cluster): a new role id (the fake, like IAM, refuses
    # a deleted role's id)
    inv2, store2 = _inv(tmp_path / "again", "c1")
    _create(inv2, store2)
    GcpProvider().destroy(inv2, store2)
    assert len(iam.roles) == 2


def test_a_failure_half_way_is_rolled_back(iam: FakeIam, tmp_path: Path) -> None:
    inv, store = _inv(tmp_path, "c2")
    iam.fail("POST", r":setIamPolicy$", 409)  # a concurrent edit of the project's policy
    with pytest.raises(IamError, match="409"):
        _create(inv, store)
    assert {r.kind for r in inv.resources} == {"service-account", "iam-custom-role",
                                                "iam-binding"}
    GcpProvider().destroy(inv, store)  # the pipeline's rollback
    assert inv.resources == [] and iam.accounts == {}


def test_gc_finds_and_deletes_what_no_inventory_knows(iam: FakeIam, tmp_path: Path) -> None:
    inv, store = _inv(tmp_path, "lost")
    _create(inv, store)
    spec = build_cluster_spec({}, {"name": "gc-scope", "provider": "gcp",
                                   "gcp": {"project": PROJECT, "zone": ZONE}})
    provider = GcpProvider()
    found = [r for r in provider.orphans(spec, known={"c1"}) if r.name == "lost"]
    assert sorted(r.kind for r in found) == ["iam-binding", "iam-binding", "iam-custom-role",
                                             "service-account"]
    assert [r for r in provider.orphans(spec, known={"lost"}) if r.name == "lost"] == []
    provider.delete_orphans(spec, found)
    assert iam.accounts == {} and [b["role"] for b in iam.policy["bindings"]] == ["roles/owner"]


def test_an_account_that_cannot_be_deleted_is_named(iam: FakeIam, tmp_path: Path) -> None:
    inv, store = _inv(tmp_path, "c3")
    _create(inv, store)
    iam.fail("DELETE", r"/serviceAccounts/", 403)
    with pytest.raises(TeardownError, match="service account"):
        GcpProvider().destroy(inv, store)
    assert [r.kind for r in inv.resources] == ["service-account"]
