"""Warm spares on AWS under moto (issue 44): planned and priced with the cluster, launched
in the same all-or-nothing RunInstances and placement group, a spare taking a rank, the lost
instance terminated, a new spare launched like a replacement, and `down` leaving nothing."""

from __future__ import annotations

import pytest

from provision.cluster import pipeline
from provision.cluster.providers import get_provider, spares
from provision.cluster.providers.aws.catalog import hourly_price
from provision.cluster.providers.contract import KeepsSpares


def test_spares_are_priced_in_the_plan_and_launched_with_the_nodes_in_one_call(
        fakes, spec_for, store, up_cluster, tagged) -> None:
    spec = spec_for(nodes=2, max_hours=2).model_copy(update={"spares": 1})
    provider = get_provider("aws")
    plan = provider.plan(spec)
    price = hourly_price(plan.launch.instance_type, plan.launch.region).usd_per_hour
    assert price
    assert (plan.nodes, plan.spares, plan.node_hourly_usd) == (3, 1, pytest.approx(price))
    assert "2 node(s) + 1 warm spare(s)" in plan.render()
    assert plan.hourly_cost_usd >= 3 * price  # the spare is paid for like a node
    text = plan.render()
    assert f"spares: 1 x ${price:,.2f}/h = ${price:,.2f}/h, in the cost above" in text
    assert "~10.0 min on all 2 node(s) (assumed: a GPU instance's launch and boot" in text
    inv = up_cluster(spec)
    (launch,) = fakes.calls("RunInstances")  # all-or-nothing, one placement group
    assert launch["MinCount"] == launch["MaxCount"] == 3
    assert [n.name for n in inv.nodes] == ["node-0", "node-1"]
    assert [(n.name, n.rank) for n in inv.spares] == [("node-2", 2)]
    assert set(tagged("c1")["instance"]) == {n.resource_id for n in [*inv.nodes, *inv.spares]}
    pipeline.down("c1", store=store, log=lambda m: None)
    assert tagged() == {} and not store.exists("c1")


def test_a_spare_takes_a_rank_the_lost_instance_goes_and_a_new_spare_is_launched_alike(
        fakes, spec_for, store, up_cluster, tagged, moto_ec2) -> None:
    inv = up_cluster(spec_for(nodes=2, spot=True, max_hours=2).model_copy(
        update={"spares": 1}))
    provider = get_provider("aws")
    assert isinstance(provider, KeepsSpares) and provider.refills
    lost, spare = inv.nodes[1], inv.spares[0]
    new = provider.promote(inv, store, spare, lost)
    assert (new.name, new.rank, new.resource_id) == ("node-1", 1, spare.resource_id)
    provider.retire(inv, store, lost)
    (state,) = [i["State"]["Name"] for r in moto_ec2.describe_instances(
        InstanceIds=[lost.resource_id])["Reservations"] for i in r["Instances"]]
    assert state in ("shutting-down", "terminated")
    assert lost.address not in {r.name for r in inv.resources_of("elastic-ip")}  # released
    template = spares.next_spare(inv, lost)
    made = provider.make_spare(inv, store, template)
    first, again = fakes.calls("RunInstances")
    assert again["MinCount"] == again["MaxCount"] == 1
    for key in ("ImageId", "InstanceType", "Placement", "NetworkInterfaces",
                "InstanceMarketOptions"):
        assert again.get(key) == first.get(key), key
    assert (made.name, made.rank, made.zone) == ("node-3", 3, lost.zone)
    assert made.host_key == fakes.host_key(made.resource_id)  # read from its console
    assert [n.resource_id for n in inv.nodes] == [inv.nodes[0].resource_id, spare.resource_id]
    ids = {r.id for r in store.load("c1").resources_of("instance")}
    assert made.resource_id in ids and lost.resource_id not in ids
    pipeline.down("c1", store=store, log=lambda m: None)
    assert tagged() == {} and not store.exists("c1")
