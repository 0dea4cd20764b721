"""destroy / down / gc against the fake: order, idempotency, label lookup, failures."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import PROJECT
from fake_compute import FakeCompute
from typer.testing import CliRunner

from provision.cli import app
from provision.cluster import pipeline
from provision.cluster.providers import get_provider
from provision.model.errors import TeardownError
from provision.model.inventory import CLUSTER_TAG, Inventory, InventoryStore
from provision.model.spec import ClusterSpec

MakeSpec = Callable[..., ClusterSpec]
Up = Callable[[ClusterSpec], Inventory]


def test_down_deletes_instances_then_policy_then_firewalls(
    fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore
) -> None:
    up(make_spec())
    fake.requests.clear()
    pipeline.down("c1", store=store, log=lambda m: None)
    deletes = [r.path.rsplit("/", 2)[-2] for r in fake.requests if r.method == "DELETE"]
    assert deletes == ["instances", "instances", "resourcePolicies", "firewalls", "firewalls"]
    assert fake.all_resources() == []
    assert not store.exists("c1")


def test_destroy_is_idempotent(fake: FakeCompute, make_spec: MakeSpec, up: Up,
                               store: InventoryStore) -> None:
    inv = up(make_spec())
    copy = inv.model_copy(deep=True)
    provider = get_provider("gcp")
    provider.destroy(inv, store)
    assert inv.resources == [] and fake.all_resources() == []
    copy.name = "c1"
    provider.destroy(copy, store)  # everything already gone: NotFound is not an error
    assert copy.resources == []


def test_destroy_finds_unrecorded_labelled_instances(
    fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore
) -> None:
    inv = up(make_spec())
    stray = dict(fake.instances[(PROJECT, "us-central1-a", "c1-node-0")], name="c1-stray")
    stray["resourcePolicies"] = []
    fake.instances[(PROJECT, "us-central1-f", "c1-stray")] = dict(
        stray, zone=f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/us-central1-f")
    get_provider("gcp").destroy(inv, store)
    assert fake.all_resources() == []


def test_failed_instance_delete_keeps_the_rest_and_the_inventory(
    fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore
) -> None:
    up(make_spec())
    fake.fail("DELETE", r"instances/c1-node-1$", 400, times=1, reason="invalid")
    with pytest.raises(TeardownError, match="c1-node-1"):
        pipeline.down("c1", store=store, log=lambda m: None)
    left = store.load("c1")
    assert sorted(r.kind for r in left.resources) == [
        "firewall", "firewall", "instance", "resource-policy"]
    assert fake.sent("DELETE", r"resourcePolicies/") == []  # still used by node-1
    pipeline.down("c1", store=store, log=lambda m: None)  # the fault is gone: finishes
    assert fake.all_resources() == [] and not store.exists("c1")


def test_gc_lists_and_deletes_resources_no_inventory_knows(
    fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore
) -> None:
    up(make_spec(name="lost", gcp={"machine_type": "a3-highgpu-8g"}))  # + GPUDirect networks
    store.delete("lost")  # the inventory is gone, the cloud resources are not
    up(make_spec(name="kept"))
    fake.firewalls[(PROJECT, "unrelated")] = {"name": "unrelated", "description": "not ours"}

    runner = CliRunner()
    res = runner.invoke(app, ["gc", "--provider", "gcp", "--project", PROJECT])
    assert res.exit_code == 0, res.output
    listed = [line.split("\t")[1] for line in res.stdout.splitlines() if "\t" in line]
    assert sorted(listed) == sorted([
        "zones/us-central1-a/instances/lost-node-0", "zones/us-central1-a/instances/lost-node-1",
        "regions/us-central1/resourcePolicies/lost-compact", "global/firewalls/lost-ssh",
        "global/firewalls/lost-internal",
        *[f"global/networks/lost-gpunet-{k}" for k in range(4)],
        *[f"regions/us-central1/subnetworks/lost-gpunet-{k}" for k in range(4)],
        *[f"global/firewalls/lost-gpunet-{k}-internal" for k in range(4)],
    ])
    res = runner.invoke(app, ["gc", "--provider", "gcp", "--project", PROJECT,
                              "--zone", "us-central1-a", "--delete"])
    assert res.exit_code == 0, res.output
    left = fake.all_resources()
    assert not [r for r in left if "lost" in r]
    assert len([r for r in left if "kept" in r]) == 5 and "firewall unrelated" in left
    instances = [v for v in fake.instances.values()]
    assert all(v["labels"][CLUSTER_TAG] == "kept" for v in instances)


def test_a_record_of_a_kind_gcp_does_not_make_is_a_teardown_error_not_a_crash(
    fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore
) -> None:
    """Before: `ValueError: unknown GCP resource kind` escaped the error tree (a traceback)."""
    from provision.model.inventory import ResourceRecord

    inv = up(make_spec())
    store.record(inv, ResourceRecord(kind="bucket", id="global/buckets/b1", name="b1",
                                     extra={"project": PROJECT}))
    with pytest.raises(TeardownError, match="records it as a 'bucket'") as info:
        pipeline.down("c1", store=store, log=lambda m: None)
    assert "does not make" in str(info.value)
    assert fake.all_resources() == []  # everything else was deleted
    assert [r.kind for r in store.load("c1").resources] == ["bucket"]  # kept for `down`
