"""The GCP controller VM (issue 18) against the Compute fake (and the IAM fake): made with its
identity at the first managed hand-off, recorded before its insert, deleted by `down`, rolled
back, found by `gc`; from inside it deletes the cluster but itself, then itself. Every Compute
request a replacement and the teardown from inside make is allowed by the custom role and its
condition as SENT (gcp_iam_rules.denied), and the condition names nothing but the cluster's."""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess

import gcp_iam_rules as iam_rules
import pytest
from conftest import PROJECT
from fake_compute import FakeCompute
from fake_iam import FakeIam

from provision.cluster.providers import get_provider
from provision.cluster.providers.contract import Supervising
from provision.cluster.providers.controller_boot import READY
from provision.cluster.providers.gcp.controller import bindings, condition
from provision.cluster.providers.gcp.controller_vm import IMAGE, is_controller
from provision.model.inventory import Inventory

ZONE = "us-central1-a"
INSERT = r"zones/us-central1-a/instances$"


def _hours_ago(hours: float) -> str:
    return (dt.datetime.now(dt.UTC) - dt.timedelta(hours=hours)).isoformat(timespec="seconds")


def _up(up, make_spec, **over) -> Inventory:
    inv = up(make_spec(max_hours=2, **over))
    inv.spec = inv.spec.model_copy(update={"store": "gs://ckpt/runs"})
    return inv


def _role(iam: FakeIam, inv: Inventory) -> tuple[list[str], str]:
    role = next(r.id for r in inv.resources if r.kind == "iam-custom-role")
    (sent,) = iam.set_policies()
    (cond,) = [b["condition"]["expression"] for b in sent["bindings"] if b["role"] == role]
    return list(iam.roles[role]["includedPermissions"]), cond


def test_the_controller_is_a_small_vm_beside_the_nodes(fake: FakeCompute, iam: FakeIam, up,
                                                       make_spec, store) -> None:
    inv = _up(up, make_spec)
    provider = get_provider("gcp")
    assert isinstance(provider, Supervising)
    ctl = provider.create_controller(inv, store)

    (sent,) = fake.sent("POST", INSERT)
    body = sent.body
    assert body["name"] == "c1-controller" and body["machineType"].endswith("/e2-small")
    assert "resourcePolicies" not in body  # never under the compact policy
    assert body["tags"]["items"] == ["mgpu-cloud-c1"]  # the cluster's firewall rules
    assert body["disks"][0]["initializeParams"]["sourceImage"] == IMAGE
    (sa,) = body["serviceAccounts"]
    email = next(r.id for r in inv.resources if r.kind == "service-account")
    assert sa["email"] == email
    meta = {i["key"]: i["value"] for i in body["metadata"]["items"]}
    assert meta["enable-guest-attributes"] == "TRUE" and "PRIVATE KEY" not in str(meta)
    assert READY in meta["startup-script"] and "google-cloud-storage==" in meta["startup-script"]
    if shutil.which("sh"):
        subprocess.run(["sh", "-n"], input=meta["startup-script"].encode(), check=True)
    assert body["scheduling"]["instanceTerminationAction"] == "DELETE"
    assert 7100 < int(body["scheduling"]["maxRunDuration"]["seconds"]) <= 7200
    # recorded: identity, then the VM (before its insert), saved
    saved = store.load("c1")
    rec = next(r for r in saved.resources if is_controller(r))
    assert rec.name == "c1-controller" and rec.extra["ready_file"] == READY
    # its own host key from its guest attributes; its external address
    inst = fake.instances[(PROJECT, ZONE, "c1-controller")]
    assert ctl.address == inst["networkInterfaces"][0]["accessConfigs"][0]["natIP"]
    assert ctl.host_key and ctl.host_key in str(fake.host_keys[(PROJECT, ZONE, "c1-controller")])
    permissions, cond = _role(iam, inv)
    member = f"serviceAccount:{email}"
    assert iam_rules.check_grants("c1", member, iam.set_policies()[0], iam.roles, "runs/c1") == []


def test_the_machine_type_is_overridable(fake: FakeCompute, iam: FakeIam, up, make_spec,
                                         store) -> None:
    inv = _up(up, make_spec, gcp={"controller_machine_type": "n1-standard-4"})
    get_provider("gcp").create_controller(inv, store)
    (sent,) = fake.sent("POST", INSERT)
    assert sent.body["machineType"].endswith("/n1-standard-4")


def test_down_deletes_the_controller_and_its_identity(fake: FakeCompute, iam: FakeIam, up,
                                                      make_spec, store) -> None:
    inv = _up(up, make_spec)
    provider = get_provider("gcp")
    provider.create_controller(inv, store)
    provider.destroy(inv, store)
    assert inv.resources == [] and fake.all_resources() == [] and iam.accounts == {}


def test_a_controller_that_cannot_be_made_is_rolled_back(fake: FakeCompute, iam: FakeIam, up,
                                                         make_spec, store) -> None:
    inv = _up(up, make_spec)
    fake.fail("POST", INSERT, 403)
    provider = get_provider("gcp")
    with pytest.raises(Exception, match="403|ermission"):
        provider.create_controller(inv, store)
    assert "service-account" in {r.kind for r in store.load("c1").resources}
    provider.destroy(inv, store)
    assert inv.resources == [] and fake.all_resources() == [] and iam.accounts == {}


def test_gc_collects_a_controller_no_inventory_knows(fake: FakeCompute, iam: FakeIam, up,
                                                     make_spec, store) -> None:
    inv = _up(up, make_spec)
    provider = get_provider("gcp")
    provider.create_controller(inv, store)
    spec = make_spec(name="gc-scope")
    found = provider.orphans(spec, known=set())
    assert "zones/us-central1-a/instances/c1-controller" in {r.id for r in found}
    assert "service-account" in {r.kind for r in found}
    provider.delete_orphans(spec, found)
    assert fake.all_resources() == [] and iam.accounts == {}


def test_a_replacement_is_allowed_by_the_role_and_its_condition(
        fake: FakeCompute, iam: FakeIam, up, make_spec, store) -> None:
    inv = _up(up, make_spec)
    provider = get_provider("gcp")
    provider.create_controller(inv, store)
    inv.created_at = _hours_ago(0.5)
    permissions, cond = _role(iam, inv)
    start = len(fake.requests)
    provider.replace(inv, store, inv.nodes[1])
    made = [(r.method, r.path, r.body) for r in fake.requests[start:]]
    assert any("getGuestAttributes" in p for _, p, _ in made)
    assert iam_rules.denied(made, permissions, cond) == []
    # the audit's finding: without getGuestAttributes the new node's key cannot be read
    less = [p for p in permissions if p != "compute.instances.getGuestAttributes"]
    assert any("getGuestAttributes" in v for v in iam_rules.denied(made, less, cond))


def test_teardown_from_inside_leaves_only_the_controller(fake: FakeCompute, iam: FakeIam, up,
                                                         make_spec, store) -> None:
    inv = _up(up, make_spec)
    provider = get_provider("gcp")
    provider.create_controller(inv, store)
    permissions, cond = _role(iam, inv)
    start = len(fake.requests)
    provider.teardown_from_controller(inv, store)
    made = [(r.method, r.path, r.body) for r in fake.requests[start:]]
    assert iam_rules.denied(made, permissions, cond) == []
    assert fake.all_resources() == [f"instance {ZONE}/c1-controller"]
    kinds = sorted({r.kind for r in store.load("c1").resources})
    assert kinds == ["iam-binding", "iam-custom-role", "instance", "service-account"]
    provider.teardown_from_controller(inv, store)  # idempotent
    start = len(fake.requests)
    provider.remove_controller_from_inside(inv)
    made = [(r.method, r.path, r.body) for r in fake.requests[start:]]
    assert iam_rules.denied(made, permissions, cond) == []
    assert fake.all_resources() == []


def test_the_condition_names_only_the_clusters_resources() -> None:
    cond = condition(PROJECT, ZONE, "c1")
    assert "resource.type" not in cond
    z = f"projects/{PROJECT}/zones/{ZONE}"
    assert iam_rules.condition_allows(cond, f"{z}/instances/c1-node-3")
    assert iam_rules.condition_allows(cond, f"{z}/disks/c1-controller")
    for other in (f"{z}/disks/someone-elses", f"{z}/instances/c2-node-0",
                  f"projects/{PROJECT}/global/firewalls/default-allow-ssh",
                  f"projects/{PROJECT}/regions/us-central1/subnetworks/prod"):
        assert not iam_rules.condition_allows(cond, other), other
    member, role = "serviceAccount:x@p.iam", f"projects/{PROJECT}/roles/r"
    roles = {role: {"includedPermissions": ["compute.instances.get"]}}
    (b,) = bindings(PROJECT, ZONE, "c1", member, role, None)
    assert iam_rules.check_grants("c1", member, {"bindings": [b]}, roles, None) == []
    # main's condition (every non-instance resource of the project) is refused by the rules
    b["condition"]["expression"] = (f'resource.name.startsWith("{z}/instances/c1-") || '
                                    'resource.type != "compute.googleapis.com/Instance"')
    found = iam_rules.check_grants("c1", member, {"bindings": [b]}, roles, None)
    assert any("beyond resource names" in v for v in found), found
