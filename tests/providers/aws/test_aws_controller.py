"""The AWS controller's identity (issue 18): role, cluster-only inline policy and instance
profile are created (recorded as they exist), rolled back, deleted by `down` and found by `gc`
under moto's IAM, and the policy SENT obeys iam_rules (every rule can fail)."""

from __future__ import annotations

import json
from pathlib import Path

import aws_iam_rules as iam_rules
import pytest

from provision.cluster.providers.aws.clients import make_client, new_session
from provision.cluster.providers.aws.controller import controller_policy, create_identity, role_name
from provision.cluster.providers.aws.provider import AwsProvider
from provision.model.errors import TeardownError
from provision.model.inventory import Inventory, InventoryStore
from provision.model.spec import build_cluster_spec
from remote.store import parse_url

STORE = parse_url("s3://ckpt-bucket/runs")
ACCOUNT = "123456789012"  # moto's


def policy(cluster: str = "c1") -> dict:
    return controller_policy(cluster, "us-east-1", "123456789012", STORE)


def test_the_policy_names_only_the_cluster() -> None:
    assert iam_rules.check_policy("c1", policy(), "runs/c1") == []
    assert len(role_name("a" * 40)) <= 64


@pytest.mark.parametrize(("change", "words"), [
    (lambda st: st[1].update(Action="*"), "wildcard action"),
    (lambda st: st[1].update(Action=["ec2:*"]), "wildcard action"),
    (lambda st: st[1].pop("Condition"), "not limited to resources tagged"),
    (lambda st: st[1]["Condition"]["StringEquals"].update(
        {"aws:ResourceTag/mgpu-cloud-cluster": "other"}), "not limited"),
    (lambda st: st[4].update(Resource="*"), "Resource '*'"),
    (lambda st: st[6].update(Resource=["arn:aws:s3:::ckpt-bucket/*"]), "outside the store"),
    (lambda st: st[7].pop("Condition"), "without an s3:prefix"),
])
def test_each_policy_rule_can_fail(change, words) -> None:
    doc = policy()
    change(doc["Statement"])
    found = iam_rules.check_policy("c1", doc, "runs/c1")
    assert any(words in v for v in found), found


def _inventory(tmp_path: Path, name: str) -> tuple[Inventory, InventoryStore]:
    store = InventoryStore(tmp_path / "home")
    spec = build_cluster_spec({}, {"name": name, "provider": "aws", "ssh_cidr": "203.0.113.7/32",
                                   "aws": {"region": "us-east-1"}})
    inv = Inventory(name=name, provider="aws", spec=spec, key_path=str(tmp_path / "k"))
    store.create(inv)
    return inv, store


def _iam() -> object:
    return make_client(new_session(), "iam", "us-east-1")


def test_created_recorded_and_deleted_by_down(fakes, tmp_path: Path) -> None:
    inv, store = _inventory(tmp_path, "c1")
    iam = _iam()
    create_identity(iam, "c1", policy(), lambda r: store.record(inv, r), account=ACCOUNT)
    assert sorted(r.kind for r in inv.resources) == ["iam-instance-profile", "iam-role"]
    [sent] = fakes.calls("PutRolePolicy")
    assert iam_rules.check_policy("c1", json.loads(sent["PolicyDocument"]), "runs/c1") == []
    role = iam.get_role(RoleName="mgpu-ctl-c1")["Role"]
    assert role["Path"] == "/mgpu-cloud/"
    assert {"Key": "mgpu-cloud-cluster", "Value": "c1"} in iam.list_role_tags(
        RoleName="mgpu-ctl-c1")["Tags"]
    prof = iam.get_instance_profile(InstanceProfileName="mgpu-ctl-c1")["InstanceProfile"]
    assert [r["RoleName"] for r in prof["Roles"]] == ["mgpu-ctl-c1"]
    AwsProvider().destroy(inv, store)
    assert inv.resources == []
    assert iam.list_roles(PathPrefix="/mgpu-cloud/")["Roles"] == []
    assert iam.list_instance_profiles(PathPrefix="/mgpu-cloud/")["InstanceProfiles"] == []
    AwsProvider().destroy(inv, store)  # idempotent


def test_a_failure_half_way_is_rolled_back_from_the_records(fakes, tmp_path: Path) -> None:
    inv, store = _inventory(tmp_path, "c2")
    fakes.fail("AddRoleToInstanceProfile", "LimitExceeded", 409)
    with pytest.raises(Exception, match="LimitExceeded"):
        create_identity(_iam(), "c2", policy("c2"), lambda r: store.record(inv, r),
                        account=ACCOUNT)
    assert len(inv.resources) == 2  # both recorded before the failing call
    AwsProvider().destroy(inv, store)  # what the pipeline's rollback calls
    assert inv.resources == [] and _iam().list_roles(PathPrefix="/mgpu-cloud/")["Roles"] == []


def test_gc_finds_and_deletes_an_identity_no_inventory_knows(fakes, tmp_path: Path) -> None:
    create_identity(_iam(), "lost", policy("lost"), lambda r: None, account=ACCOUNT)
    spec = build_cluster_spec({}, {"name": "gc-scope", "provider": "aws",
                                   "aws": {"region": "us-east-1"}})
    provider = AwsProvider()
    found = provider.orphans(spec, known={"c1"})
    assert sorted((r.kind, r.id, r.name) for r in found) == [
        ("iam-instance-profile", "mgpu-ctl-lost", "lost"), ("iam-role", "mgpu-ctl-lost", "lost")]
    assert provider.orphans(spec, known={"lost"}) == []
    provider.delete_orphans(spec, found)
    assert provider.orphans(spec, known=set()) == []


def test_a_role_that_cannot_be_deleted_is_named(fakes, tmp_path: Path) -> None:
    inv, store = _inventory(tmp_path, "c3")
    create_identity(_iam(), "c3", policy("c3"), lambda r: store.record(inv, r),
                    account=ACCOUNT)
    fakes.fail("DeleteRole", "AccessDenied", 403)
    with pytest.raises(TeardownError, match="role mgpu-ctl-c3"):
        AwsProvider().destroy(inv, store)
    assert [r.kind for r in inv.resources] == ["iam-role"]  # kept for the next `down`
