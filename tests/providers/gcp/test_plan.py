"""plan(): read-only validation and the printed plan, against the fake."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import CALLER_IP, PROJECT, writes
from fake_compute import FakeCompute

from provision.cluster.providers import get_provider
from provision.cluster.providers.gcp.plan import GcpPlan, Layout, layout_to_plan
from provision.model.errors import SpecError, UserInputError
from provision.model.spec import ClusterSpec

MakeSpec = Callable[..., ClusterSpec]


def test_plan_describes_cluster_and_cost_without_writing(fake: FakeCompute, make_spec: MakeSpec) -> None:
    plan = get_provider("gcp").plan(make_spec())
    kinds = [(r.kind, r.name) for r in plan.resources]
    assert kinds == [
        ("resource-policy", "c1-compact"), ("firewall", "c1-ssh"), ("firewall", "c1-internal"),
        ("instance", "c1-node-0"), ("instance", "c1-node-1"),
    ]
    policy = plan.resources[0].details
    assert policy["collocation"] == "COLLOCATED" and policy["vm_count"] == "2"
    # failover candidates: zones of the region that offer a2-ultragpu-8g (not us-central1-b)
    assert policy["zones"] == "us-central1-a,us-central1-c,us-central1-f"
    assert plan.slots_per_node == 8
    assert plan.hourly_cost_usd == pytest.approx(2 * (40.55 + 0.1 * 200 / 730 + 0.005), abs=0.01)
    assert plan.unpriced == [] and plan.unresolved == []
    assert "skypilot" not in plan.price_source.lower() or "2026" in plan.price_source
    assert plan.max_hours == 8.0  # the stated default
    text = plan.render()
    assert "default; set --max-hours" in text and "$/hour" not in text and "/hour" in text
    node = plan.resources[3].details
    assert node["image_family"] == "common-cu129-ubuntu-2404-nvidia-580"
    assert node["image"].endswith("/images/common-cu129-ubuntu-2404-nvidia-580-v20260804")
    assert "boot image common-cu129-ubuntu-2404-nvidia-580-v20260804 from family" in text
    assert "internet: every node has an external IPv4 address" in text
    assert "one bulkInsert (minCount 2: all or none)" in text
    assert writes(fake) == []
    assert all(r.method == "GET" for r in fake.requests)


def test_plan_defaults_ssh_cidr_to_caller(make_spec: MakeSpec) -> None:
    spec = make_spec()
    spec.ssh_cidr = None
    plan = get_provider("gcp").plan(spec)
    ssh = next(r for r in plan.resources if r.name == "c1-ssh")
    assert ssh.details["source_ranges"] == f"{CALLER_IP}/32"


def test_typed_plan_round_trips_through_json() -> None:
    layout = Layout(cluster="c9", project="p", region="us-central1",
                    zones=["us-central1-c", "us-central1-a"], nodes=3, machine_type="n1-standard-8",
                    gpus=2, accelerator_type="nvidia-tesla-t4", slots=2,
                    image="https://x/images/i", image_family="f", disk_gb=100, spot=True,
                    max_hours=1.5,
                    ssh_cidr="10.0.0.0/8")
    plan = layout_to_plan(layout, max_hours_defaulted=False)
    assert plan.layout == layout
    assert GcpPlan.model_validate_json(plan.model_dump_json()).layout == layout


@pytest.mark.parametrize(
    ("overrides", "error", "words"),
    [
        ({"gcp": {"zone": "us-central1-z"}}, UserInputError, "unknown zone"),
        ({"gcp": {"zone": "mars"}}, UserInputError, "not a Compute Engine zone"),
        ({"gcp": {"zone": "asia-east9-a"}}, UserInputError, "unknown zone"),
        ({"gcp": {"machine_type": "a9-hypergpu-8g"}}, UserInputError, "does not exist in zone"),
        ({"gcp": {"machine_type": "n1-standard-8"}}, UserInputError, "has no GPUs"),
        ({"gcp": {"machine_type": "n1-standard-8", "accelerator_type": "nvidia-h200"}},
         UserInputError, "accelerator type"),
        ({"gcp": {"accelerator_type": "nvidia-tesla-t4"}}, UserInputError, "already has 8 GPU"),
        ({"gcp": {"image_family": "no-such-family"}}, UserInputError,
         "tried: no-such-family: not found"),
    ],
)
def test_bad_input_is_refused_before_any_write(
    fake: FakeCompute, make_spec: MakeSpec, overrides: dict[str, object],
    error: type[Exception], words: str,
) -> None:
    with pytest.raises(error, match=words):
        get_provider("gcp").plan(make_spec(**overrides))
    assert writes(fake) == []


def test_no_project_is_a_clear_error(fake: FakeCompute, make_spec: MakeSpec) -> None:
    spec = make_spec()
    spec.gcp.project = None
    with pytest.raises(UserInputError, match="no Google Cloud project") as info:
        get_provider("gcp").plan(spec)
    assert "--project" in (info.value.hint or "")
    assert fake.requests == []


def test_without_credentials_the_plan_is_made_offline(
    fake: FakeCompute, make_spec: MakeSpec, monkeypatch: pytest.MonkeyPatch, store: object
) -> None:
    monkeypatch.delenv("MGPU_CLOUD_GCP_ENDPOINT")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/adc.json")
    spec = make_spec(nodes=3, gcp={"machine_type": "a3-megagpu-8g"})
    plan = get_provider("gcp").plan(spec)
    assert fake.requests == []  # nothing asked of Compute
    assert plan.hourly_cost_usd == pytest.approx(3 * (92.21 + 0.1 * 200 / 730 + 0.005), abs=0.01)
    unresolved = " | ".join(plan.unresolved)
    assert "boot image (family common-cu129-ubuntu-2404-nvidia-580 or a fallback" in unresolved
    assert "failover zones" in unresolved
    assert "gcloud auth application-default login" in unresolved
    assert plan.slots_per_node == 8
    assert "unresolved: boot image" in plan.render()
    from provision.cluster import pipeline
    from provision.model.errors import ProviderUnavailableError

    with pytest.raises(ProviderUnavailableError, match="this plan cannot be created"):
        pipeline.up(spec, confirm=lambda p: True, store=store, bootstrap=False,  # type: ignore[arg-type]
                    log=lambda m: None)
    assert fake.requests == []


def test_offline_plan_of_an_unknown_machine_type_lists_the_known_ones(
    make_spec: MakeSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MGPU_CLOUD_GCP_ENDPOINT")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/adc.json")
    with pytest.raises(UserInputError, match="not in the offline catalog") as info:
        get_provider("gcp").plan(make_spec(gcp={"machine_type": "z9-weird-8g"}))
    assert "a3-ultragpu-8g" in (info.value.hint or "")


# --- the boot image: a current Deep Learning VM family, with fallbacks ---------------------------
def test_a_gone_family_falls_back_to_the_next(fake: FakeCompute, make_spec: MakeSpec) -> None:
    del fake.images["deeplearning-platform-release"]["common-cu129-ubuntu-2404-nvidia-580"]
    plan = get_provider("gcp").plan(make_spec())
    layout = plan.layout
    assert layout.image_family == "pytorch-2-9-cu129-ubuntu-2404-nvidia-580"
    assert layout.image_tried == ["common-cu129-ubuntu-2404-nvidia-580: not found"]
    assert "skipped: common-cu129-ubuntu-2404-nvidia-580: not found" in plan.render()
    tried = [r.path.rsplit("/", 1)[-1] for r in fake.requests if "images/family" in r.path]
    assert tried == ["common-cu129-ubuntu-2404-nvidia-580",
                     "pytorch-2-9-cu129-ubuntu-2404-nvidia-580"]


def test_obsolete_and_deprecated_families_are_skipped(fake: FakeCompute,
                                                      make_spec: MakeSpec) -> None:
    families = fake.images["deeplearning-platform-release"]
    families["common-cu129-ubuntu-2404-nvidia-580"] = "OBSOLETE"
    families["pytorch-2-9-cu129-ubuntu-2404-nvidia-580"] = "DEPRECATED"
    del families["common-cu129-ubuntu-2204-nvidia-580"]  # not found
    del families["pytorch-2-9-cu129-ubuntu-2204-nvidia-580"]
    families["pytorch-2-7-cu128-ubuntu-2204-nvidia-570"] = "READY"
    layout = get_provider("gcp").plan(make_spec()).layout
    assert layout.image_family == "pytorch-2-7-cu128-ubuntu-2204-nvidia-570"
    assert layout.image_tried[0].endswith("is OBSOLETE")
    assert layout.image_tried[1].endswith("is DEPRECATED")


def test_a_deprecated_image_is_used_when_nothing_newer_works(fake: FakeCompute,
                                                            make_spec: MakeSpec) -> None:
    fake.images["deeplearning-platform-release"] = {
        "common-cu128-ubuntu-2204-nvidia-570": "DEPRECATED"}
    layout = get_provider("gcp").plan(make_spec()).layout
    assert layout.image_family == "common-cu128-ubuntu-2204-nvidia-570"
    assert any("DEPRECATED" in t for t in layout.image_tried)


def test_no_usable_family_names_everything_tried(fake: FakeCompute, make_spec: MakeSpec) -> None:
    from provision.cluster.providers.gcp.images import DEFAULT_IMAGE_FAMILIES

    fake.images["deeplearning-platform-release"] = {"common-cu121-debian-11-py310": "OBSOLETE"}
    with pytest.raises(UserInputError) as info:
        get_provider("gcp").plan(make_spec())
    message = info.value.message
    assert all(f in message for f in DEFAULT_IMAGE_FAMILIES)
    assert "common-cu121-debian-11-py310: common-cu121-debian-11-py310-v20260804 is OBSOLETE" \
        in message
    assert "gcloud compute images list" in (info.value.hint or "")
    assert writes(fake) == []


def test_an_explicit_family_has_no_fallback(fake: FakeCompute, make_spec: MakeSpec) -> None:
    with pytest.raises(UserInputError, match="tried: common-cu121-debian-11-py310: not found") \
            as info:
        get_provider("gcp").plan(make_spec(gcp={"image_family": "common-cu121-debian-11-py310"}))
    assert "leave --image-family out" in (info.value.hint or "")


# --- prices -----------------------------------------------------------------------------------
def test_unknown_spot_price_is_planned_as_price_unknown(make_spec: MakeSpec) -> None:
    plan = get_provider("gcp").plan(make_spec(spot=True))  # a2-ultragpu-8g spot
    assert plan.unpriced and "a2-ultragpu-8g (spot)" in plan.unpriced[0]
    assert plan.hourly_cost_usd == pytest.approx(2 * (0.1 * 200 / 730 + 0.0025), abs=0.001)
    assert "cost: price unknown" in plan.render()


@pytest.mark.parametrize(("machine_type", "on_demand", "spot"), [
    ("a3-megagpu-8g", 92.21, 28.17), ("a3-ultragpu-8g", 86.76, 40.99),
    ("a2-highgpu-8g", 29.387, 14.431),
])
def test_catalog_prices_have_a_source_and_date(fake: FakeCompute, make_spec: MakeSpec,
                                               machine_type: str, on_demand: float,
                                               spot: float) -> None:
    fake.networks_quota = 16
    # a3-ultra: not sold on demand (flex-start shows the on-demand upper bound); its Hyperdisk
    # boot disk has no price in the catalog
    flex = {"flex_start": True} if machine_type.startswith("a3-ultragpu") else {}
    disk = 0.0 if flex else 0.1 * 200 / 730
    for is_spot, price in ((False, on_demand), (True, spot)):
        plan = get_provider("gcp").plan(make_spec(spot=is_spot, gcp={
            "machine_type": machine_type, **({} if is_spot else flex)}))
        ip = 0.0025 if is_spot else 0.005
        assert plan.hourly_cost_usd == pytest.approx(2 * (price + disk + ip), abs=0.01)
        assert "SkyPilot GCP catalog v8" in plan.price_source and "2026-08-21" in plan.price_source


def test_bad_cidr_is_refused_by_the_spec(make_spec: MakeSpec) -> None:
    with pytest.raises(SpecError, match="not a CIDR"):
        make_spec(ssh_cidr="my-laptop")


def test_guest_accelerators_for_n1(make_spec: MakeSpec) -> None:
    spec = make_spec(gcp={"machine_type": "n1-standard-8", "accelerator_type": "nvidia-tesla-t4",
                          "accelerator_count": 2})
    plan = get_provider("gcp").plan(spec)
    node = next(r for r in plan.resources if r.kind == "instance").details
    assert node["accelerator"] == "nvidia-tesla-t4" and node["gpus"] == "2"
    assert plan.slots_per_node == 2
    assert plan.resources[0].details["zones"] == "us-central1-a,us-central1-b"
    assert plan.hourly_cost_usd == pytest.approx(
        2 * (0.38 + 2 * 0.35 + 0.1 * 200 / 730 + 0.005), abs=0.01)
    assert PROJECT == plan.resources[0].details["project"]


def test_ubuntu_2404_dlvm_families_come_first_and_2204_is_their_fallback(
        fake: FakeCompute, make_spec: MakeSpec) -> None:
    families = fake.images["deeplearning-platform-release"]
    assert get_provider("gcp").plan(make_spec()).layout.image_family == \
        "common-cu129-ubuntu-2404-nvidia-580"
    del families["common-cu129-ubuntu-2404-nvidia-580"]
    del families["pytorch-2-9-cu129-ubuntu-2404-nvidia-580"]
    layout = get_provider("gcp").plan(make_spec()).layout
    assert layout.image_family == "common-cu129-ubuntu-2204-nvidia-580"
    assert layout.image_tried == ["common-cu129-ubuntu-2404-nvidia-580: not found",
                                  "pytorch-2-9-cu129-ubuntu-2404-nvidia-580: not found"]
