"""How every node reaches the internet (egress): decided at plan time, made by `create`.

    mode        used for                          made per cluster                  cost (us-east-1)
    public-ip   one-interface types (g5, g6,     nothing: EC2 gives each node a    $0.005/h per node
                p3dn) without --private-ips      public IPv4 in the default subnet
    elastic-ip  multi-card types (p4d, p5, p5e,  one Elastic IP per node, on its   $0.005/h per node
                p5en, p6-b200, g6e.48xlarge)     primary interface
                without --private-ips
    nat         --private-ips (the controller    a private subnet in the launch    $0.045/h + $0.045 per
                runs inside the VPC)             zone, a route table, a NAT        GB through it, + the
                                                 gateway with its Elastic IP in    NAT's address
                                                 the zone's default subnet

Why: EC2 gives no automatic public IPv4 to an instance launched with more than one network
interface ("If you specify more than one network interface, your instance cannot receive a
public IPv4 address", EC2 User Guide, "Launch an instance"), and a default VPC has no NAT, so
without an address of their own the nodes of a p4d/p5 cluster cannot pull an image or pip
install. An Elastic IP per node is the cheapest fix (the same $0.005/h every public IPv4 costs,
no per-GB charge: a 20 GB image pulled by 8 nodes through a NAT gateway costs ~$7 on top of its
$0.045/h) and keeps direct SSH to every node. It is limited by the region's Elastic IP quota
(`vpc-max-elastic-ips`, 5 by default: "Elastic IP address quota", EC2 User Guide), which
`plan` checks against the addresses already in use. With --private-ips nodes get no public
address at all, so a per-cluster NAT gateway gives them egress (one Elastic IP).

Every resource is tagged and recorded the moment its id exists; teardown.py deletes them.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable
from typing import Any, Literal

from provision.cluster.providers.aws import retry
from provision.cluster.providers.aws.api import Ec2, client_token, tag_spec
from provision.cluster.providers.aws.catalog import network_prices
from provision.cluster.providers.aws.errors import error_code
from provision.model.base import StrictModel
from provision.model.errors import ProvisionError, UserInputError
from provision.model.inventory import ResourceRecord

EgressMode = Literal["public-ip", "elastic-ip", "nat"]
EIP_QUOTA_ATTRIBUTE = "vpc-max-elastic-ips"
EVERYWHERE = "0.0.0.0/0"  # the default route's destination: egress only, never an SSH source
RESERVED_PER_SUBNET = 5  # AWS keeps the first four and the last address of every subnet
Record = Callable[[ResourceRecord], None]


class Egress(StrictModel):
    """How the nodes reach the internet (part of AwsLaunch)."""

    mode: EgressMode
    elastic_ips: int  # Elastic IPs this cluster allocates
    hourly_usd: float  # addresses and NAT gateway, whole cluster
    eip_quota: int | None = None  # None: not looked up (offline plan, or no EIP needed)
    eips_in_use: int | None = None

    def describe(self, nodes: int) -> str:
        if self.mode == "public-ip":
            return "each node has the public IPv4 EC2 gives it in the default subnet"
        if self.mode == "elastic-ip":
            return (f"each node has an Elastic IP ({nodes}): multi-card types get no "
                    "automatic public IPv4")
        return ("nodes have private addresses only; they reach the internet through the "
                "cluster's NAT gateway")


def egress_mode(interfaces: int, private_ips: bool) -> EgressMode:
    if private_ips:
        return "nat"
    return "public-ip" if interfaces == 1 else "elastic-ip"


def plan_egress(ec2: Ec2 | None, nodes: int, interfaces: int, private_ips: bool) -> Egress:
    """The egress of a cluster; with `ec2`, checks the Elastic IP quota (read-only calls).
    UserInputError naming the alternatives when the quota does not allow it."""
    mode = egress_mode(interfaces, private_ips)
    net = network_prices()
    ipv4 = float(net["public_ipv4_hour"])
    eips = {"public-ip": 0, "elastic-ip": nodes, "nat": 1}[mode]
    hourly = {"public-ip": nodes * ipv4, "elastic-ip": nodes * ipv4,
              "nat": ipv4 + float(net["nat_gateway_hour"])}[mode]
    egress = Egress(mode=mode, elastic_ips=eips, hourly_usd=round(hourly, 4))
    if ec2 is None or eips == 0:
        return egress
    quota, in_use = eip_quota(ec2)
    egress.eip_quota, egress.eips_in_use = quota, in_use
    if in_use + eips > quota:
        free = max(0, quota - in_use)
        alternative = (
            "or run the controller inside the VPC with --private-ips (the nodes then share "
            "one NAT gateway and need one Elastic IP)" if mode == "elastic-ip" else
            "or release an unused Elastic IP"
        )
        raise UserInputError(
            f"this cluster needs {eips} Elastic IP(s) in {ec2.region} but only {free} of the "
            f"region's {quota} are free ({in_use} allocated)",
            hint="raise the quota 'EC2-VPC Elastic IPs' in the Service Quotas console (code "
            f"L-0263D0A3), release unused addresses (aws ec2 describe-addresses --region "
            f"{ec2.region}), ask for fewer --nodes, {alternative}",
        )
    return egress


def eip_quota(ec2: Ec2) -> tuple[int, int]:
    """(the region's Elastic IP quota, addresses allocated now). DescribeAccountAttributes
    documents `vpc-max-elastic-ips`; every allocated VPC address counts, associated or not."""
    attributes = ec2.get("describe_account_attributes", "AccountAttributes",
                         AttributeNames=[EIP_QUOTA_ATTRIBUTE])
    values = [v["AttributeValue"] for a in attributes
              if a.get("AttributeName") == EIP_QUOTA_ATTRIBUTE
              for v in a.get("AttributeValues", [])]
    quota = int(values[0]) if values else 5  # the documented default
    addresses = ec2.get("describe_addresses", "Addresses",
                        Filters=[{"Name": "domain", "Values": ["vpc"]}])
    return quota, len(addresses)


def subnet_prefix(nodes: int) -> int:
    """The smallest subnet (AWS allows /28../16) with an address per node: only the primary
    interface of a node takes one ('efa-only' interfaces have no IP address)."""
    for prefix in range(28, 15, -1):
        if 2 ** (32 - prefix) - RESERVED_PER_SUBNET >= nodes:
            return prefix
    return 16


def free_block(vpc_cidrs: list[str], taken: list[str], prefix: int) -> str | None:
    """A /prefix inside the VPC that overlaps no existing subnet, from the top of the range
    (the default subnets take the bottom; new default subnets are added after them)."""
    used = [ipaddress.ip_network(c) for c in taken]
    for cidr in vpc_cidrs:
        net = ipaddress.ip_network(cidr)
        if net.version != 4 or net.prefixlen > prefix:
            continue
        for block in reversed(list(net.subnets(new_prefix=prefix))):
            if not any(block.overlaps(u) for u in used):
                return str(block)
    return None


class EgressMaker:
    """The write steps of the egress; each resource recorded as soon as its id exists."""

    def __init__(self, ec2: Ec2, cluster: str, vpc_id: str, record: Record, nonce: str) -> None:
        """`nonce`: one per `up`, in every ClientToken (a token reused by a later `up` of the
        same name would return the earlier, deleted resource)."""
        self.ec2, self.cluster, self.vpc_id, self._record = ec2, cluster, vpc_id, record
        self.nonce = nonce
        self.route_table_id: str | None = None

    def _rec(self, kind: str, rid: str, name: str | None = None,
             zone: str | None = None) -> None:
        self._record(ResourceRecord(kind=kind, id=rid, name=name, region=self.ec2.region,
                                    zone=zone))

    # --- elastic-ip --------------------------------------------------------------------------
    def node_addresses(self, instances: list[dict[str, Any]]) -> dict[str, str]:
        """An Elastic IP on the primary interface of every node: instance id -> address.
        Two calls per node (AllocateAddress and AssociateAddress have no batch form)."""
        out: dict[str, str] = {}
        for inst in instances:
            eni = primary_interface(inst)
            zone = inst["Placement"]["AvailabilityZone"]
            eip = self.ec2.call("allocate_address", Domain="vpc",
                                TagSpecifications=tag_spec("elastic-ip", self.cluster))
            self._rec("elastic-ip", eip["AllocationId"], eip["PublicIp"], zone)
            self.ec2.call("associate_address", AllocationId=eip["AllocationId"],
                          NetworkInterfaceId=eni, AllowReassociation=False)
            out[inst["InstanceId"]] = str(eip["PublicIp"])
        return out

    # --- nat -----------------------------------------------------------------------------------
    def route_table(self) -> str:
        rt = self.ec2.get("create_route_table", "RouteTable", VpcId=self.vpc_id,
                          ClientToken=client_token(self.cluster, self.nonce, "route-table"),
                          TagSpecifications=tag_spec("route-table", self.cluster))
        self.route_table_id = str(rt["RouteTableId"])
        self._rec("route-table", self.route_table_id)
        return self.route_table_id

    def private_subnet(self, zone: str, nodes: int) -> str:
        """A new subnet for the nodes in `zone`, associated with the cluster's route table."""
        assert self.route_table_id is not None, "route_table() first"
        vpc = self.ec2.get("describe_vpcs", "Vpcs", VpcIds=[self.vpc_id])[0]
        cidrs = [a["CidrBlock"] for a in vpc.get("CidrBlockAssociationSet", [])
                 if (a.get("CidrBlockState") or {}).get("State", "associated") == "associated"]
        cidrs = cidrs or [vpc["CidrBlock"]]
        taken = [s["CidrBlock"] for s in self.ec2.pages(
            "describe_subnets", "Subnets", Filters=[{"Name": "vpc-id", "Values": [self.vpc_id]}])]
        prefix = subnet_prefix(nodes)
        block = free_block(cidrs, taken, prefix)
        if block is None:
            raise ProvisionError(
                f"the default VPC {self.vpc_id} has no free /{prefix} for the cluster's "
                "private subnet",
                hint="delete unused subnets of the default VPC, or leave out --private-ips",
            )
        subnet = self.ec2.get("create_subnet", "Subnet", VpcId=self.vpc_id, CidrBlock=block,
                              AvailabilityZone=zone,
                              TagSpecifications=tag_spec("subnet", self.cluster))
        subnet_id = str(subnet["SubnetId"])
        self._rec("subnet", subnet_id, block, zone)
        self.ec2.call("associate_route_table", RouteTableId=self.route_table_id,
                      SubnetId=subnet_id)
        return subnet_id

    def nat_gateway(self, public_subnet: str, zone: str) -> str:
        """A NAT gateway (with its own Elastic IP) in the zone's default subnet, and the route
        EVERYWHERE -> it in the cluster's route table. Waits until it is available."""
        assert self.route_table_id is not None, "route_table() first"
        eip = self.ec2.call("allocate_address", Domain="vpc",
                            TagSpecifications=tag_spec("elastic-ip", self.cluster))
        self._rec("elastic-ip", eip["AllocationId"], eip["PublicIp"], zone)
        nat = self.ec2.get(
            "create_nat_gateway", "NatGateway", SubnetId=public_subnet,
            AllocationId=eip["AllocationId"], ConnectivityType="public",
            ClientToken=client_token(self.cluster, self.nonce, zone, "nat"),
            TagSpecifications=tag_spec("natgateway", self.cluster))
        nat_id = str(nat["NatGatewayId"])
        self._rec("nat-gateway", nat_id, zone=zone)
        self._wait_available(nat_id)
        from botocore.exceptions import ClientError

        try:
            self.ec2.call("create_route", RouteTableId=self.route_table_id,
                          DestinationCidrBlock=EVERYWHERE, NatGatewayId=nat_id)
        except ClientError as exc:
            if error_code(exc) != "RouteAlreadyExists":  # a retried call had succeeded
                raise
        return nat_id

    def _wait_available(self, nat_id: str) -> None:
        from botocore.exceptions import ClientError

        p = retry.policy()
        deadline = time.monotonic() + p.launch_timeout_s
        while True:
            try:
                found = self.ec2.get("describe_nat_gateways", "NatGateways",
                                     NatGatewayIds=[nat_id])
            except ClientError as exc:  # not visible yet (eventual consistency)
                if error_code(exc) != "NatGatewayNotFound":
                    raise
                found = []
            nat = found[0] if found else {"State": "pending"}
            state = nat.get("State")
            if state == "available":
                return
            if state in ("failed", "deleting", "deleted"):
                raise ProvisionError(
                    f"NAT gateway {nat_id} is {state}: "
                    f"{nat.get('FailureCode', '')} {nat.get('FailureMessage', '')}".strip())
            if time.monotonic() > deadline:
                raise ProvisionError(f"NAT gateway {nat_id} not available after "
                                     f"{p.launch_timeout_s:.0f} s")
            time.sleep(p.poll_interval_s)


def primary_interface(inst: dict[str, Any]) -> str:
    """The network interface at card 0, device 0 (the one with the node's IP address)."""
    for nic in inst.get("NetworkInterfaces", []):
        attachment = nic.get("Attachment", {})
        if int(attachment.get("DeviceIndex", 0)) == 0 and \
                int(attachment.get("NetworkCardIndex", 0)) == 0:
            return str(nic["NetworkInterfaceId"])
    raise ProvisionError(f"node {inst['InstanceId']} has no primary network interface")
