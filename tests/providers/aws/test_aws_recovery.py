"""Recovery under moto: node_alive and replace (contract.Recoverable). The rules layer checks
the replacement like the nodes of `up` (request rules, and its path to the internet)."""

from __future__ import annotations

import base64
import datetime as dt
import re

import pytest

from provision.cluster import pipeline
from provision.cluster.providers import get_provider
from provision.cluster.providers.contract import Recoverable
from provision.model.errors import CapacityError, ProvisionError


def _on_active_seconds(run: dict) -> int:
    raw = run["UserData"]
    text = raw if raw.startswith("#cloud-config") else base64.b64decode(raw).decode()
    return int(re.search(r"--on-active=(\d+)s", text).group(1))


def _hours_ago(hours: float) -> str:
    return (dt.datetime.now(dt.UTC) - dt.timedelta(hours=hours)).isoformat(timespec="seconds")


def _live_addresses(moto_ec2) -> set[str]:
    return {a["AllocationId"] for a in moto_ec2.describe_addresses()["Addresses"]}


@pytest.mark.parametrize("egress", ["elastic-ip", "nat"])
def test_replace_node_1_launches_it_the_same_way_and_down_leaves_nothing(
        fakes, spec_for, store, up_cluster, tagged, moto_ec2, egress):
    nat = egress == "nat"
    spec = (spec_for(instance_type="g6.xlarge", private_ips=True, max_hours=2) if nat
            else spec_for(spot=True, max_hours=2))
    inv = up_cluster(spec)
    provider = get_provider("aws")
    assert isinstance(provider, Recoverable)
    old = inv.nodes[1]
    old_records = {(r.kind, r.id) for r in inv.resources}
    nat_eips = {r.id for r in inv.resources_of("elastic-ip")} if nat else set()
    inv.created_at = _hours_ago(1)  # the cluster has run for an hour of its 2

    new = provider.replace(inv, store, old)

    first, again = fakes.calls("RunInstances")
    assert again["MinCount"] == again["MaxCount"] == 1
    for key in ("ImageId", "InstanceType", "KeyName", "Placement", "NetworkInterfaces",
                "InstanceMarketOptions", "BlockDeviceMappings", "MetadataOptions",
                "InstanceInitiatedShutdownBehavior"):
        assert again.get(key) == first.get(key), key
    assert again["ClientToken"] != first["ClientToken"]
    # what is left of --max-hours 2, not 2 h again
    assert _on_active_seconds(first) == 7200 and 3500 < _on_active_seconds(again) <= 3600
    # the NodeRecord keeps name and rank; new instance, addresses and pinned host key
    assert (new.name, new.rank, new.slots, new.zone) == (old.name, old.rank, old.slots, old.zone)
    assert new.resource_id != old.resource_id and new.host_key != old.host_key
    assert new.host_key.startswith("ssh-ed25519 ")
    assert new.private_address  # (EC2 may give it the address the old one freed)
    assert inv.nodes[1] == new and store.load("c1").nodes[1] == new and inv.nodes[0].rank == 0
    # the old instance is terminated and forgotten, the new one recorded with its launch facts
    (state,) = [i["State"]["Name"] for r in moto_ec2.describe_instances(
        InstanceIds=[old.resource_id])["Reservations"] for i in r["Instances"]]
    assert state in ("shutting-down", "terminated")
    ids = [r.id for r in store.load("c1").resources_of("instance")]
    assert old.resource_id not in ids and new.resource_id in ids and len(ids) == 2
    rec = next(r for r in inv.resources_of("instance") if r.id == new.resource_id)
    assert rec.extra["market"] == ("on-demand" if nat else "spot")
    eips = {r.id for r in store.load("c1").resources_of("elastic-ip")}
    if nat:  # the NAT gateway's address is not a node's: kept
        assert new.address == new.private_address and eips == nat_eips
        assert fakes.calls("ReleaseAddress") == [] and len(fakes.calls("CreateNatGateway")) == 1
    else:  # its own Elastic IP; the old one released
        assert {("elastic-ip", e) for e in eips} - old_records
        assert new.address in {r.name for r in inv.resources_of("elastic-ip")}
        assert old.address not in {r.name for r in inv.resources_of("elastic-ip")}
        assert eips == _live_addresses(moto_ec2) and len(eips) == 2
    assert set(tagged("c1")["instance"]) == {inv.nodes[0].resource_id, new.resource_id}

    pipeline.down("c1", store=store, log=lambda m: None)
    assert tagged() == {} and not store.exists("c1")


def test_no_capacity_for_a_replacement_is_clear_and_leaves_nothing_half_made(
        fakes, spec_for, store, up_cluster, tagged, moto_ec2):
    inv = up_cluster(spec_for())
    old = inv.nodes[1]
    created, inv.created_at = inv.created_at, _hours_ago(7.95)  # --max-hours 8 ends in 3 min
    writes = len(fakes.writes())
    with pytest.raises(ProvisionError, match="not replacing node-1: .* ends in 1[78]\\d s"):
        get_provider("aws").replace(inv, store, old)
    assert len(fakes.writes()) == writes  # nothing touched
    inv.created_at = created

    for rec in inv.resources_of("instance"):  # an inventory from before launch facts were kept
        rec.extra.clear()
    fakes.fail("RunInstances", "InsufficientInstanceCapacity", status=500,
               when=lambda params: params["MinCount"] == 1)
    with pytest.raises(CapacityError) as err:
        get_provider("aws").replace(inv, store, old)
    message = str(err.value)
    assert "node-1" in message and "us-east-1a" in message and "InsufficientInstanceCapacity" \
        in message
    assert "checkpoint" in (err.value.hint or "")
    first, again = fakes.calls("RunInstances")  # one zone only: the placement group's
    for key in ("ImageId", "NetworkInterfaces", "Placement"):  # facts described from EC2
        assert again[key] == first[key], key
    saved = store.load("c1")
    # nothing of the attempt: the lost node's instance and address are gone and forgotten
    assert [r.id for r in saved.resources_of("instance")] == [inv.nodes[0].resource_id]
    assert {r.name for r in saved.resources_of("elastic-ip")} == {inv.nodes[0].address}
    assert _live_addresses(moto_ec2) == {r.id for r in saved.resources_of("elastic-ip")}
    assert tagged("c1")["instance"] == [inv.nodes[0].resource_id]
    pipeline.down("c1", store=store, log=lambda m: None)
    assert tagged() == {}


def test_node_alive_says_false_only_when_ec2_says_the_instance_is_gone(
        fakes, spec_for, store, up_cluster, moto_ec2):
    inv = up_cluster(spec_for())
    provider = get_provider("aws")
    node0, node1 = inv.nodes
    assert provider.node_alive(inv, node0) and provider.node_alive(inv, node1)
    moto_ec2.stop_instances(InstanceIds=[node0.resource_id])
    moto_ec2.terminate_instances(InstanceIds=[node1.resource_id])
    assert not provider.node_alive(inv, node0) and not provider.node_alive(inv, node1)
    unknown = node1.model_copy(update={"resource_id": "i-0123456789abcdef0"})
    assert not provider.node_alive(inv, unknown)
    fakes.fail("DescribeInstances", "InternalError", status=500)  # EC2 cannot be asked
    assert provider.node_alive(inv, node1)
