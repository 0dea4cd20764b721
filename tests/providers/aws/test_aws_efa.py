"""EFA inside the training container: what the provider puts into Inventory.container_args,
checked on the `docker run` line provision.nodes.container builds from it."""

from __future__ import annotations

import pytest

from provision.cluster.providers.aws import efa
from provision.nodes.container import docker_run_argv


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == flag]


@pytest.mark.parametrize("instance_type", [
    "p4d.24xlarge", "p5.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge", "g5.48xlarge",
])
def test_every_efa_device_and_the_host_libraries_reach_the_container(
        fakes, spec_for, up_cluster, instance_type):
    inv = up_cluster(spec_for(instance_type=instance_type, nodes=1))
    argv = docker_run_argv(inv, inv.container_image, inv.nccl_env, mount=".mgpu-cloud/run")
    image_at = argv.index(inv.container_image)
    before_image = argv[:image_at]
    # picked on the node by driver (remote/devices.py), never uverbs0..N-1 by count
    assert _pairs(before_image, "--device") == ["@by-driver:infiniband_verbs:efa"]
    assert _pairs(before_image, "-v")[1:] == ["/opt/amazon/efa:/opt/amazon/efa:ro",
                                              "/opt/amazon/ofi-nccl:/opt/amazon/ofi-nccl:ro"]
    # the host's rdma-core (libibverbs + the libefa provider) in a folder of their own
    assert _pairs(before_image, "--mount") == [
        "type=bind,source=/usr/lib/x86_64-linux-gnu/libibverbs.so.1,"
        "target=/opt/mgpu-cloud/host-rdma/libibverbs.so.1,readonly",
        "type=bind,source=/usr/lib/x86_64-linux-gnu/libefa.so.1,"
        "target=/opt/mgpu-cloud/host-rdma/libefa.so.1,readonly"]
    env = dict(e.split("=", 1) for e in _pairs(before_image, "-e"))
    assert "LD_LIBRARY_PATH" not in env  # not replaced: prepended inside the container
    after_image = argv[image_at + 1:]
    assert after_image[:2] == ["sh", "-c"] and after_image[3].split(":") == [
        "/opt/mgpu-cloud/host-rdma",
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
    assert efa.container_args(0) == [] and efa.library_path(0) == []
    assert efa.container_args(1)[:2] == efa.container_args(32)[:2] == [
        "--device", "@by-driver:infiniband_verbs:efa"]


def test_the_selector_prefix_is_the_one_the_nodes_expand():
    from provision.nodes.container import DEVICE_SELECTOR
    from remote.devices import SELECTOR

    assert DEVICE_SELECTOR == SELECTOR


# --- the interface layout follows the type's per-card data (p6-b300: card 0 is ENA-only) -------
def test_the_fake_answers_p6_b300_with_its_real_card_layout(moto_ec2):
    """moto 5.2.5 ships DescribeInstanceTypes' p6-b300 entry: 17 cards, card 0 lists only
    'interface' (ENA), cards 1..16 EFA (aws-parallelcluster issue #7143 says the same)."""
    (item,) = moto_ec2.describe_instance_types(InstanceTypes=["p6-b300.48xlarge"])["InstanceTypes"]
    net = item["NetworkInfo"]
    assert net["MaximumNetworkCards"] == 17 and net["EfaInfo"]["MaximumEfaInterfaces"] == 16
    cards = {c["NetworkCardIndex"]: c["InterfaceTypes"] for c in net["NetworkCards"]}
    assert cards[0] == ["interface"] and all("efa-only" in cards[c] for c in range(1, 17))


def test_p6_b300_puts_efa_on_cards_1_to_16_and_an_ena_primary_on_card_0(
        fakes, spec_for, up_cluster, aws_rules_layer):
    inv = up_cluster(spec_for(instance_type="p6-b300.48xlarge"))
    ifaces = fakes.calls("RunInstances")[0]["NetworkInterfaces"]
    assert (ifaces[0]["NetworkCardIndex"], ifaces[0]["DeviceIndex"],
            ifaces[0]["InterfaceType"]) == (0, 0, "interface")
    assert [(i["NetworkCardIndex"], i["InterfaceType"]) for i in ifaces[1:]] == [
        (c, "efa-only") for c in range(1, 17)]
    assert aws_rules_layer.rules.violations == []
    assert len(fakes.calls("AllocateAddress")) == 2  # 17 interfaces: an Elastic IP per node
    assert inv.nccl_env["FI_PROVIDER"] == "efa"


def test_card_layout_from_describe_instance_types():
    from provision.cluster.providers.aws.catalog import card_layout

    def card(i, types):
        return {"NetworkCardIndex": i, "InterfaceTypes": types}

    efa = ["interface", "efa", "efa-only"]
    b300 = {"EfaSupported": True, "EfaInfo": {"MaximumEfaInterfaces": 16},
            "MaximumNetworkCards": 17,
            "NetworkCards": [card(0, ["interface"])] + [card(i, efa) for i in range(1, 17)]}
    assert card_layout(b300) == tuple(range(1, 17))
    # at most MaximumEfaInterfaces; without per-card types (older data): cards 0..n-1
    assert card_layout({**b300, "EfaInfo": {"MaximumEfaInterfaces": 2}}) == (1, 2)
    assert card_layout({"EfaSupported": True, "EfaInfo": {"MaximumEfaInterfaces": 4},
                        "MaximumNetworkCards": 4}) == (0, 1, 2, 3)
    assert card_layout({"EfaSupported": False, "NetworkCards": [card(0, efa)]}) == ()
