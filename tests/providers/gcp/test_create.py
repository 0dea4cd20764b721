"""create(): what is sent to Compute, zone failover, retries, and rollback at every write step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from conftest import PROJECT
from fake_compute import FakeCompute

from provision.cluster.providers.gcp.clients import MAX_ATTEMPTS
from provision.model.errors import CapacityError, ProvisionError, TeardownError
from provision.model.inventory import CLUSTER_TAG, Inventory, InventoryStore
from provision.model.spec import ClusterSpec

MakeSpec = Callable[..., ClusterSpec]
Up = Callable[[ClusterSpec], Inventory]
BULK = r"zones/us-central1-a/instances/bulkInsert$"


def bodies(fake: FakeCompute, pattern: str) -> list[Any]:
    return [r.body for r in fake.sent("POST", pattern)]


def metadata(body: dict[str, Any]) -> dict[str, str]:
    return {i["key"]: i["value"] for i in body["metadata"]["items"]}


def assert_firewalls(fake: FakeCompute) -> None:
    """The two firewalls: ssh from the caller's range, all traffic inside the cluster."""
    ssh_fw, internal_fw = bodies(fake, r"global/firewalls$")
    assert ssh_fw["name"] == "c1-ssh"
    assert ssh_fw["sourceRanges"] == ["203.0.113.0/24"]
    assert ssh_fw["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]
    assert ssh_fw["targetTags"] == ["mgpu-cloud-c1"]
    assert internal_fw["allowed"] == [{"IPProtocol": "all"}]
    assert internal_fw["sourceTags"] == internal_fw["targetTags"] == ["mgpu-cloud-c1"]
    assert "sourceRanges" not in internal_fw
    for fw in (ssh_fw, internal_fw):
        assert fw["description"] == f"{CLUSTER_TAG}=c1"


def assert_saved_inventory(saved: Inventory) -> None:
    """The inventory of a 3-node a2 cluster: nodes, keys, node-side settings."""
    assert [n.name for n in saved.nodes] == ["node-0", "node-1", "node-2"]
    node = saved.nodes[1]
    assert (node.rank, node.user, node.slots, node.zone) == (1, "mgpu", 8, "us-central1-a")
    assert node.resource_id == "c1-node-1"
    assert node.address.startswith("203.0.113.") and node.private_address.startswith("10.128.")
    assert node.host_key is not None and node.host_key.startswith("ssh-ed25519 AAAA")
    assert len(node.host_key.split()) == 2
    assert saved.key_path and saved.key_path.endswith("keys/c1/id_ed25519")
    assert saved.wait_for_gpu and saved.manage_etc_hosts
    assert saved.container_image == "nvcr.io/nvidia/pytorch:24.06-py3"
    assert saved.nccl_env["NCCL_IB_DISABLE"] == "1"
    assert saved.fabric is None  # a2: no row in the fabric table, `--fabric-check auto` skips it
    # on-demand too: host maintenance ends GPU VMs (no live migration) with a notice
    assert saved.preemption is not None
    assert (saved.preemption.protocol, saved.preemption.url) == ("gcp",
                                                                 "http://metadata.google.internal")
    assert saved.hourly_cost_usd > 0
    kinds = sorted(r.kind for r in saved.resources)
    assert kinds == ["firewall", "firewall", "instance", "instance", "instance", "resource-policy"]
    assert all(r.extra["project"] == PROJECT for r in saved.resources)


def test_up_sends_compact_policy_terminate_labels_and_firewalls(
    fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore
) -> None:
    inv = up(make_spec(nodes=3, max_hours=2))

    (policy,) = bodies(fake, r"regions/us-central1/resourcePolicies$")
    assert policy["groupPlacementPolicy"] == {"collocation": "COLLOCATED", "vmCount": 3}
    assert policy["description"] == f"{CLUSTER_TAG}=c1"

    # one bulkInsert for all nodes, all or nothing
    (bulk,) = bodies(fake, BULK)
    assert bulk["count"] == bulk["minCount"] == "3"
    assert sorted(bulk["perInstanceProperties"]) == ["c1-node-0", "c1-node-1", "c1-node-2"]
    body = bulk["instanceProperties"]
    assert body["resourcePolicies"] == ["c1-compact"]  # a name, as InstanceProperties wants
    assert body["scheduling"] == {
        "onHostMaintenance": "TERMINATE", "automaticRestart": False,
        "provisioningModel": "STANDARD", "instanceTerminationAction": "DELETE",
        "maxRunDuration": {"seconds": "7200"},
    }
    assert body["labels"] == {CLUSTER_TAG: "c1"}
    disk = body["disks"][0]
    assert disk["boot"] and disk["autoDelete"]
    assert disk["initializeParams"]["labels"] == {CLUSTER_TAG: "c1"}
    assert disk["initializeParams"]["diskType"] == "pd-balanced"
    assert "deeplearning-platform-release/global/images/common-cu129-ubuntu-2404-nvidia-580" in \
        disk["initializeParams"]["sourceImage"]
    assert body["machineType"] == "a2-ultragpu-8g"
    assert "guestAccelerators" not in body  # a2 carries its GPUs
    nic = body["networkInterfaces"][0]
    assert nic["nicType"] == "GVNIC" and nic["accessConfigs"][0]["type"] == "ONE_TO_ONE_NAT"
    assert body["tags"]["items"] == ["mgpu-cloud-c1"]
    meta = metadata(body)
    assert meta["ssh-keys"].startswith("mgpu:ssh-ed25519 ")
    assert meta["enable-guest-attributes"] == "TRUE"  # the VM publishes its own host keys
    assert "PRIVATE KEY" not in str(body)  # no key material travels (the rules check it too)
    # each node's pinned key is the one its VM published, read through the API
    for rank, node in enumerate(inv.nodes):
        published = fake.host_keys[(PROJECT, "us-central1-a", f"c1-node-{rank}")]
        assert node.host_key == published["ssh-ed25519"]
        assert node.host_key not in str(body)
    assert fake.sent("POST", r"/instances$") == []  # no single inserts

    assert_firewalls(fake)

    # every insert carries a requestId, every one different
    inserts = [r for r in fake.requests if r.method == "POST" and not r.path.endswith("/wait")]
    rids = [r.query.get("requestId") for r in inserts]
    assert all(rids) and len(set(rids)) == len(rids) == 4  # policy, 2 firewalls, 1 bulkInsert

    # the inventory: nodes, keys, node-side settings
    assert_saved_inventory(store.load("c1"))


def test_operations_are_waited_on_through_our_own_clients(
    fake: FakeCompute, make_spec: MakeSpec, up: Up
) -> None:
    fake.pending_polls = 2  # each operation needs three waits
    up(make_spec())
    waits = [r.path for r in fake.requests if r.path.endswith("/wait")]
    assert len(waits) == 4 * 3  # policy + 2 firewalls + 1 bulkInsert
    assert any("/regions/us-central1/operations/" in w for w in waits)
    assert any("/global/operations/" in w for w in waits)
    assert any("/zones/us-central1-a/operations/" in w for w in waits)


def test_spot_keeps_terminate_and_deletes_on_preemption(
    fake: FakeCompute, make_spec: MakeSpec, up: Up
) -> None:
    up(make_spec(spot=True))
    for body in bodies(fake, BULK):
        sched = body["instanceProperties"]["scheduling"]
        assert sched["provisioningModel"] == "SPOT"
        assert sched["instanceTerminationAction"] == "DELETE"
        assert sched["onHostMaintenance"] == "TERMINATE"
        assert sched["automaticRestart"] is False
        assert sched["maxRunDuration"] == {"seconds": str(8 * 3600)}


def test_n1_gets_guest_accelerators(fake: FakeCompute, make_spec: MakeSpec, up: Up) -> None:
    inv = up(make_spec(gcp={"machine_type": "n1-standard-8", "accelerator_type": "nvidia-tesla-t4",
                            "accelerator_count": 2}))
    (body,) = bodies(fake, BULK)
    assert body["instanceProperties"]["guestAccelerators"] == [{
        "acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 2,
    }]
    assert [n.slots for n in inv.nodes] == [2, 2]


def test_stockout_fails_over_to_the_next_zone(
    fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore
) -> None:
    fake.stockout("us-central1-a")
    inv = up(make_spec())
    assert {n.zone for n in inv.nodes} == {"us-central1-c"}
    assert sorted(fake.all_resources()) == [
        "firewall c1-internal", "firewall c1-ssh", "instance us-central1-c/c1-node-0",
        "instance us-central1-c/c1-node-1", "policy us-central1/c1-compact",
    ]
    assert len(fake.sent("POST", BULK)) == 1
    (body,) = bodies(fake, r"zones/us-central1-c/instances/bulkInsert$")
    assert body["instanceProperties"]["resourcePolicies"] == ["c1-compact"]
    assert body["instanceProperties"]["machineType"] == "a2-ultragpu-8g"
    assert all(r.zone in (None, "us-central1-c") for r in store.load("c1").resources)


def test_zonal_quota_fails_over_but_regional_quota_does_not(
    fake: FakeCompute, make_spec: MakeSpec, up: Up
) -> None:
    zonal = [{"quotaInfo": {"metricName": "compute.googleapis.com/gpus",
                            "limitName": "GPUS-per-zone",
                            "dimensions": {"zone": "us-central1-a", "gpu_family": "A100"}}}]
    fake.fail_operation("POST", r"zones/us-central1-a/instances/", "QUOTA_EXCEEDED",
                        http_status=403, times=1, details=zonal)
    inv = up(make_spec())
    assert {n.zone for n in inv.nodes} == {"us-central1-c"}


def test_regional_quota_is_not_a_capacity_problem(
    fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore
) -> None:
    regional = [{"quotaInfo": {"metricName": "compute.googleapis.com/nvidia_a100_80gb_gpus",
                               "limitName": "NVIDIA-A100-80GB-GPUS-per-project-region",
                               "dimensions": {"region": "us-central1"}}}]
    fake.fail_operation("POST", r"zones/us-central1-a/instances/", "QUOTA_EXCEEDED",
                        http_status=403, times=1, details=regional)
    with pytest.raises(ProvisionError, match="QUOTA_EXCEEDED") as info:
        up(make_spec())
    assert not isinstance(info.value, CapacityError)
    assert "quota" in (info.value.hint or "")
    assert fake.sent("POST", r"zones/us-central1-c/instances/bulkInsert$") == []
    assert fake.all_resources() == []
    assert not store.exists("c1")


def test_no_capacity_anywhere_is_a_capacity_error_and_leaves_nothing(
    fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore
) -> None:
    fake.stockout("us-central1-a", "us-central1-c", "us-central1-f")
    with pytest.raises(CapacityError, match="us-central1-a .*us-central1-c .*us-central1-f"):
        up(make_spec())
    assert fake.all_resources() == []
    assert not store.exists("c1")


def test_429_and_5xx_are_retried(fake: FakeCompute, make_spec: MakeSpec, up: Up) -> None:
    fake.fail("POST", BULK, 429, times=2, reason="rateLimitExceeded")
    fake.fail("POST", r"resourcePolicies$", 503, times=1)
    fake.fail("POST", r"global/operations/.*/wait$", 500, times=1)
    fake.fail("GET", r"machineTypes/", 502, times=1)
    inv = up(make_spec())
    assert len(inv.nodes) == 2
    assert len(fake.all_resources()) == 5


def test_retried_insert_whose_reply_was_lost_makes_one_vm(
    fake: FakeCompute, make_spec: MakeSpec, up: Up
) -> None:
    # the server creates the nodes but the reply is a 503: the client retries the same requestId
    fake.fail("POST", BULK, 503, times=1, after=True)
    up(make_spec())
    sent = fake.sent("POST", BULK)
    assert len(sent) == 2
    assert sent[0].query["requestId"] == sent[1].query["requestId"]
    assert sorted(k[2] for k in fake.instances) == ["c1-node-0", "c1-node-1"]


# A fault at each write step: the cluster is rolled back and nothing is left anywhere.
FAULTS = {
    "policy insert 400": lambda f: f.fail("POST", r"resourcePolicies$", 400, reason="invalid"),
    "policy insert 5xx forever": lambda f: f.fail("POST", r"resourcePolicies$", 500, times=99),
    "policy operation error": lambda f: f.fail_operation("POST", r"resourcePolicies/",
                                                         "INVALID_USAGE"),
    "ssh firewall insert 400": lambda f: f.fail("POST", r"global/firewalls$", 400),
    "internal firewall operation error": lambda f: f.fail_operation(
        "POST", r"firewalls/c1-internal$", "INVALID_FIELD_VALUE"),
    # every retry of the firewall's operation wait (MAX_ATTEMPTS) answers 429
    "firewall wait 429 until retries run out": lambda f: f.fail(
        "POST", r"global/operations/.*/wait$", 429, times=MAX_ATTEMPTS),
    "bulk insert 400": lambda f: f.fail("POST", r"/instances/bulkInsert$", 400),
    "instance operation error": lambda f: f.fail_operation("POST", r"/instances/c1-node-0$",
                                                           "INTERNAL_ERROR", http_status=500),
    "instance list 500 forever": lambda f: f.fail("GET", r"zones/us-central1-a/instances$", 500,
                                                  times=99),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_at_each_write_step_leaves_nothing(
    fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore, fault: str
) -> None:
    FAULTS[fault](fake)
    with pytest.raises(ProvisionError):
        up(make_spec())
    assert fake.all_resources() == []
    assert not store.exists("c1")


def test_a_rollback_that_fails_keeps_the_inventory_for_down(
    fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore
) -> None:
    # every operation wait answers 429: creating fails, and so does deleting
    fake.fail("POST", r"global/operations/.*/wait$", 429, times=10_000)
    with pytest.raises(TeardownError, match="rolling back also failed") as info:
        up(make_spec())
    assert "HTTP 429" in str(info.value)
    assert store.exists("c1")  # what is left stays findable
    fake.faults.clear()
    from provision.cluster import pipeline

    pipeline.down("c1", store=store, log=lambda msg: None)
    assert fake.all_resources() == []
    assert not store.exists("c1")


def test_one_node_failing_makes_none(
    fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore
) -> None:
    """bulkInsert with minCount = count: one node that cannot be made means no node at all."""
    fake.fail_operation("POST", r"/instances/c1-node-1$", "INTERNAL_ERROR", http_status=500)
    with pytest.raises(ProvisionError, match="INTERNAL_ERROR"):
        up(make_spec())
    assert fake.all_resources() == [] and fake.instances == {}
    assert not store.exists("c1")


def test_a_conflicting_instance_name_is_not_ours_and_kept(
    fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore
) -> None:
    fake.instances[(PROJECT, "us-central1-a", "c1-node-1")] = {"name": "c1-node-1",
                                                               "labels": {}}
    with pytest.raises(ProvisionError, match="already exists"):
        up(make_spec())
    assert list(fake.instances) == [(PROJECT, "us-central1-a", "c1-node-1")]
    assert fake.sent("DELETE", r"instances/") == []
    assert not store.exists("c1")


def test_conflict_with_a_foreign_firewall_keeps_it(
    fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore
) -> None:
    fake.firewalls[(PROJECT, "c1-ssh")] = {"name": "c1-ssh", "description": "someone else's"}
    with pytest.raises(ProvisionError, match="already exists") as info:
        up(make_spec())
    assert "gc --provider gcp" in (info.value.hint or "")
    assert fake.all_resources() == ["firewall c1-ssh"]
    assert fake.sent("DELETE", r"firewalls/c1-ssh$") == []
    assert not store.exists("c1")
