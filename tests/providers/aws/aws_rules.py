"""EC2's documented rules that moto does not enforce, checked on every request the provider
sends and on the state `create` leaves. Every AWS test runs through them (conftest's autouse
`aws_rules` fixture) and fails on a violation.

Request rules are pure functions `(operation, params) -> [violation, ...]` (REQUEST_RULES);
state rules read moto through a plain client after `create` returned (check_state). Each rule
names its source: the title of the AWS document that states it.

moto differences these rules make up for (ENVIRONMENT.md): no string limits (ClientToken,
tags); an automatic public IP even for instances with several interfaces; a default VPC with
no internet gateway and no 0.0.0.0/0 route (`real_default_vpc` adds what a real one has); EFA
interface types and card indexes dropped (so EFA rules read the request, not moto).
"""

from __future__ import annotations

import base64
import binascii
import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aws_moto_filters

Params = dict[str, Any]

# EFA interfaces (= network cards used for EFA) per instance type. Sources: "Maximize network
# bandwidth on accelerated instance types" and "Supported instance types" (EFA), EC2 User
# Guide; the same counts in SkyPilot (sky/provision/aws/constants.py EFA_DEVICE_COUNT) and
# dstack; g-types from DescribeInstanceTypes (MaximumEfaInterfaces). 0: no EFA.
EFA_INTERFACES: dict[str, int] = {
    "p3dn.24xlarge": 1, "p4d.24xlarge": 4, "p4de.24xlarge": 4, "p5.48xlarge": 32,
    "p5e.48xlarge": 32, "p5en.48xlarge": 16, "p6-b200.48xlarge": 8, "p6-b300.48xlarge": 16,
    "g5.xlarge": 0, "g5.12xlarge": 1, "g5.48xlarge": 1, "g6.xlarge": 0, "g6.12xlarge": 1,
    "g6.48xlarge": 1, "g6e.48xlarge": 4,
    "t3.small": 0, "t3.medium": 0, "t4g.small": 0,  # the managed runs' controller (controller_vm.py)
}
# The cards that support EFA, where they are not simply 0..n-1, and the number of network
# cards. p6-b300: "P6-B300 has 17 network cards, of which the primary network card (network
# card index 0) only supports ENA (4 ENIs), the remaining secondary network cards (indexes
# 1-16) support EFA and ENA" (AWS engineering, quoted in aws-parallelcluster issue #7143); its
# DescribeInstanceTypes entry says the same per card (NetworkCards[0].InterfaceTypes =
# ['interface'], cards 1..16 ['interface', 'efa', 'efa-only']; as moto 5.2.5 ships it).
EFA_CARDS: dict[str, list[int]] = {"p6-b300.48xlarge": list(range(1, 17))}
NETWORK_CARDS: dict[str, int] = {"p6-b300.48xlarge": 17}


def efa_cards(itype: str) -> list[int]:
    return EFA_CARDS.get(itype, list(range(EFA_INTERFACES.get(itype, 0))))


IP_SETTINGS = ("AssociatePublicIpAddress", "PrivateIpAddress", "PrivateIpAddresses",
               "SecondaryPrivateIpAddressCount", "Ipv6AddressCount", "Ipv6Addresses")
TAG_OPERATIONS_WITHOUT_SPECS = ("CreateTags",)


# --- request rules ---------------------------------------------------------------------------
def client_token(op: str, params: Params) -> list[str]:
    # "RunInstances" (EC2 API Reference), ClientToken: "Constraints: Maximum 64 ASCII
    # characters"; the same for CreateNatGateway, CreateRouteTable ("Ensuring idempotency").
    token = params.get("ClientToken")
    if token is None:
        return []
    if len(token) > 64 or not token.isascii():
        return [f"{op}: ClientToken of {len(token)} characters ({token!r}); at most 64 ASCII"]
    return []


def tags(op: str, params: Params) -> list[str]:
    # "Tag your Amazon EC2 resources" (EC2 User Guide), Tag restrictions: at most 50 tags per
    # resource, key at most 128 and value at most 256 Unicode characters, `aws:` reserved.
    groups = [s.get("Tags", []) for s in params.get("TagSpecifications", [])]
    if op in TAG_OPERATIONS_WITHOUT_SPECS:
        groups.append(params.get("Tags", []))
    out = []
    for group in groups:
        if len(group) > 50:
            out.append(f"{op}: {len(group)} tags on one resource; at most 50")
        for tag in group:
            key, value = str(tag.get("Key", "")), str(tag.get("Value", ""))
            if not 1 <= len(key) <= 128:
                out.append(f"{op}: tag key of {len(key)} characters ({key[:40]!r}...); 1-128")
            if len(value) > 256:
                out.append(f"{op}: tag value of {len(value)} characters for {key!r}; at most 256")
            if key.lower().startswith("aws:"):
                out.append(f"{op}: tag key {key!r} uses the reserved aws: prefix")
    return out


def public_ip_with_several_interfaces(op: str, params: Params) -> list[str]:
    # "InstanceNetworkInterfaceSpecification" (EC2 API Reference), AssociatePublicIpAddress:
    # "You cannot specify more than one network interface in the request" (EC2 answers
    # InvalidParameterCombination). `False` is accepted.
    if op != "RunInstances":
        return []
    ifaces = params.get("NetworkInterfaces") or []
    if len(ifaces) > 1 and any(i.get("AssociatePublicIpAddress") is True for i in ifaces):
        return [f"{op}: AssociatePublicIpAddress=true with {len(ifaces)} network interfaces"]
    return []


def _card(iface: Params) -> int:
    return int(iface.get("NetworkCardIndex", 0))


def efa_layout(op: str, params: Params) -> list[str]:
    # "Maximize network bandwidth on accelerated instance types" (EC2 User Guide): the primary
    # interface is NetworkCardIndex 0 / DeviceIndex 0 and may not be 'efa-only'; one EFA
    # interface per network card; "NetworkCardIndex" (API Reference): the primary interface
    # must be on card 0. "InstanceNetworkInterfaceSpecification": an 'efa-only' interface gets
    # no IP address. "Elastic Fabric Adapter" limitations: EFA traffic does not cross subnets.
    # NetworkCardInfo.InterfaceTypes (API Reference): a card takes only the interface types it
    # lists, so no EFA on a card that has none (p6-b300's card 0, EFA_CARDS above).
    if op != "RunInstances":
        return []
    itype = params.get("InstanceType", "")
    ifaces = params.get("NetworkInterfaces") or []
    if itype not in EFA_INTERFACES:
        return [f"{op}: {itype} has no documented EFA layout in the rules table"]
    expected = EFA_INTERFACES[itype]
    allowed = efa_cards(itype)
    efa = [i for i in ifaces if i.get("InterfaceType") in ("efa", "efa-only")]
    out = []
    if expected == 0:
        return [f"{op}: {itype} has no EFA, yet {len(efa)} EFA interface(s)"] if efa else []
    if len(efa) != expected:
        out.append(f"{op}: {itype} has {expected} EFA interfaces, {len(efa)} requested")
    cards = sorted({_card(i) for i in efa})
    if cards != allowed:
        out.append(f"{op}: EFA interfaces on cards {cards}, expected {allowed[0]}..{allowed[-1]}")
    out += [f"{op}: an EFA interface on card {c} of {itype}, which has no EFA (ENA only)"
            for c in cards if c not in allowed and c < NETWORK_CARDS.get(itype, expected)]
    primary = [i for i in ifaces if _card(i) == 0 and int(i.get("DeviceIndex", -1)) == 0]
    if len(primary) != 1:
        out.append(f"{op}: {len(primary)} interfaces at card 0 / device 0; exactly one")
    elif primary[0].get("InterfaceType") == "efa-only":
        out.append(f"{op}: the primary interface is 'efa-only'")
    slots = [(_card(i), int(i.get("DeviceIndex", -1))) for i in ifaces]
    if len(set(slots)) != len(slots):
        out.append(f"{op}: two interfaces share a (card, device index) slot")
    for i in ifaces:
        if int(i.get("DeviceIndex", -1)) not in (0, 1) or \
                _card(i) >= NETWORK_CARDS.get(itype, expected):
            out.append(f"{op}: interface at card {_card(i)} / device {i.get('DeviceIndex')}")
        if i.get("InterfaceType") == "efa-only" and any(k in i for k in IP_SETTINGS):
            out.append(f"{op}: 'efa-only' interface on card {_card(i)} has IP settings")
    if len({i.get("SubnetId") for i in ifaces}) > 1:
        out.append(f"{op}: interfaces in several subnets; EFA traffic stays in one subnet")
    return out


def user_data_size(op: str, params: Params) -> list[str]:
    # "Run commands when you launch an EC2 instance with user data input" (EC2 User Guide):
    # "User data is limited to 16 KB, in raw form, before it is base64-encoded".
    data = params.get("UserData")
    if op != "RunInstances" or data is None:
        return []
    raw = data.encode() if isinstance(data, str) else bytes(data)
    try:
        decoded = base64.b64decode(raw, validate=True)
        raw = decoded if decoded.startswith(b"#cloud-config") else raw
    except (binascii.Error, ValueError):
        pass
    return [f"{op}: user data of {len(raw)} bytes; at most 16384"] if len(raw) > 16384 else []


def _user_data_text(data: Any) -> str:
    raw = data.encode() if isinstance(data, str) else bytes(data)
    try:
        decoded = base64.b64decode(raw, validate=True)
        raw = decoded if decoded.startswith(b"#") else raw
    except (binascii.Error, ValueError):
        pass
    return raw.decode(errors="replace")


def no_private_key_in_user_data(op: str, params: Params) -> list[str]:
    # "Instance metadata categories" (EC2 User Guide): user data is readable by any process
    # on the instance through the metadata service (and by anyone allowed
    # DescribeInstanceAttribute), and "we recommend that you don't store sensitive data, such
    # as passwords or long-lived encryption keys, as user data" ("Run commands when you launch
    # an EC2 instance with user data input"). A private key (PEM/OpenSSH armour) never goes there.
    data = params.get("UserData")
    if op != "RunInstances" or data is None:
        return []
    return [f"{op}: the user data carries a private key"] if "PRIVATE KEY" in \
        _user_data_text(data) else []


def capacity_block_launch(op: str, params: Params) -> list[str]:
    # "To use your Capacity Block, you must specify the Capacity Block reservation ID when
    # launching instances" ("Launch instances using Capacity Blocks", EC2 User Guide); the
    # capacity-block market cannot be spot, and a block is never launched into with spot
    # options (InstanceMarketOptionsRequest, EC2 API Reference). Which reservation is a block,
    # its zone and time window are checked by the capacity fake (aws_capacity.py).
    if op != "RunInstances":
        return []
    market = params.get("InstanceMarketOptions") or {}
    target = ((params.get("CapacityReservationSpecification") or {})
              .get("CapacityReservationTarget") or {})
    out = []
    if market.get("MarketType") == "capacity-block":
        if not target.get("CapacityReservationId"):
            out.append(f"{op}: MarketType capacity-block without a targeted reservation id")
        if market.get("SpotOptions"):
            out.append(f"{op}: SpotOptions with MarketType capacity-block")
    if target and market.get("MarketType") == "spot":
        out.append(f"{op}: a spot launch targeting capacity reservation {target}")
    return out


REQUEST_RULES: list[Callable[[str, Params], list[str]]] = [
    client_token, tags, public_ip_with_several_interfaces, efa_layout, user_data_size,
    no_private_key_in_user_data, capacity_block_launch,
]


def check_request(op: str, params: Params) -> list[str]:
    return [v for rule in REQUEST_RULES for v in rule(op, params)]


# --- state rules -----------------------------------------------------------------------------
def _route_table(ec2: Any, vpc_id: str, subnet_id: str) -> dict[str, Any] | None:
    explicit = ec2.describe_route_tables(
        Filters=[{"Name": "association.subnet-id", "Values": [subnet_id]}])["RouteTables"]
    if explicit:
        return dict(explicit[0])
    main = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [vpc_id]},
                                              {"Name": "association.main", "Values": ["true"]}])
    return dict(main["RouteTables"][0]) if main["RouteTables"] else None


def _default_route(table: dict[str, Any] | None) -> dict[str, Any]:
    for route in (table or {}).get("Routes", []):
        if route.get("DestinationCidrBlock") == "0.0.0.0/0" and route.get("State") != "blackhole":
            return dict(route)
    return {}


def _igw_attached(ec2: Any, igw: str | None, vpc_id: str) -> bool:
    if not igw or not igw.startswith("igw-"):
        return False
    found = ec2.describe_internet_gateways(InternetGatewayIds=[igw])["InternetGateways"]
    return any(a.get("VpcId") == vpc_id and a.get("State") in ("available", "attached")
               for g in found for a in g.get("Attachments", []))


def internet_path(ec2: Any, inst: dict[str, Any], request: Params) -> list[str]:
    # A subnet reaches the internet through a route 0.0.0.0/0 to an internet gateway attached
    # to its VPC ("Enable internet access for a VPC using an internet gateway", Amazon VPC User
    # Guide) for instances with a public IPv4 address; without one, through a route to a
    # public NAT gateway that itself sits in such a subnet ("NAT gateways", Amazon VPC User
    # Guide). "If you specify more than one network interface, your instance cannot receive a
    # public IPv4 address" ("Launch an instance", EC2 User Guide): moto's automatic address on
    # such an instance does not count, only an Elastic IP does.
    iid, vpc_id = inst["InstanceId"], inst["VpcId"]
    ifaces = request.get("NetworkInterfaces") or []
    primary = next((n for n in inst.get("NetworkInterfaces", [])
                    if int(n.get("Attachment", {}).get("DeviceIndex", -1)) == 0), None)
    if primary is None:
        return [f"{iid}: no primary network interface"]
    subnet_id = primary["SubnetId"]
    eips = ec2.describe_addresses(Filters=[{"Name": "network-interface-id",
                                            "Values": [primary["NetworkInterfaceId"]]}])
    public = bool(eips["Addresses"])
    if not public and len(ifaces) == 1:
        subnet = ec2.describe_subnets(SubnetIds=[subnet_id])["Subnets"][0]
        asked = ifaces[0].get("AssociatePublicIpAddress")
        public = asked is True or (asked is None and subnet.get("MapPublicIpOnLaunch", False))
    route = _default_route(_route_table(ec2, vpc_id, subnet_id))
    if public:
        if _igw_attached(ec2, route.get("GatewayId"), vpc_id):
            return []
        return [f"{iid}: has a public address but its subnet {subnet_id} has no 0.0.0.0/0 "
                "route to an attached internet gateway"]
    nat_id = route.get("NatGatewayId")
    if not nat_id:
        return [f"{iid}: no public address and no route to a NAT gateway (subnet {subnet_id})"]
    nat = ec2.describe_nat_gateways(NatGatewayIds=[nat_id])["NatGateways"][0]
    if nat.get("State") != "available" or nat.get("ConnectivityType", "public") != "public":
        return [f"{iid}: NAT gateway {nat_id} is {nat.get('State')} / "
                f"{nat.get('ConnectivityType')}"]
    if not any(a.get("PublicIp") for a in nat.get("NatGatewayAddresses", [])):
        return [f"{iid}: NAT gateway {nat_id} has no public address"]
    if nat.get("VpcId") != vpc_id:
        return [f"{iid}: NAT gateway {nat_id} is in another VPC ({nat.get('VpcId')})"]
    nat_route = _default_route(_route_table(ec2, vpc_id, nat["SubnetId"]))
    if not _igw_attached(ec2, nat_route.get("GatewayId"), vpc_id):
        return [f"{iid}: NAT gateway {nat_id} sits in a subnet without an internet gateway route"]
    return []


def efa_security_group(ec2: Any, request: Params) -> list[str]:
    # "Elastic Fabric Adapter" limitations / "Get started with EFA" (EC2 User Guide): "The EFA
    # must be a member of a security group that allows all inbound and outbound traffic to
    # and from the security group itself."
    groups = {g for i in request.get("NetworkInterfaces") or []
              if i.get("InterfaceType") in ("efa", "efa-only") for g in i.get("Groups", [])}
    out = []
    for sg in ec2.describe_security_groups(GroupIds=sorted(groups))["SecurityGroups"] if groups else []:
        for direction in ("IpPermissions", "IpPermissionsEgress"):
            own = [p for p in sg.get(direction, []) if p.get("IpProtocol") == "-1"
                   and any(pair.get("GroupId") == sg["GroupId"]
                           for pair in p.get("UserIdGroupPairs", []))]
            if not own:
                out.append(f"{sg['GroupId']}: no all-traffic rule to itself in {direction}")
    return out


# The Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)'s release notes list the
# EC2 instances it supports; p6-b300 is not among them (the 24.04 AMI's notes list it).
DLAMI_2204_UNSUPPORTED = ("p6-b300.",)


def image_supports(ec2: Any, inst: dict[str, Any]) -> list[str]:
    if not str(inst.get("InstanceType", "")).startswith(DLAMI_2204_UNSUPPORTED):
        return []
    images = ec2.describe_images(ImageIds=[inst["ImageId"]])["Images"]
    name = str(images[0].get("Name", "")) if images else ""
    if "Deep Learning" in name and "Ubuntu 22.04" in name:
        return [f"{inst['InstanceId']}: {inst['InstanceType']} on {name!r}, which does not "
                "support it (launch the Ubuntu 24.04 DLAMI)"]
    return []


@dataclass
class AwsRules:
    """Attached to every client the provider makes (clients.add_client_hook)."""

    violations: list[str] = field(default_factory=list)
    # instance id -> (region, the RunInstances request that made it)
    launched: dict[str, tuple[str, Params]] = field(default_factory=dict)
    requests: int = 0

    def attach(self, client: Any) -> None:
        service = client.meta.service_model.service_id.hyphenize()
        region = client.meta.region_name
        client.meta.events.register(f"before-parameter-build.{service}", self._request)

        def launched(parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
            for inst in parsed.get("Instances", []):
                self.launched[inst["InstanceId"]] = (region, context.get("rules_params", {}))

        client.meta.events.register(f"after-call.{service}.RunInstances", launched)
        client.meta.events.register(f"after-call.{service}.DescribeNatGateways",
                                    aws_moto_filters.nat_gateway_tag_filters)

    def _request(self, params: Params, model: Any, context: dict[str, Any], **_: Any) -> None:
        self.requests += 1
        snapshot = copy.deepcopy(params)
        context["rules_params"] = snapshot
        self.violations += check_request(model.name, snapshot)

    def check_state(self, ec2_for: Callable[[str], Any]) -> int:
        """After `create`: every live instance launched in this test has a path to the
        internet, and every EFA security group its self rules. Returns the instances checked."""
        by_region: dict[str, list[str]] = {}
        for iid, (region, _) in self.launched.items():
            by_region.setdefault(region, []).append(iid)
        checked = 0
        for region, ids in by_region.items():
            ec2 = ec2_for(region)
            found = [i for r in ec2.describe_instances(InstanceIds=ids)["Reservations"]
                     for i in r["Instances"] if i["State"]["Name"] in ("pending", "running")]
            for inst in found:
                checked += 1
                request = self.launched[inst["InstanceId"]][1]
                self.violations += internet_path(ec2, inst, request)
                self.violations += efa_security_group(ec2, request)
                self.violations += image_supports(ec2, inst)
        return checked


def real_default_vpc(ec2: Any) -> None:
    """Give moto's default VPC what a real one has: an attached internet gateway and the
    route 0.0.0.0/0 -> it in the main route table ("Default VPCs", Amazon VPC User Guide)."""
    (vpc,) = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
    igw = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
    ec2.attach_internet_gateway(InternetGatewayId=igw, VpcId=vpc["VpcId"])
    (main,) = ec2.describe_route_tables(Filters=[
        {"Name": "vpc-id", "Values": [vpc["VpcId"]]},
        {"Name": "association.main", "Values": ["true"]}])["RouteTables"]
    ec2.create_route(RouteTableId=main["RouteTableId"], DestinationCidrBlock="0.0.0.0/0",
                     GatewayId=igw)
