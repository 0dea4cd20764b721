"""Capacity: which errors move `up` to the next zone or region (errors.py's code tables), and
--regions (the plan says where, in which order, at what price; create fails over across
regions, cleaning up each region it leaves)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import PROJECT, writes
from fake_compute import FakeCompute

from provision.cluster import pipeline
from provision.cluster.providers import get_provider
from provision.model.errors import CapacityError, ProvisionError, UserInputError
from provision.model.inventory import Inventory, InventoryStore
from provision.model.spec import ClusterSpec

MakeSpec = Callable[..., ClusterSpec]
Up = Callable[[ClusterSpec], Inventory]
BULK_A = r"zones/us-central1-a/instances/bulkInsert$"


@pytest.mark.parametrize("code", ["UNSUPPORTED_OPERATION", "GPU_STOCKOUT", "RESOURCE_NOT_READY",
                                  "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                                  "insufficientCapacity"])
def test_each_zone_capacity_code_fails_over_to_the_next_zone(
        fake: FakeCompute, make_spec: MakeSpec, up: Up, code: str) -> None:
    fake.fail_operation("POST", r"zones/us-central1-a/instances/c1-node-0$", code,
                        http_status=503)
    inv = up(make_spec())
    assert {n.zone for n in inv.nodes} == {"us-central1-c"}
    assert [k[1] for k in fake.instances] == ["us-central1-c", "us-central1-c"]


def test_bulk_inserts_503_insufficient_capacity_is_not_retried_in_place(
        fake: FakeCompute, make_spec: MakeSpec, up: Up) -> None:
    """"Troubleshoot bulk VM creation": HTTP 503 reason insufficientCapacity: another zone.
    Before, a 503 was retried MAX_ATTEMPTS times in the same zone and then ended `up`."""
    fake.fail("POST", BULK_A, 503, reason="insufficientCapacity", times=99)
    inv = up(make_spec())
    assert {n.zone for n in inv.nodes} == {"us-central1-c"}
    assert len(fake.sent("POST", BULK_A)) == 1


def test_a_region_wide_shortage_skips_the_regions_other_zones(
        fake: FakeCompute, make_spec: MakeSpec, up: Up) -> None:
    fake.fail_operation("POST", r"zones/us-central1-a/instances/c1-node-0$",
                        "REGION_RESOURCE_POOL_EXHAUSTED", http_status=503)
    with pytest.raises(CapacityError, match="REGION_RESOURCE_POOL_EXHAUSTED") as info:
        up(make_spec())
    assert "--regions any" in (info.value.hint or "")
    assert fake.sent("POST", r"zones/us-central1-c/instances/bulkInsert$") == []
    assert fake.all_resources() == []


def test_other_operation_errors_stop_at_once(fake: FakeCompute, make_spec: MakeSpec,
                                             up: Up) -> None:
    fake.fail_operation("POST", r"zones/us-central1-a/instances/c1-node-0$", "INVALID_USAGE")
    with pytest.raises(ProvisionError, match="INVALID_USAGE") as info:
        up(make_spec())
    assert not isinstance(info.value, CapacityError)
    assert fake.sent("POST", r"zones/us-central1-c/instances/bulkInsert$") == []


# --- --regions ---------------------------------------------------------------------------------
def test_the_plan_says_where_it_will_try_in_which_order_at_what_price(
        fake: FakeCompute, make_spec: MakeSpec) -> None:
    plan = get_provider("gcp").plan(make_spec(gcp={"regions": "europe-west4"}))
    layout = plan.layout  # type: ignore[attr-defined]
    assert [(r.region, r.zones) for r in layout.attempts] == [
        ("us-central1", ["us-central1-a", "us-central1-c", "us-central1-f"]),
        ("europe-west4", ["europe-west4-a"])]
    assert layout.regions_after[0].price_usd_hour is None  # no regional price in the catalog
    note = next(n for n in plan.notes if n.startswith("--regions"))
    assert ("us-central1 (us-central1-a, us-central1-c, us-central1-f; $81.16/h) -> "
            "europe-west4 (europe-west4-a; price not in the catalog)") in note
    assert writes(fake) == []
    # one aggregated list finds every zone offering the type (no get per zone)
    assert len(fake.sent("GET", r"aggregated/machineTypes$")) == 1
    assert fake.sent("GET", r"zones/[^/]+/machineTypes/") == []


def test_any_means_every_region_offering_the_type(make_spec: MakeSpec) -> None:
    layout = get_provider("gcp").plan(make_spec(
        gcp={"zone": "europe-west4-a", "regions": "any"})).layout  # type: ignore[attr-defined]
    assert [r.region for r in layout.attempts] == ["europe-west4", "us-central1"]
    assert layout.regions_after[0].price_usd_hour is not None  # us-central1: catalog prices


@pytest.mark.parametrize(("regions", "words"), [
    ("asia-east1", r"asia-east1 offer\(s\) no a2-ultragpu-8g"),
])
def test_a_region_without_the_type_is_refused_at_plan_time(
        fake: FakeCompute, make_spec: MakeSpec, regions: str, words: str) -> None:
    with pytest.raises(UserInputError, match=words):
        get_provider("gcp").plan(make_spec(gcp={"regions": regions}))
    assert writes(fake) == []


def test_bad_region_names_are_refused_by_the_spec(make_spec: MakeSpec) -> None:
    from provision.model.errors import SpecError

    with pytest.raises(SpecError, match="not a region name"):
        make_spec(gcp={"regions": "us-central1-a"})
    with pytest.raises(SpecError, match="stands alone"):
        make_spec(gcp={"regions": ["any", "us-central1"]})


def test_no_capacity_in_the_first_region_fails_over_to_the_next(
        fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore) -> None:
    fake.stockout("us-central1-a", "us-central1-c", "us-central1-f")
    inv = up(make_spec(gcp={"regions": "europe-west4"}))
    assert {n.zone for n in inv.nodes} == {"europe-west4-a"}
    # the first region's policy was deleted before the next region's was made
    assert sorted(fake.all_resources()) == [
        "firewall c1-internal", "firewall c1-ssh", "instance europe-west4-a/c1-node-0",
        "instance europe-west4-a/c1-node-1", "policy europe-west4/c1-compact"]
    posts = [w for w in writes(fake) if "resourcePolicies" in w]
    assert posts == [f"POST projects/{PROJECT}/regions/us-central1/resourcePolicies",
                     f"DELETE projects/{PROJECT}/regions/us-central1/resourcePolicies/c1-compact",
                     f"POST projects/{PROJECT}/regions/europe-west4/resourcePolicies"]
    assert {r.region for r in store.load("c1").resources if r.region} == {"europe-west4"}
    get_provider("gcp").replace(inv, store, inv.nodes[0])  # a replacement stays in the region
    assert fake.sent("POST", r"zones/europe-west4-a/instances/bulkInsert$")[-1]
    pipeline.down("c1", store=store, log=lambda m: None)
    assert fake.all_resources() == []


def test_a_region_wide_shortage_moves_to_the_next_region_with_regions(
        fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore) -> None:
    """REGION_RESOURCE_POOL_EXHAUSTED in the first zone: the region's other zones are not
    tried (the shortage is region-wide), the next --regions region is."""
    fake.fail_operation("POST", r"zones/us-central1-a/instances/c1-node-0$",
                        "REGION_RESOURCE_POOL_EXHAUSTED", http_status=503)
    inv = up(make_spec(gcp={"regions": "europe-west4"}))
    assert {n.zone for n in inv.nodes} == {"europe-west4-a"}
    assert fake.sent("POST", r"zones/us-central1-[cf]/instances/bulkInsert$") == []
    assert len(fake.sent("POST", r"zones/europe-west4-a/instances/bulkInsert$")) == 1
    assert {r.region for r in store.load("c1").resources if r.region} == {"europe-west4"}
    pipeline.down("c1", store=store, log=lambda m: None)
    assert fake.all_resources() == []


def test_gpudirect_subnets_follow_the_region(fake: FakeCompute, make_spec: MakeSpec, up: Up,
                                             store: InventoryStore) -> None:
    fake.zones["europe-west4-a"].append("a3-highgpu-8g")
    fake.stockout("us-central1-a", "us-central1-c")
    up(make_spec(gcp={"machine_type": "a3-highgpu-8g", "regions": "europe-west4"}))
    subnets = sorted(r for r in fake.all_resources() if r.startswith("subnetwork"))
    assert subnets == [f"subnetwork europe-west4/c1-gpunet-{k}" for k in range(4)]
    pipeline.down("c1", store=store, log=lambda m: None)
    assert fake.all_resources() == []


def test_no_region_with_capacity_names_every_zone_and_leaves_nothing(
        fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore) -> None:
    fake.stockout("us-central1-a", "us-central1-c", "us-central1-f", "europe-west4-a")
    with pytest.raises(CapacityError, match="us-central1-f .*europe-west4-a"):
        up(make_spec(gcp={"regions": "any"}))
    assert fake.all_resources() == [] and not store.exists("c1")
