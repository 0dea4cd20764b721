"""A Capacity Block's money and time: its up-front price is the plan's cost, its end governs how
long the nodes live (not the 8 h default), a block starting later is waited for (an injected
clock: nothing sleeps), and a plan made without credentials says how the nodes will be bought.
Through moto + the capacity fake (aws_capacity.py) and the rules layer."""

from __future__ import annotations

import base64
import datetime as dt
import re

import pytest
from typer.testing import CliRunner

from provision.cli.app import app
from provision.cluster import pipeline
from provision.cluster.providers import get_provider
from provision.cluster.providers.aws import capacity

P5E_REGION = "us-east-2"  # moto offers p5e in no us-east-1 zone
MARGIN_H = 35 / 60


def _lifetime_s(run: dict) -> int:
    text = base64.b64decode(run["UserData"]).decode()
    return int(re.search(r"--on-active=(\d+)s", text).group(1))


def _dry_run(*extra: str) -> str:
    result = CliRunner().invoke(app, [
        "up", "--provider", "aws", "--instance-type", "p5e.48xlarge", "--nodes", "2",
        "--region", P5E_REGION, "--capacity-block", "--dry-run", *extra])
    assert result.exit_code == 0, result.output
    return result.output


# --- 1. the cost of a block is its up-front price ---------------------------------------------
def test_the_plan_of_a_block_shows_its_up_front_price_as_the_cost(fakes):
    fakes.capacity.offer(P5E_REGION, "p5e.48xlarge", "us-east-2a", hours=24, count=2,
                         fee=1510.27)
    out = _dry_run()
    assert "cost: $1,510.27 paid up front by `up`, not refundable" in out
    assert re.search(r"in all at most \$1,510\.(2[7-9]|[3-9]\d) \(23\.4\d h of nodes", out), out
    assert "$503.50" not in out and "/hour for the whole cluster" not in out


def test_an_explicit_max_hours_keeps_the_whole_price_as_the_cost(fakes, spec_for):
    fakes.capacity.offer(P5E_REGION, "p5e.48xlarge", "us-east-2a", hours=24, count=2,
                         fee=1510.27)
    plan = get_provider("aws").plan(spec_for(instance_type="p5e.48xlarge", region=P5E_REGION,
                                             capacity_block=True, max_hours=8))
    assert plan.upfront_usd == 1510.27 and plan.max_hours == 8
    assert plan.max_cost_usd == pytest.approx(1510.27 + 8 * plan.launch.egress.hourly_usd,
                                              abs=0.01)


# --- 2. the block's end governs how long the nodes live ----------------------------------------
def test_without_max_hours_the_nodes_live_until_the_block_ends(fakes, spec_for, store):
    spec = spec_for(instance_type="p5e.48xlarge", region=P5E_REGION, capacity_block=True)
    offer = fakes.capacity.offer(P5E_REGION, "p5e.48xlarge", "us-east-2a", hours=24)
    plan = get_provider("aws").plan(spec)
    assert 24 - MARGIN_H - 0.02 <= plan.launch.max_hours <= 24 - MARGIN_H
    (note,) = [n for n in plan.notes if n.startswith("nodes ")]
    assert "power off 35 min before the Capacity Block ends" in note
    assert "--max-hours defaults to the block" in note and "8 h" not in note

    pipeline.up(spec, confirm=lambda p: True, store=store, bootstrap=False, log=lambda m: None)
    (run,) = fakes.calls("RunInstances")
    left = (offer["EndDate"] - dt.datetime.now(dt.UTC)).total_seconds() - 35 * 60
    assert left - 120 < _lifetime_s(run) <= left  # not 8 h: the 16 paid hours are used


def test_a_shorter_max_hours_is_kept_and_the_plan_names_the_paid_hours_it_gives_up(
        fakes, spec_for, store):
    spec = spec_for(instance_type="p5e.48xlarge", region=P5E_REGION, capacity_block=True,
                    max_hours=8)
    fakes.capacity.offer(P5E_REGION, "p5e.48xlarge", "us-east-2a", hours=24)
    plan = get_provider("aws").plan(spec)
    (note,) = [n for n in plan.notes if n.startswith("nodes ")]
    assert "after 8 h (--max-hours)" in note and "15.4 paid hours of the block are given " \
        "up" in note and "power off 35 min" not in note

    pipeline.up(spec, confirm=lambda p: True, store=store, bootstrap=False, log=lambda m: None)
    (run,) = fakes.calls("RunInstances")
    assert _lifetime_s(run) == 8 * 3600


def test_a_replacement_in_a_block_without_max_hours_lives_to_the_blocks_end(
        fakes, spec_for, store, up_cluster):
    """Nine hours into a 24 h block (past the old 8 h default) a lost node is replaced, and
    the new one powers off 35 min before the block's end."""
    spec = spec_for(instance_type="p5e.48xlarge", region=P5E_REGION, capacity_block=True)
    inv = up_cluster(spec)
    end = fakes.capacity.reservations[inv.resources_of("capacity-block")[0].id]["EndDate"]
    inv.created_at = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=9)).isoformat(
        timespec="seconds")
    def left() -> float:  # seconds from now to 35 min before the block's end
        return (end - dt.datetime.now(dt.UTC)).total_seconds() - 35 * 60

    before = left()  # the lifetime is counted between these two readings of the clock
    get_provider("aws").replace(inv, store, inv.nodes[1])
    _, again = fakes.calls("RunInstances")
    assert left() - 120 < _lifetime_s(again) <= before


# --- 6. a block that starts later: `up` waits through `scheduled` -------------------------------
class FakeClock(capacity.Clock):
    def __init__(self) -> None:
        self.at = dt.datetime.now(dt.UTC)
        self.slept: list[float] = []

    def now(self) -> dt.datetime:
        return self.at

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.at += dt.timedelta(seconds=seconds)


def test_up_waits_for_a_block_that_starts_in_three_hours_without_sleeping(
        fakes, spec_for, store, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(capacity, "CLOCK", clock)
    fakes.capacity.clock = clock.now
    offer = fakes.capacity.offer(P5E_REGION, "p5e.48xlarge", "us-east-2a", start_in_h=3,
                                 hours=24)
    seen: list[str] = []
    real_state = fakes.capacity._state

    def state(item):
        seen.append(real_state(item))
        return seen[-1]

    fakes.capacity._state = state
    spec = spec_for(instance_type="p5e.48xlarge", region=P5E_REGION, capacity_block=True)
    plan = get_provider("aws").plan(spec)
    assert plan.launch.block.start == offer["StartDate"].isoformat(timespec="seconds")
    started = dt.datetime.now(dt.UTC)
    pipeline.up(spec, confirm=lambda p: True, store=store, bootstrap=False, log=lambda m: None)
    assert (dt.datetime.now(dt.UTC) - started).total_seconds() < 60  # nothing really slept
    assert seen[:2] == ["payment-pending", "payment-pending"] and "scheduled" in seen
    assert seen.index("scheduled") < seen.index("active")
    assert clock.at >= offer["StartDate"] and len(clock.slept) < 30  # slept towards the start
    assert fakes.capacity.refusals == []  # launched inside the block, not before it
    (run,) = fakes.calls("RunInstances")
    left = (offer["EndDate"] - clock.at).total_seconds() - 35 * 60
    assert left - 120 < _lifetime_s(run) <= left  # counted from the start, not the purchase


def test_a_scheduled_block_cancelled_while_waited_for_stops_up(fakes, spec_for, store,
                                                              monkeypatch):
    from provision.model.errors import ProvisionError

    clock = FakeClock()
    monkeypatch.setattr(capacity, "CLOCK", clock)
    fakes.capacity.clock = clock.now
    fakes.capacity.offer(P5E_REGION, "p5e.48xlarge", "us-east-2a", start_in_h=30, hours=24)
    real_sleep = clock.sleep

    def sleep(seconds):
        real_sleep(seconds)
        if clock.at - FakeClock().at > dt.timedelta(hours=2):  # two hours in: cancelled
            for rid in fakes.capacity.reservations:
                fakes.capacity.forced_state[rid] = "cancelled"

    clock.sleep = sleep
    spec = spec_for(instance_type="p5e.48xlarge", region=P5E_REGION, capacity_block=True)
    with pytest.raises(ProvisionError, match="is cancelled"):
        pipeline.up(spec, confirm=lambda p: True, store=store, bootstrap=False,
                    log=lambda m: None)
    assert fakes.calls("RunInstances") == []


# --- 3. a plan without credentials says how the nodes are bought --------------------------------
def test_an_offline_block_plan_shows_the_market_and_what_is_looked_up(aws_offline):
    out = _dry_run()
    assert "market=capacity-block" in out and "market=on-demand" not in out
    assert "placement-group" not in out  # a block's instances are placed by EC2
    assert "the Capacity Block's price, paid up front: from its offering " \
           "(DescribeCapacityBlockOfferings" in out
    assert "AWS publishes no on-demand price" not in out
    assert "power off 35 min before the Capacity Block ends" in out


def test_an_offline_reservation_plan_shows_the_market_and_makes_no_placement_group(aws_offline):
    result = CliRunner().invoke(app, [
        "up", "--provider", "aws", "--instance-type", "p4d.24xlarge", "--nodes", "2",
        "--region", "us-east-1", "--reservation", "cr-0123456789abcdef0", "--dry-run"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "market=reservation" in out and "market=on-demand" not in out
    assert "placement-group" not in out
    assert "capacity reservation cr-0123456789abcdef0: its zone, end, free instances and " \
           "placement group" in out
