"""Host keys: no private key is sent to a VM; each VM's own host key is read from Compute
(guest attributes, published by its guest agent some time after it runs) and pinned, with a
bounded wait and an error naming the node that never published one."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import PROJECT
from fake_compute import FakeCompute

from provision.cluster.providers.gcp.hostkeys import key_line
from provision.model.errors import ProvisionError
from provision.model.inventory import Inventory, InventoryStore
from provision.model.spec import ClusterSpec
from provision.nodes.sshconn import write_cluster_known_hosts

MakeSpec = Callable[..., ClusterSpec]
Up = Callable[[ClusterSpec], Inventory]
GUEST = r"instances/[^/]+/getGuestAttributes$"


def test_up_waits_for_each_vms_published_key_and_pins_it(
        fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore) -> None:
    fake.hostkey_polls = 3  # the guest agent publishes on the 4th query
    inv = up(make_spec())
    for rank, node in enumerate(inv.nodes):
        assert node.host_key == fake.host_keys[(PROJECT, "us-central1-a",
                                                f"c1-node-{rank}")]["ssh-ed25519"]
    queries = fake.sent("GET", GUEST)
    assert len(queries) == 2 * 5  # two VMs, four queries each, and one that sees it again
    assert {q.query["queryPath"] for q in queries} == {"hostkeys/"}
    known = write_cluster_known_hosts(inv, store).read_text().splitlines()
    assert known == [f"{n.address} {n.host_key}" for n in inv.nodes]


def test_a_vm_that_never_publishes_is_named_and_nothing_is_left(
        fake: FakeCompute, make_spec: MakeSpec, up: Up, store: InventoryStore,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MGPU_CLOUD_GCP_HOSTKEY_DEADLINE_S", "0")
    fake.hostkey_polls = 0  # node-0 has published by the first query
    fake.silent_vms = {"c1-node-1"}
    with pytest.raises(ProvisionError) as info:
        up(make_spec())
    message = str(info.value)
    assert "no SSH host key was published by node-1 (c1-node-1: it is RUNNING)" in message
    assert "node-0" not in message.split("hint:")[0]
    assert "get-serial-port-output c1-node-1" in (info.value.hint or "")
    assert fake.all_resources() == [] and not store.exists("c1")


def test_a_key_published_again_by_a_second_writer_is_the_one_pinned(
        fake: FakeCompute, make_spec: MakeSpec, up: Up) -> None:
    """On Ubuntu, cloud-init and the guest agent may both publish host keys to the same guest
    attributes; the last writer's are what sshd serves. Before: the first key read was pinned
    and the first connection then met another key and was refused."""
    fake.republish_at = 3  # 404, the agent's keys, then cloud-init's (what sshd serves)
    inv = up(make_spec())
    for rank, node in enumerate(inv.nodes):
        assert node.host_key == fake.second_keys[(PROJECT, "us-central1-a",
                                                  f"c1-node-{rank}")]["ssh-ed25519"]


def test_only_well_formed_keys_of_the_named_type_are_taken() -> None:
    line = ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOoeeUuIpBS0HZTdDDClDD4Dvcdds+1FCfGvqC1dRBsi")
    assert key_line("ssh-ed25519", line.split()[1]) == line
    assert key_line("ecdsa-sha2-nistp256", line.split()[1]) is None  # blob says ed25519
    assert key_line("ssh-ed25519", "not base64!") is None
    assert key_line("ssh-ed25519", "AAAA") is None
