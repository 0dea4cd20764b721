"""Issue 42 (the mutation run): aws's check at deletion time (`teardown.Teardown.owned` and
`refuse`) says exactly whose a refused resource is, and a recorded resource EC2 no longer has
is dropped quietly, never a failure; under moto."""

from __future__ import annotations

import pytest

from provision.cluster.providers import get_provider
from provision.model.errors import TeardownError
from provision.model.inventory import ResourceRecord

REGION = "us-east-1"


def test_a_refusal_says_whose_it_is_and_a_gone_record_is_dropped(
        fakes, spec_for, store, up_cluster, moto_ec2) -> None:
    other = up_cluster(spec_for(name="c2", instance_type="g6.xlarge"))
    inv = up_cluster(spec_for(name="c1", instance_type="g6.xlarge"))
    theirs = next(r.id for r in other.resources if r.kind == "security-group")
    loose = moto_ec2.create_security_group(GroupName="loose", Description="x")["GroupId"]
    gone = moto_ec2.create_security_group(GroupName="gone", Description="x")["GroupId"]
    moto_ec2.delete_security_group(GroupId=gone)
    inv.resources += [ResourceRecord(kind="security-group", id=i, name=i, region=REGION)
                      for i in (theirs, loose, gone)]
    store.save(inv)
    with pytest.raises(TeardownError) as err:
        get_provider("aws").destroy(inv, store)
    said = err.value.message
    assert (f"refused to delete security-group {theirs}: it is tagged mgpu-cloud-cluster=c2, "
            "not mgpu-cloud-cluster=c1 (left alone; dropped from the inventory)") in said
    assert (f"refused to delete security-group {loose}: it is without the mgpu-cloud-cluster "
            "tag, not mgpu-cloud-cluster=c1 (left alone; dropped from the inventory)") in said
    assert gone not in said  # gone already: forgotten, not a problem
    assert not [r for r in inv.resources if r.id in (theirs, loose, gone)]
    get_provider("aws").destroy(inv, store)  # nothing of it left to refuse: it finishes


def test_another_clusters_nat_gateway_is_refused_and_left_running(
        fakes, spec_for, store, up_cluster, moto_ec2) -> None:
    """A NAT gateway recorded in c1's inventory that EC2 tags for c2: looked up by id (with
    DescribeNatGateways' own parameter name, `Filter`), refused by name, never deleted, and
    dropped from the inventory; a second teardown has nothing of it left to refuse."""
    inv = up_cluster(spec_for(name="c1", instance_type="g6.xlarge"))
    vpc = moto_ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    subnet = moto_ec2.create_subnet(VpcId=vpc, CidrBlock="10.9.1.0/24")["Subnet"]["SubnetId"]
    eip = moto_ec2.allocate_address(Domain="vpc")["AllocationId"]
    tags = [{"ResourceType": "natgateway",
             "Tags": [{"Key": "mgpu-cloud-cluster", "Value": "c2"}]}]
    nat = moto_ec2.create_nat_gateway(SubnetId=subnet, AllocationId=eip,
                                      TagSpecifications=tags)["NatGateway"]["NatGatewayId"]
    inv.resources.append(ResourceRecord(kind="nat-gateway", id=nat, name=nat, region=REGION))
    store.save(inv)
    with pytest.raises(TeardownError) as err:
        get_provider("aws").destroy(inv, store)
    assert (f"refused to delete nat-gateway {nat}: it is tagged mgpu-cloud-cluster=c2, not "
            "mgpu-cloud-cluster=c1 (left alone; dropped from the inventory)") in err.value.message
    left = moto_ec2.describe_nat_gateways(NatGatewayIds=[nat])["NatGateways"]
    assert [n["State"] for n in left] == ["available"]
    assert not [r for r in inv.resources if r.id == nat]
    get_provider("aws").destroy(inv, store)
