"""Capacity Block offerings as botocore's EC2 model shapes them (issue 38), through moto + the
capacity fake: DescribeCapacityBlockOfferings is paged (NextToken), and an offering may be made
of several CapacityBlockOfferingSegments (each its own zone and schedule; bought as one
reservation per segment). `plan` reads every page and picks only an offering the nodes can be
launched into with one RunInstances into one reservation."""

from __future__ import annotations

import pytest

from provision.cluster.providers import get_provider
from provision.model.errors import UserInputError

P5E_REGION = "us-east-2"  # moto offers p5e in no us-east-1 zone


def _block(plan) -> dict:
    return {r.kind: r.details for r in plan.resources}["capacity-block"]


def test_every_page_of_offerings_is_read(fakes, spec_for) -> None:
    """Before: only the first page was read; the earliest offering on a later page was never
    seen."""
    fakes.capacity.page = 1
    fakes.capacity.offer(P5E_REGION, "p5e.48xlarge", "us-east-2a", start_in_h=48)
    fakes.capacity.offer(P5E_REGION, "p5e.48xlarge", "us-east-2b", start_in_h=24)
    soonest = fakes.capacity.offer(P5E_REGION, "p5e.48xlarge", "us-east-2c", start_in_h=2)
    plan = get_provider("aws").plan(spec_for(instance_type="p5e.48xlarge", region=P5E_REGION,
                                             capacity_block=True))
    assert plan.launch.block.offering_id == soonest["CapacityBlockOfferingId"]
    assert len(fakes.calls("DescribeCapacityBlockOfferings")) == 3


def test_an_offering_of_several_segments_is_skipped(fakes, spec_for) -> None:
    """Before: a two-zone offering was read as one zone, start and reservation."""
    split = fakes.capacity.offer(P5E_REGION, "p5e.48xlarge", "us-east-2a", start_in_h=1,
                                 segments=["us-east-2a", "us-east-2b"])
    whole = fakes.capacity.offer(P5E_REGION, "p5e.48xlarge", "us-east-2b", start_in_h=5)
    plan = get_provider("aws").plan(spec_for(instance_type="p5e.48xlarge", region=P5E_REGION,
                                             capacity_block=True))
    assert plan.launch.block.offering_id == whole["CapacityBlockOfferingId"]
    assert plan.launch.block.offering_id != split["CapacityBlockOfferingId"]


def test_only_offerings_of_several_segments_is_a_clear_refusal(fakes, spec_for) -> None:
    fakes.capacity.offer(P5E_REGION, "p5e.48xlarge", "us-east-2a",
                         segments=["us-east-2a", "us-east-2b"])
    with pytest.raises(UserInputError, match="several segments"):
        get_provider("aws").plan(spec_for(instance_type="p5e.48xlarge", region=P5E_REGION,
                                          capacity_block=True))
    assert "PurchaseCapacityBlock" not in fakes.operations()
