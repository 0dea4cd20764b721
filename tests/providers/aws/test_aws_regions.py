"""--regions: failover across regions, not only zones. The plan says where it will try, in
which order, at what price; `up` moves to the next region when one has no capacity, deleting
what it made in the region it leaves."""

from __future__ import annotations

import pytest

from provision.cluster import pipeline
from provision.cluster.providers import get_provider
from provision.model.errors import CapacityError, UserInputError


def _tagged_in(moto_client, region: str, cluster: str) -> dict[str, list[str]]:
    ec2 = moto_client(region)
    flt = [{"Name": "tag:mgpu-cloud-cluster", "Values": [cluster]}]
    out = {
        "instance": [i["InstanceId"] for r in ec2.describe_instances(Filters=flt)["Reservations"]
                     for i in r["Instances"] if i["State"]["Name"] != "terminated"],
        "security-group": [g["GroupId"] for g in
                           ec2.describe_security_groups(Filters=flt)["SecurityGroups"]],
        "key-pair": [k["KeyPairId"] for k in ec2.describe_key_pairs(Filters=flt)["KeyPairs"]],
        "elastic-ip": [a["AllocationId"] for a in ec2.describe_addresses(Filters=flt)["Addresses"]],
    }
    return {k: v for k, v in out.items() if v}


def test_plan_lists_the_regions_in_order_with_their_zones_and_prices(fakes, spec_for):
    plan = get_provider("aws").plan(spec_for(region=None, regions="us-west-2,us-east-1"))
    assert plan.launch.region == "us-west-2"
    assert [s.region for s in plan.launch.fallback] == ["us-east-1"]
    (note,) = [n for n in plan.notes if n.startswith("regions tried in order")]
    assert note.index("us-west-2 (us-west-2a") < note.index("us-east-1 (us-east-1a")
    assert "$21.96/h per node" in note  # us-east-1's price; us-west-2 shows the reference one
    # each region has its own AMI (the DLAMI is per region) and default VPC
    assert plan.launch.ami == fakes.dlami_in("us-west-2")
    assert plan.launch.fallback[0].ami == fakes.dlami_in("us-east-1")
    assert fakes.writes() == []


def test_up_fails_over_to_the_next_region_and_cleans_up_the_first(
        fakes, spec_for, store, moto_in):
    moto_client = moto_in
    fakes.fail("RunInstances", "InsufficientInstanceCapacity", 500,
               when=lambda p: p["Placement"]["AvailabilityZone"].startswith("us-west-2"))
    spec = spec_for(region=None, regions="us-west-2,us-east-1")
    inv = pipeline.up(spec, confirm=lambda p: True, store=store, bootstrap=False,
                      log=lambda m: None)
    tried = [r["Placement"]["AvailabilityZone"] for r in fakes.calls("RunInstances")]
    assert tried[:4] == ["us-west-2a", "us-west-2b", "us-west-2c", "us-west-2d"]
    assert tried[-1].startswith("us-east-1")
    assert {r.region for r in inv.resources} == {"us-east-1"}
    assert {n.zone for n in inv.nodes} <= {"us-east-1a", "us-east-1b", "us-east-1c",
                                           "us-east-1d"}
    assert _tagged_in(moto_client, "us-west-2", "c1") == {}  # nothing left behind
    assert "placement-group" in {r.kind for r in inv.resources}
    pipeline.down("c1", store=store, log=lambda m: None)
    assert _tagged_in(moto_client, "us-east-1", "c1") == {}


def test_no_region_with_capacity_names_every_region(fakes, spec_for, store, moto_in):
    moto_client = moto_in
    fakes.fail("RunInstances", "InsufficientInstanceCapacity", 500)
    with pytest.raises(CapacityError, match="no region had capacity") as err:
        pipeline.up(spec_for(region=None, regions="us-west-2,us-east-1"),
                    confirm=lambda p: True, store=store, bootstrap=False, log=lambda m: None)
    assert "us-west-2:" in err.value.message and "us-east-1:" in err.value.message
    for region in ("us-west-2", "us-east-1"):
        assert _tagged_in(moto_client, region, "c1") == {}


def test_regions_any_tries_every_enabled_region_offering_the_type(fakes, spec_for):
    plan = get_provider("aws").plan(spec_for(region=None, regions="any",
                                             instance_type="p6-b200.48xlarge"))
    regions = [plan.launch.region] + [s.region for s in plan.launch.fallback]
    assert regions[0] == "us-east-1"  # the caller's default region first
    assert set(regions) == {"ap-south-1", "ap-south-2", "eu-north-1", "eu-west-3",
                            "us-east-1", "us-east-2", "us-west-2"}  # where moto offers it
    assert fakes.calls("DescribeRegions")


@pytest.mark.parametrize(("extra", "words"), [
    ({"region": "us-east-1"}, "--region and --regions exclude each other"),
    ({"region": None, "ami": "ami-12345678"}, "--ami ami-12345678 belongs to one region"),
    ({"region": None, "zone": "us-east-1a"}, "--zone us-east-1a belongs to one region"),
    ({"region": None, "reservation": "cr-0123456789abcdef0"}, "belongs to one region"),
    ({"region": None, "regions": "any,us-east-1"}, "cannot be mixed"),
])
def test_region_choices_that_cannot_work_are_refused_before_anything(
        fakes, spec_for, extra, words):
    args = {"regions": "us-west-2,us-east-1", **extra}
    with pytest.raises(UserInputError, match=words):
        get_provider("aws").plan(spec_for(**args))
    assert fakes.writes() == []


def test_the_flag_is_declared_by_the_provider():
    from provision.cluster.providers.aws import INFO
    from provision.cluster.providers.aws.options import AwsOptions

    assert "--regions" in [f.decl for f in INFO.flags]
    assert AwsOptions(regions="us-west-2, us-east-1").regions == ["us-west-2", "us-east-1"]
