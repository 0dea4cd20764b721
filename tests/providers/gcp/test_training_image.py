"""The training container on GCP follows the GPUs as Compute describes them (the same rule as
AWS, provision/nodes/container.py): B200 VMs (a4-highgpu-8g) get a CUDA 12.8+ image, an
`--image` too old for them is refused at plan time, before anything is written."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import writes
from fake_compute import FakeCompute

from provision.cluster.providers import get_provider
from provision.model.errors import UserInputError
from provision.model.inventory import Inventory
from provision.model.spec import ClusterSpec
from provision.nodes.container import BLACKWELL_TRAINING_IMAGE, DEFAULT_TRAINING_IMAGE

MakeSpec = Callable[..., ClusterSpec]
A4 = {"gcp": {"machine_type": "a4-highgpu-8g"}, "spot": True}  # a4: no on-demand


def _details(plan) -> dict[str, str]:
    return next(r.details for r in plan.resources if r.kind == "instance")


def test_b200_vms_get_the_blackwell_default_image(fake: FakeCompute, make_spec: MakeSpec,
                                                  up: Callable[[ClusterSpec], Inventory]) -> None:
    plan = get_provider("gcp").plan(make_spec(**A4))
    assert _details(plan)["training_image"] == BLACKWELL_TRAINING_IMAGE
    inv = up(make_spec(**A4))
    assert inv.container_image == BLACKWELL_TRAINING_IMAGE  # what bootstrap pulls
    assert inv.gpu_model == "nvidia-b200"  # a job's own --image is checked against it


def test_an_image_too_old_for_b200_is_refused_before_anything_is_written(
        fake: FakeCompute, make_spec: MakeSpec) -> None:
    spec = make_spec(**A4, image="nvcr.io/nvidia/pytorch:24.06-py3")
    with pytest.raises(UserInputError, match="need CUDA 12.8 or newer") as err:
        get_provider("gcp").plan(spec)
    assert "a4-highgpu-8g" in err.value.message and BLACKWELL_TRAINING_IMAGE in err.value.hint
    assert writes(fake) == []


def test_hopper_and_ampere_keep_the_default_and_an_explicit_image_is_used(
        fake: FakeCompute, make_spec: MakeSpec) -> None:
    a3 = get_provider("gcp").plan(make_spec(gcp={"machine_type": "a3-highgpu-8g"}))
    assert _details(a3)["training_image"] == DEFAULT_TRAINING_IMAGE
    mine = get_provider("gcp").plan(make_spec(image="my.registry/train:7"))
    assert _details(mine)["training_image"] == "my.registry/train:7"


def test_offline_plan_takes_the_gpus_from_the_catalog(
        fake: FakeCompute, make_spec: MakeSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MGPU_CLOUD_GCP_ENDPOINT")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/adc.json")
    plan = get_provider("gcp").plan(make_spec(gcp={"machine_type": "a3-highgpu-8g"}))
    assert plan.unresolved and fake.requests == []
    assert _details(plan)["training_image"] == DEFAULT_TRAINING_IMAGE
    assert plan.layout.gpu_model == "nvidia-h100-80gb"
