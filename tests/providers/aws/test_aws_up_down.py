"""up/down under moto: inventory, EFA interfaces, security-group rules, tags, user data,
egress (an Elastic IP per node, or a NAT gateway with --private-ips), idempotent and tolerant
teardown. The rules layer (aws_rules.py) checks every request and, after each `create`, that
every node has a path to the internet in moto's state."""

from __future__ import annotations

import base64

import pytest
import yaml

from provision.cluster import pipeline
from provision.cluster.providers import get_provider
from provision.model.errors import TeardownError

TAG = "mgpu-cloud-cluster"


@pytest.mark.parametrize("nodes", [2, 16])
def test_up_then_down(fakes, spec_for, store, up_cluster, tagged, aws_rules_layer, nodes):
    fakes.eip_quota = 64
    inv = up_cluster(spec_for(nodes=nodes))
    assert aws_rules_layer.creates_checked == 1
    assert len(fakes.calls("RunInstances")) == 1
    run = fakes.calls("RunInstances")[0]
    assert run["MinCount"] == run["MaxCount"] == nodes
    assert run["Placement"]["GroupName"] == "mgpu-cloud-c1"
    assert fakes.calls("CreatePlacementGroup")[0]["Strategy"] == "cluster"

    assert [n.rank for n in inv.nodes] == list(range(nodes))
    assert [n.name for n in inv.nodes] == [f"node-{i}" for i in range(nodes)]
    assert all(n.user == "ubuntu" and n.slots == 8 and n.zone == "us-east-1a" for n in inv.nodes)
    assert all(n.host_key and n.host_key.startswith("ssh-ed25519 AAAA") for n in inv.nodes)
    assert len({n.resource_id for n in inv.nodes}) == nodes
    # multi-card p4d: no automatic public IP, so every node gets an Elastic IP of its own
    eips = {r.name for r in inv.resources_of("elastic-ip")}
    assert len(eips) == nodes and {n.address for n in inv.nodes} == eips
    assert all(n.proxy_jump is None and n.address != n.private_address for n in inv.nodes)
    assert len(fakes.calls("AllocateAddress")) == len(fakes.calls("AssociateAddress")) == nodes
    assert inv.wait_for_gpu and inv.manage_etc_hosts
    assert inv.container_image == "nvcr.io/nvidia/pytorch:24.06-py3"
    assert inv.nccl_env["FI_PROVIDER"] == "efa" and inv.nccl_env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert inv.container_args.count("--device") == 4  # p4d: uverbs0..3
    # the fabric gate's expectation (provision/job/fabric.py's row); on-demand: no notices
    assert inv.fabric is not None and (inv.fabric.transport, inv.fabric.busbw_gbps) == ("efa", 77.35)
    assert inv.preemption is None
    assert inv.key_path and store.load("c1").resources == inv.resources
    assert {r.kind for r in inv.resources} == {
        "key-pair", "security-group", "placement-group", "instance", "elastic-ip"}
    assert len(inv.resources_of("instance")) == nodes
    assert set(tagged("c1")) == {"instance", "security-group", "key-pair", "elastic-ip",
                                 "volume", "placement-group"}

    pipeline.down("c1", store=store, log=lambda m: None)
    assert tagged() == {}
    assert not store.exists("c1")


def _interfaces(fakes, spec_for, up_cluster, instance_type, **aws):
    up_cluster(spec_for(instance_type=instance_type, **aws))
    return fakes.calls("RunInstances")[0]["NetworkInterfaces"]


@pytest.mark.parametrize(("instance_type", "cards"), [("p4d.24xlarge", 4), ("p5.48xlarge", 32)])
def test_efa_interfaces_per_type(fakes, spec_for, up_cluster, instance_type, cards):
    ifaces = _interfaces(fakes, spec_for, up_cluster, instance_type)
    assert len(ifaces) == cards
    assert [i["NetworkCardIndex"] for i in ifaces] == list(range(cards))
    assert ifaces[0]["InterfaceType"] == "efa" and ifaces[0]["DeviceIndex"] == 0
    assert all(i["InterfaceType"] == "efa-only" and i["DeviceIndex"] == 1 for i in ifaces[1:])
    assert all(i["DeleteOnTermination"] is True for i in ifaces)
    assert all("AssociatePublicIpAddress" not in i for i in ifaces)
    assert len(fakes.calls("AllocateAddress")) == 2  # one per node


def test_single_efa_interface_gets_a_public_ip_and_no_eip(fakes, spec_for, up_cluster):
    inv = up_cluster(spec_for(instance_type="g5.48xlarge"))
    (iface,) = fakes.calls("RunInstances")[0]["NetworkInterfaces"]
    assert iface["InterfaceType"] == "efa" and iface["AssociatePublicIpAddress"] is True
    assert fakes.calls("AllocateAddress") == []
    assert all(n.proxy_jump is None and n.address != n.private_address for n in inv.nodes)
    assert "FI_EFA_USE_DEVICE_RDMA" not in inv.nccl_env  # g5: no GPUDirect RDMA over EFA


def test_type_without_efa_gets_one_plain_interface(fakes, spec_for, up_cluster):
    inv = up_cluster(spec_for(instance_type="g6.xlarge"))
    (iface,) = fakes.calls("RunInstances")[0]["NetworkInterfaces"]
    assert "InterfaceType" not in iface
    assert "FI_PROVIDER" not in inv.nccl_env and inv.nccl_env["NCCL_IB_DISABLE"] == "1"
    assert inv.fabric is None  # no row in the fabric table: `--fabric-check auto` skips it


@pytest.mark.parametrize("instance_type", ["p4d.24xlarge", "g6.xlarge"])
def test_private_ips_reach_the_internet_through_a_nat_gateway(
        fakes, spec_for, store, up_cluster, tagged, moto_ec2, instance_type):
    inv = up_cluster(spec_for(private_ips=True, instance_type=instance_type))
    assert all(n.address == n.private_address and n.proxy_jump is None for n in inv.nodes)
    (subnet_call,) = fakes.calls("CreateSubnet")
    (nat_call,) = fakes.calls("CreateNatGateway")
    (run,) = fakes.calls("RunInstances")
    subnet = inv.resources_of("subnet")[0].id
    # the nodes are in the cluster's private subnet, the NAT gateway in the zone's public one
    assert {i["SubnetId"] for i in run["NetworkInterfaces"]} == {subnet}
    assert nat_call["SubnetId"] != subnet and nat_call["ConnectivityType"] == "public"
    assert all(i.get("AssociatePublicIpAddress") in (None, False) for i in run["NetworkInterfaces"])
    assert subnet_call["AvailabilityZone"] == "us-east-1a"
    assert subnet_call["CidrBlock"] == "172.31.255.240/28"  # the top of the default VPC
    assert len(fakes.calls("AllocateAddress")) == 1  # the NAT gateway's
    (route,) = fakes.calls("CreateRoute")
    assert route["DestinationCidrBlock"] == "0.0.0.0/0" and route["NatGatewayId"]
    assert {r.kind for r in inv.resources} >= {"route-table", "subnet", "nat-gateway",
                                               "elastic-ip"}
    assert set(tagged("c1")) >= {"route-table", "subnet", "nat-gateway", "elastic-ip"}

    pipeline.down("c1", store=store, log=lambda m: None)
    assert tagged() == {}


def _norm(perms):
    out = set()
    for p in perms:
        for r in p.get("IpRanges", []):
            out.add((p["IpProtocol"], p.get("FromPort"), p.get("ToPort"), r["CidrIp"]))
        for r in p.get("Ipv6Ranges", []):
            out.add((p["IpProtocol"], p.get("FromPort"), p.get("ToPort"), r["CidrIpv6"]))
        for g in p.get("UserIdGroupPairs", []):
            out.add((p["IpProtocol"], p.get("FromPort"), p.get("ToPort"), g["GroupId"]))
    return out


def test_security_group_rules_are_exact(fakes, spec_for, up_cluster, moto_ec2):
    inv = up_cluster(spec_for())
    sg_id = inv.resources_of("security-group")[0].id
    (sg,) = moto_ec2.describe_security_groups(GroupIds=[sg_id])["SecurityGroups"]
    assert _norm(sg["IpPermissions"]) == {("tcp", 22, 22, "203.0.113.7/32"), ("-1", None, None, sg_id)}
    # outbound: to the group itself (EFA) + EC2's default allow-all (nodes pull images)
    assert _norm(sg["IpPermissionsEgress"]) == {("-1", None, None, sg_id), ("-1", None, None, "0.0.0.0/0")}
    sent = fakes.calls("AuthorizeSecurityGroupIngress")[0]["IpPermissions"]
    assert "0.0.0.0/0" not in str(sent)
    assert sg["VpcId"] == fakes.calls("CreateSecurityGroup")[0]["VpcId"]


def test_ipv6_ssh_cidr(fakes, spec_for, up_cluster, moto_ec2):
    up_cluster(spec_for(ssh_cidr="2001:db8::1/128"))
    sent = fakes.calls("AuthorizeSecurityGroupIngress")[0]["IpPermissions"][0]
    assert sent["Ipv6Ranges"][0]["CidrIpv6"] == "2001:db8::1/128" and "IpRanges" not in sent


def test_every_resource_is_tagged(fakes, spec_for, up_cluster, moto_ec2):
    inv = up_cluster(spec_for(spot=True))
    tagged_types = {
        spec["ResourceType"]
        for op, params in fakes.sent
        for spec in params.get("TagSpecifications", [])
        if {"Key": TAG, "Value": "c1"} in spec["Tags"]
    }
    assert tagged_types == {"key-pair", "security-group", "placement-group", "instance", "volume",
                            "network-interface", "spot-instances-request", "elastic-ip"}

    up_cluster(spec_for(name="c2", private_ips=True))
    nat_types = {spec["ResourceType"] for op, params in fakes.sent
                 for spec in params.get("TagSpecifications", [])
                 if {"Key": TAG, "Value": "c2"} in spec["Tags"]}
    assert nat_types >= {"route-table", "subnet", "natgateway", "elastic-ip"}
    for op, params in fakes.sent:  # every create call carries the tag
        if op.startswith(("Create", "Run", "Import", "Allocate")) and op != "CreateRoute":
            assert params.get("TagSpecifications"), op
    flt = [{"Name": f"tag:{TAG}", "Values": ["c1"]}]
    ids = {i["InstanceId"] for r in moto_ec2.describe_instances(Filters=flt)["Reservations"]
           for i in r["Instances"]}
    assert ids == {n.resource_id for n in inv.nodes}


def test_launch_settings_and_user_data(fakes, spec_for, up_cluster):
    inv = up_cluster(spec_for(max_hours=2.5, disk_gb=500, spot=True))
    run = fakes.calls("RunInstances")[0]
    assert run["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert run["ImageId"] == fakes.dlami
    assert run["KeyName"] == "mgpu-cloud-c1"
    assert run["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 500
    assert run["BlockDeviceMappings"][0]["DeviceName"] == "/dev/sda1"  # the AMI's root device
    assert run["InstanceMarketOptions"]["MarketType"] == "spot"
    # spot nodes watch EC2's interruption notice (IMDSv2, remote/preempt.py)
    assert inv.preemption is not None
    assert (inv.preemption.protocol, inv.preemption.url) == ("aws", "http://169.254.169.254")
    assert run["ClientToken"].startswith("mgpu-") and len(run["ClientToken"]) == 45
    raw = run["UserData"]
    text = raw if raw.startswith("#cloud-config") else base64.b64decode(raw).decode()
    assert text.startswith("#cloud-config")
    data = yaml.safe_load(text)
    assert data["ssh_keys"]["ed25519_public"] == inv.nodes[0].host_key
    assert data["ssh_keys"]["ed25519_private"].startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert data["ssh_genkeytypes"] == ["ed25519"]  # cloud-init's schema: at least one item
    assert "--on-active=9000s" in data["bootcmd"][0][2]
    public_key = fakes.calls("ImportKeyPair")[0]["PublicKeyMaterial"]
    with open(inv.key_path + ".pub", "rb") as fh:
        assert public_key == fh.read().strip()


def test_down_is_idempotent(fakes, spec_for, store, up_cluster, tagged):
    inv = up_cluster(spec_for())
    provider = get_provider("aws")
    provider.destroy(inv, store)
    assert inv.resources == [] and tagged() == {}
    provider.destroy(inv, store)  # again: nothing left, no error
    assert tagged() == {}


def test_down_tolerates_resources_already_gone(fakes, spec_for, store, up_cluster, tagged, moto_ec2):
    inv = up_cluster(spec_for())
    ids = [n.resource_id for n in inv.nodes]
    moto_ec2.terminate_instances(InstanceIds=ids)
    for eip in inv.resources_of("elastic-ip"):
        moto_ec2.release_address(AllocationId=eip.id)
    moto_ec2.delete_key_pair(KeyName="mgpu-cloud-c1")
    pipeline.down("c1", store=store, log=lambda m: None)
    assert tagged() == {} and not store.exists("c1")


def test_down_retries_busy_placement_and_security_groups(fakes, spec_for, store, up_cluster, tagged):
    up_cluster(spec_for())
    fakes.extra_in_use = 3
    fakes.fail("DeleteSecurityGroup", "DependencyViolation", times=2)
    pipeline.down("c1", store=store, log=lambda m: None)
    assert fakes.operations().count("DeletePlacementGroup") == 4
    assert fakes.operations().count("DeleteSecurityGroup") == 3
    assert tagged() == {}


def test_down_that_cannot_finish_keeps_the_inventory(fakes, spec_for, store, up_cluster, tagged):
    up_cluster(spec_for())
    fakes.fail("DeleteSecurityGroup", "DependencyViolation")  # forever
    with pytest.raises(TeardownError) as err:
        pipeline.down("c1", store=store, log=lambda m: None)
    assert "security group" in str(err.value) and "DependencyViolation" in str(err.value)
    left = store.load("c1")
    assert [r.kind for r in left.resources] == ["security-group"]
    fakes.faults.clear()
    pipeline.down("c1", store=store, log=lambda m: None)
    assert tagged() == {} and not store.exists("c1")


def test_placement_group_in_use_while_instances_live(fakes, spec_for, up_cluster, moto_ec2):
    """The fake models EC2's rule, so teardown order matters: instances must go first."""
    from botocore.exceptions import ClientError

    from provision.cluster.providers.aws.api import Ec2

    up_cluster(spec_for())
    with pytest.raises(ClientError, match="InUse"):
        Ec2("us-east-1").client.delete_placement_group(GroupName="mgpu-cloud-c1")


def test_api_calls_grow_only_by_the_elastic_ips(fakes, spec_for, store, up_cluster):
    """One RunInstances for any N; the only per-node calls are the Elastic IPs (EC2 has no
    batch form of AllocateAddress / AssociateAddress / ReleaseAddress)."""
    fakes.eip_quota = 64
    per_node = ("AllocateAddress", "AssociateAddress", "DisassociateAddress", "ReleaseAddress")
    counts = []
    for n, name in ((2, "small"), (12, "large")):
        start = len(fakes.sent)
        up_cluster(spec_for(name=name, nodes=n))
        pipeline.down(name, store=store, log=lambda m: None)
        ops = [op for op, _ in fakes.sent[start:]]
        counts.append((len([o for o in ops if o not in per_node]),
                       {o: ops.count(o) for o in per_node}))
    assert counts[0][0] == counts[1][0]
    assert counts[0][1]["AllocateAddress"] == 2 and counts[1][1]["AllocateAddress"] == 12
    assert counts[1][1]["ReleaseAddress"] == 12
