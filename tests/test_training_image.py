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
