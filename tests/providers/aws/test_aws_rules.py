"""The rules layer (aws_rules.py): every rule can fail (a violating request or state per rule),
the layer sees every request a provider client sends, and `up` with the longest name and
every catalog type passes through all of it."""

from __future__ import annotations

import base64

import aws_rules as rules
import pytest

from provision.cluster import pipeline
from provision.cluster.providers.aws.catalog import catalog_types

LONGEST_NAME = "a" + "b" * 38 + "9"  # 40 characters, the most a cluster name may have
REGION_OF = {"p5e.48xlarge": "us-east-2"}  # moto offers p5e in no us-east-1 zone


def efa(card: int, device: int, kind: str = "efa-only", subnet: str = "subnet-1") -> dict:
    return {"NetworkCardIndex": card, "DeviceIndex": device, "InterfaceType": kind,
            "SubnetId": subnet, "Groups": ["sg-1"]}


def p4d(ifaces: list[dict]) -> dict:
    return {"InstanceType": "p4d.24xlarge", "NetworkInterfaces": ifaces}


GOOD_P4D = [efa(0, 0, "efa")] + [efa(c, 1) for c in range(1, 4)]


# --- every request rule fails on a violating request, and only then ----------------------------
@pytest.mark.parametrize(("op", "params", "words"), [
    ("RunInstances", {"ClientToken": "x" * 65}, "ClientToken of 65"),
    ("CreateNatGateway", {"ClientToken": "é" * 10}, "ASCII"),
    ("CreateSecurityGroup", {"TagSpecifications": [{"Tags": [
        {"Key": f"k{i}", "Value": "v"} for i in range(51)]}]}, "51 tags"),
    ("CreateSubnet", {"TagSpecifications": [{"Tags": [{"Key": "k" * 129, "Value": ""}]}]},
     "tag key of 129"),
    ("RunInstances", {"TagSpecifications": [{"Tags": [{"Key": "k", "Value": "v" * 257}]}]},
     "tag value of 257"),
    ("CreateTags", {"Tags": [{"Key": "aws:owner", "Value": "me"}]}, "reserved aws:"),
    ("RunInstances", p4d([dict(i, AssociatePublicIpAddress=True) if i["NetworkCardIndex"] == 0
                          else i for i in GOOD_P4D]), "AssociatePublicIpAddress=true with 4"),
    ("RunInstances", p4d(GOOD_P4D[:3]), "4 EFA interfaces, 3 requested"),
    ("RunInstances", p4d([efa(0, 0)] + GOOD_P4D[1:]), "primary interface is 'efa-only'"),
    ("RunInstances", p4d(GOOD_P4D[:3] + [efa(2, 1)]), "share a (card, device index)"),
    ("RunInstances", p4d(GOOD_P4D[:3] + [efa(4, 1)]), "cards [0, 1, 2, 4]"),
    ("RunInstances", p4d(GOOD_P4D[:3] + [dict(efa(3, 1), PrivateIpAddress="10.0.0.9")]),
     "has IP settings"),
    ("RunInstances", p4d(GOOD_P4D[:3] + [efa(3, 1, subnet="subnet-2")]), "several subnets"),
    ("RunInstances", p4d(GOOD_P4D[:3] + [efa(3, 2)]), "device 2"),
    ("RunInstances", {"InstanceType": "g6.xlarge", "NetworkInterfaces": [efa(0, 0, "efa")]},
     "has no EFA"),
    ("RunInstances", {"InstanceType": "p9.future", "NetworkInterfaces": []},
     "no documented EFA layout"),
    ("RunInstances", {"InstanceType": "g6.xlarge", "UserData": "#cloud-config\n" + "x" * 16400},
     "user data of"),
])
def test_each_request_rule_fails_on_a_violation(op, params, words):
    found = rules.check_request(op, params)
    assert any(words in v for v in found), found


@pytest.mark.parametrize(("op", "params"), [
    ("RunInstances", {"ClientToken": "x" * 64, **p4d(GOOD_P4D)}),
    ("RunInstances", {"InstanceType": "g6.xlarge", "NetworkInterfaces": [
        {"DeviceIndex": 0, "AssociatePublicIpAddress": True, "SubnetId": "s"}],
        "UserData": base64.b64encode(b"#cloud-config\n" + b"x" * 16000).decode()}),
    ("RunInstances", p4d([dict(i, AssociatePublicIpAddress=False) if i["NetworkCardIndex"] == 0
                          else i for i in GOOD_P4D])),
    # the current AWS layout: ENA primary + efa-only at device 1 on card 0, device 0 elsewhere
    ("RunInstances", p4d([efa(0, 0, "interface"), efa(0, 1)] + [efa(c, 0) for c in (1, 2, 3)])),
    ("CreateTags", {"Tags": [{"Key": "k" * 128, "Value": "v" * 256}] * 50}),
])
def test_documented_requests_pass(op, params):
    assert rules.check_request(op, params) == []


# --- state rules fail on moto states that would be offline on EC2 --------------------------------
def _launch(ec2, subnet, ifaces=1, public=None):
    ami = ec2.describe_images(Owners=["self"])["Images"][0]["ImageId"]
    nics = [{"DeviceIndex": 0 if i == 0 else 1, "NetworkCardIndex": i, "SubnetId": subnet}
            for i in range(ifaces)]
    if public is not None:
        nics[0]["AssociatePublicIpAddress"] = public
    request = {"InstanceType": "p4d.24xlarge", "NetworkInterfaces": nics}
    inst = ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, **request)["Instances"][0]
    return inst, request


def _default_subnet(ec2):
    return ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])[
        "Subnets"][0]["SubnetId"]


def test_internet_rule_ignores_moto_public_ip_on_multi_interface_instances(fakes, moto_ec2):
    inst, request = _launch(moto_ec2, _default_subnet(moto_ec2), ifaces=4)
    assert inst.get("PublicIpAddress")  # moto gives one; EC2 would not
    (violation,) = rules.internet_path(moto_ec2, inst, request)
    assert "no public address and no route to a NAT gateway" in violation
    eip = moto_ec2.allocate_address(Domain="vpc")
    moto_ec2.associate_address(AllocationId=eip["AllocationId"],
                               NetworkInterfaceId=inst["NetworkInterfaces"][0]["NetworkInterfaceId"])
    assert rules.internet_path(moto_ec2, inst, request) == []


def test_internet_rule_needs_an_internet_gateway_route(fakes, moto_ec2):
    vpc = moto_ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]  # no gateway
    subnet = moto_ec2.create_subnet(VpcId=vpc, CidrBlock="10.9.0.0/24")["Subnet"]["SubnetId"]
    inst, request = _launch(moto_ec2, subnet, public=True)
    (violation,) = rules.internet_path(moto_ec2, inst, request)
    assert "no 0.0.0.0/0 route to an attached internet gateway" in violation
    inst, request = _launch(moto_ec2, _default_subnet(moto_ec2), public=True)
    assert rules.internet_path(moto_ec2, inst, request) == []  # the fixture's real default VPC


def test_internet_rule_checks_the_nat_gateway_path(fakes, moto_ec2):
    vpc = moto_ec2.describe_vpcs()["Vpcs"][0]["VpcId"]
    # a subnet of the default VPC whose own route table has no internet gateway route
    lonely_subnet = moto_ec2.create_subnet(VpcId=vpc, CidrBlock="172.31.251.0/24")["Subnet"]
    lonely_rt = moto_ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
    moto_ec2.associate_route_table(RouteTableId=lonely_rt, SubnetId=lonely_subnet["SubnetId"])
    private = moto_ec2.create_subnet(VpcId=vpc, CidrBlock="172.31.250.0/24")["Subnet"]["SubnetId"]
    rt = moto_ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
    moto_ec2.associate_route_table(RouteTableId=rt, SubnetId=private)
    inst, request = _launch(moto_ec2, private, ifaces=4)
    eip = moto_ec2.allocate_address(Domain="vpc")["AllocationId"]
    bad_nat = moto_ec2.create_nat_gateway(SubnetId=lonely_subnet["SubnetId"],
                                          AllocationId=eip)["NatGateway"]["NatGatewayId"]
    moto_ec2.create_route(RouteTableId=rt, DestinationCidrBlock="0.0.0.0/0",
                          NatGatewayId=bad_nat)
    (violation,) = rules.internet_path(moto_ec2, inst, request)
    assert "sits in a subnet without an internet gateway route" in violation
    eip2 = moto_ec2.allocate_address(Domain="vpc")["AllocationId"]
    good_nat = moto_ec2.create_nat_gateway(SubnetId=_default_subnet(moto_ec2),
                                           AllocationId=eip2)["NatGateway"]["NatGatewayId"]
    moto_ec2.replace_route(RouteTableId=rt, DestinationCidrBlock="0.0.0.0/0",
                           NatGatewayId=good_nat)
    assert rules.internet_path(moto_ec2, inst, request) == []


def test_efa_security_group_rule_needs_self_rules_both_ways(fakes, moto_ec2):
    sg = moto_ec2.create_security_group(GroupName="g", Description="d")["GroupId"]
    request = p4d([dict(i, Groups=[sg]) for i in GOOD_P4D])
    found = rules.efa_security_group(moto_ec2, request)
    assert len(found) == 2 and "IpPermissionsEgress" in found[1]
    itself = [{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": sg}]}]
    moto_ec2.authorize_security_group_ingress(GroupId=sg, IpPermissions=itself)
    (found,) = rules.efa_security_group(moto_ec2, request)
    assert "IpPermissionsEgress" in found
    moto_ec2.authorize_security_group_egress(GroupId=sg, IpPermissions=itself)
    assert rules.efa_security_group(moto_ec2, request) == []


def test_the_layer_sees_requests_of_every_provider_client(fakes, aws_rules_layer):
    from provision.cluster.providers.aws.api import Ec2

    before = aws_rules_layer.rules.requests
    Ec2("us-east-1").client.create_tags(Resources=["i-0123456789abcdef0"],
                                        Tags=[{"Key": "x" * 129, "Value": "v"}])
    assert aws_rules_layer.rules.requests == before + 1
    assert [v for v in aws_rules_layer.rules.violations if "tag key of 129" in v]
    aws_rules_layer.rules.violations.clear()  # seen: do not fail this test for it


# --- the longest name, every catalog type, spot: all through the rules --------------------------
@pytest.mark.parametrize("instance_type", catalog_types())
def test_longest_name_and_every_catalog_type_pass_all_rules(
        fakes, spec_for, store, up_cluster, tagged, aws_rules_layer, instance_type):
    region = REGION_OF.get(instance_type, "us-east-1")
    spec = spec_for(name=LONGEST_NAME, instance_type=instance_type, region=region)
    inv = up_cluster(spec)
    assert aws_rules_layer.creates_checked == 1
    assert len(aws_rules_layer.rules.launched) == 2  # both nodes checked for internet access
    assert all(n.address for n in inv.nodes)
    pipeline.down(LONGEST_NAME, store=store, log=lambda m: None)


@pytest.mark.parametrize(("instance_type", "extra"), [
    ("p4d.24xlarge", {}), ("p5.48xlarge", {}), ("p4d.24xlarge", {"spot": True}),
    ("p5.48xlarge", {"spot": True, "private_ips": True}),
])
def test_two_nodes_with_a_40_character_name_are_online(
        fakes, spec_for, store, up_cluster, aws_rules_layer, moto_ec2, instance_type, extra):
    inv = up_cluster(spec_for(name=LONGEST_NAME, instance_type=instance_type, **extra))
    assert aws_rules_layer.creates_checked == 1 and aws_rules_layer.rules.violations == []
    assert len(aws_rules_layer.rules.launched) == 2
    ids = {iid for iid, _ in aws_rules_layer.rules.launched.items()}
    assert ids == {n.resource_id for n in inv.nodes}
    requests = [request for _, request in aws_rules_layer.rules.launched.values()]
    assert all(len(r["ClientToken"]) <= 64 for r in requests)
    markets = {r.get("InstanceMarketOptions", {}).get("MarketType", "on-demand") for r in requests}
    assert markets == {"spot" if extra.get("spot") else "on-demand"}
