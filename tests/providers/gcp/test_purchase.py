"""How GPUs are bought on GCP: --reservation (SPECIFIC_RESERVATION), --flex-start (DWS),
a3-ultra (not on demand, Hyperdisk), the combinations Compute refuses (refused at plan time,
before anything is made), and the NETWORKS quota GPUDirect needs. The rules layer
(gcp_rules.purchase / disk_types) checks every request sent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from conftest import PROJECT, writes
from fake_compute import FakeCompute

from provision.cluster import pipeline
from provision.cluster.providers import get_provider
from provision.model.errors import ProvisionError, UserInputError
from provision.model.inventory import Inventory, InventoryStore
from provision.model.spec import ClusterSpec

MakeSpec = Callable[..., ClusterSpec]
Up = Callable[[ClusterSpec], Inventory]


def _zoneless(spec: ClusterSpec) -> ClusterSpec:
    """The spec without --zone (the reservation says where)."""
    from provision.cluster.providers.gcp.options import GcpOptions

    spec.options_as(GcpOptions).zone = None
    return spec


def _props(fake: FakeCompute) -> dict[str, Any]:
    (bulk,) = fake.sent("POST", r"instances/bulkInsert$")
    return dict(bulk.body["instanceProperties"])


# --- --reservation ------------------------------------------------------------------------------
def test_a_reservation_pins_its_zone_and_is_consumed_by_name(
        fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore) -> None:
    fake.add_reservation(PROJECT, "us-central1-f", "r1", "a2-ultragpu-8g", count=4, in_use=1)
    plan = get_provider("gcp").plan(_zoneless(make_spec(gcp={"reservation": "r1"})))
    layout = plan.layout  # type: ignore[attr-defined]
    assert layout.zones == ["us-central1-f"]  # the reservation's zone, no failover
    assert [r.kind for r in plan.resources].count("resource-policy") == 0
    assert any("consume reservation r1" in n for n in plan.notes)

    inv = up(_zoneless(make_spec(gcp={"reservation": "r1"})))
    props = _props(fake)
    assert props["reservationAffinity"] == {
        "consumeReservationType": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name", "values": ["r1"]}
    assert props["scheduling"]["provisioningModel"] == "STANDARD"
    assert "resourcePolicies" not in props  # the reservation places the VMs
    assert fake.sent("POST", r"resourcePolicies$") == []
    assert {n.zone for n in inv.nodes} == {"us-central1-f"}
    spec = fake.reservations[(PROJECT, "us-central1-f", "r1")]["specificReservation"]
    assert spec["inUseCount"] == "3"
    pipeline.down("c1", store=store, log=lambda m: None)
    assert spec["inUseCount"] == "1" and fake.all_resources() == []


@pytest.mark.parametrize(("reservation", "words"), [
    (("us-central1-a", "r1", "a2-highgpu-8g", 4, 0),
     "reservation r1 holds a2-highgpu-8g, not a2-ultragpu-8g"),
    (("us-central1-a", "r1", "a2-ultragpu-8g", 2, 1), "has 1 of 2 VMs free; 2 needed"),
    (None, "no reservation 'r1' in project"),
])
def test_a_reservation_that_cannot_hold_the_cluster_is_refused_at_plan_time(
        fake: FakeCompute, make_spec: MakeSpec, reservation: tuple[Any, ...] | None,
        words: str) -> None:
    if reservation is not None:
        fake.add_reservation(PROJECT, *reservation)
    with pytest.raises(UserInputError, match=words):
        get_provider("gcp").plan(_zoneless(make_spec(gcp={"reservation": "r1"})))
    assert writes(fake) == []


def test_a3_ultra_from_a_reservation_is_reservation_bound_on_hyperdisk(
        fake: FakeCompute, make_spec: MakeSpec, up: Up) -> None:
    fake.add_reservation(PROJECT, "us-central1-a", "ultra", "a3-ultragpu-8g", count=2)
    up(make_spec(gcp={"machine_type": "a3-ultragpu-8g",
                      "reservation": "projects/test-proj/reservations/ultra"}))
    props = _props(fake)
    assert props["scheduling"]["provisioningModel"] == "RESERVATION_BOUND"
    assert "maxRunDuration" not in props["scheduling"]  # the reservation's end ends them
    assert props["reservationAffinity"]["values"] == ["projects/test-proj/reservations/ultra"]
    assert props["disks"][0]["initializeParams"]["diskType"] == "hyperdisk-balanced"


# --- --flex-start --------------------------------------------------------------------------------
def test_flex_start_vms_have_the_documented_fields(fake: FakeCompute, make_spec: MakeSpec,
                                                   up: Up) -> None:
    up(make_spec(max_hours=48, gcp={"machine_type": "a3-ultragpu-8g", "flex_start": True}))
    props = _props(fake)
    assert props["scheduling"] == {
        "onHostMaintenance": "TERMINATE", "automaticRestart": False,
        "provisioningModel": "FLEX_START", "instanceTerminationAction": "DELETE",
        "maxRunDuration": {"seconds": str(48 * 3600)}}
    assert props["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}
    assert "resourcePolicies" not in props
    assert props["disks"][0]["initializeParams"]["diskType"] == "hyperdisk-balanced"


# --- combinations Compute refuses: refused before anything is asked or made --------------------
@pytest.mark.parametrize(("overrides", "words"), [
    ({"spot": True, "gcp": {"flex_start": True}}, "two provisioning models"),
    ({"spot": True, "gcp": {"reservation": "r1"}}, "Spot and flex-start VMs never consume"),
    ({"gcp": {"flex_start": True, "reservation": "r1"}}, "--reservation cannot be combined"),
    ({"max_hours": 200, "gcp": {"flex_start": True}}, "flex-start VMs run at most 168 h"),
    ({"gcp": {"flex_start": True, "machine_type": "n1-standard-8",
              "accelerator_type": "nvidia-tesla-t4"}}, "--flex-start is not offered"),
    ({"gcp": {"machine_type": "a3-ultragpu-8g"}}, "a3-ultragpu-8g is not sold on demand"),
    ({"gcp": {"reservation": "r1", "regions": "any"}}, "--regions cannot be combined"),
])
def test_combinations_compute_refuses_are_refused_at_plan_time(
        fake: FakeCompute, make_spec: MakeSpec, overrides: dict[str, Any], words: str) -> None:
    with pytest.raises(UserInputError, match=words):
        get_provider("gcp").plan(make_spec(**overrides))
    assert writes(fake) == []


def test_the_offline_plan_refuses_them_too(fake: FakeCompute, make_spec: MakeSpec,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MGPU_CLOUD_GCP_ENDPOINT")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/adc.json")
    with pytest.raises(UserInputError, match="not sold on demand") as info:
        get_provider("gcp").plan(make_spec(gcp={"machine_type": "a3-ultragpu-8g"}))
    assert "--spot, --flex-start or --reservation NAME" in (info.value.hint or "")


def test_reservation_names_are_checked_by_the_spec(make_spec: MakeSpec) -> None:
    from provision.model.errors import SpecError

    with pytest.raises(SpecError, match="not a reservation name"):
        make_spec(gcp={"reservation": "Bad_Name"})


# --- the NETWORKS quota for GPUDirect ------------------------------------------------------------
def test_too_small_a_networks_quota_is_refused_at_plan_time(
        fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore) -> None:
    """A new project has 5 networks (the default one among them); TCPXO needs 8 more. Before,
    `up` made 4 networks, failed on the 5th with QUOTA_EXCEEDED and rolled back."""
    with pytest.raises(UserInputError, match="needs 8 extra VPC networks") as info:
        up(make_spec(gcp={"machine_type": "a3-megagpu-8g"}))
    assert "NETWORKS quota of at least 9" in (info.value.hint or "")
    assert writes(fake) == [] and not store.exists("c1")
    fake.networks_quota = 9
    inv = up(make_spec(gcp={"machine_type": "a3-megagpu-8g"}))
    assert len(inv.nodes) == 2
    assert len(fake.sent("GET", r"projects/[^/]+$")) == 2  # one quota read per plan


def test_the_fake_refuses_networks_beyond_the_quota_as_compute_does(
        fake: FakeCompute, make_spec: MakeSpec, up: Up) -> None:
    """What a plan made before the quota check would meet: QUOTA_EXCEEDED on the 5th network."""
    from provision.cluster.providers.gcp import resolve

    fake.networks_quota = 4

    def no_check(*_: Any) -> None:
        return None

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(resolve, "_check_networks_quota", no_check)
        with pytest.raises(ProvisionError, match="QUOTA_EXCEEDED"):
            up(make_spec(gcp={"machine_type": "a3-highgpu-8g"}))
    assert fake.all_resources() == []
