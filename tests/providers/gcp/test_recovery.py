"""Recovery against the Compute fake: node_alive and replace (contract.Recoverable). The rules
layer checks the replacement's requests and, after it, that the compact policy holds exactly
vmCount VMs again."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from conftest import PROJECT
from fake_compute import FakeCompute

from provision.cluster import pipeline
from provision.cluster.providers import get_provider
from provision.cluster.providers.contract import Recoverable
from provision.model.errors import CapacityError
from provision.model.inventory import Inventory, InventoryStore
from provision.model.spec import ClusterSpec

MakeSpec = Callable[..., ClusterSpec]
Up = Callable[[ClusterSpec], Inventory]
BULK = r"zones/us-central1-a/instances/bulkInsert$"
INSERT = r"zones/us-central1-a/instances$"


def _hours_ago(hours: float) -> str:
    return (dt.datetime.now(dt.UTC) - dt.timedelta(hours=hours)).isoformat(timespec="seconds")


def _props(body: dict[str, Any]) -> dict[str, Any]:
    return dict(body["instanceProperties"])


def _as_props(instance: dict[str, Any]) -> dict[str, Any]:
    """An instances.insert body as the InstanceProperties it was made from: without its name,
    and names where the Instance resource takes URLs."""
    props = {k: v for k, v in instance.items() if k != "name"}
    props["machineType"] = props["machineType"].rsplit("/", 1)[-1]
    props["resourcePolicies"] = [p.rsplit("/", 1)[-1] for p in props["resourcePolicies"]]
    for disk in props["disks"]:
        disk["initializeParams"]["diskType"] = disk["initializeParams"]["diskType"].rsplit(
            "/", 1)[-1]
    return props


def test_replace_deletes_the_old_vm_first_then_makes_one_like_it(
    fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore
) -> None:
    inv = up(make_spec(spot=True, max_hours=2))
    provider = get_provider("gcp")
    assert isinstance(provider, Recoverable)
    old = inv.nodes[1]
    inv.created_at = _hours_ago(1)  # an hour of the cluster's 2 is left
    start = len(fake.requests)

    new = provider.replace(inv, store, old)

    writes = [(r.method, r.path) for r in fake.requests[start:]
              if r.method in ("POST", "DELETE") and not r.path.endswith("/wait")]
    # one VM by instances.insert, named (not a bulkInsert of the zone's collection: the
    # controller's resource-name condition can allow only the former)
    assert writes == [("DELETE", f"projects/{PROJECT}/zones/us-central1-a/instances/c1-node-1"),
                      ("POST", f"projects/{PROJECT}/zones/us-central1-a/instances")]
    (first,) = (r.body for r in fake.sent("POST", BULK))
    (again,) = (r.body for r in fake.sent("POST", INSERT))
    assert again["name"] == "c1-node-1"
    assert again["machineType"] == "zones/us-central1-a/machineTypes/a2-ultragpu-8g"
    assert again["resourcePolicies"] == ["regions/us-central1/resourcePolicies/c1-compact"]
    assert not [r for r in fake.requests[start:]  # read back by instances.get, no list
                if r.method == "GET" and r.path.endswith("/instances")]
    before, after = _props(first), _as_props(again)
    assert int(after["scheduling"].pop("maxRunDuration")["seconds"]) in range(3500, 3601)
    assert int(before["scheduling"].pop("maxRunDuration")["seconds"]) == 7200
    old_meta = {i["key"]: i["value"] for i in before.pop("metadata")["items"]}
    new_meta = {i["key"]: i["value"] for i in after.pop("metadata")["items"]}
    assert after == before  # policy, image, machine type, NICs, scheduling, labels, tags
    assert new_meta["ssh-keys"] == old_meta["ssh-keys"]
    assert new.host_key and new.host_key != old.host_key
    # the new VM made its own keys; the one it published is pinned, none was sent to it
    assert new.host_key == fake.host_keys[(PROJECT, "us-central1-a", "c1-node-1")]["ssh-ed25519"]
    new_meta.pop("startup-script"), old_meta.pop("startup-script")  # maxRunDuration differs
    assert new_meta == old_meta and "PRIVATE KEY" not in str(again)
    assert (new.name, new.rank, new.zone, new.resource_id) == (old.name, 1, old.zone, "c1-node-1")
    assert store.load("c1").nodes[1] == new
    instances = store.load("c1").resources_of("instance")
    assert sorted(r.name for r in instances) == ["c1-node-0", "c1-node-1"]
    assert all("common-cu129" in r.extra["image"] for r in instances)
    assert sorted(k[2] for k in fake.instances) == ["c1-node-0", "c1-node-1"]

    pipeline.down("c1", store=store, log=lambda m: None)
    assert fake.all_resources() == [] and not store.exists("c1")


def test_no_capacity_for_a_replacement_is_clear_and_leaves_nothing_half_made(
    fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore
) -> None:
    inv = up(make_spec())
    for rec in inv.resources_of("instance"):  # an inventory from before images were recorded
        rec.extra.pop("image")
    fake.stockout("us-central1-a")
    with pytest.raises(CapacityError) as err:
        get_provider("gcp").replace(inv, store, inv.nodes[1])
    assert "node-1" in str(err.value) and "us-central1-a" in str(err.value)
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in str(err.value)
    (first,) = (r.body["instanceProperties"] for r in fake.sent("POST", BULK))
    (again,) = (r.body for r in fake.sent("POST", INSERT))  # one zone

    def image(body: dict[str, Any]) -> str:
        return str(body["disks"][0]["initializeParams"]["sourceImage"])

    assert image(again) == image(first)  # resolved from the family again
    saved = store.load("c1")
    assert [r.name for r in saved.resources_of("instance")] == ["c1-node-0"]
    assert [k[2] for k in fake.instances] == ["c1-node-0"]
    pipeline.down("c1", store=store, log=lambda m: None)
    assert fake.all_resources() == []


def test_node_alive_says_false_only_when_compute_says_the_vm_is_gone(
    fake: FakeCompute, make_spec: MakeSpec, up: Up
) -> None:
    inv = up(make_spec())
    provider = get_provider("gcp")
    node0, node1 = inv.nodes
    assert provider.node_alive(inv, node0) and provider.node_alive(inv, node1)
    fake.instances[(PROJECT, "us-central1-a", "c1-node-0")]["status"] = "TERMINATED"
    del fake.instances[(PROJECT, "us-central1-a", "c1-node-1")]
    assert not provider.node_alive(inv, node0) and not provider.node_alive(inv, node1)
    fake.instances[(PROJECT, "us-central1-a", "c1-node-0")]["status"] = "REPAIRING"
    assert provider.node_alive(inv, node0)  # may come back: cannot tell
    fake.fail("GET", r"instances/c1-node-1$", 500, times=99)  # Compute cannot be asked
    assert provider.node_alive(inv, node1)
