"""plan(): read-only validation and the printed plan, against the fake."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import CALLER_IP, PROJECT, writes
from fake_compute import FakeCompute

from provision.errors import ProviderUnavailableError, SpecError, UserInputError
from provision.providers import get_provider
from provision.providers.gcp.plan import GcpPlan, Layout, layout_to_plan
from provision.spec import ClusterSpec

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
    assert plan.hourly_cost_usd == pytest.approx(2 * (40.55 + 0.1 * 200 / 730), abs=0.01)
    assert plan.max_hours == 8.0  # the stated default
    text = plan.render()
    assert "default; set --max-hours" in text and "$/hour" not in text and "/hour" in text
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
                    image="https://x/images/i", disk_gb=100, spot=True, max_hours=1.5,
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
        ({"gcp": {"image_family": "no-such-family"}}, UserInputError, "image family"),
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


def test_missing_credentials_is_a_clear_error(
    fake: FakeCompute, make_spec: MakeSpec, monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.delenv("MGPU_CLOUD_GCP_ENDPOINT")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/adc.json")
    with pytest.raises(ProviderUnavailableError, match="credentials") as info:
        get_provider("gcp").plan(make_spec())
    assert "gcloud auth application-default login" in (info.value.hint or "")
    assert fake.requests == []


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
    assert plan.hourly_cost_usd == pytest.approx(2 * (0.38 + 2 * 0.35 + 0.1 * 200 / 730), abs=0.01)
    assert PROJECT == plan.resources[0].details["project"]
