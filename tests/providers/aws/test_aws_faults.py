"""All-or-nothing: a fault at each write step leaves nothing; capacity failover; throttling."""

from __future__ import annotations

import pytest

from provision.model.errors import CapacityError, ProvisionError

WRITE_STEPS = [
    ("ImportKeyPair", "importing the key pair"),
    ("CreateSecurityGroup", "creating the security group"),
    ("AuthorizeSecurityGroupIngress", "inbound rules"),
    ("AuthorizeSecurityGroupEgress", "outbound rule"),
    ("CreatePlacementGroup", "creating the placement group"),
    ("RunInstances", "launching 2 x p4d.24xlarge in us-east-1a"),
    ("AllocateAddress", "giving every node an Elastic IP"),
    ("AssociateAddress", "giving every node an Elastic IP"),
]
# --private-ips: the NAT gateway egress
NAT_STEPS = [
    ("CreateRouteTable", "creating the route table"),
    ("CreateSubnet", "creating the private subnet in us-east-1a"),
    ("AssociateRouteTable", "creating the private subnet in us-east-1a"),
    ("RunInstances", "launching 2 x p4d.24xlarge in us-east-1a"),
    ("AllocateAddress", "creating the NAT gateway in us-east-1a"),
    ("CreateNatGateway", "creating the NAT gateway in us-east-1a"),
    ("DescribeNatGateways", "creating the NAT gateway in us-east-1a"),
    ("CreateRoute", "creating the NAT gateway in us-east-1a"),
]


@pytest.mark.parametrize(("operation", "step"), WRITE_STEPS, ids=[op for op, _ in WRITE_STEPS])
def test_fault_at_each_write_step_leaves_nothing(fakes, spec_for, store, up_cluster, tagged,
                                                 operation, step):
    fakes.fail(operation, "InjectedFault")
    with pytest.raises(ProvisionError) as err:
        up_cluster(spec_for())
    message = str(err.value)
    assert step in message and "InjectedFault" in message
    assert "everything created so far was deleted" in message
    assert tagged() == {}
    assert not store.exists("c1")


@pytest.mark.parametrize(("operation", "step"), NAT_STEPS, ids=[op for op, _ in NAT_STEPS])
def test_fault_at_each_nat_step_leaves_nothing(fakes, spec_for, store, up_cluster, tagged,
                                               operation, step):
    fakes.fail(operation, "InjectedFault", times=1)
    with pytest.raises(ProvisionError) as err:
        up_cluster(spec_for(private_ips=True))
    assert step in str(err.value) and "InjectedFault" in str(err.value)
    assert tagged() == {}
    assert not store.exists("c1")


def test_nat_gateway_that_fails_is_named_and_rolled_back(fakes, spec_for, store, up_cluster,
                                                        tagged, moto_ec2):
    """A NAT gateway can end 'failed' (e.g. no free address in the subnet): the step says so."""
    answers = []

    def failed(parsed, **_):
        if answers:  # only the first look (while creating)
            return
        answers.append(1)
        for nat in parsed.get("NatGateways", []):
            nat.update(State="failed", FailureCode="InsufficientFreeAddressesInSubnet",
                       FailureMessage="no address")

    from provision.cluster.providers.aws import clients

    remove = clients.add_client_hook(lambda c: c.meta.events.register(
        "after-call.ec2.DescribeNatGateways", failed))
    try:
        with pytest.raises(ProvisionError, match="InsufficientFreeAddressesInSubnet"):
            up_cluster(spec_for(private_ips=True))
    finally:
        remove()
    assert tagged() == {}


def test_fault_while_waiting_for_nodes_leaves_nothing(fakes, spec_for, store, up_cluster, tagged):
    fakes.fail("DescribeInstances", "InjectedFault", times=1)
    with pytest.raises(ProvisionError, match="waiting for the nodes to run failed"):
        up_cluster(spec_for())
    assert tagged() == {}


def _in_zone(zone):
    return lambda params: params["Placement"]["AvailabilityZone"] == zone


def test_capacity_error_in_zone_a_moves_to_zone_b(fakes, spec_for, up_cluster):
    fakes.fail("RunInstances", "InsufficientInstanceCapacity", status=500, when=_in_zone("us-east-1a"))
    inv = up_cluster(spec_for())
    zones = [c["Placement"]["AvailabilityZone"] for c in fakes.calls("RunInstances")]
    assert zones == ["us-east-1a", "us-east-1b"]  # never retried in place
    subnets = [c["NetworkInterfaces"][0]["SubnetId"] for c in fakes.calls("RunInstances")]
    assert subnets[0] != subnets[1]
    assert {n.zone for n in inv.nodes} == {"us-east-1b"}
    assert {r.zone for r in inv.resources_of("instance")} == {"us-east-1b"}
    # the (empty) placement group goes along: one group, used for both attempts
    assert len(fakes.calls("CreatePlacementGroup")) == 1
    assert {c["Placement"]["GroupName"] for c in fakes.calls("RunInstances")} == {"mgpu-cloud-c1"}


def test_no_capacity_anywhere_is_a_capacity_error_and_leaves_nothing(fakes, spec_for, up_cluster, tagged):
    fakes.fail("RunInstances", "InsufficientInstanceCapacity", status=500)
    with pytest.raises(CapacityError) as err:
        up_cluster(spec_for())
    assert "us-east-1a" in str(err.value) and "us-east-1d" in str(err.value)
    assert len(fakes.calls("RunInstances")) == 4  # one per offering zone, none repeated
    assert tagged() == {}


def test_zone_flag_pins_the_zone(fakes, spec_for, up_cluster):
    fakes.fail("RunInstances", "Unsupported", when=_in_zone("us-east-1c"))
    with pytest.raises(CapacityError):
        up_cluster(spec_for(zone="us-east-1c"))
    assert len(fakes.calls("RunInstances")) == 1


def _spot(params):
    return "InstanceMarketOptions" in params


def test_spot_without_fallback_does_not_buy_on_demand(fakes, spec_for, up_cluster, tagged):
    fakes.fail("RunInstances", "InsufficientInstanceCapacity", status=500, when=_spot)
    with pytest.raises(CapacityError):
        up_cluster(spec_for(spot=True))
    assert all(_spot(c) for c in fakes.calls("RunInstances"))
    assert tagged() == {}


def test_spot_falls_back_to_on_demand_with_the_flag(fakes, spec_for, up_cluster):
    fakes.fail("RunInstances", "InsufficientInstanceCapacity", status=500, when=_spot)
    inv = up_cluster(spec_for(spot=True, spot_fallback=True))
    calls = fakes.calls("RunInstances")
    assert [_spot(c) for c in calls] == [True] * 4 + [False]
    assert len(inv.nodes) == 2
    assert inv.preemption is None  # bought on-demand: no spot notices to watch for


def test_throttling_on_30_percent_of_calls_still_succeeds(fakes, spec_for, store, up_cluster, tagged):
    from provision.cluster import pipeline

    fakes.throttle(0.3, seed=7)
    inv = up_cluster(spec_for(nodes=4))
    assert len(inv.nodes) == 4
    pipeline.down("c1", store=store, log=lambda m: None)
    assert fakes.throttled > 5
    fakes.throttle(0.0)
    assert tagged() == {}


def test_transient_errors_are_bounded(fakes, spec_for, up_cluster, tagged):
    from provision.cluster.providers.aws import retry

    fakes.fail("CreateSecurityGroup", "RequestLimitExceeded", status=503)  # forever
    with pytest.raises(ProvisionError, match="RequestLimitExceeded"):
        up_cluster(spec_for())
    assert fakes.operations().count("CreateSecurityGroup") == retry.policy().attempts
    assert tagged() == {}


def test_a_duplicate_answer_adopts_only_our_own_resource(fakes, spec_for, up_cluster, moto_ec2):
    """A retried create whose first try had succeeded answers 'Duplicate': the existing key
    pair is used if it carries this cluster's tag, refused otherwise."""
    from provision.model.keys import generate_ed25519

    tag = [{"ResourceType": "key-pair", "Tags": [{"Key": "mgpu-cloud-cluster", "Value": "c1"}]}]
    moto_ec2.import_key_pair(KeyName="mgpu-cloud-c1", TagSpecifications=tag,
                             PublicKeyMaterial=generate_ed25519().public_openssh.encode())
    inv = up_cluster(spec_for())
    assert len(inv.resources_of("key-pair")) == 1

    moto_ec2.import_key_pair(KeyName="mgpu-cloud-c2",
                             PublicKeyMaterial=generate_ed25519().public_openssh.encode())
    with pytest.raises(ProvisionError, match="is not tagged for cluster 'c2'"):
        up_cluster(spec_for(name="c2"))
    assert moto_ec2.describe_key_pairs(KeyNames=["mgpu-cloud-c2"])["KeyPairs"]  # not ours: kept
