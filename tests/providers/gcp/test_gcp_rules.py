"""The rules layer (gcp_rules.py): every rule can fail (a violating request or state per rule),
documented requests pass, and `up` with the longest name and every catalog machine type passes
through all of it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gcp_rules as rules
import pytest
from conftest import RulesLayer
from fake_compute import FakeCompute

from provision.cluster import pipeline
from provision.cluster.providers.gcp.catalog import gpu_machine_types
from provision.model.inventory import Inventory, InventoryStore
from provision.model.spec import ClusterSpec

LONGEST_NAME = "a" + "b" * 38 + "9"  # 40 characters, the most a cluster name may have
BULK = "projects/p/zones/us-central1-a/instances/bulkInsert"
INSERT = "projects/p/zones/us-central1-a/instances"
POLICY = "projects/p/regions/us-central1/resourcePolicies"


def props(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "machineType": "a2-ultragpu-8g", "labels": {"mgpu-cloud-cluster": "c1"},
        "resourcePolicies": ["c1-compact"],
        "scheduling": {"onHostMaintenance": "TERMINATE", "provisioningModel": "SPOT",
                       "instanceTerminationAction": "DELETE",
                       "maxRunDuration": {"seconds": "3600"}},
        "disks": [{"initializeParams": {"diskType": "pd-balanced", "labels": {"a": "b"}}}],
    }
    base.update(over)
    return base


def bulk(count: int = 2, **over: Any) -> dict[str, Any]:
    return {"count": str(count), "minCount": str(count),
            "perInstanceProperties": {f"c1-node-{i}": {} for i in range(count)},
            "instanceProperties": props(**over)}


STANDARD = {"onHostMaintenance": "TERMINATE", "provisioningModel": "STANDARD",
            "instanceTerminationAction": "DELETE", "maxRunDuration": {"seconds": "3600"}}
FLEX = {**STANDARD, "provisioningModel": "FLEX_START"}
NO_RES = {"consumeReservationType": "NO_RESERVATION"}
SPECIFIC = {"consumeReservationType": "SPECIFIC_RESERVATION",
            "key": "compute.googleapis.com/reservation-name", "values": ["r1"]}
POLICY_2 = ("POST", POLICY, {"name": "c1-compact",
                             "groupPlacementPolicy": {"collocation": "COLLOCATED",
                                                      "vmCount": 2}})


def check(*requests: tuple[str, str, Any]) -> list[str]:
    return rules.check_requests(list(requests))


@pytest.mark.parametrize(("request_", "words"), [
    (("POST", INSERT, dict(props(), name="C1-node-0")), "'C1-node-0' is not a valid"),
    (("POST", INSERT, dict(props(), name="a" * 64)), "is not a valid resource name"),
    (("POST", BULK, {**bulk(), "perInstanceProperties": {"c1-node-": {}, "c1-node-1": {}}}),
     "'c1-node-' is not a valid"),
    (("POST", POLICY, {"name": "9-compact"}), "'9-compact' is not a valid"),
    (("POST", "projects/p/global/firewalls", {"name": "c1_ssh"}), "'c1_ssh' is not a valid"),
    (("POST", BULK, bulk(labels={"Mgpu": "c1"})), "label key 'Mgpu'"),
    (("POST", BULK, bulk(labels={"1abc": "c1"})), "label key '1abc'"),
    (("POST", BULK, bulk(labels={"k": "v" * 64})), "label value"),
    (("POST", BULK, bulk(labels={f"k{i}": "v" for i in range(65)})), "65 labels"),
    (("POST", BULK, bulk(disks=[{"initializeParams": {"labels": {"k": "UPPER"}}}])),
     "label value 'UPPER'"),
    (("POST", BULK, bulk(scheduling={"onHostMaintenance": "MIGRATE"})), "GPUs with"),
    (("POST", INSERT, dict(props(machineType="zones/z/machineTypes/n1-standard-8",
                                 guestAccelerators=[{"acceleratorCount": 1}],
                                 scheduling={}), name="c1-node-0")), "GPUs with"),
    (("POST", BULK, bulk(scheduling={"onHostMaintenance": "TERMINATE",
                                     "maxRunDuration": {"seconds": "29"}})), "29 s outside"),
    (("POST", BULK, bulk(scheduling={"onHostMaintenance": "TERMINATE",
                                     "maxRunDuration": {"seconds": str(120 * 86400 + 1)}})),
     "outside 30 s .. 120 days"),
    (("POST", BULK, bulk(scheduling={"onHostMaintenance": "TERMINATE",
                                     "provisioningModel": "SPOT"})),
     "SPOT VM without an instanceTerminationAction"),
    (("POST", BULK, bulk(machineType="zones/us-central1-a/machineTypes/a2-ultragpu-8g")),
     "machineType 'zones/"),
    (("POST", BULK, bulk(resourcePolicies=[
        "projects/p/regions/us-central1/resourcePolicies/c1-compact"])), "resourcePolicies"),
    (("POST", BULK, bulk(disks=[{"initializeParams": {"diskType": "zones/z/diskTypes/pd"}}])),
     "diskType"),
    (("POST", BULK, bulk(guestAccelerators=[{"acceleratorType": "zones/z/acceleratorTypes/t4"}])),
     "acceleratorType"),
    (("POST", BULK, {**bulk(), "minCount": "3"}), "minCount 3 / count 2"),
    (("POST", INSERT, dict(props(resourcePolicies=[
        "projects/p/regions/europe-west4/resourcePolicies/c1-compact"]), name="c1-node-0")),
     "policy c1-compact of europe-west4 used by VMs in us-central1-a"),
    # what main sent before issue 19: the host's private key in the startup script
    (("POST", BULK, bulk(metadata={"items": [{"key": "startup-script", "value": (
        "cat > /etc/ssh/ssh_host_ed25519_key <<'K'\n-----BEGIN OPENSSH PRIVATE KEY-----\n"
        "b3BlbnNzaC1rZXktdjEA\n-----END OPENSSH PRIVATE KEY-----\nK\n")}]})),
     "metadata 'startup-script' carries a private key"),
    (("POST", BULK, bulk(machineType="a3-ultragpu-8g", scheduling=STANDARD,
                         disks=[{"initializeParams": {"diskType": "hyperdisk-balanced"}}])),
     "a3-ultragpu-8g on demand"),
    (("POST", BULK, bulk(machineType="a3-ultragpu-8g", scheduling=FLEX)),
     "a3-ultragpu-8g with a pd-balanced disk (Hyperdisk only)"),
    (("POST", BULK, bulk(scheduling={**FLEX, "maxRunDuration": {"seconds": str(8 * 86400)}},
                         reservationAffinity=NO_RES)), "FLEX_START with maxRunDuration 691200 s"),
    (("POST", BULK, bulk(scheduling={**FLEX, "instanceTerminationAction": None},
                         reservationAffinity=NO_RES)),
     "FLEX_START without an instanceTerminationAction"),
    (("POST", BULK, bulk(scheduling=FLEX)), "FLEX_START with reservation affinity ANY"),
    (("POST", BULK, bulk(scheduling=FLEX, reservationAffinity=NO_RES,
                         machineType="n1-standard-8",
                         guestAccelerators=[{"acceleratorCount": 1}])),
     "FLEX_START on n1-standard-8"),
    (("POST", BULK, bulk(reservationAffinity=SPECIFIC)), "a SPOT VM consuming a reservation"),
    (("POST", BULK, bulk(scheduling={**STANDARD, "provisioningModel": "RESERVATION_BOUND"})),
     "RESERVATION_BOUND without a specific reservation"),
    (("POST", BULK, bulk(scheduling=STANDARD, reservationAffinity={
        "consumeReservationType": "SPECIFIC_RESERVATION", "values": ["r1"]})),
     "SPECIFIC_RESERVATION needs key compute.googleapis.com/reservation-name"),
])
def test_each_request_rule_fails_on_a_violation(request_: tuple[str, str, Any],
                                                words: str) -> None:
    found = check(request_)
    assert any(words in v for v in found), found


def test_vm_count_must_match_the_vms_of_the_bulk_insert() -> None:
    found = check(POLICY_2, ("POST", BULK, bulk(count=3)))
    assert found == [f"{BULK}: policy c1-compact has vmCount 2, 3 VMs use it"]
    assert check(POLICY_2, ("POST", BULK, bulk(count=2))) == []


def test_a_replacement_joins_the_policy_only_after_the_vm_it_replaces_is_deleted() -> None:
    one = {**bulk(count=1), "perInstanceProperties": {"c1-node-1": {}}}
    delete = ("DELETE", f"{INSERT}/c1-node-1", None)
    assert check(POLICY_2, ("POST", BULK, bulk()), delete, ("POST", BULK, one)) == []
    other = {**one, "perInstanceProperties": {"c1-node-2": {}}}
    assert check(POLICY_2, ("POST", BULK, bulk()), ("POST", BULK, other)) == [
        f"{BULK}: policy c1-compact has vmCount 2, 3 VMs use it"]


def test_documented_requests_pass() -> None:
    assert check(
        POLICY_2, ("POST", "projects/p/global/firewalls", {"name": "c1-ssh"}),
        ("POST", BULK, bulk(scheduling={"onHostMaintenance": "TERMINATE",
                                        "provisioningModel": "STANDARD",
                                        "maxRunDuration": {"seconds": "30"}})),
        ("POST", BULK, bulk(labels={"k_" + "x" * 61: "v-" + "y" * 61})),
        ("POST", INSERT, dict(props(machineType="zones/z/machineTypes/n1-standard-8",
                                    scheduling={}, resourcePolicies=[]), name="n" * 63)),
        ("POST", BULK, bulk(scheduling={**FLEX, "maxRunDuration": {"seconds": "604800"}},
                            reservationAffinity=NO_RES, resourcePolicies=[])),
        ("POST", BULK, bulk(scheduling=STANDARD, reservationAffinity=SPECIFIC,
                            resourcePolicies=[])),
        ("POST", BULK, bulk(machineType="a3-ultragpu-8g", resourcePolicies=[],
                            scheduling={**STANDARD, "provisioningModel": "RESERVATION_BOUND"},
                            reservationAffinity=SPECIFIC,
                            disks=[{"initializeParams": {"diskType": "hyperdisk-balanced"}}])),
    ) == []


def test_state_rule_counts_the_vms_of_each_policy() -> None:
    link = "https://x/compute/v1/projects/p/regions/us-central1/resourcePolicies/c1-compact"
    policies = {("p", "us-central1", "c1-compact"): POLICY_2[2]}
    one = {("p", "us-central1-a", "c1-node-0"): {"resourcePolicies": [link]}}
    assert rules.check_state(one, policies) == ["policy c1-compact: vmCount 2, used by 1 VMs"]
    two = {**one, ("p", "europe-west4-a", "c1-node-1"): {"resourcePolicies": [link]}}
    assert rules.check_state(two, policies) == [
        "policy c1-compact of us-central1 used by c1-node-1 in europe-west4-a"]
    ok = {**one, ("p", "us-central1-a", "c1-node-1"): {"resourcePolicies": [link]}}
    assert rules.check_state(ok, policies) == []


def test_the_layer_sees_what_the_provider_sends(
    fake: FakeCompute, make_spec: Callable[..., ClusterSpec],
    up: Callable[[ClusterSpec], Inventory], gcp_rules_layer: RulesLayer,
) -> None:
    up(make_spec())
    assert gcp_rules_layer.creates_checked == 1
    fake.requests[-1].body = {"name": "BAD"}  # as if the provider had sent a bad name
    fake.requests[-1].method, fake.requests[-1].path = "POST", "projects/p/global/firewalls"
    assert [v for v in gcp_rules_layer.violations() if "'BAD'" in v]
    fake.requests.pop()  # seen: do not fail this test for it


# --- the longest name, every catalog machine type, spot: all through the rules ------------------
CATALOG = [(mt, {}) for mt in gpu_machine_types()] + [
    ("n1-standard-8", {"accelerator_type": "nvidia-tesla-t4", "accelerator_count": 2})]


@pytest.mark.parametrize("spot", [False, True])
@pytest.mark.parametrize(("machine_type", "extra"), CATALOG, ids=[mt for mt, _ in CATALOG])
def test_longest_name_and_every_catalog_type_pass_all_rules(
    fake: FakeCompute, make_spec: Callable[..., ClusterSpec],
    up: Callable[[ClusterSpec], Inventory], store: InventoryStore,
    gcp_rules_layer: RulesLayer, machine_type: str, extra: dict[str, Any], spot: bool,
) -> None:
    fake.networks_quota = 16  # a3-megagpu: 8 data networks
    if machine_type.startswith("a3-ultragpu") and not spot:
        extra = {**extra, "flex_start": True}  # not sold on demand
    spec = make_spec(name=LONGEST_NAME, spot=spot,
                     gcp={"machine_type": machine_type, **extra})
    inv = up(spec)
    assert gcp_rules_layer.creates_checked == 1
    assert len(inv.nodes) == 2 and all(n.address for n in inv.nodes)  # external address each
    (bulk_sent,) = fake.sent("POST", r"instances/bulkInsert$")
    assert sorted(bulk_sent.body["perInstanceProperties"]) == [
        f"{LONGEST_NAME}-node-0", f"{LONGEST_NAME}-node-1"]
    pipeline.down(LONGEST_NAME, store=store, log=lambda m: None)
    assert fake.all_resources() == []


# --- GPUDirect (a3): the data NICs as Google's A3 set-up has them -----------------------------
def _a3_setup(mtu: int = 8244, walls: bool = True) -> list[tuple[str, str, Any]]:
    reqs: list[tuple[str, str, Any]] = [POLICY_2]
    for k in range(4):
        net, cidr = f"c1-gpunet-{k}", f"10.0.{16 * k}.0/20"
        reqs.append(("POST", "projects/p/global/networks",
                     {"name": net, "mtu": mtu, "autoCreateSubnetworks": False}))
        reqs.append(("POST", "projects/p/regions/us-central1/subnetworks",
                     {"name": net, "network": f"global/networks/{net}", "ipCidrRange": cidr}))
        if walls:
            reqs.append(("POST", "projects/p/global/firewalls",
                         {"name": f"{net}-internal", "network": f"global/networks/{net}",
                          "sourceRanges": [cidr], "allowed": [{"IPProtocol": "tcp"}]}))
    return reqs


def _a3_nics(k: int = 4) -> list[dict[str, Any]]:
    nics: list[dict[str, Any]] = [{"network": "global/networks/default", "nicType": "GVNIC",
                                   "accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]}]
    return nics + [{"network": f"global/networks/c1-gpunet-{j}", "nicType": "GVNIC",
                    "subnetwork": f"regions/us-central1/subnetworks/c1-gpunet-{j}"}
                   for j in range(k)]


def _a3_bulk(nics: list[dict[str, Any]]) -> tuple[str, str, Any]:
    return ("POST", BULK, bulk(machineType="a3-highgpu-8g", networkInterfaces=nics))


@pytest.mark.parametrize(("setup", "nics", "words"), [
    (_a3_setup(), _a3_nics(3), "a3-highgpu-8g with 4 NICs; GPUDirect has 1 + 4"),
    (_a3_setup(), [*_a3_nics(3), _a3_nics()[1]], "NICs share a VPC network"),
    (_a3_setup(), [_a3_nics()[0], {**_a3_nics()[1], "nicType": "VIRTIO_NET"}, *_a3_nics()[2:]],
     "NIC 1 is 'VIRTIO_NET'"),
    (_a3_setup(), [*_a3_nics()[:4], {**_a3_nics()[4], "accessConfigs": [{}]}],
     "data NIC 4 has an external address"),
    (_a3_setup(mtu=1460), _a3_nics(), "network c1-gpunet-0 has MTU 1460"),
    (_a3_setup()[:1], _a3_nics(), "network c1-gpunet-0 was not created first"),
    (_a3_setup(walls=False), _a3_nics(), "no firewall rule lets c1-gpunet-3's subnet in"),
    ([("POST", "projects/p/global/networks", {"name": "n", "mtu": 9000})], None,
     "MTU 9000 outside 1300..8896"),
])
def test_the_gpudirect_rules_fail_on_each_violation(
        setup: list[tuple[str, str, Any]], nics: list[dict[str, Any]] | None, words: str) -> None:
    found = check(*setup, *([_a3_bulk(nics)] if nics is not None else []))
    assert any(words in v for v in found), found


def test_the_documented_a3_layout_passes() -> None:
    assert check(*_a3_setup(), _a3_bulk(_a3_nics())) == []
    assert check(POLICY_2, _a3_bulk(_a3_nics()[:1])) == []  # one NIC: no GPUDirect
