"""The training image per GPU architecture (provision/container.py), provider-neutral: the
default follows the GPUs, and a known NGC PyTorch release too old for them is refused."""

from __future__ import annotations

import pytest

from provision.model.errors import UserInputError
from provision.nodes.container import (
    BLACKWELL_TRAINING_IMAGE,
    DEFAULT_TRAINING_IMAGE,
    check_image,
    default_image,
    gpu_architecture,
    ngc_pytorch_cuda_at_most,
)


@pytest.mark.parametrize(("model", "arch"), [
    ("NVIDIA B200", "blackwell"), ("nvidia-b200", "blackwell"), ("NVIDIA B300", "blackwell"),
    ("NVIDIA H100", "hopper"), ("nvidia-h100-80gb", "hopper"), ("NVIDIA H200", "hopper"),
    ("nvidia-tesla-a100", "ampere"), ("NVIDIA A10G", "ampere"), ("NVIDIA L4", "ada"),
    ("NVIDIA L40S", "ada"), ("NVIDIA V100", "volta"), ("nvidia-tesla-t4", "turing"),
])
def test_architecture_from_the_catalogs_spelling(model, arch):
    found = gpu_architecture(model)
    assert found is not None and found.name == arch


def test_blackwell_gets_a_cuda_12_8_image_the_others_keep_the_old_default():
    assert default_image("NVIDIA B200") == BLACKWELL_TRAINING_IMAGE == "nvcr.io/nvidia/pytorch:25.01-py3"
    assert default_image("NVIDIA H100") == DEFAULT_TRAINING_IMAGE
    assert default_image("Some Future GPU") == DEFAULT_TRAINING_IMAGE
    assert ngc_pytorch_cuda_at_most(BLACKWELL_TRAINING_IMAGE) >= gpu_architecture("B200").min_cuda


@pytest.mark.parametrize(("image", "cuda"), [
    ("nvcr.io/nvidia/pytorch:24.06-py3", (12, 5)), ("nvcr.io/nvidia/pytorch:24.12-py3", (12, 6)),
    ("nvcr.io/nvidia/pytorch:23.10-py3", (12, 6)), ("nvcr.io/nvidia/pytorch:25.12-py3", (13, 1)),
    ("nvcr.io/nvidia/pytorch:25.05-py3", None), ("docker.io/me/train:24.06-py3", None),
    ("nvcr.io/nvidia/pytorch:latest", None),
])
def test_known_ngc_releases(image, cuda):
    assert ngc_pytorch_cuda_at_most(image) == cuda


def test_an_ngc_image_older_than_cuda_12_8_is_refused_on_blackwell():
    with pytest.raises(UserInputError, match="need CUDA 12.8 or newer") as err:
        check_image("nvcr.io/nvidia/pytorch:24.06-py3", "NVIDIA B200", "p6-b200.48xlarge")
    assert "25.01-py3" in err.value.hint
    check_image("nvcr.io/nvidia/pytorch:25.01-py3", "NVIDIA B200", "p6-b200.48xlarge")
    check_image("nvcr.io/nvidia/pytorch:24.06-py3", "NVIDIA H100", "p5.48xlarge")
    check_image("my.registry/custom:1", "NVIDIA B200", "p6-b200.48xlarge")  # unknown: passes


# --- a job's own --image (`launch`, `run`) against the cluster's GPUs -------------------------
def _cluster(gpu_model: str | None):
    from provision.model.inventory import Inventory, NodeRecord

    nodes = [NodeRecord(name=f"node-{i}", rank=i, address=f"10.0.0.{i + 1}",
                        private_address=f"10.0.0.{i + 1}", slots=8) for i in range(2)]
    return Inventory(name="b200", provider="aws", nodes=nodes, gpu_model=gpu_model,
                     container_image=BLACKWELL_TRAINING_IMAGE)


def _job(image: str | None):
    from provision.model.spec import build_job_spec

    return build_job_spec({}, {"script": __file__, **({"image": image} if image else {})})


def test_a_jobs_image_too_old_for_the_clusters_gpus_is_refused_before_anything_starts():
    from provision.job.launch import launching_nodes, node_command

    inv = _cluster("NVIDIA B200")
    with pytest.raises(UserInputError, match="need CUDA 12.8 or newer") as err:
        launching_nodes(inv, _job("nvcr.io/nvidia/pytorch:24.06-py3"))  # the job's first step
    assert "cluster 'b200'" in err.value.message and BLACKWELL_TRAINING_IMAGE in err.value.hint
    with pytest.raises(UserInputError):
        node_command(inv, _job("nvcr.io/nvidia/pytorch:24.12-py3"), inv.nodes[0])
    # a new enough image, no image of its own (the cluster's), or GPUs not known: it runs
    assert "25.09-py3" in node_command(inv, _job("nvcr.io/nvidia/pytorch:25.09-py3"),
                                       inv.nodes[0])
    assert BLACKWELL_TRAINING_IMAGE in node_command(inv, _job(None), inv.nodes[0])
    node_command(_cluster(None), _job("nvcr.io/nvidia/pytorch:24.06-py3"), inv.nodes[0])


def test_launch_refuses_it_before_the_workdir_is_synced(tmp_path, monkeypatch):
    """Through the job lifecycle on fake nodes: nothing is uploaded, nothing is started."""
    from fake_nodes import FakeConnector

    from provision.job import lifecycle
    from provision.job.attached import Attached
    from provision.model.inventory import InventoryStore
    from provision.nodes import group

    fake = FakeConnector()
    monkeypatch.setattr(group, "default_connector", lambda inv: fake)
    monkeypatch.setenv("MGPU_CLOUD_HOME", str(tmp_path / "home"))
    store = InventoryStore(tmp_path / "home")
    inv = _cluster("NVIDIA B200")
    inv.status = "ready"
    store.create(inv)
    job = _job("nvcr.io/nvidia/pytorch:24.06-py3")
    with pytest.raises(UserInputError, match="need CUDA 12.8 or newer"):
        lifecycle.start("b200", job, Attached(), store=store, log=lambda m: None)
    for node in ("node-0", "node-1"):
        assert fake.stdin(node) == []  # no workdir upload
        assert not any("job start" in c for c in fake.commands(node))
