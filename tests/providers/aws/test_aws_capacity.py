"""How the nodes are bought: Capacity Blocks (--capacity-block) and capacity reservations
(--reservation ID|auto), through moto + the capacity fake (aws_capacity.py: moto has no
Capacity Block or reservation models) and the rules layer."""

from __future__ import annotations

import base64
import datetime as dt
import re

import pytest
from typer.testing import CliRunner

from provision.cli.app import app
from provision.cluster import pipeline
from provision.cluster.providers import get_provider
from provision.cluster.providers.aws import capacity, retry
from provision.model.errors import ProvisionError, UserInputError

P5E_REGION = "us-east-2"  # moto offers p5e in no us-east-1 zone


def _lifetime_s(run: dict) -> int:
    text = base64.b64decode(run["UserData"]).decode()
    return int(re.search(r"--on-active=(\d+)s", text).group(1))


# --- p5e: Capacity Blocks or reservations only ---------------------------------------------
def test_p5e_without_a_block_or_reservation_is_refused_at_plan_time(fakes, spec_for):
    with pytest.raises(UserInputError, match="sold as Capacity Blocks") as err:
        get_provider("aws").plan(spec_for(instance_type="p5e.48xlarge", region=P5E_REGION))
    assert "--capacity-block" in err.value.hint and "--reservation" in err.value.hint
    assert fakes.writes() == []


def test_p5en_is_sold_on_demand_as_aws_price_list_has_it():
    """Issue 19 planned p5e/p5en as capacity-block-only; AWS's price list sells p5en on demand
    and as spot (catalog.yaml names the sources): only p5e is restricted."""
    from provision.cluster.providers.aws.catalog import hourly_price, markets_of

    assert {"on-demand", "spot", "capacity-block", "reservation"} <= set(
        markets_of("p5en.48xlarge"))
    assert hourly_price("p5en.48xlarge", "us-east-1").usd_per_hour == 63.296
    assert "on-demand" not in markets_of("p5e.48xlarge")


def test_dry_run_of_a_capacity_block_shows_offering_price_and_start(fakes):
    """The issue's done-check: `up --provider aws --instance-type p5e.48xlarge --nodes 2
    --capacity-block --dry-run` shows the offering, its price and start; nothing is bought."""
    offer = fakes.capacity.offer(P5E_REGION, "p5e.48xlarge", "us-east-2a", start_in_h=0,
                                 hours=24, count=2, fee=1510.27)
    result = CliRunner().invoke(app, [
        "up", "--provider", "aws", "--instance-type", "p5e.48xlarge", "--nodes", "2",
        "--region", P5E_REGION, "--capacity-block", "--dry-run"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert offer["CapacityBlockOfferingId"] in out and "1,510.27" in out
    assert offer["StartDate"].isoformat(timespec="seconds") in out and "us-east-2a" in out
    assert "PurchaseCapacityBlock" not in fakes.operations() and fakes.writes() == []


def test_dry_run_without_credentials_says_what_it_cannot_know(aws_offline):
    result = CliRunner().invoke(app, [
        "up", "--provider", "aws", "--instance-type", "p5e.48xlarge", "--nodes", "2",
        "--region", P5E_REGION, "--capacity-block", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "Capacity Block offering for 2 x p5e.48xlarge for 24 h" in result.output
    assert "DescribeCapacityBlockOfferings" in result.output


# --- up with a Capacity Block ------------------------------------------------------------------
def test_up_buys_the_block_after_confirmation_waits_and_launches_into_it(
        fakes, spec_for, store, tagged):
    spec = spec_for(instance_type="p5e.48xlarge", region=P5E_REGION, capacity_block=True,
                    max_hours=30)
    # "All Capacity Blocks end at 11:30AM UTC": a 48 h block bought now can end sooner than
    # --max-hours 30; the nodes must be gone before it ends
    offer = fakes.capacity.offer(P5E_REGION, "p5e.48xlarge", "us-east-2b", hours=48)
    offer["EndDate"] = offer["StartDate"] + dt.timedelta(hours=28)
    refused = pipeline.up(spec, confirm=lambda plan: False, store=store, bootstrap=False,
                          log=lambda m: None)
    assert refused is None and fakes.calls("PurchaseCapacityBlock") == []  # not confirmed
    (offers,) = fakes.calls("DescribeCapacityBlockOfferings")[:1]
    assert offers["CapacityDurationHours"] == 48 and offers["InstanceCount"] == 2  # 30 h: 2 days

    inv = pipeline.up(spec, confirm=lambda plan: True, store=store, bootstrap=False,
                      log=lambda m: None)
    (bought,) = fakes.calls("PurchaseCapacityBlock")
    assert bought["InstancePlatform"] == "Linux/UNIX"
    (block,) = inv.resources_of("capacity-block")
    assert block.extra["offering"] == bought["CapacityBlockOfferingId"]
    item = fakes.capacity.reservations[block.id]
    assert item["AvailabilityZone"] == "us-east-2b"
    assert fakes.capacity.polls[block.id] > fakes.capacity.pending_polls  # waited: active
    (run,) = fakes.calls("RunInstances")
    assert run["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert run["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": block.id}}
    assert run["Placement"] == {"AvailabilityZone": item["AvailabilityZone"]}  # no group
    assert "CreatePlacementGroup" not in fakes.operations()
    # the nodes power off 35 min before the block ends (EC2 terminates from 30 min before)
    end = item["EndDate"]
    left = (end - dt.datetime.now(dt.UTC)).total_seconds()
    assert left - 35 * 60 - 120 < _lifetime_s(run) <= left - 35 * 60
    assert fakes.capacity.refusals == []
    assert {n.zone for n in inv.nodes} == {item["AvailabilityZone"]}
    assert all(r.extra.get("market") == "capacity-block" for r in inv.resources_of("instance"))

    pipeline.down(spec.name, store=store, log=lambda m: None)
    assert not store.exists(spec.name)  # the block is forgotten: it cannot be cancelled


def test_replacing_a_node_launches_into_the_same_block(fakes, spec_for, store, up_cluster):
    spec = spec_for(instance_type="p5e.48xlarge", region=P5E_REGION, capacity_block=True,
                    max_hours=20)
    inv = up_cluster(spec)
    (block,) = inv.resources_of("capacity-block")
    new = get_provider("aws").replace(inv, store, inv.nodes[1])
    first, again = fakes.calls("RunInstances")
    assert again["CapacityReservationSpecification"] == first[
        "CapacityReservationSpecification"]
    assert again["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert "GroupName" not in again["Placement"] and new.zone == inv.nodes[0].zone
    assert fakes.capacity.refusals == [] and fakes.capacity.members[block.id][-1] == \
        new.resource_id


def test_a_block_whose_payment_fails_stops_up(fakes, spec_for, store, tagged):
    spec = spec_for(instance_type="p5e.48xlarge", region=P5E_REGION, capacity_block=True)
    plan = get_provider("aws").plan(spec)
    real = fakes.capacity._purchase

    def purchase(params, region):
        status, body = real(params, region)
        fakes.capacity.forced_state[body["CapacityReservation"]["CapacityReservationId"]] = \
            "payment-failed"
        return status, body

    fakes.capacity._purchase = purchase
    with pytest.raises(ProvisionError, match="is payment-failed"):
        pipeline.up(spec, confirm=lambda p: True, store=store, bootstrap=False,
                    log=lambda m: None)
    assert fakes.calls("RunInstances") == [] and plan.launch.block is not None


# --- the fake's rules refuse what EC2 refuses ---------------------------------------------------
# Direct launches of a type without EFA (g6.xlarge), so only the capacity rules are at stake.
def _run(ec2, fakes, **extra):
    base = {"ImageId": fakes.dlami_in("us-east-1"), "InstanceType": "g6.xlarge",
            "MinCount": 1, "MaxCount": 1}
    return ec2.run_instances(**{**base, **extra})


def _bought_block(fakes, zone="us-east-1a"):
    offer = fakes.capacity.offer("us-east-1", "g6.xlarge", zone, count=1)
    status, body = fakes.capacity._purchase({
        "CapacityBlockOfferingId": offer["CapacityBlockOfferingId"],
        "InstancePlatform": "Linux/UNIX"}, "us-east-1")
    rid = body["CapacityReservation"]["CapacityReservationId"]
    fakes.capacity.forced_state[rid] = "active"
    return rid


@pytest.mark.parametrize(("case", "code"), [
    ("on-demand into a block", "must be capacity-block"),
    ("outside the block's zone", "the launch asks for us-east-1b"),
    ("after the block's termination window", "is ending"),
    ("capacity-block market into an ODCR", "is not a Capacity Block"),
    ("capacity-block market without a reservation", "needs a Capacity Block reservation id"),
])
def test_capacity_fake_refuses_launches_ec2_refuses(fakes, aws_rules_layer, case, code):
    from botocore.exceptions import ClientError

    from provision.cluster.providers.aws.api import Ec2

    ec2 = Ec2("us-east-1").client
    rid = _bought_block(fakes)
    target = {"CapacityReservationSpecification": {
        "CapacityReservationTarget": {"CapacityReservationId": rid}}}
    block = {"InstanceMarketOptions": {"MarketType": "capacity-block"}}
    here = {"Placement": {"AvailabilityZone": "us-east-1a"}}
    if case == "on-demand into a block":
        params = {**target, **here}
    elif case == "outside the block's zone":
        params = {**target, **block, "Placement": {"AvailabilityZone": "us-east-1b"}}
    elif case == "after the block's termination window":
        item = fakes.capacity.reservations[rid]
        item["EndDate"] = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=20)
        params = {**target, **block, **here}
    elif case == "capacity-block market into an ODCR":
        odcr = fakes.capacity.odcr("us-east-1", "g6.xlarge", "us-east-1a")
        params = {"CapacityReservationSpecification": {
            "CapacityReservationTarget": {"CapacityReservationId": odcr}}, **block, **here}
    else:
        params = {**block, **here}
    with pytest.raises(ClientError, match=re.escape(code)):
        _run(ec2, fakes, **params)
    if case == "capacity-block market without a reservation":  # the rules layer sees it too
        assert any("without a targeted reservation id" in v
                   for v in aws_rules_layer.rules.violations)
        aws_rules_layer.rules.violations.clear()
    # and the right launch goes through
    _run(ec2, fakes, **target, **block, **here) if case == "on-demand into a block" else None


# --- reservations ----------------------------------------------------------------------------
def test_reservation_auto_launches_into_a_matching_active_reservation(
        fakes, spec_for, up_cluster):
    fakes.capacity.odcr("us-east-1", "p4d.24xlarge", "us-east-1b", available=1)  # too small
    rid = fakes.capacity.odcr("us-east-1", "p4d.24xlarge", "us-east-1c", available=4)
    inv = up_cluster(spec_for(reservation="auto"))
    (run,) = fakes.calls("RunInstances")
    assert run["CapacityReservationSpecification"]["CapacityReservationTarget"] == {
        "CapacityReservationId": rid}
    assert "InstanceMarketOptions" not in run  # an ODCR: on-demand market
    assert run["Placement"] == {"AvailabilityZone": "us-east-1c"}
    assert {n.zone for n in inv.nodes} == {"us-east-1c"} and fakes.capacity.refusals == []


def test_a_reservation_in_a_placement_group_is_launched_into_that_group(
        fakes, spec_for, up_cluster):
    fakes.placement_groups["theirs"] = {"GroupName": "theirs", "GroupId": "pg-1",
                                        "Strategy": "cluster", "State": "available", "Tags": []}
    rid = fakes.capacity.odcr("us-east-1", "p4d.24xlarge", "us-east-1a", placement_group="theirs")
    up_cluster(spec_for(reservation=rid))
    (run,) = fakes.calls("RunInstances")
    assert run["Placement"] == {"AvailabilityZone": "us-east-1a", "GroupName": "theirs"}
    assert "CreatePlacementGroup" not in fakes.operations()


@pytest.mark.parametrize(("setup", "words"), [
    ({"available": 1}, "1 instances available, 2 are needed"),
    ({"state": "expired"}, "it is expired, not active"),
])
def test_a_reservation_that_cannot_take_the_cluster_is_refused_with_why(
        fakes, spec_for, setup, words):
    rid = fakes.capacity.odcr("us-east-1", "p4d.24xlarge", "us-east-1a", **setup)
    with pytest.raises(UserInputError, match=words):
        get_provider("aws").plan(spec_for(reservation=rid))
    assert fakes.writes() == []


def test_choice_conflicts_are_refused_before_any_call(fakes, spec_for):
    with pytest.raises(UserInputError, match="exclude each other"):
        get_provider("aws").plan(spec_for(capacity_block=True, reservation="auto"))
    with pytest.raises(UserInputError, match="--spot cannot be combined"):
        get_provider("aws").plan(spec_for(capacity_block=True, spot=True))
    with pytest.raises(UserInputError, match="at most 64 instances"):
        get_provider("aws").plan(spec_for(capacity_block=True, nodes=65))
    assert fakes.writes() == []


def test_block_duration_covers_max_hours_in_documented_steps():
    assert [capacity.block_hours(h) for h in (1, 24, 25, 14 * 24, 15 * 24, 182 * 24)] == [
        24, 24, 48, 336, 504, 4368]
    with pytest.raises(UserInputError, match="182 days"):
        capacity.block_hours(183 * 24)
    assert retry.policy() is not None
