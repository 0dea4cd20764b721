"""EFA inside the training container: what the provider puts into Inventory.container_args,
checked on the `docker run` line provision.nodes.container builds from it."""

from __future__ import annotations

import pytest

from provision.cluster.providers.aws import efa
from provision.nodes.container import docker_run_argv


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == flag]


@pytest.mark.parametrize(("instance_type", "devices"), [
    ("p4d.24xlarge", 4), ("p5.48xlarge", 32), ("p5en.48xlarge", 16), ("p6-b200.48xlarge", 8),
    ("g5.48xlarge", 1),
])
def test_every_efa_device_and_the_host_libraries_reach_the_container(
        fakes, spec_for, up_cluster, instance_type, devices):
    inv = up_cluster(spec_for(instance_type=instance_type, nodes=1))
    argv = docker_run_argv(inv, inv.container_image, inv.nccl_env, mount=".mgpu-cloud/run")
    image_at = argv.index(inv.container_image)
    before_image = argv[:image_at]
    assert _pairs(before_image, "--device") == [f"/dev/infiniband/uverbs{i}" for i in range(devices)]
    assert _pairs(before_image, "-v")[1:] == ["/opt/amazon/efa:/opt/amazon/efa:ro",
                                              "/opt/amazon/ofi-nccl:/opt/amazon/ofi-nccl:ro"]
    env = dict(e.split("=", 1) for e in _pairs(before_image, "-e"))
    assert "LD_LIBRARY_PATH" not in env  # not replaced: prepended inside the container
    after_image = argv[image_at + 1:]
    assert after_image[:2] == ["sh", "-c"] and after_image[3].split(":") == [
        "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu", "/opt/amazon/ofi-nccl/lib",
        "/opt/amazon/efa/lib"]
    assert env["FI_PROVIDER"] == "efa" and env["NCCL_NET_PLUGIN"] == "ofi"
    assert "memlock=-1" in _pairs(before_image, "--ulimit")  # "Cannot allocate memory" otherwise


def test_no_efa_no_container_args(fakes, spec_for, up_cluster):
    inv = up_cluster(spec_for(instance_type="g6.xlarge", nodes=1))
    assert inv.container_args == []
    argv = docker_run_argv(inv, inv.container_image, {}, mount=".mgpu-cloud/run")
    assert "--device" not in argv and "/opt/amazon/efa:/opt/amazon/efa:ro" not in argv
    assert argv[-1] == inv.container_image  # nothing to prepend


def test_container_args_are_pure():
    assert efa.container_args(0) == []
    assert efa.uverbs_devices(2) == ["/dev/infiniband/uverbs0", "/dev/infiniband/uverbs1"]
