"""The AWS plan's rendering for people: resources and notes (pure functions of AwsLaunch)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from provision.cluster.providers.aws import capacity
from provision.cluster.providers.aws.catalog import network_prices
from provision.model.plan import PlannedResource

if TYPE_CHECKING:
    from provision.cluster.providers.aws.request import AwsLaunch


def _name(cluster: str) -> str:
    return f"mgpu-cloud-{cluster}"


def planned_resources(cluster: str, nodes: int, launch: AwsLaunch) -> list[PlannedResource]:
    name = _name(cluster)
    egress = launch.egress
    net = network_prices()
    ipv4 = f"${float(net['public_ipv4_hour']):g}/h per address"
    resources = [
        PlannedResource(kind="key-pair", name=name, details={"key": "the cluster's ed25519 key"}),
        PlannedResource(
            kind="security-group", name=name,
            details={
                "vpc": launch.vpc_id or "(unresolved)", "ssh_from": ", ".join(launch.ssh_cidrs),
                "intra_cluster": "all traffic in and out to the group itself (EFA)",
            },
        ),
        *_placement(name, launch),
        *_capacity(nodes, launch),
        PlannedResource(
            kind="instances", name=f"{nodes} x {launch.instance_type}",
            details={
                "region": launch.region,
                "instance_type": launch.instance_type,
                "gpus": launch.gpus,
                "image": launch.image,
                "zones": ",".join(f"{z.zone}={z.subnet}" for z in launch.zones) or "(unresolved)",
                "ami": launch.ami or "(unresolved)",
                "ami_name": launch.ami_name,
                "root_device": launch.root_device or "(unresolved)",
                "market": launch.market,
                "spot_fallback": "yes" if launch.spot_fallback else "no",
                "efa_interfaces": str(launch.efa_interfaces) + (
                    f" (cards {launch.efa_cards[0]}-{launch.efa_cards[-1]}; card 0 ENA only)"
                    if launch.efa_cards and 0 not in launch.efa_cards else ""),
                "gpudirect_rdma": "yes" if launch.device_rdma else "no",
                "disk_gb": str(launch.disk_gb),
                "max_hours": f"{launch.max_hours:g}",
                "addresses": {"public-ip": "public IP per node (automatic)",
                              "elastic-ip": "one Elastic IP per node",
                              "nat": "private only"}[egress.mode],
            },
        ),
    ]
    quota = ("not checked" if egress.eip_quota is None
             else f"{egress.eips_in_use} of {egress.eip_quota} in use")
    if egress.mode == "elastic-ip":
        resources.append(PlannedResource(
            kind="elastic-ips", name=f"{nodes} x Elastic IP",
            details={"why": f"{launch.instance_type} has {launch.interfaces} network cards: "
                     "no automatic public IPv4", "cost": ipv4, "region_quota": quota},
        ))
    elif egress.mode == "nat":
        resources += [
            PlannedResource(kind="route-table", name=name,
                            details={"routes": "egress (all destinations) -> the NAT gateway"}),
            PlannedResource(kind="subnet", name=f"{name} (private)",
                            details={"where": "a free block of the default VPC, in the "
                                     "launch zone", "public_ips": "none"}),
            PlannedResource(kind="nat-gateway", name=name,
                            details={"where": "the launch zone's default subnet",
                                     "cost": f"${float(net['nat_gateway_hour']):g}/h + "
                                     f"${float(net['nat_gateway_gb']):g}/GB processed"}),
            PlannedResource(kind="elastic-ip", name=f"{name} (NAT)",
                            details={"cost": ipv4, "region_quota": quota}),
        ]
    return resources


def _placement(name: str, launch: AwsLaunch) -> list[PlannedResource]:
    if launch.market == "capacity-block":
        return []  # the block's instances are placed together in an UltraCluster by EC2
    if launch.reservation is not None:
        group = launch.reservation.placement_group
        return [PlannedResource(kind="placement-group", name=group,
                                details={"strategy": "cluster", "owner": "the reservation's "
                                         "(used, not made)"})] if group else []
    if launch.reserved == "reservation":
        return []  # offline: the reservation's own group, if any, is used (unresolved)
    return [PlannedResource(kind="placement-group", name=name, details={"strategy": "cluster"})]


def _capacity(nodes: int, launch: AwsLaunch) -> list[PlannedResource]:
    b, r = launch.block, launch.reservation
    if b is not None:
        return [PlannedResource(
            kind="capacity-block", name=f"{b.instance_count} x {launch.instance_type}",
            details={"offering": b.offering_id, "zone": b.zone, "start": b.start,
                     "end": b.end, "hours": str(b.hours),
                     "price": f"{b.currency} {b.upfront_usd:,.2f} up front, not refundable",
                     "bought": "by `up` after you confirm this plan (PurchaseCapacityBlock)"})]
    if r is not None:
        return [PlannedResource(
            kind="capacity-reservation", name=r.id,
            details={"zone": r.zone, "available": f"{r.available} (needs {nodes})",
                     "end": r.end or "none", "type": "capacity block" if r.capacity_block
                     else "On-Demand Capacity Reservation (billed whether used or not)"})]
    return []


def _sites_note(launch: AwsLaunch) -> str:
    from provision.cluster.providers.aws.catalog import hourly_price

    def one(region: str, zones: str, usd: float | None) -> str:
        return f"{region} ({zones or 'zones unresolved'}; " + (
            f"${usd:,.2f}/h per node)" if usd is not None else "price unknown)")

    first = hourly_price(launch.instance_type, launch.region).usd_per_hour
    parts = [one(launch.region, ",".join(z.zone for z in launch.zones), first)]
    parts += [one(s.region, ",".join(z.zone for z in s.zones), s.usd_per_hour)
              for s in launch.fallback]
    return "regions tried in order on capacity errors: " + "; ".join(parts)


def plan_notes(nodes: int, launch: AwsLaunch, *, max_hours_defaulted: bool) -> list[str]:
    net = network_prices()
    egress = launch.egress
    notes = [
        lifetime_note(launch, max_hours_defaulted),
        "zones tried in order on capacity errors: "
        + (", ".join(z.zone for z in launch.zones) or "(unresolved)"),
        f"internet: {egress.describe(nodes)}; ${egress.hourly_usd:,.3f}/h for the cluster, "
        "included in the cost"
        + (f", plus ${float(net['nat_gateway_gb']):g} per GB through the NAT gateway "
           "(image pulls count)" if egress.mode == "nat" else ""),
    ]
    if launch.private_ips:
        notes.append("--private-ips: the controller reaches the nodes on their private "
                     "addresses (it must run inside the VPC); SSH is open to "
                     + ", ".join(launch.ssh_cidrs)
                     + " (pass --ssh-cidr to narrow it to the controller's own address)")
    if launch.spot:
        notes.append("spot: the cost shown is the on-demand ceiling")
    if launch.fallback:
        notes.append(_sites_note(launch))
    if launch.block is not None:
        b = launch.block
        notes.append(
            f"Capacity Block: {b.instance_count} x {launch.instance_type} in {b.zone} from "
            f"{b.start} to {b.end} for {b.currency} {b.upfront_usd:,.2f}, paid up front when "
            "`up` buys it (it cannot be cancelled, and is paid whatever the nodes run); `up` "
            "then waits for the start, and launches the nodes into it")
    elif launch.reservation is not None:
        notes.append(f"launched into capacity reservation {launch.reservation.id} in "
                     f"{launch.reservation.zone} (no zone failover)")
    return notes


def lifetime_note(launch: AwsLaunch, defaulted: bool) -> str:
    """How long the nodes live, as it will happen: after --max-hours, or, in a Capacity Block,
    35 min before its end (capacity.node_hours), with the paid hours a shorter --max-hours
    gives up."""
    hours = f"{launch.max_hours:g} h"
    plain = f"nodes shut down and terminate themselves after {hours}" + (
        " (default; change with --max-hours)" if defaulted else "")
    if launch.market != "capacity-block":
        return plain
    ec2 = "EC2 terminates a block's instances from 30 min before its end"
    end = capacity.capacity_end(launch)
    if end is None:  # offline: the block is not known yet
        return (f"nodes power off 35 min before the Capacity Block ends ({ec2}); "
                + ("--max-hours defaults to the block" if defaulted
                   else f"or after --max-hours {hours}, whichever is first"))
    usable = capacity.usable_hours(launch.block, launch.reservation) or 0.0
    given_up = usable - launch.max_hours
    if defaulted or given_up < 0.1:
        return (f"nodes power off 35 min before the Capacity Block ends ({end}), after up to "
                f"{hours} ({ec2})" + ("; --max-hours defaults to the block" if defaulted
                                      else ""))
    return (f"nodes shut down and terminate themselves after {hours} (--max-hours), "
            f"{given_up:.1f} h before they would have to (35 min before the Capacity Block "
            f"ends, {end}): those {given_up:.1f} paid hours of the block are given up (leave "
            "out --max-hours to use the block to its end)")
